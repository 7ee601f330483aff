"""Run the authors' own round loops on fedx's digits partitions, model and settings.

The papers' authors published their round loops (``Training_FedMR.py``,
``Training_FedIndenp.py``, ``Training_FedMut.py``, their lab's
``Training_FedCross.py``; FedMe as Jupyter notebooks). This script runs
their loop functions, with the files as published (their local update,
recombination, mutation, cross aggregation, similarity and
``Aggregation``), on what a fedx run of the same setting and seed uses: the
training split and its partitions, the initial model, the local training
settings and the method's hyper-parameters. Their data loaders are not used
(they need CIFAR files), and nothing of their code is part of fedx: point
the script at a checkout of theirs.

What the script puts around their code (adapters, not changes to it):

* the name ``Aggregation`` in their loop's module is bound to a wrapper that
  calls theirs and, for a round's global model (``Aggregation(w_locals,
  None)``), evaluates it on fedx's test split (the same 360 images and the
  same accuracy as fedx's central evaluation);
* their writers of result files (``save_result`` and the like) are bound
  to no-ops; their own test calls are left as they are (they only print);
* fedx's CNN returns logits and their loops read ``model(x)["output"]``, so
  the model is wrapped in a module that returns that dictionary;
* their ``args`` namespace is built from fedx's run config
  (:func:`authors_args`).

FedMe's notebook (``FedMe_cifar10.ipynb`` of ``OnizukaLab/FedMe``) is read
cell by cell: its server, worker, KMeans, training and test cells run as
they are, on fedx's personalized layout of the digits (each client's train,
validation and test splits, the server's unlabeled images) with fedx's
``cnn-1`` ... ``cnn-4`` in place of VGG-11 ... VGG-19, and its data loaders
in one process (``num_workers=0``: the same batches).

Examples
--------
::

    git clone https://github.com/HMHelloWorld/FedMR /tmp/authors/FedMR
    python docs/results/authors_loops.py --code /tmp/authors/FedMR --method fedindep \\
        configs/digits-cnn-dir0.1.toml configs/digits-cnn-iid.toml --seeds 0,1,2 \\
        --out comparisons/authors-fedindep.csv

One process runs one method (the repositories share module names such as
``models`` and ``utils``); rows are appended to ``--out``, and a run already
there is skipped.
"""

import argparse
import contextlib
import csv
import importlib
import json
import random
import sys
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedx.compare.plan import Setting, app_defaults
from fedx.config import RunConfig
from fedx.data import dataset_info, load_split
from fedx.data.loaders import batch_loader
from fedx.data.partitioning import dataset_labels, partition_indices
from fedx.models import build_model
from fedx.training import evaluate

APP_DIR = Path(__file__).resolve().parents[1]
#: method -> (module under the checkout's ``Algorithm/``, function, what the loop needs in ``args``)
LOOPS = {
    "fedmr": ("Training_FedMR", "FedMR"),
    "fedmr-two-stage": ("Training_FedMR", "FedMR"),
    "fedindep": ("Training_FedIndenp", "FedIndep"),
    "fedmr-p1.0": ("Training_FedMR", "FedMR_Partition"),
    "fedmut": ("Training_FedMut", "FedMut"),
    "fedcross": ("Training_FedCross", "FedCross"),
}
METHODS = (*LOOPS, "fedme")
HEADER = ["setting", "method", "seed", "rounds", "final_accuracy", "seconds", "curve"]


class DictOutput(nn.Module):
    """fedx's model with the authors' output convention: ``{"output": logits}``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"output": self.model(inputs)}


def run_config(setting: Path, seed: int, method: str) -> RunConfig:
    """The run config of a fedx-compare run of ``setting`` with ``seed`` (FedMe: round-robin starts)."""
    keys = {**app_defaults(APP_DIR), **Setting.load(setting).keys, "seed": seed}
    if method == "fedme":
        keys.update(strategy="fedme", **{"fedme-initial-architecture": "round-robin"})
    return RunConfig.from_mapping(keys)


def seed_everything(seed: int) -> None:
    """The authors' loops draw from ``random``, numpy's global generator and torch's."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def authors_args(cfg: RunConfig, method: str) -> types.SimpleNamespace:
    """The ``args`` namespace of the authors' ``main_fed.py``, from fedx's run config."""
    num_users = cfg.min_available_nodes
    return types.SimpleNamespace(
        num_users=num_users,
        frac=cfg.fraction_train,
        epochs=cfg.num_server_rounds,
        local_ep=cfg.local_epochs,
        local_bs=cfg.batch_size,
        bs=128,
        lr=cfg.learning_rate,
        momentum=cfg.momentum,
        optimizer="sgd",
        device=torch.device("cpu"),
        gpu=-1,
        verbose=False,
        ensemble_alpha=0.0,
        first_stage_bound=cfg["first-stage-rounds"] if method == "fedmr-two-stage" else 0,
        fedmr_partition=1.0,
        radius=cfg["fedmut-alpha"],
        mut_acc_rate=cfg["fedmut-beta0"],
        mut_bound=cfg["fedmut-beta-rounds"],
        fedcross_alpha=cfg["fedcross-alpha"],
        # their 0: in order, 1: lowest similarity, 2: highest similarity
        fedcross_collaberative_model_select_strategy={
            "in_order": 0,
            "lowest_similarity": 1,
            "highest_similarity": 2,
        }[cfg["fedcross-selection"]],
        fedcross_first_stage_bound=0,
    )


def _no_op(*_args: object, **_kwargs: object) -> None:
    return None


def run_round_loop(code: Path, method: str, cfg: RunConfig) -> list[tuple[int, float]]:
    """One run of the authors' loop; the global model's test accuracy after every round."""
    sys.path.insert(0, str(code))
    module_name, function_name = LOOPS[method]
    module = importlib.import_module(f"Algorithm.{module_name}")
    info = dataset_info(cfg.dataset)
    train = load_split(cfg.dataset, "train", **cfg.data_settings())
    test = load_split(cfg.dataset, "test", **cfg.data_settings())
    settings = cfg.partition_settings()
    partitions = partition_indices(
        dataset_labels(train),
        cfg.min_available_nodes,
        partitioning=settings["partitioning"],
        alpha=settings["alpha"],
        min_partition_size=settings["min_partition_size"],
        seed=cfg.seed,
    )
    dict_users = {i: indices.tolist() for i, indices in enumerate(partitions)}
    test_batches = batch_loader(test, 128)
    evaluator = DictOutputFree(build_model(cfg.model, info.input_shape, info.num_classes))
    curve: list[tuple[int, float]] = []
    authors_aggregation = module.Aggregation

    def aggregation(w: list[dict[str, torch.Tensor]], lens: Any) -> dict[str, torch.Tensor]:
        averaged = authors_aggregation(w, lens)
        if lens is None:  # the round's global model; FedCross's blends pass weights
            curve.append((len(curve) + 1, evaluator.accuracy(averaged, test_batches)))
        return averaged

    module.Aggregation = aggregation
    for writer in ("save_result", "save_model", "save_fedmut_result"):
        if hasattr(module, writer):
            setattr(module, writer, _no_op)
    torch.manual_seed(cfg.seed)  # fedx's ServerApp builds its initial model right after this
    net_glob = DictOutput(build_model(cfg.model, info.input_shape, info.num_classes))
    seed_everything(cfg.seed)
    arguments: list[Any] = [authors_args(cfg, method), net_glob, train, test, dict_users]
    if function_name == "FedMR_Partition":
        arguments.append(1.0)  # FedMR-p1.0: one permutation for the whole model
    with contextlib.redirect_stdout(sys.stderr):
        getattr(module, function_name)(*arguments)
    return curve


class DictOutputFree:
    """Evaluate a state dict of :class:`DictOutput` (keys ``model.*``) with fedx's evaluation."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def accuracy(self, state: dict[str, torch.Tensor], batches: Any) -> float:
        self.model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
        return evaluate(self.model, batches, torch.device("cpu"))[1]


# ----------------------------------------------------------------------
# FedMe: the notebook's cells on fedx's personalized layout
# ----------------------------------------------------------------------

#: The notebook's cells this script runs, by what they define (the others load
#: CIFAR, plot, or set hyper-parameters that fedx's run config sets instead).
FEDME_CELLS = (
    "class LocalDataset", "class KMeans", "class Server", "class Worker", "def train(", "def test(",
    "class Early_Stopping",
)  # fmt: skip


def _notebook_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text())["cells"]
    return ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]


class _NoWorkerLoader(torch.utils.data.DataLoader):
    """The notebook asks for 2 loader processes per loader; one process here (same batches)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["num_workers"] = 0
        super().__init__(*args, **kwargs)


def run_fedme_notebook(notebook: Path, cfg: RunConfig) -> list[tuple[int, float]]:
    """One FedMe run of the authors' notebook; mean personalized test accuracy after fine-tuning.

    The round loop is the notebook's (sample, cluster, exchange, mutual
    learning, model replacement, aggregation); the evaluation after the last
    round is its fine-tuning cell (``local_epochs`` of training on each
    client's train split, then its test split). fedx's layout supplies each
    client's splits and the server's unlabeled images; fedx's run config the
    hyper-parameters; the first architectures are fedx's round-robin ones.
    """
    from fedx.data.personalized import load_local_splits, load_unlabeled
    from fedx.server.building import build_strategy

    cells = _notebook_cells(notebook)
    namespace: dict[str, Any] = {}
    exec(cells[0], namespace)  # the notebook's imports
    torch.utils.data.DataLoader = _NoWorkerLoader  # type: ignore[misc]
    for start in FEDME_CELLS:
        (source,) = [cell for cell in cells if cell.lstrip().startswith(start)]
        exec(source, namespace)
    strategy = build_strategy(cfg)
    clients = cfg.min_available_nodes
    settings = cfg.local_split_settings()
    splits = [load_local_splits(cfg.dataset, i, clients, **settings) for i in range(clients)]
    unlabeled = load_unlabeled(cfg.dataset, size=cfg.unlabeled_size, **cfg.data_settings())
    info = dataset_info(cfg.dataset)
    # fedx's round r (from 1) is the notebook's epoch r - 1; one cluster from the start.
    schedule = [0, *(r - 1 for r in strategy.cluster_rounds)]
    namespace["args"] = types.SimpleNamespace(
        batch_size=cfg.batch_size,
        test_batch=1000,
        global_epochs=cfg.num_server_rounds,
        local_epochs=cfg.local_epochs,
        lr=cfg.learning_rate,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        clip=20.0,
        partience=cfg.num_server_rounds,
        worker_num=clients,
        sample_num=clients,
        cluster_list=list(range(1, len(schedule) + 1)),
        cluster_num=None,
        turn_of_cluster_num=schedule,
        turn_of_replacement_model=list(range(cfg.num_server_rounds)),
        unlabeleddata_size=len(unlabeled),
        device=torch.device("cpu"),
        criterion_ce=nn.CrossEntropyLoss(),
        criterion_kl=nn.KLDivLoss(reduction="batchmean"),
    )
    # The notebook's Worker builds vgg11, vgg13, vgg16, vgg19 for best_model 1 ... 4.
    names = list(strategy.candidate_architectures)
    if len(names) > 4:
        raise ValueError(f"the notebook knows 4 architectures, the setting lists {names}")
    for number, name in enumerate(names):
        namespace[("vgg11", "vgg13", "vgg16", "vgg19")[number]] = lambda name=name: build_model(
            name, info.input_shape, info.num_classes
        )
    # What the notebook's data cell would have made, from fedx's layout.
    namespace.update(
        unlabeled_dataset=_Unlabeled(unlabeled),
        federated_trainset=[s.train for s in splits],
        federated_valset=[s.validation for s in splits],
        federated_testset=[s.test for s in splits],
        client_best_model=[names.index(strategy.architecture_for(i)) + 1 for i in range(clients)],
    )
    (loop,) = [cell for cell in cells if "for epoch in range(args.global_epochs)" in cell]
    (tuned_test,) = [cell for cell in cells if "acc_tune_test = []" in cell]
    seed_everything(cfg.seed)
    with contextlib.redirect_stdout(sys.stderr):
        exec(loop, namespace)
        # fedx fine-tunes for finetune-epochs before the personalized test; the
        # notebook's tuning cell trains for local_epochs: the same count here.
        namespace["args"].local_epochs = cfg["finetune-epochs"]
        exec(tuned_test, namespace)
    accuracy = float(np.mean(namespace["acc_tune_test"])) / 100.0
    return [(cfg.num_server_rounds, accuracy)]


class _Unlabeled(torch.utils.data.Dataset):
    """The server's unlabeled images, as the notebook's loader reads them: (image, anything)."""

    def __init__(self, images: torch.utils.data.Dataset) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index][0], 0


# ----------------------------------------------------------------------


def _done(out: Path) -> set[tuple[str, str, int]]:
    if not out.is_file():
        return set()
    with out.open() as file:
        return {(row["setting"], row["method"], int(row["seed"])) for row in csv.DictReader(file)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("settings", nargs="+", type=Path, help="run-config TOML files")
    parser.add_argument("--method", required=True, choices=METHODS)
    parser.add_argument(
        "--code",
        required=True,
        type=Path,
        help="the authors' checkout (Algorithm/Training_*.py), or FedMe's notebook",
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", required=True, type=Path, help="CSV file the rows are added to")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    done = _done(args.out)
    for setting in args.settings:
        for seed in (int(s) for s in args.seeds.split(",")):
            name = Setting.load(setting).name
            if (name, args.method, seed) in done:
                continue
            cfg = run_config(setting, seed, args.method)
            start = time.perf_counter()
            if args.method == "fedme":
                curve = run_fedme_notebook(args.code, cfg)
            else:
                curve = run_round_loop(args.code, args.method, cfg)
            seconds = time.perf_counter() - start
            new = not args.out.is_file()
            with args.out.open("a", newline="") as file:
                writer = csv.writer(file)
                if new:
                    writer.writerow(HEADER)
                writer.writerow(
                    [name, args.method, seed, curve[-1][0], f"{curve[-1][1]:.4f}",
                     f"{seconds:.1f}", " ".join(f"{a:.4f}" for _, a in curve)]
                )  # fmt: skip
            print(f"{name} {args.method} seed {seed}: {curve[-1][1]:.4f} ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
