"""What a ClientApp call works with, read once: the run config, this node's partition, the round.

The ClientApp is stateless: every message carries what it needs, and the run
config (checked and typed by :class:`fedx.config.RunConfig`, as on the
server) says which data, model and method the run uses. A :class:`ClientTask`
reads all of that once per message and hands it to the handlers.

What a process can reuse between messages without carrying state from one to
the next, it keeps: the dataset split and the partitions' positions
(:mod:`fedx.data`, per process), and the model skeletons the weights are
loaded into (:mod:`fedx.client.skeletons`), which a task borrows and gives
back when its handler is done (``with ClientTask(...) as task:``).
"""

import contextlib
import functools
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn
from torch.utils.data import Dataset

from fedx.arrays import to_numpy_dict
from fedx.client.node import node_partition
from fedx.client.skeletons import SKELETONS
from fedx.config import RunConfig
from fedx.data import (
    LocalSplits,
    batch_loader,
    dataset_info,
    device_batches,
    load_local_splits,
    load_partition,
    load_test_share,
)
from fedx.protocol.common import CONFIG, SERVER_ROUND, TrainingSettings
from fedx.training import Batches, deterministic_kernels, get_device

#: Batch size of evaluation passes.
EVALUATION_BATCH = 256


@functools.lru_cache(maxsize=4)
def _checked(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    return RunConfig.from_mapping(dict(items))


def read_run_config(run_config: Mapping[str, Any]) -> RunConfig:
    """The node's run config, checked once per process and run."""
    return _checked(tuple(sorted(run_config.items())))


class ClientTask:
    """One message to answer, with everything the answer needs.

    Use it as a context manager around the answer: the models it lent
    (:meth:`model`) go back to the process's skeleton cache when the block
    ends, or are dropped when the block raised.

    Attributes
    ----------
    message : Message
        The message.
    context : Context
        The node's context (secure recombination keeps state in it).
    config : RunConfig
        The run config.
    partition_id, num_partitions : int
        This node's share of the data.
    round_config : ConfigRecord
        The message's ConfigRecord (empty when it has none).
    server_round : int
        The round the message belongs to (0 when the server did not say).
    training : TrainingSettings
        The local-training hyperparameters: the message's, else the run config's.
    device : torch.device
        Where this node trains and evaluates (the run config's ``device``).
        While the task is open (``with``), torch runs its deterministic
        kernels if the run config's ``deterministic`` says so.
    """

    def __init__(self, message: Message, context: Context) -> None:
        self.message = message
        self.context = context
        self.config = read_run_config(context.run_config)
        self.partition_id, self.num_partitions = node_partition(context)
        self.round_config = message.content.config_records.get(CONFIG, ConfigRecord())
        self.server_round = int(self.round_config.get(SERVER_ROUND, 0))
        self.training = TrainingSettings.read(self.round_config, self.config)
        self.device = get_device(self.config.device)
        self._borrowed: list[tuple[nn.Module, str]] = []
        self._kernels = contextlib.ExitStack()

    def __enter__(self) -> "ClientTask":
        # The run config says so, message by message: a process that answers
        # several runs' messages (a warm executor's, a Ray actor) follows each.
        self._kernels.enter_context(deterministic_kernels(self.config.deterministic))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._kernels.close()
        borrowed, self._borrowed = self._borrowed, []
        if kind is not None:
            return  # a call that failed may have left its models half-way: they are not kept
        info = dataset_info(self.config.dataset)
        for model, architecture in borrowed:
            SKELETONS.give_back(model, architecture, info.input_shape, info.num_classes)

    # ------------------------------------------------------------------
    # Data
    # ------------------------------------------------------------------

    @functools.cached_property
    def local_splits(self) -> LocalSplits:
        """This node's train/validation/test splits in the personalized layout."""
        return load_local_splits(
            self.config.dataset,
            self.partition_id,
            self.num_partitions,
            **self.config.local_split_settings(),
        )

    def training_data(self) -> Dataset:
        """What this node trains on: its share, or its train split when the method is personalized."""
        if self.config.personalized:
            return self.local_splits.train
        return load_partition(
            self.config.dataset,
            self.partition_id,
            self.num_partitions,
            **self.config.partition_settings(),
        )

    def test_share(self) -> Dataset:
        """This node's IID share of the held-out test split (it has the distribution of the whole)."""
        return load_test_share(
            self.config.dataset,
            self.partition_id,
            self.num_partitions,
            **self.config.data_settings(),
        )

    def train_loader(self, dataset: Dataset) -> Batches:
        """Shuffled batches of ``batch-size``, made on the device where the dataset allows.

        :func:`fedx.data.device_batches` serves in-memory images (CIFAR) on
        the task's device; :func:`fedx.data.batch_loader` the other datasets.
        """
        size = self.training.batch_size
        on_device = device_batches(dataset, size, self.device, shuffle=True)
        return on_device if on_device is not None else batch_loader(dataset, size, shuffle=True)

    def test_loader(self, dataset: Dataset) -> Batches:
        """Batches for evaluation, in order (made on the device where the dataset allows)."""
        on_device = device_batches(dataset, EVALUATION_BATCH, self.device)
        return on_device if on_device is not None else batch_loader(dataset, EVALUATION_BATCH)

    # ------------------------------------------------------------------
    # Models and training
    # ------------------------------------------------------------------

    def model(self, architecture: str, record: ArrayRecord) -> nn.Module:
        """A model of ``architecture`` holding the weights of ``record``, in training mode.

        Its module may have served an earlier message of this process; only
        the weights of ``record`` (every parameter and buffer) decide it, and
        getting it draws nothing from torch's generator.
        """
        info = dataset_info(self.config.dataset)
        model = SKELETONS.borrow(architecture, info.input_shape, info.num_classes)
        self._borrowed.append((model, architecture))
        weights = to_numpy_dict(record)
        model.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()})
        return model

    def sgd(self) -> dict[str, float]:
        """The optimizer's settings, as :func:`fedx.training.train` takes them."""
        return {
            "learning_rate": self.training.learning_rate,
            "momentum": self.training.momentum,
            "weight_decay": self.training.weight_decay,
        }

    @property
    def torch_seed(self) -> int:
        """The seed of this message's shuffling and dropout: one per (seed, round, node)."""
        return self.config.seed * 1_000_003 + self.server_round * 1009 + self.partition_id

    def seed_torch(self) -> None:
        """Reproducible shuffling and dropout (:attr:`torch_seed`)."""
        if self.device.type == "cpu":
            # torch.manual_seed would also queue the seed for every accelerator
            # torch was built for and has not started (CUDA, XPU, MTIA), with
            # a stack trace each, in every message, costing more the deeper
            # the stack: a noticeable share of a small model's ClientApp call.
            # On a CPU, its generator is all the task uses.
            torch.default_generator.manual_seed(self.torch_seed)
        else:
            torch.manual_seed(self.torch_seed)

    def reply(self, records: Mapping[str, Any]) -> Message:
        """The reply to the message, holding ``records``."""
        return Message(content=RecordDict(dict(records)), reply_to=self.message)
