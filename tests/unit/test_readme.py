"""README.md, the front door: short, its two commands on the first screen, its links and example sound.

The commands themselves are checked with every page's in
``tests/unit/test_doc_commands.py``; here: the README's length, that the install
and the first run read without scrolling sideways, that ``.ci/run`` runs the
second command as the README gives it, that every link of the README leads
to a file and heading that exist, and that the complete ServerApp the README
and docs/own-project.md show runs FedMR on numpy clients.
"""

import re

import pytest
from flwr.app import Context, RecordDict
from myst_parser.slugs import github_slugify

from fedx.strategies import to_model
from tests.support.doc_commands import _fences
from tests.support.helpers import REPO
from tests.support.standin_grid import NODE_IDS, StandInGrid

README = REPO / "README.md"
#: What one screen shows before scrolling down, and across before scrolling sideways.
FIRST_SCREEN_LINES = 45
SCREEN_COLUMNS = 80


def _blocks(page, language: str) -> list[tuple[int, str]]:
    text = page.read_text()
    return [(first, code) for first, _, lang, code in _fences(text) if lang == language]


def test_the_readme_is_at_most_150_lines():
    assert len(README.read_text().splitlines()) <= 150


def test_the_two_commands_are_on_the_first_screen_and_read_without_scrolling_sideways():
    install_and_run, tests = _blocks(README, "bash")[:2]
    assert "flwr run ." in install_and_run[1] and 'pip install -e ".[app]"' in install_and_run[1]
    assert 'pip install -e ".[dev]"' in tests[1] and tests[1].splitlines()[-1] == "pytest"
    last_line = tests[0] + len(tests[1].splitlines())
    assert last_line <= FIRST_SCREEN_LINES, f"the second command ends on line {last_line}"
    for _, code in (install_and_run, tests):
        assert max(len(line) for line in code.splitlines()) <= SCREEN_COLUMNS, code


def test_ci_runs_the_readmes_second_command_as_given():
    _, tests = _blocks(README, "bash")[1]
    script = (REPO / ".ci" / "run").read_text()
    assert script.rstrip("\n").endswith(tests.rstrip("\n")), "update .ci/run's last lines"


def _headings(page) -> set[str]:
    text = page.read_text()
    for first, after, _, _ in _fences(text):  # a `#` comment in a code block is no heading
        lines = text.split("\n")
        text = "\n".join(lines[: first - 1] + [""] * (after - first + 1) + lines[after:])
    return {github_slugify(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M)}


def test_every_link_of_the_readme_leads_somewhere():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert len(local) >= 15
    for link in local:
        path, _, anchor = link.partition("#")
        target = REPO / path if path else README
        assert target.exists(), link
        if anchor:
            assert anchor in _headings(target), f"{link}: no heading with that anchor"


def _server_app_examples() -> list[tuple[str, str]]:
    """The complete ServerApps of the README and docs/own-project.md: (page:line, code)."""
    examples = []
    for page in (README, REPO / "docs" / "own-project.md"):
        for first, code in _blocks(page, "python"):
            if "@app.main()" in code:
                examples.append((f"{page.relative_to(REPO)}:{first}", code))
    return examples


@pytest.mark.parametrize("where,code", _server_app_examples(), ids=lambda v: v.split("\n")[0])
def test_the_server_app_example_runs_fedmr_on_numpy_clients(
    where, code, capsys, server_task_identity
):
    namespace: dict = {"__name__": "example_server_app"}
    exec(compile(code, where, "exec"), namespace)  # pylint: disable=exec-used
    grid = StandInGrid(NODE_IDS[:4])
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    namespace["main"](grid, context)
    trainings = [
        batch for batch in grid.sent if batch and batch[0].metadata.message_type == "train"
    ]
    assert len(trainings) == 3, where
    # From round 2 on, FedMR sends each node a model of its own (the uploads recombined).
    received = [to_model(m.content["arrays"]) for m in trainings[1]]
    assert len({tuple(a.tobytes() for a in m.values()) for m in received}) == 4, where
    assert "'weight': (10, 64)" in capsys.readouterr().out
