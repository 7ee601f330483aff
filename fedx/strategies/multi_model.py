"""Base class for strategies that train a pool of models, one per sampled node."""

import time
from abc import abstractmethod
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result

from fedx.ops import Model, average, find_problem
from fedx.strategies.rounds import EvaluateFn, RoundEndFn, run_rounds


#: How a multi-model method averages the models of a round into one model:
#: ``"uniform"``, the plain mean (the authors' code for FedMR, FedMut and
#: FedCross), or ``"weighted"`` by each reply's ``weighted_by_key``.
POOL_MEANS: tuple[str, ...] = ("uniform", "weighted")


def to_model(record: ArrayRecord) -> Model:
    """Convert an ``ArrayRecord`` into ``{name: np.ndarray}``, keeping its order."""
    return {name: array.numpy() for name, array in record.items()}


def to_arrayrecord(model: Model) -> ArrayRecord:
    """Convert ``{name: np.ndarray}`` into an ``ArrayRecord``, keeping its order."""
    return ArrayRecord({name: Array(array) for name, array in model.items()})


# pylint: disable=too-many-instance-attributes
class MultiModelStrategy(FedAvg):
    """A strategy that sends a different model to every sampled node.

    The server keeps a pool of K models. Each round it samples up to K nodes
    (seeded), pairs every sampled node with a pool slot (:meth:`assign_slots`),
    sends each node its slot's model in its own message, and maps the replies
    back to the slots. A slot whose node failed, timed out or replied with
    arrays that do not fit the model it was sent (other names, shapes or
    dtypes, NaN or Inf, no usable weight) keeps its dispatched model; such
    replies are logged with the node id and never aggregated. A subclass then
    computes the next pool from the round's models (:meth:`update_pool`), and
    the strategy reports a global model (:meth:`global_model`, by default the
    mean of the round's models, see ``pool_mean``) to Flower. The
    global model is what centralized and federated evaluation see; the pool
    is what training uses.

    Federated evaluation works as in FedAvg, on the global model.

    Parameters
    ----------
    fraction_train : float (default: 1.0)
        Fraction of connected nodes sampled for training. With ``min_train_nodes``
        it fixes K, the pool size, in the first round.
    fraction_evaluate : float (default: 1.0)
        Fraction of connected nodes sampled for federated evaluation.
    min_train_nodes : int (default: 2)
        Minimum number of nodes sampled for training.
    min_evaluate_nodes : int (default: 2)
        Minimum number of nodes sampled for federated evaluation.
    min_available_nodes : int (default: 2)
        Number of connected nodes to wait for (at most ``node_wait_timeout``
        seconds) before sampling.
    weighted_by_key : str (default: "num-examples")
        Key of the reply's MetricRecord that every reply must carry (a
        positive number); it weights averages when ``pool_mean`` is
        ``"weighted"``.
    arrayrecord_key : str (default: "arrays")
        Key of the ArrayRecord in the messages.
    configrecord_key : str (default: "config")
        Key of the ConfigRecord in the messages.
    train_metrics_aggr_fn : callable, optional
        Aggregates the MetricRecords of the accepted training replies, as in
        FedAvg.
    evaluate_metrics_aggr_fn : callable, optional
        Aggregates the MetricRecords of federated evaluation, as in FedAvg.
    num_models : int, optional
        Pool size K. ``None`` takes the number of nodes sampled in round 1.
    pool_mean : {"uniform", "weighted"} (default: "uniform")
        How the method averages the round's models (the global model, FedMR's
        first stage, FedMut's ``w_glb``): their plain mean, as the authors'
        code computes it, or weighted by ``weighted_by_key``. With skewed
        partitions the weighted mean follows a few large clients; FedMut's
        mutation of it diverges where the plain mean does not.
    seed : int, optional
        Seed of node sampling and of the method's randomness. ``None`` draws
        fresh entropy; the run is then not reproducible.
    node_wait_timeout : float (default: 60.0)
        Seconds to wait for ``min_available_nodes`` before sampling among the
        nodes that are connected. The round never waits forever.
    unresponsive_cooldown : float (default: 60.0)
        Seconds a node that sent no reply in a round (or for which the
        SuperLink answered that it is unavailable) is left out of sampling
        while the SuperLink still lists it as connected. A SuperNode that
        dies without saying goodbye stays listed until it has missed two
        30-second heartbeats, so the default bridges exactly that gap; a
        node that left is then gone from the list anyway, and one that was
        only slow is sampled again. It is only skipped while enough other
        nodes are connected.
    """

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
        train_metrics_aggr_fn: (
            Callable[[list[RecordDict], str], MetricRecord] | None
        ) = None,
        evaluate_metrics_aggr_fn: (
            Callable[[list[RecordDict], str], MetricRecord] | None
        ) = None,
        num_models: int | None = None,
        pool_mean: str = "uniform",
        seed: int | None = None,
        node_wait_timeout: float = 60.0,
        unresponsive_cooldown: float = 60.0,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
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
        if not 0.0 < fraction_train <= 1.0:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        if num_models is not None and num_models < 1:
            raise ValueError(f"num_models must be at least 1, got {num_models}")
        if unresponsive_cooldown < 0:
            raise ValueError(f"unresponsive_cooldown must be >= 0, got {unresponsive_cooldown}")
        if pool_mean not in POOL_MEANS:
            raise ValueError(f"pool_mean must be one of {POOL_MEANS}, got {pool_mean!r}")
        self.num_models = num_models
        self.pool_mean = pool_mean
        self.seed = seed
        self.node_wait_timeout = node_wait_timeout
        self.unresponsive_cooldown = unresponsive_cooldown
        # Separate streams, so that the nodes sampled in a round do not depend
        # on how much randomness the method or evaluation used before it:
        # strategies run with the same seed sample the same nodes.
        sampling, method, evaluation = np.random.SeedSequence(seed).spawn(3)
        self.sampling_rng = np.random.default_rng(sampling)
        self.rng = np.random.default_rng(method)
        self.evaluate_rng = np.random.default_rng(evaluation)
        self.pool: list[Model] = []
        self.round_timeout = 3600.0  # Flower's default; begin_run() sets the run's
        # The round in flight: node id -> pool slot, and the messages sent
        # (their ids, set by the Grid when it pushes them, identify replies
        # the SuperLink writes on behalf of a node that went away).
        self._dispatched: dict[int, int] = {}
        self._sent: list[Message] = []
        # Nodes that missed a reply: node id -> (round, monotonic time).
        self._unresponsive: dict[int, tuple[int, float]] = {}

    # ------------------------------------------------------------------
    # What a method defines
    # ------------------------------------------------------------------

    @abstractmethod
    def update_pool(
        self,
        server_round: int,
        models: list[Model],
        weights: list[float],
        trained: list[bool],
    ) -> list[Model]:
        """Compute the next pool from this round's models.

        Parameters
        ----------
        server_round : int
            The round, from 1.
        models : list[Model]
            One model per slot: the trained model where the slot's node
            replied validly, else the model it was sent (``trained`` False).
        weights : list[float]
            The replies' ``weighted_by_key`` values (0.0 where not trained).
        trained : list[bool]
            Which slots hold a model trained this round (at least one does).

        Returns
        -------
        list[Model]
            K models. They may share arrays with ``models``; nobody writes
            into pool arrays.
        """

    def global_model(
        self,
        server_round: int,
        models: list[Model],
        weights: list[float],
        trained: list[bool],
        pool: list[Model],
    ) -> Model:
        """Return the deployment model of this round.

        By default :meth:`round_mean`. Arguments as in :meth:`update_pool`;
        ``pool`` is the new pool.
        """
        del server_round, pool
        return self.round_mean(models, weights, trained)

    def round_mean(self, models: list[Model], weights: list[float], trained: list[bool]) -> Model:
        """The mean of this round's models, as ``pool_mean`` says.

        ``"uniform"``: the plain mean of the K slot models, each the trained
        model where its node replied validly and the model it was sent where
        not, as the authors' ``Aggregation(w_locals, None)`` averages their
        list of K models. A slot that did not train thus pulls the mean
        towards where it was, which keeps FedMut's mutations centred when
        only some nodes reply. ``"weighted"``: FedAvg's rule, the models
        trained this round weighted by ``weighted_by_key``, the others left
        out. Arguments as in :meth:`update_pool`; at least one slot is trained.
        """
        if self.pool_mean == "uniform":
            return average(models)
        fresh = [(m, w) for m, w, ok in zip(models, weights, trained, strict=True) if ok]
        return average([m for m, _ in fresh], [w for _, w in fresh])

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
    # State: what a checkpoint holds
    # ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return everything the next round depends on, for a checkpoint.

        The pool, the pool size and the states of the three random
        generators (node sampling, the method's draws, evaluation sampling),
        as nested dicts and lists of JSON values and numpy arrays (see
        :mod:`fedx.strategies.checkpoint`). Subclasses with more state extend
        it. Taken between rounds, it makes a restored strategy continue
        exactly as the original would have.
        """
        return {
            "num-models": self.num_models,
            "pool": [dict(model) for model in self.pool],
            "rng": {
                "sampling": self.sampling_rng.bit_generator.state,
                "method": self.rng.bit_generator.state,
                "evaluation": self.evaluate_rng.bit_generator.state,
            },
        }

    def begin_run(self, *, num_rounds: int, timeout: float) -> None:
        """Learn the run's limits before round 1 (called by :func:`run_rounds`).

        ``timeout`` bounds every message exchange of a round, the extra ones
        a subclass makes as well.
        """
        del num_rounds
        self.round_timeout = timeout

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises
        ------
        ValueError
            When ``state`` lacks a part or its pool does not have
            ``num-models`` models.
        """
        try:
            num_models = state["num-models"]
            pool = [dict(model) for model in state["pool"]]
            generators = state["rng"]
            self.sampling_rng.bit_generator.state = generators["sampling"]
            self.rng.bit_generator.state = generators["method"]
            self.evaluate_rng.bit_generator.state = generators["evaluation"]
        except (KeyError, TypeError) as err:
            raise ValueError(f"the strategy state lacks {err}") from None
        if pool and num_models != len(pool):
            raise ValueError(f"the state has {len(pool)} pool models for num-models={num_models}")
        self.num_models = num_models
        self.pool = pool

    # ------------------------------------------------------------------
    # Flower Strategy interface
    # ------------------------------------------------------------------

    # pylint: disable=too-many-arguments
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: EvaluateFn | None = None,
        *,
        start_round: int = 1,
        result: Result | None = None,
        on_round_end: RoundEndFn | None = None,
    ) -> Result:
        """Run the strategy, as Flower's ``Strategy.start``, optionally resumed.

        Parameters are those of Flower's ``Strategy.start``, plus:

        start_round : int (default: 1)
            First round to run. To continue a checkpointed run, restore the
            strategy with :meth:`load_state_dict`, pass the checkpoint's global
            arrays as ``initial_arrays`` and its round + 1 here.
        result : Result, optional
            Metrics of the rounds already done, extended by the new rounds.
        on_round_end : callable, optional
            ``on_round_end(round, arrays, result)`` after every round; write
            checkpoints there (see :func:`fedx.strategies.run_rounds`).
        """
        return run_rounds(
            self,
            grid,
            arrays=initial_arrays,
            num_rounds=num_rounds,
            first_round=start_round,
            timeout=timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=evaluate_fn,
            result=result,
            on_round_end=on_round_end,
        )

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> Multi-model pool:")
        log(INFO, "\t│\t├── Models (K): %s", self.num_models or "nodes sampled in round 1")
        log(INFO, "\t│\t├── Mean of a round's models: %s", self.pool_mean)
        log(INFO, "\t│\t├── Seed: %s", self.seed)
        log(INFO, "\t│\t├── Node wait timeout: %.0fs", self.node_wait_timeout)
        log(INFO, "\t│\t└── Unresponsive-node cooldown: %.0fs", self.unresponsive_cooldown)
        super().summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send every sampled node the model of its pool slot."""
        sample_size = self.num_models or len(self.pool) or None
        node_ids = self._sample_nodes(
            grid, self.fraction_train, self.min_train_nodes, self.sampling_rng, sample_size
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
        self._dispatched = dict(zip(node_ids, slots, strict=True))
        log(
            INFO,
            "configure_train: %d nodes get %d different pool models (K=%d)",
            len(node_ids),
            len(set(slots)),
            len(self.pool),
        )
        self._sent = [
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
            for node_id, slot in self._dispatched.items()
        ]
        return list(self._sent)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Map replies to slots, drop invalid ones, update the pool."""
        models = list(self.pool)
        weights = [0.0] * len(self.pool)
        trained = [False] * len(self.pool)
        accepted: list[RecordDict] = []
        node_of_message = {
            m.metadata.message_id: m.metadata.dst_node_id for m in self._sent if m.metadata.message_id
        }
        for message in replies:
            # A reply the SuperLink wrote for a node that went away comes from
            # the SuperLink, not from the node: find the node by message id.
            node_id = node_of_message.get(
                message.metadata.reply_to_message_id, message.metadata.src_node_id
            )
            slot = self._dispatched.pop(node_id, None)
            if slot is None:
                log(WARNING, "Round %s: ignored a reply from node %s, which was not sent a model", server_round, node_id)
                continue
            if message.has_error() and message.metadata.src_node_id != node_id:
                log(WARNING, "Round %s: node %s (slot %s) is lost: %s; the slot keeps the model it was sent", server_round, node_id, slot, message.error.reason)
                self._unresponsive[node_id] = (server_round, time.monotonic())
                continue
            parsed = self._parse_reply(message, self.pool[slot])
            if isinstance(parsed, str):
                log(WARNING, "Round %s: dropped the reply of node %s (slot %s): %s", server_round, node_id, slot, parsed)
                continue
            models[slot], weights[slot] = parsed
            trained[slot] = True
            accepted.append(message.content)
        for node_id, slot in self._dispatched.items():
            log(WARNING, "Round %s: no reply from node %s (slot %s) within the round timeout; the slot keeps the model it was sent", server_round, node_id, slot)
            self._unresponsive[node_id] = (server_round, time.monotonic())
        self._dispatched = {}
        self._sent = []
        log(INFO, "aggregate_train: %d of %d slots trained this round", sum(trained), len(trained))
        if not accepted:
            return None, None

        start = time.perf_counter()
        pool = self.update_pool(server_round, models, weights, trained)
        if len(pool) != len(self.pool):
            raise RuntimeError(f"update_pool returned {len(pool)} models for {len(self.pool)} slots")
        deployment = self.global_model(server_round, models, weights, trained, pool)
        self.pool = pool
        metrics = self.train_metrics_aggr_fn(accepted, self.weighted_by_key)
        metrics["pool-update-seconds"] = time.perf_counter() - start
        metrics["trained-slots"] = sum(trained)
        return to_arrayrecord(deployment), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send the global model to sampled nodes for federated evaluation."""
        if self.fraction_evaluate == 0.0:
            return []
        node_ids = self._sample_nodes(
            grid, self.fraction_evaluate, self.min_evaluate_nodes, self.evaluate_rng, None
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
        :class:`~fedx.strategies.client_identity.ClientOrderedGrid`). Nodes
        that recently missed a reply are left out while enough others are
        connected (see ``unresponsive_cooldown``). Node ids are unsigned 64-bit
        integers and never pass through a numpy array.
        """
        deadline = time.monotonic() + self.node_wait_timeout
        node_ids = list(grid.get_node_ids())
        while len(node_ids) < self.min_available_nodes and time.monotonic() < deadline:
            log(INFO, "Waiting for nodes: %d of %d connected", len(node_ids), self.min_available_nodes)
            time.sleep(1.0)
            node_ids = list(grid.get_node_ids())
        if len(node_ids) < self.min_available_nodes:
            log(
                WARNING,
                "Only %d of min_available_nodes=%d nodes connected after %.0fs; sampling among them",
                len(node_ids),
                self.min_available_nodes,
                self.node_wait_timeout,
            )
        node_ids = self._responsive(node_ids, min_nodes)
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

    def _parse_reply(self, message: Message, sent: Model) -> tuple[Model, float] | str:
        """Return the reply's model and weight, or why it cannot be used."""
        if message.has_error():
            return f"the node reported an error: {message.error.reason}"
        content = message.content
        records = content.array_records
        record = records.get(self.arrayrecord_key)
        if record is None:
            if len(records) != 1:
                return f"expected one ArrayRecord ('{self.arrayrecord_key}'), got {list(records)}"
            record = next(iter(records.values()))
        metrics = list(content.metric_records.values())
        weight = metrics[0].get(self.weighted_by_key) if len(metrics) == 1 else None
        if not isinstance(weight, (int, float)) or not np.isfinite(weight) or weight <= 0:
            return f"expected one MetricRecord with a positive '{self.weighted_by_key}', got {weight!r}"
        try:
            model = to_model(record)
        except Exception as err:  # pylint: disable=broad-exception-caught
            return f"arrays cannot be read: {err}"
        problem = find_problem(sent, model)
        if problem is not None:
            return problem
        return model, float(weight)
