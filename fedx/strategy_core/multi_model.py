"""Base class for strategies that train a pool of models, one per sampled node."""

import time
from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedx.checks import FRACTION, NON_NEGATIVE, ArgumentError, Integer, OneOf, check
from fedx.ops import Model, average
from fedx.secure.relay import RelayStats
from fedx.strategy_core.base import (
    FedxStrategy,
    MetricsAggregation,
    RoundInFlight,
    read_reply,
    to_arrayrecord,
    to_model,
)
from fedx.strategy_core.keys import POOL_MEANS
from fedx.strategy_core.secure import SecureRecombination


@dataclass(frozen=True)
class PoolRound:
    """The models of one round, one per pool slot, as :meth:`MultiModelStrategy.update_pool` gets them.

    Attributes
    ----------
    server_round : int
        The round, from 1.
    models : list[Model]
        One model per slot: the trained model where the slot's node replied
        validly, else the model it was sent (``trained`` False).
    weights : list[float]
        The replies' ``weighted_by_key`` values (0.0 where not trained).
    trained : list[bool]
        Which slots hold a model trained this round (at least one does).
    """

    server_round: int
    models: list[Model]
    weights: list[float]
    trained: list[bool]

    def trained_models(self) -> tuple[list[Model], list[float]]:
        """The models trained this round and their weights."""
        pairs = [
            (m, w) for m, w, ok in zip(self.models, self.weights, self.trained, strict=True) if ok
        ]
        return [m for m, _ in pairs], [w for _, w in pairs]


# pylint: disable=too-many-instance-attributes
class MultiModelStrategy(FedxStrategy[RoundInFlight[int]], FedAvg):
    """A strategy that sends a different model to every sampled node.

    The server keeps a pool of K models (docs/methods.md, "The multi-model
    round"). Each round it samples up to K nodes, pairs each with a pool slot
    (:meth:`assign_slots`) and sends it that slot's model; a slot whose node
    failed or sent an invalid reply (logged, never aggregated) keeps the
    model it was sent. A subclass computes the next pool (:meth:`update_pool`,
    given a :class:`PoolRound`); the global model (:meth:`global_model`) is
    what Flower's centralized and federated evaluation see, as in FedAvg.

    Its arguments are Flower's FedAvg's (sampling, record keys, metric
    aggregation), :class:`~fedx.strategies.FedxStrategy`'s (``seed``,
    ``node_wait_timeout``) and the pool's own below; a method that derives
    from it adds its own in front of them.

    Parameters
    ----------
    fraction_train : float (default: 1.0)
        Fraction of connected nodes sampled for training. With
        ``min_train_nodes`` it fixes K, the pool size, in the first round,
        unless ``num_models`` sets K.
    min_train_nodes : int (default: 2)
        Minimum number of nodes sampled for training.
    min_available_nodes : int (default: 2)
        Number of connected nodes to wait for (at most ``node_wait_timeout``
        seconds) before sampling.
    weighted_by_key : str (default: "num-examples")
        Key of the reply's MetricRecord that every reply must carry (a
        positive number); it weights averages when ``pool_mean`` is
        ``"weighted"``.
    num_models : int, optional
        K, the number of models in the pool. ``None`` (default; run config:
        0) takes the number of nodes sampled in round 1: ``fraction_train``
        of the connected nodes, at least ``min_train_nodes``. Each round
        samples at most K nodes; with fewer, a random subset of the K models
        trains that round.
    pool_mean : {"uniform", "weighted"} (default: "uniform")
        How the method averages a round's models (the global model, and any
        mean the method takes: a first stage, the centre of mutations, see
        :meth:`round_mean`): the plain mean of the K models, as the authors'
        code computes it, or the trained ones weighted by
        ``weighted_by_key`` (not with secure recombination). With skewed
        partitions the weighted mean follows a few large clients (a mutation
        around it diverges where one around the plain mean does not).
    unresponsive_cooldown : float (default: 60.0)
        Seconds a node that sent no reply in a round (or for which the
        SuperLink answered that it is unavailable) is left out of sampling
        while the SuperLink still lists it as connected. A SuperNode that
        dies without saying goodbye stays listed until it has missed two
        30-second heartbeats, so the default bridges exactly that gap; a
        node that left is then gone from the list anyway, and one that was
        only slow is sampled again. It is only skipped while enough other
        nodes are connected.
    secure : SecureRecombination, optional
        Let the clients exchange layers among themselves before they upload
        (:mod:`fedx.strategy_core.secure`); the ClientApp must support it.
        Needs ``pool_mean="uniform"``: an uploaded model then mixes several
        clients' layers, so no reply's weight belongs to it.
    """

    random_streams = ("sampling", "method", "evaluation")

    # pylint: disable=too-many-arguments,too-many-locals
    def __init__(
        self,
        *,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggregation | None = None,
        evaluate_metrics_aggr_fn: MetricsAggregation | None = None,
        seed: int | None = None,
        node_wait_timeout: float = 60.0,
        num_models: int | None = None,
        pool_mean: str = "uniform",
        unresponsive_cooldown: float = 60.0,
        secure: SecureRecombination | None = None,
    ) -> None:
        super().__init__(
            seed=seed,
            node_wait_timeout=node_wait_timeout,
            fraction_train=check("fraction_train", fraction_train, FRACTION),
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self.num_models = (
            None if num_models is None else check("num_models", num_models, Integer(1))
        )
        self.pool_mean = check("pool_mean", pool_mean, OneOf(POOL_MEANS))
        self.unresponsive_cooldown = check(
            "unresponsive_cooldown", unresponsive_cooldown, NON_NEGATIVE
        )
        if secure is not None and pool_mean == "weighted":
            raise ArgumentError(
                "pool_mean",
                pool_mean,
                "'uniform' with secure recombination (an uploaded model "
                "mixes several clients' layers)",
            )
        self.secure = secure
        #: What the last round's secure exchange cost (None before the first, or without it).
        self.relay_stats: RelayStats | None = None
        self.pool: list[Model] = []
        self._grid: Grid | None = None
        # Nodes that missed a reply: node id -> (round, monotonic time).
        self._unresponsive: dict[int, tuple[int, float]] = {}

    @property
    def rng(self) -> np.random.Generator:
        """The method's random stream (separate from node sampling and evaluation)."""
        return self.random["method"]

    # ------------------------------------------------------------------
    # What a method defines
    # ------------------------------------------------------------------

    @abstractmethod
    def update_pool(self, trained: PoolRound) -> list[Model]:
        """Compute the next pool from this round's models.

        Returns
        -------
        list[Model]
            K models. They may share arrays with ``trained.models``; nobody
            writes into pool arrays.
        """

    def global_model(self, trained: PoolRound, pool: list[Model]) -> Model:
        """Return the deployment model of this round.

        By default :meth:`round_mean`; ``pool`` is the new pool.
        """
        del pool
        return self.round_mean(trained)

    def round_mean(self, trained: PoolRound) -> Model:
        """The mean of this round's models, as ``pool_mean`` says.

        ``"uniform"``: the plain mean of the K slot models, each the trained
        model where its node replied validly and the model it was sent where
        not, as the authors' ``Aggregation(w_locals, None)`` averages their
        list of K models. A slot that did not train thus pulls the mean
        towards where it was, which keeps a mutation around the mean centred
        when only some nodes reply. ``"weighted"``: FedAvg's rule, the models
        trained this round weighted by ``weighted_by_key``, the others left
        out.
        """
        if self.pool_mean == "uniform":
            return average(trained.models)
        models, weights = trained.trained_models()
        return average(models, weights)

    def assign_slots(self, num_nodes: int) -> list[int]:
        """Return the pool slot of each of ``num_nodes`` sampled nodes.

        Node i gets slot i when all K slots are used; when fewer nodes than K
        are available, a random subset of the slots is trained.
        """
        num_slots = len(self.pool)
        if num_nodes >= num_slots:
            return list(range(num_slots))
        chosen = self.rng.choice(num_slots, size=num_nodes, replace=False)
        return sorted(int(slot) for slot in chosen)

    # ------------------------------------------------------------------
    # State: what a checkpoint holds besides the random streams
    # ------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """The pool and the pool size (subclasses with more state extend it)."""
        return {"num-models": self.num_models, "pool": [dict(model) for model in self.pool]}

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore the pool; its size must be ``num-models``."""
        try:
            num_models = state["num-models"]
            pool = [dict(model) for model in state["pool"]]
        except (KeyError, TypeError) as err:
            raise ValueError(f"the strategy state lacks {err}") from None
        if pool and num_models != len(pool):
            raise ValueError(f"the state has {len(pool)} pool models for num-models={num_models}")
        self.num_models = num_models
        self.pool = pool

    # ------------------------------------------------------------------
    # Flower Strategy interface
    # ------------------------------------------------------------------

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        secure = self.secure
        self.log_settings(
            "Multi-model pool",
            {
                "Models (K)": self.num_models or "nodes sampled in round 1",
                "Mean of a round's models": self.pool_mean,
                "Seed": self.seed,
                "Node wait timeout": f"{self.node_wait_timeout:.0f}s",
                "Unresponsive-node cooldown": f"{self.unresponsive_cooldown:.0f}s",
                "Secure recombination": (
                    f"r_s={secure.repeats}, n in [{secure.min_layers}, {secure.max_layers}]"
                    if secure
                    else "off"
                ),
            },
        )
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send every sampled node the model of its pool slot."""
        sample_size = self.num_models or len(self.pool) or None
        node_ids = self._sample_nodes(
            grid, self.fraction_train, self.min_train_nodes, self.random["sampling"], sample_size
        )
        if not self.pool:
            if not node_ids:
                return []
            initial = to_model(arrays)
            self.num_models = self.num_models or len(node_ids)
            self.pool = [initial] * self.num_models
            node_ids = node_ids[: self.num_models]
        slots = self.assign_slots(len(node_ids))
        config["server-round"] = server_round
        if self.secure is not None:
            self._grid = grid
            self.secure.ask(config)
        log(
            INFO,
            "configure_train: %d nodes get %d different pool models (K=%d)",
            len(node_ids),
            len(set(slots)),
            len(self.pool),
        )
        targets = dict(zip(node_ids, slots, strict=True))
        messages = [
            Message(
                content=RecordDict(
                    {
                        self.arrayrecord_key: to_arrayrecord(self.pool[slot]),
                        self.configrecord_key: config,
                    }
                ),
                message_type=MessageType.TRAIN,
                dst_node_id=node_id,
            )
            for node_id, slot in targets.items()
        ]
        self.training.put(
            RoundInFlight(
                server_round,
                targets,
                messages,
                describe=lambda slot: f"slot {slot}",
                consequence="the slot keeps the model it was sent",
            )
        )
        return list(messages)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Map replies to slots, drop invalid ones, update the pool.

        With secure recombination the training replies carry public keys
        only; the exchange turns them into upload replies first, which then
        go through the usual validation.
        """
        in_flight = self.training.take()
        if self.secure is not None:
            assert self._grid is not None  # set by configure_train
            replies, self.relay_stats = self.secure.exchange(
                self._grid, server_round, replies, self.round_timeout
            )
        models = list(self.pool)
        weights = [0.0] * len(self.pool)
        trained = [False] * len(self.pool)
        accepted: list[tuple[int, RecordDict]] = []
        for answer in in_flight.match(replies):
            parsed = read_reply(
                answer.message, self.pool[answer.target], self.arrayrecord_key, self.weighted_by_key
            )
            if isinstance(parsed, str):
                in_flight.dropped(answer, parsed)
                continue
            models[answer.target], weights[answer.target] = parsed
            trained[answer.target] = True
            accepted.append((answer.target, answer.message.content))
        now = time.monotonic()
        for node_id in in_flight.unanswered:
            self._unresponsive[node_id] = (server_round, now)
        log(INFO, "aggregate_train: %d of %d slots trained this round", sum(trained), len(trained))
        if not accepted:
            return None, None

        start = time.perf_counter()
        this_round = PoolRound(server_round, models, weights, trained)
        pool = self.update_pool(this_round)
        if len(pool) != len(self.pool):
            raise RuntimeError(
                f"update_pool returned {len(pool)} models for {len(self.pool)} slots"
            )
        deployment = self.global_model(this_round, pool)
        self.pool = pool
        # The clients' metrics in slot order, not in the order their replies
        # came: the sums, and so a seeded run's metrics, are the same bit for bit.
        by_slot = [content for _, content in sorted(accepted, key=lambda item: item[0])]
        metrics = self.train_metrics_aggr_fn(by_slot, self.weighted_by_key)
        metrics["pool-update-seconds"] = time.perf_counter() - start
        metrics["trained-slots"] = sum(trained)
        if self.secure is not None and self.relay_stats is not None:
            self.secure.add_metrics(metrics, self.relay_stats)
        return to_arrayrecord(deployment), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the global model to sampled nodes for federated evaluation."""
        if self.fraction_evaluate == 0.0:
            return []
        node_ids = self._sample_nodes(
            grid, self.fraction_evaluate, self.min_evaluate_nodes, self.random["evaluation"], None
        )
        config["server-round"] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, node_ids, MessageType.EVALUATE)

    # ------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------

    # pylint: disable=too-many-arguments
    def _sample_nodes(
        self,
        grid: Grid,
        fraction: float,
        min_nodes: int,
        rng: np.random.Generator,
        at_most: int | None,
    ) -> list[int]:
        """Sample nodes after waiting a bounded time for ``min_available_nodes``.

        The generator draws positions in the grid's node list, so the same
        seed samples the same nodes whenever the grid lists them in the same
        order (fedx's ServerApp lists them by client id: see
        :class:`~fedx.strategy_core.client_identity.ClientOrderedGrid`). Nodes
        that recently missed a reply are left out while enough others are
        connected (see ``unresponsive_cooldown``). Node ids are unsigned 64-bit
        integers and never pass through a numpy array.
        """
        node_ids = self._responsive(self.connected_nodes(grid), min_nodes)
        size = max(int(len(node_ids) * fraction), min_nodes)
        size = min(size, len(node_ids), at_most or len(node_ids))
        positions = rng.choice(len(node_ids), size=size, replace=False)
        return [node_ids[int(position)] for position in positions]

    def _responsive(self, node_ids: list[int], min_nodes: int) -> list[int]:
        """``node_ids`` without the nodes that missed a reply within the cooldown."""
        now = time.monotonic()
        connected = set(node_ids)
        self._unresponsive = {
            node: (missed, since)
            for node, (missed, since) in self._unresponsive.items()
            if node in connected and now - since < self.unresponsive_cooldown
        }
        responsive = [node for node in node_ids if node not in self._unresponsive]
        if not self._unresponsive or len(responsive) < max(min_nodes, 1):
            return node_ids
        for node, (missed, _) in self._unresponsive.items():
            log(
                INFO,
                "Leaving out node %s: no reply in round %s, though still listed as connected",
                node,
                missed,
            )
        return responsive
