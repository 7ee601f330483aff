"""What the GPU benchmarks share: the card's own readings, fake CIFAR data, fedx-compare runs.

How busy the card was comes from NVML, through ``nvidia-smi
--query-gpu=utilization.gpu,memory.used -lms 100``: ``utilization.gpu`` is
the share of the driver's last sample period (1/6 s to 1 s, by the card) in
which at least one kernel ran on the GPU. It says whether the GPU waited for
the host, not how much of the card a kernel used: one tiny kernel at a time,
back to back, reads 100 %. ``memory.used`` is the whole card's, every
process's together (ten actors' CUDA contexts included). Where no
``nvidia-smi`` answers, both read as unknown.
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedx_bench import common, fake_cifar

#: The query :class:`GpuMonitor` runs: one line of "utilization %, MiB used" per sample.
NVIDIA_SMI = (
    "nvidia-smi",
    "--query-gpu=utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
    "-lms",
    "100",
)
#: The fake sets of a ``--quick`` run: training and test images.
QUICK_TRAIN_SIZE, QUICK_TEST_SIZE = 400, 100


@dataclass
class Reading:
    """The card over a stretch of time: mean utilisation and peak memory, ``None`` when unknown."""

    busy: float | None = None  # mean of utilization.gpu, in [0, 1]
    peak_mib: float | None = None  # largest memory.used
    samples: int = 0

    def text(self) -> str:
        """``busy 87% peak 13210 MiB``, or ``busy n/a`` where nothing was read."""
        if not self.samples:
            return "busy n/a"
        busy = "n/a" if self.busy is None else f"{100 * self.busy:.0f}%"
        return f"busy {busy} peak {self.peak_mib:.0f} MiB"


class GpuMonitor:
    """``nvidia-smi`` sampling the first GPU in the background, with a clock on every sample.

    Use as a context manager; :meth:`reading` summarises the samples of a
    stretch of ``time.monotonic()``. ``command`` replaces the query (tests).
    """

    def __init__(self, command: tuple[str, ...] | None = None) -> None:
        self.command = command or NVIDIA_SMI
        self.samples: list[tuple[float, float, float]] = []  # (time, utilisation 0-1, MiB)
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    @property
    def available(self) -> bool:
        """Whether a sampler is running."""
        return self._process is not None

    def __enter__(self) -> "GpuMonitor":
        if shutil.which(self.command[0]) is None:
            return self
        try:
            self._process = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        except OSError:
            return self
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            parts = [part.strip() for part in line.split(",")]
            try:
                first = parts[0].split()[0]  # only the first GPU's line (one card per machine)
                utilisation, mib = float(first) / 100.0, float(parts[1])
            except (IndexError, ValueError):
                continue
            self.samples.append((time.monotonic(), utilisation, mib))

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def reading(self, start: float = 0.0, end: float = float("inf")) -> Reading:
        """Mean utilisation and peak memory of the samples taken between ``start`` and ``end``."""
        chosen = [(u, m) for t, u, m in list(self.samples) if start <= t <= end]
        if not chosen:
            return Reading()
        return Reading(
            busy=sum(u for u, _ in chosen) / len(chosen),
            peak_mib=max(m for _, m in chosen),
            samples=len(chosen),
        )


def device_line() -> str:
    """The machine: the GPU torch sees (or the CPU), torch and CUDA versions, cores, load."""
    import torch  # pylint: disable=import-outside-toplevel

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        where = f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
    else:
        where = "no GPU (CPU)"
    load = os.getloadavg()[0]
    return (
        f"{where}; torch {torch.__version__} CUDA {torch.version.cuda}; {os.cpu_count()} cores, "
        f"load {load:.1f}; fedx {git_commit()}"
    )


def git_commit() -> str:
    """The checkout's commit (``unknown`` outside a git checkout)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(common.REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


# ----------------------------------------------------------------------
# Fake CIFAR, and the processes that read it
# ----------------------------------------------------------------------


def cifar_root(
    arguments: argparse.Namespace, folder: Path, names: tuple[str, ...] = ("cifar10",)
) -> Path:
    """The CIFAR files of the command line (:func:`add_simulation_options`): ``--data-root``
    when given (real or fake files there), else fake sets written into ``folder``.

    Written sets (``names``, of ``--train-size`` + ``--test-size`` images) are
    accepted by this process's torchvision; :func:`environment` makes other
    processes accept them.
    """
    root, train, test = arguments.data_root, arguments.train_size, arguments.test_size
    if root is not None:
        md5 = root / fake_cifar.MD5_FILE
        if md5.exists():
            fake_cifar.accept(md5)
        return root
    for name in names:
        print(f"writing a {name}-shaped set ({train} + {test} images) in {folder}", flush=True)
        fake_cifar.write(folder, name, train=train, test=test)
    fake_cifar.accept(folder / fake_cifar.MD5_FILE)
    return folder


def environment(root: Path) -> dict[str, str]:
    """This process's environment, for processes that read the data under ``root``.

    Fake sets (an md5 file there) need :data:`fake_cifar.SITE` on their
    ``PYTHONPATH``; every process gets one torch thread per core Ray gives it.
    """
    env = dict(os.environ)
    md5 = root / fake_cifar.MD5_FILE
    if md5.exists():
        env[fake_cifar.MD5_ENV] = str(md5)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(fake_cifar.SITE), *filter(None, [env.get("PYTHONPATH")])]
        )
    env.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    return env


def copy_app(folder: Path) -> Path:
    """The fedx app (pyproject.toml and the fedx package) in ``folder``: what ``flwr run`` packs.

    ``flwr run`` reads every file under the app's folder; a checkout with its
    virtual environment inside holds tens of thousands.
    """
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(common.REPO / "pyproject.toml", folder / "pyproject.toml")
    shutil.copytree(
        common.REPO / "fedx",
        folder / "fedx",
        ignore=shutil.ignore_patterns("__pycache__"),
        dirs_exist_ok=True,
    )
    return folder


# ----------------------------------------------------------------------
# The command line of the scripts that simulate
# ----------------------------------------------------------------------


def add_simulation_options(parser: argparse.ArgumentParser, timeout: float) -> None:
    """The data (``--data-root`` or fake sets' sizes) and the simulated clients' resources."""
    parser.add_argument("--data-root", type=Path, help="CIFAR files (default: write fake ones)")
    parser.add_argument("--train-size", type=int, default=50000, help="fake training images")
    parser.add_argument("--test-size", type=int, default=10000, help="fake test images")
    parser.add_argument("--client-cpus", type=float, default=1.0)
    parser.add_argument(
        "--client-gpus",
        type=float,
        default=None,
        help="GPU share of a simulated client (default: 0.1 where torch sees a GPU, else 0)",
    )
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds per run")


def parse_simulation_options(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    quick_help: str,
    **quick_defaults: Any,
) -> argparse.Namespace:
    """``argv`` parsed by :func:`fedx_bench.common.parse_quick`, ``--quick`` writing small fake sets too;
    ``--client-gpus`` by the machine where it was not given."""
    arguments = common.parse_quick(
        parser,
        argv,
        f"{quick_help}; fake sets of {QUICK_TRAIN_SIZE} + {QUICK_TEST_SIZE} images",
        train_size=QUICK_TRAIN_SIZE,
        test_size=QUICK_TEST_SIZE,
        **quick_defaults,
    )
    if arguments.client_gpus is None:
        import torch  # pylint: disable=import-outside-toplevel

        arguments.client_gpus = 0.1 if torch.cuda.is_available() else 0.0
    return arguments


# ----------------------------------------------------------------------
# fedx-compare
# ----------------------------------------------------------------------


@dataclass
class CompareRun:
    """One method's run of a fedx-compare call: its rounds' seconds and the card meanwhile."""

    method: str
    round_seconds: list[float] = field(default_factory=list)
    rounds_at: list[float] = field(default_factory=list)  # monotonic time each round was recorded
    finished: bool = False
    stop_reason: str | None = None

    @property
    def per_round(self) -> float | None:
        """Mean seconds of rounds 2 to R (round 1 holds the start-up)."""
        later = self.round_seconds[1:]
        return sum(later) / len(later) if later else None


@dataclass
class Comparison:
    """A fedx-compare call: exit status, its runs, its output's tail, wall seconds."""

    returncode: int
    runs: dict[str, CompareRun]
    wall_seconds: float
    output_tail: str


def run_compare(
    setting: Path,
    methods: list[str],
    out: Path,
    arguments: argparse.Namespace,
    *,
    root: Path,
    num_supernodes: int,
    overrides: dict[str, object],
) -> Comparison:
    """``fedx-compare SETTING --methods ... --seeds 0`` in a process of its own; follow its rounds.

    The app is a copy next to ``out`` (:func:`copy_app`); the data is under
    ``root`` (:func:`environment`); the clients' resources and a run's
    timeout are ``arguments``' (:func:`add_simulation_options`). A run's
    ``metrics.json`` gains a row at the end of every round: polling it gives
    each round's end on this process's clock (:attr:`CompareRun.rounds_at`),
    so the card's readings can be taken over the rounds only.
    """
    app = copy_app(out.parent / "app")
    env = environment(root)
    timeout = arguments.timeout
    command = [
        sys.executable,
        "-m",
        "fedx.compare.cli",
        str(setting),
        "--methods",
        ",".join(methods),
        "--seeds",
        "0",
        "--out",
        str(out),
        "--app",
        str(app),
        "--num-supernodes",
        str(num_supernodes),
        "--client-cpus",
        f"{arguments.client_cpus:g}",
        "--client-gpus",
        f"{arguments.client_gpus:g}",
        "--run-timeout",
        f"{timeout:g}",
    ]
    for key, value in overrides.items():
        command += ["--set", f"{key}={json.dumps(value)}"]
    runs = {method: CompareRun(method) for method in methods}
    log_path = out / "compare.log"
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while process.poll() is None:
                _follow(out, runs)
                if time.monotonic() - start > timeout * max(1, len(methods)):
                    process.terminate()
                    process.wait(timeout=60)
                    break
                time.sleep(0.2)
        except BaseException:
            # Stopped from outside (a step's cap): say where the runs stood, which is all the
            # log there is once the temporary folder is gone.
            process.terminate()
            print(
                f"fedx-compare stopped; its log ends:\n{log_path.read_text(errors='replace')[-3000:]}"
            )
            raise
    _follow(out, runs)
    wall = time.monotonic() - start
    tail = log_path.read_text(errors="replace")[-3000:]
    return Comparison(process.returncode, runs, wall, tail)


def _follow(out: Path, runs: dict[str, CompareRun]) -> None:
    """Read every run's ``metrics.json`` under ``out``; note the time of rounds first seen."""
    for path in glob.glob(str(out / "runs" / "*" / "*" / "seed-0" / "metrics.json")):
        method = Path(path).parts[-3]
        run = runs.get(method)
        if run is None:
            continue
        try:
            metrics = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue  # being written
        seconds = [row["round-seconds"] for row in metrics["rounds"] if "round-seconds" in row]
        now = time.monotonic()
        run.rounds_at += [now] * (len(seconds) - len(run.rounds_at))
        run.round_seconds = seconds
        run.stop_reason = metrics.get("stop-reason")
        final_round = (metrics.get("final") or {}).get("round")
        run.finished = final_round == metrics["config"]["num-server-rounds"]
