"""A client group's training messages answered together: the simulation actor's side of client groups.

Where the run config's ``client-group-size`` is above 1, fedx's simulation
backend hands one actor several training messages of a round at once
(:mod:`fedx.simulation.groups`), and the actor calls :func:`train_group`
with them. The clients that can be batched (the same architecture and
training settings, a model :func:`fedx.group_training.batching_obstacle`
accepts) train as one batched step (:func:`fedx.group_training.train_group`),
each reply what :func:`fedx.client.handlers.train_model` would have sent for
it alone, within float rounding. The others train one by one through the
ClientApp, with one log line that says why: a method that trains its own way
(mutual learning of two models, clients of mixed architectures), a
secure-recombination round (the model stays on the node), a model ``vmap``
cannot batch (the LSTM). A batched step that fails turns groups off for its
model in this process, with one WARNING and the traceback: its clients, those
of that step and of every later round, train one by one.
"""

import contextlib
from collections.abc import Callable, Sequence
from logging import INFO, WARNING

from flwr.app import ArrayRecord, Context, Message, MetricRecord
from flwr.common import log

from fedx.arrays import to_numpy_dict
from fedx.client.task import ClientTask
from fedx.group_training import ClientRandom, GroupMember, batching_obstacle, train_group
from fedx.protocol.common import ARRAYS, METRICS, NUM_EXAMPLES, PROXIMAL_MU, TRAIN_LOSS
from fedx.secure.client import is_secure_round

#: Answers one message through the ClientApp (the actor's own call).
Alone = Callable[[Message, Context], Message]
#: What a message of the group gets: its reply, or the error its training raised.
Outcome = Message | Exception

_logged: set[str] = set()
#: Models whose batched step failed in this process: their clients train one by one.
_failed: dict[str, str] = {}


def train_messages(
    messages: Sequence[Message], contexts: Sequence[Context], alone: Alone
) -> list[Outcome]:
    """Answer a group's training messages: those that batch together as one step, the rest alone.

    Parameters
    ----------
    messages, contexts : sequences of the same length
        The group's training messages and their nodes' contexts.
    alone : callable
        Answers one message as the ClientApp does.

    Returns
    -------
    list
        Per message, in order: its reply, or the exception its training raised.
    """
    outcomes: list[Outcome | None] = [None] * len(messages)
    together: dict[tuple, list[int]] = {}
    one_by_one: dict[str, list[int]] = {}
    for index, (message, context) in enumerate(zip(messages, contexts, strict=True)):
        try:
            task = ClientTask(message, context)
            reason = _why_alone(task)
        except Exception as err:  # pylint: disable=broad-exception-caught  (its own reply)
            outcomes[index] = err
            continue
        if reason is None:
            together.setdefault(_settings(task), []).append(index)
        else:
            one_by_one.setdefault(reason, []).append(index)
    for settings, indices in together.items():
        if len(indices) == 1:
            one_by_one.setdefault("", []).extend(indices)
            continue
        try:
            replies = _train_together(
                [messages[i] for i in indices], [contexts[i] for i in indices]
            )
        except Exception as err:  # pylint: disable=broad-exception-caught
            model = settings[0]  # _settings: the model first
            _failed[model] = f"{type(err).__name__}: {err}"
            log(
                WARNING,
                "fedx client groups: the batched step of model %s failed; its clients train "
                "one by one from now on",
                model,
                exc_info=True,
            )
            one_by_one.setdefault("", []).extend(indices)
            continue
        for i, reply in zip(indices, replies, strict=True):
            outcomes[i] = reply
    for reason, indices in one_by_one.items():
        if reason and reason not in _logged:
            _logged.add(reason)
            log(INFO, "fedx client groups: %d client(s) train one by one: %s", len(indices), reason)
        for i in indices:
            try:
                outcomes[i] = alone(messages[i], contexts[i])
            except Exception as err:  # pylint: disable=broad-exception-caught
                outcomes[i] = err
    assert all(outcome is not None for outcome in outcomes)
    return outcomes  # type: ignore[return-value]


def _why_alone(task: ClientTask) -> str | None:
    """Why this message's client cannot join a batched step; ``None`` when it can."""
    method = task.config.method
    if method.client_train is not None:
        return f"{method.name} trains its clients its own way ({method.client_train})"
    if is_secure_round(task.message):
        return "secure recombination keeps each trained model on its node"
    if task.training.local_epochs < 1:
        return ""
    if task.config.model in _failed:
        return f"model {task.config.model}: its batched step failed ({_failed[task.config.model]})"
    obstacle = _obstacle(task)
    return None if obstacle is None else f"model {task.config.model}: {obstacle}"


def _obstacle(task: ClientTask) -> str | None:
    from fedx.client.skeletons import SKELETONS  # pylint: disable=import-outside-toplevel
    from fedx.data import dataset_info  # pylint: disable=import-outside-toplevel

    info = dataset_info(task.config.dataset)
    model = SKELETONS.borrow(task.config.model, info.input_shape, info.num_classes)
    try:
        return batching_obstacle(model)
    finally:
        SKELETONS.give_back(model, task.config.model, info.input_shape, info.num_classes)


def _settings(task: ClientTask) -> tuple:
    """What the members of one batched step share: architecture, device and training settings."""
    return (
        task.config.model,
        str(task.device),
        task.config.deterministic,
        task.training.local_epochs,
        task.training.batch_size,
        tuple(sorted(task.sgd().items())),
        float(task.round_config.get(PROXIMAL_MU, 0.0)),
    )


def _train_together(messages: Sequence[Message], contexts: Sequence[Context]) -> list[Message]:
    """The messages' clients trained as one batched step; their replies, as ``train_model``'s."""
    with contextlib.ExitStack() as stack:
        tasks = [
            stack.enter_context(ClientTask(m, c)) for m, c in zip(messages, contexts, strict=True)
        ]
        first = tasks[0]
        members, sizes = [], []
        for task in tasks:
            # As train_model does alone: seed, the data, the batches; the draws start in training.
            task.seed_torch()
            dataset = task.training_data()
            batches = task.train_loader(dataset)
            weights = to_numpy_dict(task.message.content.array_records[ARRAYS])
            members.append(GroupMember(weights, batches, ClientRandom.capture(task.device)))
            sizes.append(len(dataset))
        skeleton = first.model(first.config.model, first.message.content.array_records[ARRAYS])
        results = train_group(
            skeleton,
            members,
            epochs=first.training.local_epochs,
            proximal_mu=float(first.round_config.get(PROXIMAL_MU, 0.0)),
            device=first.device,
            **first.sgd(),
        )
        replies = []
        for task, result, size in zip(tasks, results, sizes, strict=True):
            arrays = ArrayRecord({name: value.cpu() for name, value in result.state.items()})
            metrics = MetricRecord({NUM_EXAMPLES: size, TRAIN_LOSS: result.train_loss})
            replies.append(task.reply({ARRAYS: arrays, METRICS: metrics}))
        return replies
