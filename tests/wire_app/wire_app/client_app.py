"""A numpy softmax-regression ClientApp that, when asked to, sends bad replies.

It speaks fedx's packed model form as fedx's ClientApp does
(:mod:`fedx.client.packing`): its answer to the identity query says so,
packed models reach its handlers as standard ArrayRecords, and it replies
packed to what came packed.
"""

import os
import time

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedx.client.packing import packed_models

NUM_FEATURES, NUM_CLASSES = 6, 3

#: Set in a SuperNode's environment, its ClientApps run without fedx's packed-form mod: a node
#: that restarted as something else (tests/system/test_packed_restart.py).
WITHOUT_PACKED_MOD = "WIRE_APP_WITHOUT_PACKED_MOD"

app = ClientApp(mods=[] if os.environ.get(WITHOUT_PACKED_MOD) else [packed_models])


@app.query()
def identify(msg: Message, context: Context) -> Message:
    """Which client this node is: its partition id (the mod adds that it reads packed models)."""
    partition_id = int(context.node_config["partition-id"])
    return Message(RecordDict({"metrics": MetricRecord({"client-id": partition_id})}), reply_to=msg)


def local_data(partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Three Gaussian blobs; each partition has its own sample."""
    rng = np.random.default_rng(100 + partition_id)
    centres = np.random.default_rng(0).normal(scale=2.0, size=(NUM_CLASSES, NUM_FEATURES))
    labels = rng.integers(0, NUM_CLASSES, size=60)
    return (centres[labels] + rng.normal(size=(60, NUM_FEATURES))).astype(np.float32), labels


def gradient_steps(model: dict, x: np.ndarray, y: np.ndarray, steps: int = 10) -> float:
    """Full-batch gradient descent on the cross-entropy, in place; the last loss."""
    onehot = np.eye(NUM_CLASSES, dtype=np.float32)[y]
    loss = 0.0
    for _ in range(steps):
        logits = x @ model["weight"] + model["bias"]
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        loss = float(-np.mean(np.log(probs[np.arange(y.size), y] + 1e-12)))
        grad = (probs - onehot) / y.size
        model["weight"] = (model["weight"] - 0.5 * x.T @ grad).astype(np.float32)
        model["bias"] = (model["bias"] - 0.5 * grad.sum(axis=0)).astype(np.float32)
    return loss


def one_step(model: dict, partition_id: int) -> float:
    """Change every array in place as a training step would; 0.0 (the loss).

    Each float array moves by a step of its own (its node's and its place's),
    integers (batch counters) by 1. Every array the node returns then differs
    from the one it was sent and from every other, as after real training
    (a fresh model's equal arrays, its batch norms' ones and zeros, travel
    once per message, as Flower's objects of equal content do), so all of it
    crosses the network again.
    """
    for index, array in enumerate(model.values()):
        array += (
            np.float32(1e-3 * (partition_id + 1) + 1e-6 * index) if array.dtype.kind == "f" else 1
        )
    return 0.0


# Under misbehave="wire": (round, partition) -> what that ClientApp gets wrong.
FAULTS = {(1, 1): "wrong-shape", (1, 2): "nan", (2, 1): "no-metrics"}


def train_delay(msg: Message, context: Context, server_round: int) -> float:
    """Seconds this ClientApp waits before replying: its ``train-delays`` entry, else ``train-delay``.

    ``train-delays`` is "round:partition=seconds,..." (for example "2:0=0,2:1=20").
    """
    partition_id = int(context.node_config["partition-id"])
    for entry in str(context.run_config.get("train-delays", "")).split(","):
        if entry.strip():
            key, seconds = entry.split("=")
            if tuple(int(part) for part in key.split(":")) == (server_round, partition_id):
                return float(seconds)
    return float(msg.content["config"].get("train-delay", 0.0))


def misbehaviour(context: Context, server_round: int) -> str:
    """What this ClientApp does wrong this round ("" for nothing)."""
    if context.run_config.get("misbehave") != "wire":
        return ""
    return FAULTS.get((server_round, int(context.node_config["partition-id"])), "")


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the model received; reply with Flower's usual records (or bad ones)."""
    partition_id = int(context.node_config["partition-id"])
    server_round = int(msg.content["config"].get("server-round", 0))
    model = {name: array.numpy().copy() for name, array in msg.content["arrays"].items()}
    x, y = local_data(partition_id)
    if {"weight", "bias"} <= set(model):  # the softmax regression (and a payload)
        softmax = {name: model[name] for name in ("weight", "bias")}
        loss = gradient_steps(softmax, x, y)
        one_step(model, partition_id)
        model.update(softmax)
    else:  # another model's arrays (the run config's model): moved, not trained
        loss = one_step(model, partition_id)
    time.sleep(train_delay(msg, context, server_round))
    fault = misbehaviour(context, server_round)
    if fault == "wrong-shape":
        model["weight"] = np.zeros((NUM_FEATURES + 1, NUM_CLASSES), dtype=np.float32)
    elif fault == "nan":
        model["bias"][0] = np.nan
    records = {"arrays": ArrayRecord({n: Array(a) for n, a in model.items()})}
    if fault != "no-metrics":
        records["metrics"] = MetricRecord({"num-examples": int(y.size), "train-loss": loss})
    return Message(content=RecordDict(records), reply_to=msg)
