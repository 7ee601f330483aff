"""fedx's promises on a GPU, checked on one: seeded runs repeat with ``deterministic``, saved models load anywhere.

Three simulated runs of one seed (``fedx-compare``, FedMR on
``configs/cifar10-resnet20-iid.toml`` with ``--nodes`` SuperNodes sharing
the GPU, ``--rounds`` rounds of ``--local-epochs`` epoch(s), CIFAR-10-shaped
data unless ``--data-root``): two with ``deterministic = true``, one
without. It prints and returns:

* whether the two deterministic runs wrote the same ``metrics.json`` (every
  value but the wall times: ``*-seconds`` and ``timings``) and the same
  ``model.pt``, bit for bit; and whether the third differs (what the
  setting buys on this machine);
* the seconds per round (rounds 2 to R) of each run: what the setting costs;
* whether ``model.pt``, written by a ServerApp that evaluated on the GPU,
  loads in a process that sees no GPU (``CUDA_VISIBLE_DEVICES=""``) with a
  plain ``torch.load`` and holds CPU tensors only.

Usage::

    python benchmarks/gpu_checks.py                # on a GPU machine
    python benchmarks/gpu_checks.py --quick        # a CPU: 4 nodes, 2 rounds of the CNN

This script reports; it is not a test, and it always exits with status 0.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedx_bench import common, gpu

SETTING = gpu.REPO / "configs" / "cifar10-resnet20-iid.toml"
METHOD = "fedmr"
#: Loads a model file in a process that sees no GPU; prints what it holds.
LOAD_ON_CPU = """
import json, sys, torch
state = torch.load(sys.argv[1])
print(json.dumps({"gpu-visible": torch.cuda.is_available(),
                  "devices": sorted({t.device.type for t in state.values()}),
                  "tensors": len(state)}))
"""


@dataclass
class Run:
    """One of the runs: its folder, its per-round seconds, whether it did all its rounds."""

    label: str
    directory: Path | None = None
    per_round: float | None = None
    finished: bool = False
    error: str | None = None


@dataclass
class Checks:
    """What the checks found."""

    runs: list[Run] = field(default_factory=list)
    same_metrics: bool | None = None  # the two deterministic runs
    same_model: bool | None = None
    other_differs: bool | None = None  # the run without the setting against the first
    loads_on_cpu: dict | None = None


def comparable_metrics(path: Path) -> dict:
    """``metrics.json`` without what the wall clock decides, nor the keys the runs set apart."""
    metrics = json.loads(path.read_text())
    metrics.pop("timings", None)
    metrics["rounds"] = [
        {k: v for k, v in row.items() if not k.endswith("-seconds")} for row in metrics["rounds"]
    ]
    metrics["final"] = {
        k: v for k, v in (metrics.get("final") or {}).items() if not k.endswith("-seconds")
    }
    for key in ("output-dir", "run-name", "deterministic"):  # what the runs differ in by design
        metrics["config"].pop(key, None)
    return metrics


def differences(first: dict, second: dict) -> list[str]:
    """Where two comparable ``metrics.json`` differ: ``round 2 train-loss``, ``final accuracy`` ..."""
    found = []
    for one, other in zip(first["rounds"], second["rounds"], strict=False):
        for key in sorted(set(one) | set(other)):
            if one.get(key) != other.get(key):
                found.append(f"round {one.get('round')} {key}")
    if len(first["rounds"]) != len(second["rounds"]):
        found.append("the number of rounds")
    for part in ("config", "final", "stop-reason"):
        if first.get(part) != second.get(part):
            found.append(part)
    return found


def same_model(first: Path, second: Path) -> bool:
    one, other = torch.load(first), torch.load(second)
    return list(one) == list(other) and all(torch.equal(one[k], other[k]) for k in one)


def run_once(label: str, arguments, root: Path, work: Path, deterministic: bool) -> Run:
    overrides = {
        "num-server-rounds": arguments.rounds,
        "eval-every": 1,
        "data-root": str(root),
        "model": arguments.model,
        "local-epochs": arguments.local_epochs,
        "min-available-nodes": arguments.nodes,
        "min-train-nodes": arguments.clients,
        "fraction-train": arguments.clients / arguments.nodes,
        "first-stage-rounds": 0,
        "deterministic": deterministic,
        "round-timeout": arguments.timeout,
    }
    out = work / label
    comparison = gpu.run_compare(
        SETTING, [METHOD], out, arguments, root=root, num_supernodes=arguments.nodes,
        overrides=overrides,
    )  # fmt: skip
    result = comparison.runs[METHOD]
    run = Run(label, out / "runs" / SETTING.stem / METHOD / "seed-0", result.per_round)
    run.finished = result.finished
    if not result.finished:
        run.error = f"fedx-compare exited {comparison.returncode}:\n{comparison.output_tail}"
    return run


def load_without_gpu(path: Path) -> dict:
    """What :data:`LOAD_ON_CPU` reports of ``path``, in a process that sees no GPU."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", LOAD_ON_CPU, str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = common.benchmark_parser(__doc__)
    gpu.add_simulation_options(parser, timeout=600.0)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--nodes", type=int, default=20, help="SuperNodes (IID shares)")
    parser.add_argument("--clients", type=int, default=10, help="clients a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-epochs", type=int, default=1)
    return gpu.parse_simulation_options(
        parser,
        argv,
        "4 nodes, 2 a round, 2 rounds of the CNN",
        model="cnn",
        nodes=4,
        clients=2,
        rounds=2,
    )


def main(argv: Sequence[str] | None = None) -> Checks:
    arguments = parse_arguments(argv)
    print(gpu.device_line())
    print(
        f"FedMR, {arguments.model}, {arguments.clients} of {arguments.nodes} nodes a round, "
        f"{arguments.rounds} rounds of {arguments.local_epochs} epoch(s), "
        f"{arguments.client_gpus:g} GPU a client; seed 0 three times"
    )
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="fedx-gpu-checks-") as folder:
        work = Path(folder)
        root = gpu.cifar_root(arguments, work / "data")
        for label, deterministic in (
            ("deterministic-1", True),
            ("deterministic-2", True),
            ("default", False),
        ):
            run = run_once(label, arguments, root, work, deterministic)
            seconds = "" if run.per_round is None else f"{run.per_round:.3f} s/round"
            print(f"{label:<18}{'done' if run.finished else 'NOT DONE':<10}{seconds}", flush=True)
            common.print_error(run.error)
            checks.runs.append(run)
        first, second, other = checks.runs
        if first.finished and second.finished and first.directory and second.directory:
            metrics = [comparable_metrics(r.directory / "metrics.json") for r in (first, second)]
            checks.same_metrics = metrics[0] == metrics[1]
            if not checks.same_metrics:
                print("  they differ in: " + ", ".join(differences(*metrics)))
            checks.same_model = same_model(
                first.directory / "model.pt", second.directory / "model.pt"
            )
            print(
                f"deterministic runs: metrics.json {'identical' if checks.same_metrics else 'DIFFER'}"
                f" (wall times aside), model.pt {'identical' if checks.same_model else 'DIFFERS'}"
            )
        if first.finished and other.finished and first.directory and other.directory:
            checks.other_differs = comparable_metrics(
                first.directory / "metrics.json"
            ) != comparable_metrics(other.directory / "metrics.json") or not same_model(
                first.directory / "model.pt", other.directory / "model.pt"
            )
            print(
                "without deterministic: "
                + ("differs from them" if checks.other_differs else "the same bits")
            )
        done = [run for run in checks.runs if run.finished and run.directory]
        if done:
            assert done[0].directory is not None
            checks.loads_on_cpu = load_without_gpu(done[0].directory / "model.pt")
            print(
                f"model.pt of {done[0].label} in a process without a GPU: "
                f"{json.dumps(checks.loads_on_cpu)}"
            )
    return checks
