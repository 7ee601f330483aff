"""A fresh ClientApp process, as Flower starts one per message: what it imports (test_cold_start.py).

Run as ``python -m tests.support.cold_start '<run config as JSON>'``: it imports
``fedx.client_app`` and ``fedx.server_app``, answers a query, then a
training and an evaluation message of the digits with the real handlers,
and prints which of :data:`HEAVY` (and, after the imports, of
:data:`HANDLERS_IMPORT`) each step had imported, as JSON. Only the standard
library is imported here at the top, so what it reports is what fedx
imports.
"""

import json
import sys
from typing import Any

#: What a digits run never needs: the loaders and models of other data sets,
#: the partitioners (their results are in the disk cache), plotting, and
#: torch's compiler (which torch.optim's classes import on first use).
HEAVY = ("torchvision", "datasets", "flwr_datasets", "matplotlib", "sklearn", "torch._dynamo")
#: What the ServerApp's main and the ClientApp's train and evaluate handlers
#: import when they first run, and the app modules themselves do not.
HANDLERS_IMPORT = (
    "torch",
    "fedx.data",
    "fedx.models",
    "fedx.training",
    "fedx.strategies",
    "fedx.client.task",
    "fedx.server.experiment",
)


def loaded(names: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``names`` this process has imported."""
    return [name for name in names if name in sys.modules]


def answer_digits_messages(run_config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Train and evaluate the initial CNN on node 1 of 4 with the ClientApp's handlers; their metrics."""
    # pylint: disable=import-outside-toplevel  (imported here, so that the caller sees when)
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

    from fedx import client_app
    from fedx.data import dataset_info
    from fedx.models import build_model

    info = dataset_info("digits")
    arrays = ArrayRecord(build_model("cnn", info.input_shape, info.num_classes).state_dict())
    context = Context(1, 1, {"partition-id": 1, "num-partitions": 4}, RecordDict(), run_config)
    replies = {}
    for kind, handler in (
        ("train", client_app.train_model),
        ("evaluate", client_app.evaluate_model),
    ):
        content = RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": 1})})
        message = Message(content, dst_node_id=1, message_type=kind)
        replies[kind] = dict(handler(message, context).content["metrics"])
    return replies


def main() -> None:
    from flwr.supercore.task_identity import TaskIdentity  # pylint: disable=import-outside-toplevel

    # Messages are stamped with the run and node of the process, as in a ClientApp process.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    report: dict[str, Any] = {}
    # pylint: disable=import-outside-toplevel,unused-import
    from flwr.app import Context, Message, RecordDict

    import fedx.server_app  # noqa: F401
    from fedx.client_app import identify

    report["import the apps"] = loaded(HEAVY + HANDLERS_IMPORT)
    context = Context(1, 1, {"partition-id": 3, "num-partitions": 4}, RecordDict(), {})
    reply = identify(Message(RecordDict(), dst_node_id=1, message_type="query"), context)
    report["query"] = dict(reply.content["metrics"])
    report["replies"] = answer_digits_messages(json.loads(sys.argv[1]))
    report["train and evaluate"] = loaded()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
