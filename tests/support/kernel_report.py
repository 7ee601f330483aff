"""A ClientApp whose reply says which kernels fedx's training ran with (deterministic, cuBLAS).

For the checks that the run config's ``deterministic`` reaches the training
code on each path a message takes (tests/unit/test_gpu_promises.py in-process,
tests/system/test_gpu_promises.py in a Ray actor).
"""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedx.models import build_model
from tests.support.helpers import DEFAULTS

NODE = 7


def train_message() -> Message:
    torch.manual_seed(0)
    record = ArrayRecord(build_model("cnn", (1, 8, 8), 10).state_dict())
    content = RecordDict({"arrays": record, "config": ConfigRecord({"server-round": 1})})
    return Message(content, dst_node_id=NODE, message_type="train")


def node_context(**config) -> Context:
    run_config = {**DEFAULTS, "local-epochs": 1, "device": "cpu", **config}
    return Context(1, NODE, {"partition-id": 1, "num-partitions": 10}, RecordDict(), run_config)


def reporting_client_app() -> ClientApp:
    """fedx's training handler, reporting the kernels and cuBLAS setting its training ran with."""
    app = ClientApp()

    @app.train()
    def train_and_report(msg: Message, context: Context) -> Message:
        # pylint: disable=import-outside-toplevel,reimported
        import os as process_os

        import torch as process_torch

        from fedx.client import handlers

        seen = {}
        real = handlers.train

        def spy(*args, **kwargs):
            seen["deterministic"] = process_torch.are_deterministic_algorithms_enabled()
            seen["cublas"] = process_os.environ.get("CUBLAS_WORKSPACE_CONFIG") == ":4096:8"
            seen["device"] = str(kwargs["device"])
            return real(*args, **kwargs)

        handlers.train = spy
        try:
            reply = handlers.train_model(msg, context)
        finally:
            handlers.train = real
        reply.content["report"] = MetricRecord(
            {
                "deterministic-in-training": int(seen["deterministic"]),
                "cublas-set": int(seen["cublas"]),
                "cpu": int(seen["device"] == "cpu"),
                "deterministic-after": int(process_torch.are_deterministic_algorithms_enabled()),
            }
        )
        return reply

    return app
