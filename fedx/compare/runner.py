"""Runs planned comparison runs one after another in Flower's simulation.

One simulation SuperLink (free ports, private ``FLWR_HOME`` under the output
folder) serves every run; each run is ``flwr run <app> --stream`` with the
run's own run-config file, so it starts its own Ray-backed simulation. A run
counts as finished when its ``metrics.json`` holds the last round's
evaluation, and as diverged when the app stopped it early for diverging (its
``stop-reason``); the runner then writes ``run.json`` next to it, and a later
invocation with the same output folder skips it (a diverged run diverges
again with the same seed).
"""

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from fedx.compare.plan import DONE, RUN_RECORD, PlannedRun
from fedx.config import ConfigError
from fedx.deploy.local import FederationSpec, LocalFederation, free_port
from fedx.files import write_json_atomically
from fedx.outputs import METRICS_FILE

RUN_CONFIG_FILE = "run-config.toml"
RUN_LOG = "flwr-run.log"


def toml_value(value: Any) -> str:
    """A run-config value (string, boolean, integer or float) as TOML, for ``--run-config "k=v"``."""
    if not isinstance(value, (str, bool, int, float)):
        raise TypeError(f"run-config values are strings, booleans or numbers, not {value!r}")
    return tomli_w.dumps({"value": value}).removeprefix("value = ").rstrip("\n")


def write_run_config(path: Path, run_config: dict[str, Any]) -> None:
    """Write a run config as a flat TOML file, ``flwr run --run-config`` reads it."""
    path.write_text(tomli_w.dumps(run_config))


def finished_record(run: PlannedRun) -> dict[str, Any] | None:
    """The ``run.json`` of a run that is done (:data:`DONE`), ``None`` when it has yet to run.

    Raises
    ------
    ConfigError
        When the folder holds a finished run of a different run config: its
        results would be mixed with this comparison's.
    """
    try:
        record = json.loads((run.directory / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return None
    if record.get("status") not in DONE:
        return None
    if _portable(record.get("run-config", {})) != _portable(run.run_config):
        raise ConfigError(
            f"{run.directory} holds a finished run with another run config; "
            "use a new --out folder (or delete that run) to change settings"
        )
    return record


def _portable(run_config: dict[str, Any]) -> dict[str, Any]:
    """A run config without its absolute output paths (the folder may have moved)."""
    return {k: v for k, v in run_config.items() if k not in ("output-dir", "run-name")}


def _metrics(run: PlannedRun) -> dict[str, Any]:
    try:
        metrics = json.loads((run.directory / METRICS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return metrics if isinstance(metrics, dict) else {}


def completed_rounds(run: PlannedRun) -> int | None:
    """The round of the last evaluation in the run's ``metrics.json`` (``None``: none)."""
    return _metrics(run).get("final", {}).get("round")


def stop_reason(run: PlannedRun) -> str | None:
    """Why the app stopped the run before its last round (``metrics.json``'s ``stop-reason``)."""
    reason = _metrics(run).get("stop-reason")
    return str(reason) if reason else None


def app_commit(app_dir: Path) -> str:
    """The git commit of the app folder (``<sha>-dirty`` with uncommitted changes), or ``""``.

    Recorded with every run, so a table drawn from the runs can say which
    code made each of its cells (untracked files, such as outputs, do not
    count as changes).
    """

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(app_dir), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return ""
    return f"{commit}-dirty" if dirty else commit


def last_error_line(log: Path) -> str:
    """The last line of a run's log that names an error, for the progress line."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    errors = [line.strip() for line in lines if "ERROR" in line or "Error" in line]
    return errors[-1] if errors else (lines[-1].strip() if lines else "empty log")


@dataclass
class RunOutcome:
    """What happened to one run: ``finished``, ``diverged``, ``skipped`` (done before) or ``failed``."""

    run: PlannedRun
    status: str
    wall_seconds: float
    detail: str = ""


class ComparisonRunner:
    """Runs :class:`PlannedRun` s against one simulation SuperLink.

    Parameters
    ----------
    app_dir : Path
        The Flower app (a folder with its pyproject.toml), for ``flwr run``.
    state_dir : Path
        Where the SuperLink keeps its database, ``FLWR_HOME`` and logs; one
        folder per runner, so that several runners can share an output folder.
    client_resources : str
        The resources part of ``flwr run --federation-config``, e.g.
        ``client-resources-num-cpus=1``; each run adds its ``num-supernodes``.
    run_timeout : float
        Seconds one run may take; a run over it is stopped (with the
        SuperLink, which is then restarted) and reported as failed.
    """

    def __init__(
        self, app_dir: Path, state_dir: Path, client_resources: str, run_timeout: float
    ) -> None:
        self.app_dir = app_dir
        self.client_resources = client_resources
        self.run_timeout = run_timeout
        self.commit = app_commit(app_dir)
        self._spec = FederationSpec(0, state_dir, port=free_port(), insecure=True, simulation=True)
        self._federation: LocalFederation | None = None

    def __enter__(self) -> "ComparisonRunner":
        return self

    def __exit__(self, *exc_info) -> None:
        if self._federation is not None:
            self._federation.stop()
            self._federation = None

    def _superlink(self) -> LocalFederation:
        if self._federation is None:
            self._federation = LocalFederation(self._spec)
            self._federation.start_superlink()
        return self._federation

    def run_all(
        self, runs: list[PlannedRun], report: Callable[[int, RunOutcome], None]
    ) -> list[RunOutcome]:
        """Run every unfinished run in order; call ``report(index, outcome)`` after each."""
        outcomes = []
        for index, run in enumerate(runs):
            record = finished_record(run)
            if record is not None:
                outcome = RunOutcome(
                    run, "skipped", record["wall-seconds"], f"{record['status']} before"
                )
            else:
                outcome = self.run_one(run)
            outcomes.append(outcome)
            report(index, outcome)
        return outcomes

    def run_one(self, run: PlannedRun) -> RunOutcome:
        """One ``flwr run`` of ``run``; its log goes to ``flwr-run.log`` in the run folder."""
        run.remove_outputs()
        run.directory.mkdir(parents=True)
        config_file = run.directory / RUN_CONFIG_FILE
        write_run_config(config_file, run.run_config)
        command = [
            str(self._spec.bin_dir / "flwr"),
            "run",
            str(self.app_dir),
            "--stream",
            "--federation-config",
            f"num-supernodes={run.num_supernodes} {self.client_resources}",
            "--run-config",
            str(config_file),
        ]
        federation = self._superlink()
        started = time.perf_counter()
        with (run.directory / RUN_LOG).open("w") as log:
            try:
                subprocess.run(
                    command,
                    env=self._spec.environment(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=self.run_timeout,
                    check=False,
                )
                timed_out = False
            except subprocess.TimeoutExpired:
                timed_out = True
        wall = time.perf_counter() - started
        diverged = None if timed_out else stop_reason(run)
        if timed_out:
            # The ServerApp and its simulation outlive the CLI: stop them with the SuperLink.
            federation.stop()
            self._federation = None
            detail = f"stopped after the run timeout of {self.run_timeout:g} s"
        elif diverged is None and completed_rounds(run) != run.num_rounds:
            detail = last_error_line(run.directory / RUN_LOG)
        else:
            status = "finished" if diverged is None else "diverged"
            record = {
                "status": status,
                "wall-seconds": wall,
                "command": command,
                "run-config": run.run_config,
                "app-commit": self.commit,
            }
            if diverged is not None:
                record["stop-reason"] = diverged
            write_json_atomically(run.directory / RUN_RECORD, record)
            return RunOutcome(run, status, wall, diverged or "")
        return RunOutcome(run, "failed", wall, detail)
