"""fedx ClientApp: train or evaluate whatever model arrives, on this node's data.

It is stateless: the model arrives in the message, the training
hyperparameters in the message's ConfigRecord (falling back to the run config
when a ServerApp does not send them), and the dataset, model and partitioning
settings come from the run config. A node finds its partition from
``partition-id``/``num-partitions`` in its node config (set by the simulation
engine, or by ``flower-supernode --node-config`` in a deployment).

Personalized strategies (``fedme``, ``fedavg-ft``) use the personalized data
layout: the node's share is split into its own train, validation and test
data (:func:`fedx.data.load_local_splits`). FedMe's messages carry two models
(``personalized`` and ``exchanged`` ArrayRecords with their architectures in
the config); a ``query`` message asks the node which client it is.
The one exception is FedMR's secure recombination: within a round, the
trained model waits in the node's ``context.state`` while the clients swap
layers (:mod:`fedx.secure.client`).
"""

import sys

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn
from torch.utils.data import DataLoader, Dataset, Subset

from fedx.config import PERSONALIZED_STRATEGIES
from fedx.data import (
    LocalSplits,
    dataset_info,
    load_local_splits,
    load_partition,
    load_split,
    partition_indices,
)
from fedx.models import build_model
from fedx.mutual import prefers_exchanged, train_mutual
from fedx.secure.client import is_secure_round, register_secure_handlers, secure_train_reply
from fedx.training import evaluate, get_device, train

# Inside Flower's simulation engine, ClientApps run on fedx's Ray backend: its
# actor pool follows the nodes of a Ray cluster (fedx/ray_backend.py).
if "flwr.server.superlink.fleet.vce.vce_api" in sys.modules:
    from fedx.ray_backend import install as install_ray_backend

    install_ray_backend()

app = ClientApp()
# FedMR's secure recombination: the exchange's send, return and upload steps.
register_secure_handlers(app)


def _partition(context: Context) -> tuple[int, int]:
    try:
        return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    except KeyError as err:
        raise RuntimeError(
            f"node config lacks {err}: start the SuperNode with "
            "--node-config 'partition-id=<i> num-partitions=<n>'"
        ) from None


def _config(msg: Message) -> ConfigRecord:
    return msg.content.config_records.get("config", ConfigRecord())


def _setting(msg: Message, context: Context, key: str):
    """A training setting from the message's config, else from the run config."""
    config = _config(msg)
    return config[key] if key in config else context.run_config[key]


def _build(context: Context, name: str, record: ArrayRecord) -> nn.Module:
    """A model of architecture ``name`` holding the weights of ``record``."""
    info = dataset_info(str(context.run_config["dataset"]))
    model = build_model(name, info.input_shape, info.num_classes)
    model.load_state_dict(record.to_torch_state_dict())
    return model


def _data_settings(context: Context) -> dict:
    run_config = context.run_config
    return {
        "root": str(run_config["data-root"]),
        "download": bool(run_config["download"]),
        "seed": int(run_config["seed"]),
        "test_fraction": float(run_config["test-fraction"]),
        "leaf_users": int(run_config["leaf-users"]),
        "leaf_min_samples": int(run_config["leaf-min-samples"]),
    }


def _personalized(context: Context) -> bool:
    return str(context.run_config["strategy"]) in PERSONALIZED_STRATEGIES


def _local_splits(context: Context) -> LocalSplits:
    """This node's train/validation/test splits in the personalized layout."""
    partition_id, num_partitions = _partition(context)
    run_config = context.run_config
    return load_local_splits(
        str(run_config["dataset"]),
        partition_id,
        num_partitions,
        partitioning=str(run_config["partitioning"]),
        alpha=float(run_config["dirichlet-alpha"]),
        size_alpha=float(run_config["size-alpha"]),
        min_partition_size=int(run_config["min-partition-size"]),
        unlabeled=int(run_config["unlabeled-size"]),
        local_test_fraction=float(run_config["local-test-fraction"]),
        local_validation_fraction=float(run_config["local-validation-fraction"]),
        **_data_settings(context),
    )


def _training_data(context: Context) -> Dataset:
    """The data this node trains on: its share, or its train split when personalized."""
    if _personalized(context):
        return _local_splits(context).train
    partition_id, num_partitions = _partition(context)
    run_config = context.run_config
    return load_partition(
        str(run_config["dataset"]),
        partition_id,
        num_partitions,
        partitioning=str(run_config["partitioning"]),
        alpha=float(run_config["dirichlet-alpha"]),
        min_partition_size=int(run_config["min-partition-size"]),
        **_data_settings(context),
    )


def _seed_torch(msg: Message, context: Context) -> None:
    """Reproducible shuffling and dropout: one stream per (seed, round, node)."""
    partition_id, _ = _partition(context)
    server_round = int(_config(msg).get("server-round", 0))
    torch.manual_seed(int(context.run_config["seed"]) * 1_000_003 + server_round * 1009 + partition_id)


def _sgd_settings(msg: Message, context: Context) -> dict:
    return {
        "learning_rate": float(_setting(msg, context, "learning-rate")),
        "momentum": float(_setting(msg, context, "momentum")),
        "weight_decay": float(_setting(msg, context, "weight-decay")),
    }


def _train_loader(msg: Message, context: Context, dataset: Dataset) -> DataLoader:
    return DataLoader(dataset, batch_size=int(_setting(msg, context, "batch-size")), shuffle=True)


@app.query()
def identify(msg: Message, context: Context) -> Message:
    """Tell the server which client this node is: its ``partition-id`` (FedMe)."""
    partition_id, _ = _partition(context)
    return Message(content=RecordDict({"metrics": MetricRecord({"client-id": partition_id})}),
                   reply_to=msg)


@app.train()
def train_model(msg: Message, context: Context) -> Message:
    """Train the received model (or FedMe's two models) on this node's data and send it back."""
    _seed_torch(msg, context)
    if "personalized" in msg.content.array_records:
        return _train_fedme(msg, context)
    dataset = _training_data(context)
    model = _build(context, str(context.run_config["model"]), msg.content.array_records["arrays"])
    train_loss = train(
        model,
        _train_loader(msg, context, dataset),
        epochs=int(_setting(msg, context, "local-epochs")),
        proximal_mu=float(_config(msg).get("proximal-mu", 0.0)),
        device=get_device(),
        **_sgd_settings(msg, context),
    )
    arrays = ArrayRecord(model.state_dict())
    metrics = MetricRecord({"num-examples": len(dataset), "train-loss": train_loss})
    if is_secure_round(msg):
        # The model stays on this node until it has swapped layers with others.
        return secure_train_reply(msg, context, arrays, metrics)
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


def _train_fedme(msg: Message, context: Context) -> Message:
    """FedMe's client round: deep mutual learning, then the choice by validation loss."""
    config = _config(msg)
    splits = _local_splits(context)
    records = msg.content.array_records
    personalized = _build(context, str(config["personalized-architecture"]), records["personalized"])
    exchanged = _build(context, str(config["exchanged-architecture"]), records["exchanged"])
    device = get_device()
    train_losses = train_mutual(
        personalized,
        exchanged,
        _train_loader(msg, context, splits.train),
        epochs=int(_setting(msg, context, "local-epochs")),
        mutual_learning=bool(config.get("mutual-learning", True)),
        device=device,
        **_sgd_settings(msg, context),
    )
    validation = DataLoader(splits.validation, batch_size=256)
    validation_losses = (evaluate(personalized, validation, device)[0],
                         evaluate(exchanged, validation, device)[0])
    chose_exchanged = bool(config.get("model-tuning", True)) and prefers_exchanged(*validation_losses)
    reply = RecordDict(
        {
            "personalized": ArrayRecord(personalized.state_dict()),
            "exchanged": ArrayRecord(exchanged.state_dict()),
            "metrics": MetricRecord(
                {
                    "num-examples": len(splits.train),
                    "train-loss-personalized": train_losses[0],
                    "train-loss-exchanged": train_losses[1],
                    "val-loss-personalized": validation_losses[0],
                    "val-loss-exchanged": validation_losses[1],
                    "chose-exchanged": int(chose_exchanged),
                }
            ),
        }
    )
    return Message(content=reply, reply_to=msg)


@app.evaluate()
def evaluate_model(msg: Message, context: Context) -> Message:
    """Evaluate the received model: on this node's own test split when personalized.

    Personalized (FedMe, FedAvg + fine-tuning): the model, fine-tuned first
    for ``finetune-epochs`` epochs on the node's train split, is tested on the
    node's test split. Otherwise the model is tested on this node's IID share
    of the held-out test split.
    """
    partition_id, num_partitions = _partition(context)
    if _personalized(context):
        return _evaluate_personalized(msg, context, partition_id)
    test_set = load_split(str(context.run_config["dataset"]), "test", **_data_settings(context))
    # The held-out test split is shared out IID, so every node's share has
    # the same distribution as the whole.
    shares = partition_indices(
        _targets(test_set), num_partitions, partitioning="iid", seed=int(context.run_config["seed"])
    )
    local_test = Subset(test_set, shares[partition_id].tolist())
    model = _build(context, str(context.run_config["model"]), msg.content.array_records["arrays"])
    loss, accuracy = evaluate(model, DataLoader(local_test, batch_size=256), get_device())
    reply = RecordDict(
        {
            "metrics": MetricRecord(
                {"num-examples": len(local_test), "eval-loss": loss, "eval-acc": accuracy}
            )
        }
    )
    return Message(content=reply, reply_to=msg)


def _evaluate_personalized(msg: Message, context: Context, partition_id: int) -> Message:
    """Fine-tune this node's model on its train split, test it on its test split."""
    _seed_torch(msg, context)
    config = _config(msg)
    records = msg.content.array_records
    if "personalized" in records:
        model = _build(context, str(config["personalized-architecture"]), records["personalized"])
    else:
        model = _build(context, str(context.run_config["model"]), records["arrays"])
    splits = _local_splits(context)
    device = get_device()
    epochs = int(config.get("finetune-epochs", 0))
    if epochs > 0:
        train(model, _train_loader(msg, context, splits.train), epochs=epochs, device=device,
              **_sgd_settings(msg, context))
    loss, accuracy = evaluate(model, DataLoader(splits.test, batch_size=256), device)
    metrics = MetricRecord(
        {
            "num-examples": len(splits.test),
            "eval-loss": loss,
            "eval-acc": accuracy,
            "client-id": partition_id,
        }
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


def _targets(dataset) -> np.ndarray:
    return np.asarray(dataset.targets, dtype=np.int64)
