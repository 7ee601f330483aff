"""What a comparison runs: every setting × method × seed, one Flower simulation each.

A *setting* is a run-config TOML file (``configs/digits-cnn-dir0.1.toml``):
data, partitioning, model, training and every method's hyper-parameters. A
*method* switches the strategy on top of it: the variants the registered
methods declare (:func:`comparison_methods`; ``fedmr-two-stage`` is FedMR
with the setting's first stage). All methods of a setting share the
setting's keys and the seed, so for one seed they start from the same
initial model and train on the same partitions.
"""

import contextlib
import logging
import shutil
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedx.config import ConfigError, RunConfig
from fedx.registry import Method, Variant, all_methods, builtin_methods


def comparison_methods() -> dict[str, tuple[Method, Variant]]:
    """Every method fedx-compare can run, by name: each registered method's variants."""
    return {
        variant.name: (method, variant)
        for method in all_methods()
        for variant in method.comparison_variants
    }


def default_methods() -> list[str]:
    """What a comparison runs unless told otherwise: fedx's own methods with a global model."""
    return [
        variant.name
        for method in builtin_methods()
        if not method.personalized
        for variant in method.comparison_variants
    ]


#: The run-config keys the comparison owns: where a run writes, and its seed.
OWNED_KEYS = ("seed", "output-dir", "run-name", "resume-from")
RUN_RECORD = "run.json"
#: The ``status`` in ``run.json`` of a run that is done: it ran all its rounds, or it diverged.
DONE = ("finished", "diverged")


def app_defaults(app_dir: Path) -> dict[str, Any]:
    """The app's run-config defaults, ``[tool.flwr.app.config]`` of its pyproject.toml.

    Raises
    ------
    ConfigError
        When ``app_dir`` holds no Flower app.
    """
    pyproject = app_dir / "pyproject.toml"
    try:
        with pyproject.open("rb") as file:
            return dict(tomllib.load(file)["tool"]["flwr"]["app"]["config"])
    except (OSError, KeyError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject} is not a Flower app's pyproject.toml ({error})") from None


@dataclass(frozen=True)
class Setting:
    """One run-config file: its name (the file's stem) and its keys."""

    name: str
    path: Path
    keys: dict[str, Any]

    @classmethod
    def load(cls, path: Path) -> "Setting":
        """Read a run-config TOML file.

        Raises
        ------
        ConfigError
            When the file is missing, is not TOML or sets keys the comparison owns.
        """
        try:
            with path.open("rb") as file:
                keys = tomllib.load(file)
        except OSError as error:
            raise ConfigError(f"cannot read setting {path}: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"setting {path} is not valid TOML: {error}") from None
        owned = sorted(set(keys) & set(OWNED_KEYS))
        if owned:
            raise ConfigError(f"setting {path} sets {owned}; the comparison sets those per run")
        return cls(path.stem, path, keys)


def method_keys(method: str, config: RunConfig) -> dict[str, Any]:
    """The keys ``method`` sets, after checking that the setting supports it.

    Raises
    ------
    ConfigError
        For an unknown method, or a setting the method's variant does not
        suit (FedProx without a proximal term, two-stage FedMR without a
        first stage shorter than the run).
    """
    methods = comparison_methods()
    if method not in methods:
        raise ConfigError(f"unknown method {method!r}; known methods: {', '.join(methods)}")
    declared, variant = methods[method]
    lacking = variant.requires(config) if variant.requires is not None else None
    if lacking:
        raise ConfigError(f"method {method} {lacking}")
    return {"strategy": declared.name, **variant.keys}


@dataclass(frozen=True)
class PlannedRun:
    """One Flower simulation of the comparison and where it writes."""

    setting: str
    method: str
    seed: int
    directory: Path
    run_config: dict[str, Any]
    num_rounds: int
    num_supernodes: int

    @property
    def label(self) -> str:
        """``setting · method · seed s``, for progress lines."""
        return f"{self.setting} · {self.method} · seed {self.seed}"

    def remove_outputs(self) -> None:
        """Delete what an unfinished earlier attempt left, before running again."""
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def _flower_warnings_held() -> Iterator[None]:
    """Flower's logger at ERROR while a strategy is built only to check its run config.

    Flower's strategies warn when they are built with some settings (fedx's
    methods set ``fraction_evaluate = 0.0``: they evaluate on the server), and
    the check builds one strategy per planned run: a grid would print the same
    warning for each of its runs. Each run's own log still has it, once.
    """
    flower = logging.getLogger("flwr")
    level = flower.level
    flower.setLevel(logging.ERROR)
    try:
        yield
    finally:
        flower.setLevel(level)


def plan_runs(
    settings: list[Setting],
    methods: list[str],
    seeds: list[int],
    overrides: dict[str, Any],
    defaults: dict[str, Any],
    out_dir: Path,
    num_supernodes: int | None = None,
) -> list[PlannedRun]:
    """Every run of the grid, checked before anything starts.

    ``overrides`` apply to every run (after the setting's keys); each run
    writes to ``<out_dir>/runs/<setting>/<method>/seed-<seed>/`` and
    simulates ``num_supernodes`` clients (default: the run's
    ``min-available-nodes``).

    Raises
    ------
    ConfigError
        When a setting, method or override does not give a valid run config
        (the method's strategy is built to check it); the message names the
        setting and method.
    """
    from fedx.server.building import build_strategy  # pylint: disable=import-outside-toplevel  (torch)

    owned = sorted(set(overrides) & set(OWNED_KEYS))
    if owned:
        raise ConfigError(f"{owned} cannot be overridden: the comparison sets them per run")
    runs = []
    for setting in settings:
        for method in methods:
            for seed in seeds:
                directory = (out_dir / "runs" / setting.name / method / f"seed-{seed}").resolve()
                keys = {**setting.keys, **overrides}
                try:
                    base = RunConfig.from_mapping({**defaults, **keys})
                    keys.update(method_keys(method, base))
                    keys.update(
                        seed=seed,
                        **{"output-dir": str(directory.parent), "run-name": directory.name},
                    )
                    config = RunConfig.from_mapping({**defaults, **keys})
                    with _flower_warnings_held():
                        build_strategy(config)  # the method's own checks, before anything runs
                except ConfigError as error:
                    raise ConfigError(f"setting {setting.name}, method {method}: {error}") from None
                runs.append(
                    PlannedRun(
                        setting.name,
                        method,
                        seed,
                        directory,
                        keys,
                        config.num_server_rounds,
                        num_supernodes or config.min_available_nodes,
                    )
                )
    return runs
