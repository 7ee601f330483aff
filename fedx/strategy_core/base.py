"""What every fedx strategy shares: run limits, random streams, checkpoint state, replies.

:class:`FedxStrategy` is the base of fedx's strategies (the pool strategies,
the personalized ones). It gives them, once:

* ``begin_run``: the run's last round and the timeout every exchange waits;
* the round loop (:meth:`FedxStrategy.start`, :func:`fedx.strategies.run_rounds`),
  able to resume a checkpointed run;
* named random streams spawned from one seed (:class:`RandomStreams`), whose
  states ``state_dict`` captures without a subclass listing them;
* the round in flight (:class:`RoundInFlight`): which node was sent what,
  matching replies to it, naming the nodes that did not answer;
* reading a reply's model and weight, or saying why it cannot be used.

What the round loop and the ServerApp ask of a strategy beyond Flower's
``Strategy`` is described by the protocols of
:mod:`fedx.strategy_core.capabilities`, so Flower's own strategies run through
the same code.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedx.arrays import to_numpy_dict
from fedx.checks import NON_NEGATIVE, POSITIVE, check
from fedx.messaging import wait_for_nodes
from fedx.ops import Model, find_problem
from fedx.strategy_core.rounds import run_rounds

Target = TypeVar("Target")

#: ``function(replies, weighted_by_key) -> MetricRecord``: how Flower's FedAvg
#: aggregates the MetricRecords of a round's replies (its ``*_metrics_aggr_fn``).
MetricsAggregation = Callable[[list[RecordDict], str], MetricRecord]


def to_model(record: ArrayRecord) -> Model:
    """Convert an ``ArrayRecord``, standard or packed, into ``{name: np.ndarray}``, keeping its
    order (:mod:`fedx.arrays`)."""
    return to_numpy_dict(record)


def to_arrayrecord(model: Model) -> ArrayRecord:
    """Convert ``{name: np.ndarray}`` into an ``ArrayRecord``, keeping its order."""
    return ArrayRecord({name: Array(array) for name, array in model.items()})


class RandomStreams:
    """Independent random generators, one per name, all spawned from one seed.

    The streams are independent so that, for example, the nodes sampled in a
    round do not depend on how many draws the method made before it; the
    same seed gives the same streams in every run.

    Parameters
    ----------
    seed : int, optional
        ``None`` draws fresh entropy (the run is then not reproducible).
    names : sequence of str
        The streams, in spawn order (the order decides each stream's seed).
    """

    def __init__(self, seed: int | None, names: Sequence[str]) -> None:
        children = np.random.SeedSequence(seed).spawn(len(names))
        self._generators = {
            name: np.random.default_rng(child) for name, child in zip(names, children, strict=True)
        }

    def __getitem__(self, name: str) -> np.random.Generator:
        return self._generators[name]

    def state(self) -> dict[str, Any]:
        """Every stream's bit-generator state, by name (JSON values)."""
        return {name: rng.bit_generator.state for name, rng in self._generators.items()}

    def restore(self, state: dict[str, Any]) -> None:
        """Put every stream back into a state :meth:`state` returned.

        Raises
        ------
        ValueError
            When a stream is missing or its state does not fit.
        """
        for name, rng in self._generators.items():
            if name not in state:
                raise ValueError(f"the strategy state lacks the random stream {name!r}")
            try:
                rng.bit_generator.state = state[name]
            except (TypeError, ValueError, KeyError) as err:
                raise ValueError(f"random stream {name!r}: {err}") from None


@dataclass
class Answered(Generic[Target]):
    """A reply to a message of the round in flight, from the node it went to."""

    node_id: int
    target: Target
    message: Message


@dataclass
class RoundInFlight(Generic[Target]):
    """One message exchange in flight: the messages sent, and what each node stands for.

    Parameters
    ----------
    server_round : int
        The round.
    targets : dict[int, Target]
        Node id -> what the node was sent for (a pool slot, a client...).
    messages : list[Message]
        The messages, one per node; the Grid sets their ids when it pushes
        them, which identify the replies the SuperLink writes on behalf of a
        node that went away.
    describe : callable
        ``describe(target)`` for log lines (``"slot 3"``).
    consequence : str
        What becomes of a target without a usable reply, for log lines.
    """

    server_round: int
    targets: dict[int, Target]
    messages: list[Message]
    describe: Callable[[Target], str] = str
    consequence: str = ""
    #: Nodes that did not answer (lost, or no reply in time), once :meth:`match` ran.
    unanswered: dict[int, Target] = field(default_factory=dict)

    def match(self, replies: Iterable[Message]) -> list[Answered[Target]]:
        """The replies of the nodes that were sent a message; the rest logged and left out.

        A reply the SuperLink wrote for a node that went away (an error not
        from the node) and a missing reply put the node in ``unanswered``;
        an error from the node itself is returned like any reply.
        """
        node_of_message = {
            m.metadata.message_id: m.metadata.dst_node_id
            for m in self.messages
            if m.metadata.message_id
        }
        waiting = dict(self.targets)
        answered: list[Answered[Target]] = []
        for message in replies:
            node_id = node_of_message.get(
                message.metadata.reply_to_message_id, message.metadata.src_node_id
            )
            if node_id not in waiting:
                log(
                    WARNING,
                    "Round %s: ignored a reply from node %s, which was not sent a message",
                    self.server_round,
                    node_id,
                )
                continue
            target = waiting.pop(node_id)
            if message.has_error() and message.metadata.src_node_id != node_id:
                log(
                    WARNING,
                    "Round %s: node %s (%s) is lost: %s%s",
                    self.server_round,
                    node_id,
                    self.describe(target),
                    message.error.reason,
                    self._then(),
                )
                self.unanswered[node_id] = target
                continue
            answered.append(Answered(node_id, target, message))
        for node_id, target in waiting.items():
            log(
                WARNING,
                "Round %s: no reply from node %s (%s) within the round timeout%s",
                self.server_round,
                node_id,
                self.describe(target),
                self._then(),
            )
            self.unanswered[node_id] = target
        return answered

    def dropped(self, answer: Answered[Target], reason: str) -> None:
        """Log that ``answer`` cannot be used, and why."""
        log(
            WARNING,
            "Round %s: dropped the reply of node %s (%s): %s%s",
            self.server_round,
            answer.node_id,
            self.describe(answer.target),
            reason,
            self._then(),
        )

    def _then(self) -> str:
        return f"; {self.consequence}" if self.consequence else ""


Sent = TypeVar("Sent")


class Handover(Generic[Sent]):
    """What ``configure_train`` sent, kept for the ``aggregate_train`` of the same round.

    :meth:`take` hands it over once, so an ``aggregate_train`` without a new
    ``configure_train`` fails instead of aggregating a stale round.
    """

    def __init__(self) -> None:
        #: What the last ``configure_train`` sent, until it is taken.
        self.sent: Sent | None = None

    def put(self, sent: Sent) -> None:
        """Keep what this round's ``configure_train`` sent."""
        self.sent = sent

    def take(self) -> Sent:
        """What this round's ``configure_train`` sent; it is no longer kept.

        Raises
        ------
        RuntimeError
            When ``configure_train`` sent nothing since the last :meth:`take`.
        """
        sent, self.sent = self.sent, None
        if sent is None:
            raise RuntimeError("aggregate_train needs configure_train to have sent the round")
        return sent


def read_weight(content: RecordDict, key: str) -> float | str:
    """The positive ``key`` metric of a reply's single MetricRecord, or why there is none."""
    records = list(content.metric_records.values())
    weight = records[0].get(key) if len(records) == 1 else None
    if (
        not isinstance(weight, (int, float))
        or isinstance(weight, bool)
        or not np.isfinite(weight)
        or weight <= 0
    ):
        return f"expected one MetricRecord with a positive '{key}', got {weight!r}"
    return float(weight)


def read_model(record: ArrayRecord, sent: Model) -> Model | str:
    """A reply's model, or why it cannot stand in for the model ``sent``.

    It must have the names of ``sent``, each with the same shape and dtype,
    and no NaN or infinity. What the record says of its arrays is checked
    against ``sent`` before any array is read (:func:`fedx.arrays.to_numpy_dict`),
    so that a hostile reply costs no more than a valid one.
    """
    try:
        model = to_numpy_dict(record, expected=sent)
    except Exception as err:  # pylint: disable=broad-exception-caught
        return f"arrays cannot be read: {err}"
    problem = find_problem(sent, model)
    return model if problem is None else problem


def read_reply(
    message: Message, sent: Model, arrayrecord_key: str, weight_key: str
) -> tuple[Model, float] | str:
    """A training reply's model and weight, or why the reply cannot be used.

    The reply must not be an error, must hold the ArrayRecord
    ``arrayrecord_key`` (or a single ArrayRecord of another name) fitting the
    model ``sent`` (:func:`read_model`) and one MetricRecord with a positive
    ``weight_key`` (:func:`read_weight`).
    """
    if message.has_error():
        return f"the node reported an error: {message.error.reason}"
    records = message.content.array_records
    record = records.get(arrayrecord_key)
    if record is None:
        if len(records) != 1:
            return f"expected one ArrayRecord ('{arrayrecord_key}'), got {list(records)}"
        record = next(iter(records.values()))
    weight = read_weight(message.content, weight_key)
    if isinstance(weight, str):
        return weight
    model = read_model(record, sent)
    return model if isinstance(model, str) else (model, weight)


class FedxStrategy(Strategy, Generic[Sent]):
    """Base of fedx's strategies: run limits, random streams, state, the round loop.

    ``FedxStrategy[Sent]``: ``Sent`` is what the strategy's ``configure_train``
    hands to its ``aggregate_train`` through :attr:`training`.

    Parameters
    ----------
    seed : int, optional
        Seeds every stream of :attr:`random_streams`. ``None`` draws fresh
        entropy; the run is then not reproducible.
    node_wait_timeout : float (default: 60.0)
        Seconds to wait for ``min_available_nodes`` before sampling among the
        nodes that are connected: a round never waits forever.
    **kwargs
        Passed on to the next class (Flower's ``FedAvg`` for most).
    """

    #: The random streams of the strategy, in spawn order (see :class:`RandomStreams`).
    random_streams: ClassVar[tuple[str, ...]] = ()

    #: Every model of a reply is read with :func:`to_model` (:func:`read_model`),
    #: which reads fedx's packed form too (:mod:`fedx.strategy_core.packing`).
    #: A subclass that reads a reply's arrays another way sets it False.
    reads_packed_models: ClassVar[bool] = True

    #: Set by the strategy's constructor (Flower's ``FedAvg`` sets it for its subclasses).
    min_available_nodes: int

    def __init__(
        self, *, seed: int | None = None, node_wait_timeout: float = 60.0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.seed = seed
        self.node_wait_timeout = check("node_wait_timeout", node_wait_timeout, NON_NEGATIVE)
        self.random = RandomStreams(seed, self.random_streams)
        #: The run's last round (``None`` until :meth:`begin_run`).
        self.num_rounds: int | None = None
        #: Seconds every message exchange of a round waits (Flower's default until :meth:`begin_run`).
        self.round_timeout = 3600.0
        #: What ``configure_train`` sent, for ``aggregate_train``.
        self.training: Handover[Sent] = Handover()

    def begin_run(self, *, num_rounds: int, timeout: float) -> None:
        """Learn the run's limits before round 1 (the round loop calls it).

        ``timeout`` bounds every message exchange of a round, the extra ones
        a strategy makes as well; ``num_rounds`` is the last round.
        """
        self.num_rounds = num_rounds
        self.round_timeout = check("timeout", timeout, POSITIVE)

    # ------------------------------------------------------------------
    # State: what a checkpoint holds
    # ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything the next round depends on, for a checkpoint.

        The random streams' states (``"rng"``) and :meth:`checkpoint_state`,
        as nested dicts and lists of JSON values and numpy arrays (see
        :mod:`fedx.strategy_core.checkpoint`). Taken between rounds, it makes a
        restored strategy continue exactly as the original would have.
        """
        return {**self.checkpoint_state(), "rng": self.random.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises
        ------
        ValueError
            When ``state`` lacks a part or does not fit the strategy.
        """
        if not isinstance(state, dict) or not isinstance(state.get("rng"), dict):
            raise ValueError("the strategy state lacks 'rng'")
        self.random.restore(state["rng"])
        self.restore_checkpoint_state(state)

    def checkpoint_state(self) -> dict[str, Any]:
        """The strategy's own state besides its random streams (none by default)."""
        return {}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`checkpoint_state` returned (``state`` also holds ``"rng"``)."""
        del state

    # ------------------------------------------------------------------
    # Running
    # ------------------------------------------------------------------

    # Flower's ``Strategy.start``, able to resume a checkpointed run and to
    # report every round: ``start_round``, ``result``, ``on_round_end`` and
    # ``guard`` as :func:`fedx.strategies.run_rounds` describes them.
    start = run_rounds

    def connected_nodes(self, grid: Grid) -> list[int]:
        """The connected nodes, after waiting at most ``node_wait_timeout`` for ``min_available_nodes``."""
        node_ids = wait_for_nodes(grid, self.min_available_nodes, self.node_wait_timeout)
        if len(node_ids) < self.min_available_nodes:
            log(
                WARNING,
                "Only %d of min_available_nodes=%d nodes connected after %.0fs; sampling among them",
                len(node_ids),
                self.min_available_nodes,
                self.node_wait_timeout,
            )
        return node_ids

    def evaluation_due(self, server_round: int, every: int) -> bool:
        """Whether to evaluate after ``server_round``: every ``every`` rounds, and the last."""
        return server_round % every == 0 or server_round == self.num_rounds

    def log_settings(self, title: str, settings: dict[str, Any]) -> None:
        """Log a block of the strategy's settings under ``title`` (for :meth:`summary`)."""
        log(INFO, "\t├──> %s:", title)
        items = list(settings.items())
        for index, (name, value) in enumerate(items):
            log(INFO, "\t│\t%s── %s: %s", "└" if index == len(items) - 1 else "├", name, value)


__all__ = [
    "Answered",
    "FedxStrategy",
    "MetricsAggregation",
    "RandomStreams",
    "RoundInFlight",
    "read_model",
    "read_reply",
    "read_weight",
    "to_arrayrecord",
    "to_model",
]
