"""Client groups: several clients trained as one batched step, each as ``train()`` trains it alone.

fedx.group_training against fedx.training.train on the CPU (float32 within
1e-6, float64 within 1e-12: the same arithmetic in other kernels); the
ClientApp's group handler against its one-message handler; the simulation
backend's collector, which gathers a round's messages into groups.
"""

import copy
import logging
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch.utils.data import DataLoader, TensorDataset

from fedx import client_app
from fedx.client import groups as client_groups
from fedx.data import DeviceBatches, DeviceImages, ImageTransform
from fedx.group_training import ClientRandom, GroupMember, batching_obstacle, train_group
from fedx.models import build_model
from fedx.simulation.groups import GroupCollector
from fedx.training import train
from tests.support.helpers import DEFAULTS

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CPU = torch.device("cpu")
#: FedProx's term, momentum and weight decay, as the paper settings use them.
SETTINGS = {"learning_rate": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "proximal_mu": 0.01}


def image_batches(shape, sizes, batch_size, seed=0):
    """Per client: a factory of its batches (CIFAR's device path, crops and flips drawn from
    torch's default generator, for 3-channel images; a shuffled DataLoader otherwise)."""
    rng = np.random.default_rng(seed)
    channels, height, width = shape
    factories = []
    if channels == 3:
        pixels = rng.integers(0, 256, size=(sum(sizes), height, width, 3), dtype=np.uint8)
        transform = ImageTransform((0.5,) * 3, (0.25,) * 3, crop_padding=2, flip=True)
        images = DeviceImages(pixels, rng.integers(0, 10, sum(pixels.shape[:1])), transform, CPU)
        start = 0
        for size in sizes:
            share = torch.arange(start, start + size)
            start += size
            factories.append(
                lambda s=share: DeviceBatches(images, s, batch_size, shuffle=True, augment=True)
            )
        return factories
    for size in sizes:
        inputs = torch.from_numpy(rng.normal(size=(size, *shape)).astype(np.float32))
        labels = torch.from_numpy(rng.integers(0, 10, size))
        data = TensorDataset(inputs, labels)
        factories.append(lambda d=data: DataLoader(d, batch_size=batch_size, shuffle=True))
    return factories


def alone_and_together(architecture, shape, sizes, batch_size, epochs, dtype=torch.float32):
    """Each client trained by train() alone, and all of them by train_group(); both results."""
    torch.manual_seed(0)
    model = build_model(architecture, shape, 10).to(dtype)
    start = copy.deepcopy(model.state_dict())
    factories = image_batches(shape, sizes, batch_size)
    settings = {"epochs": epochs, "device": CPU, **SETTINGS}

    def convert(batches):
        for inputs, labels in batches:
            yield inputs.to(dtype), labels

    class Converted:  # the batches in float64 where the model is
        def __init__(self, batches):
            self.batches = batches

        def __iter__(self):
            return convert(self.batches)

    alone = []
    for client, factory in enumerate(factories):
        mine = copy.deepcopy(model)
        torch.manual_seed(100 + client)  # as ClientTask.seed_torch: the client's own seed
        loss = train(mine, Converted(factory()), **settings)
        alone.append((mine.state_dict(), loss))
    members = []
    for client, factory in enumerate(factories):
        torch.manual_seed(100 + client)
        members.append(GroupMember(start, Converted(factory()), ClientRandom.capture(CPU)))
    torch.manual_seed(12345)  # whatever the generators hold now, each client draws its own
    together = train_group(model, members, **settings)
    return start, alone, together


CASES = {
    # FedAvg's CNN on digit-sized inputs, VGG-11 (dropout) and ResNet-20 (BatchNorm) on
    # CIFAR-shaped ones through the device path; ragged partitions: the last client takes
    # fewer and smaller batches than the others.
    "cnn": ("cnn", (1, 8, 8), [24, 24, 13], 8, 2),
    "resnet20": ("resnet20", (1, 8, 8), [16, 16, 11], 8, 1),
    "resnet20-cifar": ("resnet20", (3, 16, 16), [16, 16, 11], 8, 1),
    "vgg11": ("vgg11", (3, 32, 32), [8, 4, 3], 4, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_client_of_a_group_gets_what_train_gives_it_alone(case):
    architecture, shape, sizes, batch_size, epochs = CASES[case]
    start, alone, together = alone_and_together(architecture, shape, sizes, batch_size, epochs)
    moved = []
    for client, ((expected, loss), mine) in enumerate(zip(alone, together, strict=True)):
        assert list(mine.state) == list(expected)
        for name, tensor in expected.items():
            assert mine.state[name].dtype == tensor.dtype, name
            difference = (mine.state[name].double() - tensor.double()).abs().max().item()
            assert difference <= 1e-6, (client, name, difference)
        assert mine.train_loss == pytest.approx(loss, rel=1e-6, abs=1e-7)
        assert mine.steps == epochs * -(-sizes[client] // batch_size)
        moved.append(max((mine.state[n].double() - start[n].double()).abs().max() for n in start))
    assert min(moved) > 1e-3  # every client trained, the short one included
    assert not torch.equal(
        together[0].state[next(iter(start))], together[1].state[next(iter(start))]
    )


@pytest.mark.parametrize("case", ["cnn", "resnet20", "vgg11"])
def test_in_float64_a_group_is_train_to_the_last_digits(case):
    """The same arithmetic: in float64 the batched kernels' other orders of addition vanish."""
    architecture, shape, sizes, batch_size, epochs = CASES[case]
    _, alone, together = alone_and_together(
        architecture, shape, sizes, batch_size, epochs, dtype=torch.float64
    )
    for (expected, loss), mine in zip(alone, together, strict=True):
        for name, tensor in expected.items():
            assert torch.allclose(mine.state[name], tensor, rtol=0, atol=1e-12), name
        assert mine.train_loss == pytest.approx(loss, rel=1e-12)


@pytest.mark.usefixtures("server_task_identity")
def test_the_client_a_grouped_simulation_trains_otherwise_in_float32_is_train_in_float64():
    """Round 1 of the plain FedMR run (seed 3), client 1 of 4: 458 digits, 5 epochs of batches
    of 50 from the run's initial CNN. In float32 its batched step and train() part at its 10th
    step (a max pooling window whose two largest values lie 7.5e-9 apart in train() and equal
    in the batched step) and end 2e-2 apart; in float64 they are the same arithmetic."""
    from fedx.client.task import ClientTask  # pylint: disable=import-outside-toplevel
    from tests.support.helpers import PLAIN_FEDMR  # pylint: disable=import-outside-toplevel

    torch.manual_seed(PLAIN_FEDMR["seed"])  # as the ServerApp builds the initial model
    model = build_model("cnn", (1, 8, 8), 10).double()
    start = copy.deepcopy(model.state_dict())
    run_config = {**DEFAULTS, "seed": PLAIN_FEDMR["seed"], "model": "cnn", "dataset": "digits"}
    round_config = {"server-round": 1, "learning-rate": 0.05, "momentum": 0.9}
    round_config |= {"weight-decay": 0.0, "batch-size": 50, "local-epochs": 5}
    content = RecordDict({"arrays": ArrayRecord(start), "config": ConfigRecord(round_config)})
    message = Message(content, dst_node_id=2, message_type="train")
    task = ClientTask(message, Context(1, 2, {"partition-id": 1, "num-partitions": 4},
                                       RecordDict(), run_config))  # fmt: skip
    dataset = task.training_data()
    assert len(dataset) == 458

    class Doubles:
        def __iter__(self):
            for inputs, labels in task.train_loader(dataset):
                yield inputs.double(), labels

    settings = {"epochs": task.training.local_epochs, "device": CPU, **task.sgd()}
    task.seed_torch()
    loss = train(model, Doubles(), **settings)
    task.seed_torch()
    member = GroupMember(start, Doubles(), ClientRandom.capture(CPU))
    (mine,) = train_group(build_model("cnn", (1, 8, 8), 10).double(), [member], **settings)
    assert mine.steps == 50
    for name, tensor in model.state_dict().items():
        assert torch.allclose(mine.state[name], tensor, rtol=0, atol=1e-12), name
    assert mine.train_loss == pytest.approx(loss, rel=1e-12)


def test_an_lstm_or_unknown_randomness_is_not_batched():
    assert batching_obstacle(build_model("lstm", (80,), 80)) is not None
    assert "Dropout2d" in batching_obstacle(torch.nn.Sequential(torch.nn.Dropout2d()))
    for name, shape in (("cnn", (1, 8, 8)), ("resnet20", (3, 32, 32)), ("vgg16", (3, 32, 32))):
        assert batching_obstacle(build_model(name, shape, 10)) is None, name
    with pytest.raises(ValueError, match="LSTM"):
        train_group(build_model("lstm", (80,), 80), [], epochs=1, learning_rate=0.1, device=CPU)


# ----------------------------------------------------------------------
# The ClientApp's side: a group's messages, answered together
# ----------------------------------------------------------------------


def train_message(record: ArrayRecord, node: int, proximal_mu: float = 0.0) -> Message:
    config = ConfigRecord({"server-round": 3, "proximal-mu": proximal_mu})
    content = RecordDict({"arrays": record, "config": config})
    return Message(content, dst_node_id=node, message_type="train")


def node_context(node: int, **config) -> Context:
    run_config = {**DEFAULTS, "local-epochs": 2, "batch-size": 16, **config}
    return Context(1, node, {"partition-id": node, "num-partitions": 12}, RecordDict(), run_config)


@pytest.mark.usefixtures("server_task_identity")
def test_the_group_handler_replies_as_the_clientapp_does(caplog):
    torch.manual_seed(0)
    record = ArrayRecord(build_model("cnn", (1, 8, 8), 10).state_dict())
    nodes = [0, 1, 2]
    messages = [train_message(record, node, proximal_mu=0.01) for node in nodes]
    contexts = [node_context(node) for node in nodes]
    alone = [client_app.train_model(m, c) for m, c in zip(messages, contexts, strict=True)]
    asked_alone = []

    def one(message, context):
        asked_alone.append(message)
        return client_app.train_model(message, context)

    together = client_groups.train_messages(messages, contexts, one)
    assert asked_alone == []  # all three batched
    for expected, mine in zip(alone, together, strict=True):
        assert isinstance(mine, Message) and not mine.has_error()
        assert mine.metadata.reply_to_message_id == expected.metadata.reply_to_message_id
        theirs, ours = expected.content["arrays"], mine.content["arrays"]
        assert list(ours) == list(theirs)
        for name in theirs:
            np.testing.assert_allclose(
                ours[name].numpy(), theirs[name].numpy(), rtol=0, atol=1e-6, err_msg=name
            )
        metrics, our_metrics = dict(expected.content["metrics"]), dict(mine.content["metrics"])
        assert our_metrics["num-examples"] == metrics["num-examples"]
        assert our_metrics["train-loss"] == pytest.approx(metrics["train-loss"], rel=1e-6)
    # A model the group cannot batch trains one by one, through the ClientApp, said once.
    lstm = [node_context(node, model="lstm", dataset="shakespeare") for node in nodes[:2]]
    with caplog.at_level(logging.INFO, logger="flwr"):
        outcomes = client_groups.train_messages(messages[:2], lstm, lambda m, c: "alone")
    assert outcomes == ["alone", "alone"]
    assert "train one by one: model lstm" in caplog.text


@pytest.mark.usefixtures("server_task_identity")
def test_an_actor_answers_each_message_of_a_group_from_its_own_node():
    """The actor's group call, without Ray: partitions of different sizes, given out of order;
    each reply is for its own message, from its own node, counts its own partition's examples."""
    from fedx.client.task import ClientTask  # pylint: disable=import-outside-toplevel
    from fedx.simulation.actor import ClientAppActor  # pylint: disable=import-outside-toplevel

    torch.manual_seed(0)
    record = ArrayRecord(build_model("cnn", (1, 8, 8), 10).state_dict())
    partitions = [1, 0, 3]  # 56, 169 and 79 examples of 12 partitions
    messages, contexts = [], []
    for partition in partitions:
        message = train_message(record, 100 + partition)
        message.metadata.__dict__["_message_id"] = f"message {partition}"  # as Flower's state does
        messages.append(message)
        context = node_context(partition, **{"local-epochs": 1})
        contexts.append(
            Context(1, 100 + partition, context.node_config, RecordDict(), context.run_config)
        )
    sizes = [len(ClientTask(m, c).training_data()) for m, c in zip(messages, contexts, strict=True)]
    assert len(set(sizes)) == len(sizes)
    actor = ClientAppActor.__ray_actor_class__()
    answers = actor.run_group(
        lambda: client_app.app,
        client_app.GROUP_HANDLER,
        messages,
        [str(p) for p in partitions],
        contexts,
    )
    for partition, size, context, (cid, reply, its_context) in zip(
        partitions, sizes, contexts, answers, strict=True
    ):
        assert cid == str(partition) and its_context is context
        assert isinstance(reply, Message) and not reply.has_error(), reply
        assert reply.metadata.reply_to_message_id == f"message {partition}"
        assert reply.metadata.src_node_id == 100 + partition
        assert reply.content["metrics"]["num-examples"] == size


# ----------------------------------------------------------------------
# The simulation's side: which messages go to which actor
# ----------------------------------------------------------------------


def stand_in(node: int, round_id: str = "3", kind: str = "train"):
    """What the collector reads of a message: its run, round and type."""
    metadata = SimpleNamespace(run_id=1, group_id=round_id, message_type=kind, dst_node_id=node)
    return SimpleNamespace(metadata=metadata)


def test_a_rounds_messages_are_split_into_one_group_per_actor():
    collector = GroupCollector(actors=lambda: 2, workers=lambda: 64, quiet=0.05)
    groups_seen, answers = [], {}

    def run_group(messages, contexts):
        groups_seen.append(sorted(m.metadata.dst_node_id for m in messages))
        return [
            (
                ValueError("bad node")
                if m.metadata.dst_node_id == 4
                else f"reply {m.metadata.dst_node_id}",
                c,
            )
            for m, c in zip(messages, contexts, strict=True)
        ]

    def run_one(message, context):
        groups_seen.append([message.metadata.dst_node_id])
        return f"reply {message.metadata.dst_node_id}", context

    def worker(node):
        try:
            answers[node] = collector.run(
                stand_in(node), f"context {node}", node, 10, run_group, run_one
            )
        except ValueError as err:
            answers[node] = err

    messages = [stand_in(node) for node in range(9)]
    for message in messages:  # the feeder hands them over: they are on their way
        collector.announce(message)
    threads = [threading.Thread(target=worker, args=(node,)) for node in reversed(range(9))]
    for thread in threads:
        thread.start()
        time.sleep(0.01)
    for thread in threads:
        thread.join(timeout=30)
    # 9 messages, 2 actors, groups of at most 10: two groups, in partition order, 5 and 4.
    assert sorted(groups_seen) == [[0, 1, 2, 3, 4], [5, 6, 7, 8]]
    assert {n: a for n, a in answers.items() if n != 4} == {
        n: (f"reply {n}", f"context {n}") for n in range(9) if n != 4
    }
    assert isinstance(answers[4], ValueError)  # its own error, nobody else's
    assert dict(collector.group_sizes) == {5: 1, 4: 1}


def test_groups_never_exceed_their_size_and_a_lone_message_runs_alone():
    collector = GroupCollector(actors=lambda: 1, workers=lambda: 64, quiet=0.02)
    seen = []

    def run_group(messages, contexts):
        seen.append(len(messages))
        return [("ok", c) for c in contexts]

    def run_one(message, context):
        seen.append(1)
        return "ok", context

    messages = [stand_in(n) for n in range(7)]
    for message in messages:  # announced: no batch closes for a slow thread's sake
        collector.announce(message)
    threads = [
        threading.Thread(target=collector.run, args=(m, None, n, 3, run_group, run_one))
        for n, m in enumerate(messages)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # 7 messages, one actor, groups of at most 3: three groups (a batch that fills one actor's
    # group runs at once, so the split is 3+3+1 or, where all 7 came before, 2+2+3).
    assert sum(seen) == 7 and len(seen) == 3 and max(seen) == 3
    seen.clear()
    collector.run(stand_in(1, round_id="4"), None, 1, 3, run_group, run_one)
    assert seen == [1]
