"""fedx ClientApp: train or evaluate whatever model arrives, on this node's data.

It is stateless: the model arrives in the message, the training
hyperparameters in the message's ConfigRecord (falling back to the run config
when a ServerApp does not send them), and the dataset, model and partitioning
settings come from the run config. A node finds its partition from
``partition-id``/``num-partitions`` in its node config (set by the simulation
engine, or by ``flower-supernode --node-config`` in a deployment).

The one exception is FedMR's secure recombination: within a round, the
trained model waits in the node's ``context.state`` while the clients swap
layers (:mod:`fedx.secure.client`).
"""

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch.utils.data import DataLoader, Subset

from fedx.data import dataset_info, load_partition, load_split, partition_indices
from fedx.models import build_model
from fedx.secure.client import is_secure_round, register_secure_handlers, secure_train_reply
from fedx.training import evaluate, get_device, train

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


def _setting(msg: Message, context: Context, key: str):
    """A training setting from the message's config, else from the run config."""
    config = msg.content.config_records.get("config", {})
    return config[key] if key in config else context.run_config[key]


def _model_from_message(msg: Message, context: Context) -> torch.nn.Module:
    run_config = context.run_config
    info = dataset_info(str(run_config["dataset"]))
    model = build_model(str(run_config["model"]), info.input_shape, info.num_classes)
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    return model


def _data_settings(context: Context) -> dict:
    run_config = context.run_config
    return {
        "root": str(run_config["data-root"]),
        "download": bool(run_config["download"]),
        "seed": int(run_config["seed"]),
        "test_fraction": float(run_config["test-fraction"]),
    }


@app.train()
def train_model(msg: Message, context: Context) -> Message:
    """Train the received model on this node's partition and send it back."""
    partition_id, num_partitions = _partition(context)
    run_config = context.run_config
    server_round = int(msg.content.config_records.get("config", {}).get("server-round", 0))
    # Reproducible shuffling and dropout: one stream per (seed, round, node).
    torch.manual_seed(int(run_config["seed"]) * 1_000_003 + server_round * 1009 + partition_id)

    dataset = load_partition(
        str(run_config["dataset"]),
        partition_id,
        num_partitions,
        partitioning=str(run_config["partitioning"]),
        alpha=float(run_config["dirichlet-alpha"]),
        min_partition_size=int(run_config["min-partition-size"]),
        **_data_settings(context),
    )
    model = _model_from_message(msg, context)
    loader = DataLoader(dataset, batch_size=int(_setting(msg, context, "batch-size")), shuffle=True)
    config = msg.content.config_records.get("config", {})
    train_loss = train(
        model,
        loader,
        epochs=int(_setting(msg, context, "local-epochs")),
        learning_rate=float(_setting(msg, context, "learning-rate")),
        momentum=float(_setting(msg, context, "momentum")),
        weight_decay=float(_setting(msg, context, "weight-decay")),
        proximal_mu=float(config.get("proximal-mu", 0.0)),
        device=get_device(),
    )
    arrays = ArrayRecord(model.state_dict())
    metrics = MetricRecord({"num-examples": len(dataset), "train-loss": train_loss})
    if is_secure_round(msg):
        # The model stays on this node until it has swapped layers with others.
        return secure_train_reply(msg, context, arrays, metrics)
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate_model(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this node's share of the test split."""
    partition_id, num_partitions = _partition(context)
    test_set = load_split(str(context.run_config["dataset"]), "test", **_data_settings(context))
    # The held-out test split is shared out IID, so every node's share has
    # the same distribution as the whole.
    shares = partition_indices(
        _targets(test_set), num_partitions, partitioning="iid", seed=int(context.run_config["seed"])
    )
    local_test = Subset(test_set, shares[partition_id].tolist())
    model = _model_from_message(msg, context)
    loss, accuracy = evaluate(model, DataLoader(local_test, batch_size=256), get_device())
    reply = RecordDict(
        {
            "metrics": MetricRecord(
                {"num-examples": len(local_test), "eval-loss": loss, "eval-acc": accuracy}
            )
        }
    )
    return Message(content=reply, reply_to=msg)


def _targets(dataset) -> np.ndarray:
    return np.asarray(dataset.targets, dtype=np.int64)
