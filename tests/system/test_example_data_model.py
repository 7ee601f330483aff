"""The commands of docs/own-data.md run the example (examples/tabular) as the page types them.

Both ways: the example's folder as a Flower app (names by reference, nothing
installed) and the package installed next to fedx (names by entry point,
fedx's own app), each on a simulation SuperLink of its own. How fedx loads,
partitions and trains the example's data and model: tests/unit/test_example_data_model.py.
"""

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.doc_commands import page_commands
from tests.support.helpers import BIN, REPO, copy_app, environment_with_path, install_example
from tests.support.simulation import FEDERATION

pytestmark = pytest.mark.cost(4)

EXAMPLE = REPO / "examples" / "tabular"
PAGE = REPO / "docs" / "own-data.md"


def _page_commands(*start: str) -> list:
    """The commands of docs/own-data.md that start with ``start``, in order."""
    return [c for c in page_commands(PAGE) if c.argv[: len(start)] == list(start)]


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def _page_accuracy() -> str:
    """The final accuracy the page prints for the example's run."""
    found = re.search(r"final global test accuracy (\d\.\d{4}) \(round 10\)", PAGE.read_text())
    assert found, "docs/own-data.md shows no final accuracy"
    return found.group(1)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example installed by pip (entry points included) into a folder of its own."""
    return install_example(EXAMPLE, tmp_path_factory.mktemp("example"))


def _flwr_run(env: dict, app, argv: list[str], cwd) -> str:
    """The page's ``flwr run`` with ``app`` for its folder, against the SuperLink of ``env``."""
    run_config = _option(argv, "--run-config")
    options = ["--federation-config", _option(argv, "--federation-config") or FEDERATION]
    command = [str(BIN / "flwr"), "run", str(app), "--stream", *options]
    if run_config:
        command += ["--run-config", run_config]
    done = subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=900, check=False
    )
    return done.stdout + done.stderr


def _final(work) -> dict:
    (folder,) = sorted((work / "outputs").iterdir())
    metrics = json.loads((folder / "metrics.json").read_text())
    return {"folder": folder.name, **metrics}


def test_the_pages_commands_run_the_example_both_ways(installed, tmp_path):
    # pylint: disable=import-outside-toplevel
    from fedx.deploy.local import FederationSpec, LocalFederation, free_port

    by_reference, by_name = [c.argv for c in _page_commands("flwr", "run")]
    assert by_reference[2] == "examples/tabular" and by_name[2] == "."
    assert 'dataset="wdbc" model="mlp"' in _option(by_name, "--run-config")
    prepare_by_path, prepare_installed = _page_commands("python", "-m", "fedx_tabular.prepare")
    assert prepare_by_path.env == {"PYTHONPATH": "examples/tabular"}
    example = tmp_path / "tabular"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "app").mkdir()
    app = copy_app(tmp_path / "app")
    finals = {}
    for route, app_dir, argv, prepare, path in (
        # Nothing installed: the names are references, found in the app's folder.
        ("reference", example, by_reference, prepare_by_path, None),
        # The installed package's entry points, in fedx's own app.
        ("name", app, by_name, prepare_installed, str(installed)),
    ):
        work = tmp_path / f"work-{route}"  # the SuperLink's folder: data/ and outputs/
        work.mkdir()
        subprocess.run(
            [sys.executable, *prepare.argv[1:]],
            cwd=work,
            env=environment_with_path(path or EXAMPLE),
            check=True,
            capture_output=True,
            timeout=300,
        )
        extra = {"PYTHONPATH": path} if path else {}
        spec = FederationSpec(
            0, tmp_path / f"home-{route}", port=free_port(), insecure=True, simulation=True,
            extra_environment=extra, workdir=work,
        )  # fmt: skip
        with LocalFederation(spec) as federation:
            federation.start_superlink(timeout=120)
            output = _flwr_run(spec.environment(), app_dir, argv, work)
        assert (work / "outputs").is_dir(), output[-3000:]
        finals[route] = _final(work)
        label = "fedmr-WDBC-build_mlp-" if path is None else "fedmr-wdbc-mlp-"
        assert finals[route]["folder"].startswith(label), finals[route]["folder"]
    for route, metrics in finals.items():
        rows = {row["round"]: row for row in metrics["rounds"]}
        assert metrics["final"]["round"] == 10, route
        assert rows[10]["accuracy"] > rows[0]["accuracy"] + 0.1, (route, rows[0], rows[10])
        # What the page prints is what this seed gives.
        assert f"{metrics['final']['accuracy']:.4f}" == _page_accuracy(), route
    # One data set, one model, one seed: the two ways are the same run.
    assert finals["reference"]["rounds"][-1]["accuracy"] == finals["name"]["rounds"][-1]["accuracy"]
