"""FedMe: personalized federated learning via model exchange.

Matsuda et al., "FedMe: Federated Learning via Model Exchange", SDM 2022
(arXiv:2110.07868), Sec. 4.
"""

import time
import warnings
from typing import Any
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedx.ops import Model, assign_exchanges, cluster_count, fedme_aggregate, find_problem
from fedx.strategies.client_identity import query_client_ids
from fedx.strategies.multi_model import to_arrayrecord, to_model
from fedx.strategies.personalized import (
    CLIENT_ID_KEY,
    ClientEvaluation,
    evaluation_due,
    parse_evaluation,
    summarize,
)

#: ArrayRecord keys of the train messages and replies.
PERSONALIZED_KEY = "personalized"
EXCHANGED_KEY = "exchanged"
#: MetricRecord key of the client's choice: 1 = adopt the exchanged model.
CHOICE_KEY = "chose-exchanged"

#: ``predict_fn(architecture, model)``: softmax outputs ``(U, M)`` on the unlabeled set.
PredictFn = Callable[[str, Model], np.ndarray]
#: ``initial_model_fn(architecture, client_id)``: a client's first personalized model.
InitialModelFn = Callable[[str, int], Model]


@dataclass
class ClientState:
    """What the server keeps for one client between rounds.

    Attributes
    ----------
    node_id : int
        The Flower node the client was last seen on.
    architecture : str
        Architecture name of the personalized model.
    model : Model
        The personalized model.
    """

    node_id: int
    architecture: str
    model: Model


@dataclass(frozen=True)
class _Dispatch:
    """One round's training messages: who got what."""

    clients: tuple[int, ...]  # client ids, one per message
    partners: tuple[int, ...]  # positions in `clients`: whose model each one received
    nodes: dict[int, int]  # node id -> position


@dataclass(frozen=True)
class _TrainReply:
    personalized: Model
    exchanged: Model
    chose_exchanged: bool
    content: RecordDict


# pylint: disable=too-many-instance-attributes
class FedMe(Strategy):
    """FedMe: every client keeps a personalized model; clients exchange models each round.

    The server keeps one personalized model and its architecture per client
    (architectures may differ). Each round it computes the personalized
    models' softmax outputs on a small unlabeled set (``predict_fn``),
    clusters them with KMeans into ``K_t`` clusters (1 at first, one more at
    each of ``cluster_rounds``), and sends every sampled client one message
    holding its personalized model and an exchanged model: a random other
    member of its cluster, or a random model of another cluster when it is
    alone (:func:`fedx.ops.assign_exchanges`). The client trains both by deep
    mutual learning and replies with both trained models and its choice
    (``chose-exchanged``: the exchanged model had the lower validation loss).
    The server averages every personalized model with the trained copies of
    it that were exchanged out (eq. 8, :func:`fedx.ops.fedme_aggregate`), and
    each client's next personalized model is the aggregated model it chose,
    with that model's architecture.

    Clients are identified across rounds by an integer id they report when
    the strategy first sees their node (a ``query`` message answered with a
    ``client-id`` metric; the fedx ClientApp sends its ``partition-id``).
    Architectures are assigned round-robin over ``architectures`` by client
    id from a seeded offset, so the same seed gives client c the same
    architecture in every run, and the server can rebuild any client's model.

    Replies that are errors, arrive late, lack a record, carry arrays that do
    not fit the models sent (names, shapes, dtypes, NaN/Inf) or an invalid
    choice are logged with the node id and dropped. Such a client's
    personalized model enters eq. 8 untrained (averaged with any trained
    copies of it that came back) and it keeps its own model; its copy of the
    other model is left out.

    Evaluation is personalized: every ``evaluate_every`` rounds (and after
    the last) each client gets its personalized model, fine-tunes it for
    ``finetune_epochs`` epochs and tests it on its own test split. There is
    no global model: ``aggregate_train`` returns no arrays.

    Parameters
    ----------
    architectures : Sequence[str]
        Architecture names clients are assigned, round-robin by client id
        (a name may repeat to give it more clients).
    initial_model_fn : callable
        ``(architecture, client_id) -> Model``: a client's first model.
    predict_fn : callable
        ``(architecture, model) -> np.ndarray``: the model's class
        probabilities on the server's unlabeled set, shape ``(U, M)``, the
        same U samples for every model. Called once per sampled client in
        rounds with more than one cluster.
    cluster_rounds : Sequence[int] (default: ())
        Rounds at which the cluster count grows by one (paper: 1 to 4).
    model_tuning : bool (default: True)
        False: clients always keep their personalized model (ablation).
    mutual_learning : bool (default: True)
        False: clients train the two models on cross-entropy only (ablation).
    clustering : bool (default: True)
        False: one cluster always, exchanged models are uniformly random
        other models and no outputs are computed (ablation).
    fraction_train : float (default: 1.0)
        Fraction of registered, connected clients trained per round (the
        paper trains all).
    min_train_nodes : int (default: 2)
        Minimum number of clients per round; at least two (an exchange needs
        a partner).
    min_available_nodes : int (default: 2)
        Nodes to wait for (at most ``node_wait_timeout`` seconds) each round.
    evaluate_every : int (default: 1)
        Personalized evaluation every this many rounds, and after the last.
    finetune_epochs : int (default: 0)
        Local epochs of fine-tuning before each personalized evaluation.
    seed : int, optional
        Seeds client sampling, architecture assignment, exchanges and KMeans.
    node_wait_timeout : float (default: 60.0)
        Seconds to wait for ``min_available_nodes``.
    """

    # pylint: disable=too-many-arguments,too-many-locals
    def __init__(
        self,
        *,
        architectures: Sequence[str],
        initial_model_fn: InitialModelFn,
        predict_fn: PredictFn,
        cluster_rounds: Sequence[int] = (),
        model_tuning: bool = True,
        mutual_learning: bool = True,
        clustering: bool = True,
        fraction_train: float = 1.0,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        evaluate_every: int = 1,
        finetune_epochs: int = 0,
        seed: int | None = None,
        node_wait_timeout: float = 60.0,
    ) -> None:
        _check_arguments(architectures, cluster_rounds, fraction_train, min_train_nodes,
                         evaluate_every, finetune_epochs)
        self.architectures = tuple(architectures)
        self.initial_model_fn = initial_model_fn
        self.predict_fn = predict_fn
        self.cluster_rounds = tuple(sorted(cluster_rounds))
        self.model_tuning = model_tuning
        self.mutual_learning = mutual_learning
        self.clustering = clustering
        self.fraction_train = fraction_train
        self.min_train_nodes = min_train_nodes
        self.min_available_nodes = min_available_nodes
        self.evaluate_every = evaluate_every
        self.finetune_epochs = finetune_epochs
        self.seed = seed
        self.node_wait_timeout = node_wait_timeout
        # Independent streams: sampling does not depend on how many draws the
        # exchanges or KMeans used before.
        sampling, exchange, kmeans, offset = np.random.SeedSequence(seed).spawn(4)
        self.sampling_rng = np.random.default_rng(sampling)
        self.rng = np.random.default_rng(exchange)
        self.kmeans_rng = np.random.default_rng(kmeans)
        self.architecture_offset = int(np.random.default_rng(offset).integers(len(self.architectures)))
        self.clients: dict[int, ClientState] = {}
        self.evaluations: dict[int, list[ClientEvaluation]] = {}
        self._node_clients: dict[int, int] = {}
        self._dispatch = _Dispatch((), (), {})
        self._evaluated_nodes: dict[int, int] = {}
        self._round_info: dict[str, float] = {}
        self._num_rounds: int | None = None
        self._timeout: float = 3600.0

    # ------------------------------------------------------------------
    # Public helpers
    # ------------------------------------------------------------------

    def architecture_for(self, client_id: int) -> str:
        """The architecture a client starts with: round-robin from the seeded offset."""
        return self.architectures[(client_id + self.architecture_offset) % len(self.architectures)]

    def personalized_models(self) -> dict[int, tuple[str, Model]]:
        """Every registered client's architecture and personalized model, by client id."""
        return {cid: (c.architecture, c.model) for cid, c in sorted(self.clients.items())}

    # ------------------------------------------------------------------
    # Flower Strategy interface
    # ------------------------------------------------------------------

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        log(INFO, "\t├──> FedMe settings:")
        log(INFO, "\t│\t├── Architectures: %s", ", ".join(self.architectures))
        log(INFO, "\t│\t├── Cluster count +1 at rounds: %s",
            list(self.cluster_rounds) or "never")
        log(INFO, "\t│\t├── Model tuning / mutual learning / clustering: %s / %s / %s",
            self.model_tuning, self.mutual_learning, self.clustering)
        log(INFO, "\t│\t├── Fraction train: %s (min %d nodes)",
            self.fraction_train, self.min_train_nodes)
        log(INFO, "\t│\t├── Evaluate every %d round(s), fine-tuning %d epoch(s)",
            self.evaluate_every, self.finetune_epochs)
        log(INFO, "\t│\t└── Seed: %s", self.seed)

    # pylint: disable=too-many-arguments,too-many-positional-arguments
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run FedMe (see :meth:`flwr.serverapp.strategy.Strategy.start`).

        ``initial_arrays`` is not used for training (every client's first
        model comes from ``initial_model_fn``); ``evaluate_fn`` receives it
        unchanged every round, as there is no global model.
        """
        self.begin_run(num_rounds=num_rounds, timeout=timeout)
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                             evaluate_config, evaluate_fn)

    def begin_run(self, *, num_rounds: int, timeout: float) -> None:
        """Learn the run's limits before round 1 (called by ``start`` and ``run_rounds``).

        The last round is always evaluated, and the identification queries
        wait at most ``timeout``.
        """
        self._num_rounds = num_rounds
        self._timeout = timeout

    def state_dict(self) -> dict[str, Any]:
        """Every client's architecture and personalized model, and the random streams.

        Node ids are left out: nodes may come back under new ids, and the
        identification query attaches them to their client again.
        """
        return {
            "clients": {
                str(client_id): {"architecture": client.architecture, "model": dict(client.model)}
                for client_id, client in self.clients.items()
            },
            "rng": {
                "sampling": self.sampling_rng.bit_generator.state,
                "exchange": self.rng.bit_generator.state,
                "kmeans": self.kmeans_rng.bit_generator.state,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned.

        Raises
        ------
        ValueError
            When ``state`` lacks a part or names an unknown architecture.
        """
        try:
            clients = {
                int(client_id): ClientState(-1, entry["architecture"], dict(entry["model"]))
                for client_id, entry in state["clients"].items()
            }
            generators = state["rng"]
            self.sampling_rng.bit_generator.state = generators["sampling"]
            self.rng.bit_generator.state = generators["exchange"]
            self.kmeans_rng.bit_generator.state = generators["kmeans"]
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"the strategy state lacks or garbles {err}") from None
        unknown = {c.architecture for c in clients.values()} - set(self.architectures)
        if unknown:
            raise ValueError(f"architectures {sorted(unknown)} are not in {self.architectures}")
        self.clients = clients
        self._node_clients = {}

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Cluster the sampled clients' models and send each its model and an exchanged one."""
        del arrays
        self._dispatch = _Dispatch((), (), {})
        node_ids = self._connected_nodes(grid)
        self._register(grid, node_ids, server_round)
        clients = self._sample_clients(node_ids)
        if len(clients) < 2:
            log(WARNING, "Round %s: %d registered client(s) connected; FedMe needs two to exchange "
                "models, skipping the round", server_round, len(clients))
            return []
        labels, num_clusters, seconds = self._cluster(server_round, clients)
        partners = assign_exchanges(labels, self.rng)
        self._dispatch = _Dispatch(
            tuple(clients), tuple(partners),
            {self.clients[cid].node_id: pos for pos, cid in enumerate(clients)},
        )
        self._round_info = {"num-clusters": num_clusters, "clustering-seconds": seconds}
        log(INFO, "configure_train: %d clients in %d cluster(s) (%.2fs), exchanges %s",
            len(clients), num_clusters, seconds,
            {cid: clients[p] for cid, p in zip(clients, partners, strict=True)})
        return [self._train_message(server_round, config, pos) for pos in range(len(clients))]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate by eq. 8 and give every client the model it chose."""
        dispatch = self._dispatch
        parsed = self._collect_train_replies(server_round, replies, dispatch)
        if not parsed:
            return None, None
        start = time.perf_counter()
        sent = [self.clients[cid].model for cid in dispatch.clients]
        aggregated = fedme_aggregate(
            [parsed[p].personalized if p in parsed else sent[p] for p in range(len(sent))],
            [parsed[p].exchanged if p in parsed else None for p in range(len(sent))],
            list(dispatch.partners),
        )
        adopted, other_architecture = self._adopt(dispatch, aggregated, parsed)
        metrics = aggregate_metricrecords([r.content for r in parsed.values()], "num-examples")
        if CHOICE_KEY in metrics:
            del metrics[CHOICE_KEY]  # a weighted mean of choices means little; counts follow
        metrics.update(
            {
                **self._round_info,
                "aggregation-seconds": time.perf_counter() - start,
                "trained-clients": len(parsed),
                "adopted-exchanged": adopted,
                "adopted-other-architecture": other_architecture,
            }
        )
        return None, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send every connected client its personalized model for evaluation on its test split."""
        del arrays
        self._evaluated_nodes = {}
        if not evaluation_due(server_round, self.evaluate_every, self._num_rounds):
            return []
        connected = set(grid.get_node_ids())
        messages = []
        for cid, client in sorted(self.clients.items()):
            if client.node_id not in connected:
                continue
            content = ConfigRecord(
                {
                    **dict(config.items()),
                    "server-round": server_round,
                    CLIENT_ID_KEY: cid,
                    "personalized-architecture": client.architecture,
                    "finetune-epochs": self.finetune_epochs,
                }
            )
            records = RecordDict({PERSONALIZED_KEY: to_arrayrecord(client.model), "config": content})
            messages.append(Message(content=records, message_type=MessageType.EVALUATE,
                                    dst_node_id=client.node_id))
            self._evaluated_nodes[client.node_id] = cid
        return messages

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Keep every client's test result; report mean and std over clients."""
        results = []
        for message in replies:
            node_id = message.metadata.src_node_id
            cid = self._evaluated_nodes.pop(node_id, None)
            if cid is None:
                log(WARNING, "Round %s: ignored an evaluation reply from node %s",
                    server_round, node_id)
                continue
            result = parse_evaluation(message, cid, self.clients[cid].architecture)
            if isinstance(result, str):
                log(WARNING, "Round %s: dropped the evaluation of node %s (client %s): %s",
                    server_round, node_id, cid, result)
                continue
            results.append(result)
        for node_id, cid in self._evaluated_nodes.items():
            log(WARNING, "Round %s: no evaluation reply from node %s (client %s)",
                server_round, node_id, cid)
        self._evaluated_nodes = {}
        if not results:
            return None
        results.sort(key=lambda e: e.client_id)
        self.evaluations[server_round] = results
        return summarize(results)

    # ------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------

    def _connected_nodes(self, grid: Grid) -> list[int]:
        """Connected node ids, after waiting a bounded time for ``min_available_nodes``."""
        deadline = time.monotonic() + self.node_wait_timeout
        node_ids = sorted(grid.get_node_ids())
        while len(node_ids) < self.min_available_nodes and time.monotonic() < deadline:
            log(INFO, "Waiting for nodes: %d of %d connected", len(node_ids), self.min_available_nodes)
            time.sleep(1.0)
            node_ids = sorted(grid.get_node_ids())
        return node_ids

    def _register(self, grid: Grid, node_ids: list[int], server_round: int) -> None:
        """Ask nodes seen for the first time which client they are; set up new clients."""
        unknown = [n for n in node_ids if n not in self._node_clients]
        if not unknown:
            return
        for node_id, client_id in query_client_ids(grid, unknown, self._timeout, server_round).items():
            self._attach(node_id, client_id)

    def _attach(self, node_id: int, client_id: int) -> None:
        known = self.clients.get(client_id)
        if known is None:
            architecture = self.architecture_for(client_id)
            model = self.initial_model_fn(architecture, client_id)
            self.clients[client_id] = ClientState(node_id, architecture, model)
            log(INFO, "Client %s (node %s) joined with architecture %s",
                client_id, node_id, architecture)
        elif known.node_id != node_id:
            # A SuperNode restarted under a new node id: same client, same model.
            log(INFO, "Client %s moved from node %s to node %s", client_id, known.node_id, node_id)
            self._node_clients.pop(known.node_id, None)
            known.node_id = node_id
        self._node_clients[node_id] = client_id

    def _sample_clients(self, node_ids: list[int]) -> list[int]:
        """Sample registered, connected clients; ids in ascending order (not node order)."""
        connected = set(node_ids)
        available = sorted(
            cid for node, cid in self._node_clients.items()
            if node in connected and self.clients[cid].node_id == node
        )
        size = min(max(int(len(available) * self.fraction_train), self.min_train_nodes), len(available))
        positions = self.sampling_rng.choice(len(available), size=size, replace=False)
        return sorted(available[int(p)] for p in positions)

    def _cluster(self, server_round: int, clients: list[int]) -> tuple[np.ndarray, int, float]:
        """KMeans on the models' outputs on the unlabeled set; (labels, cluster count, seconds)."""
        wanted = cluster_count(server_round, self.cluster_rounds) if self.clustering else 1
        num_clusters = min(wanted, len(clients))
        if num_clusters == 1:
            return np.zeros(len(clients), dtype=np.int64), 1, 0.0
        # scikit-learn is imported here, not with the module: `fedx.strategies`
        # must import with numpy and Flower alone for the other strategies.
        from sklearn.cluster import KMeans  # pylint: disable=import-outside-toplevel
        from sklearn.exceptions import ConvergenceWarning  # pylint: disable=import-outside-toplevel

        start = time.perf_counter()
        outputs = np.stack(
            [
                np.asarray(self.predict_fn(self.clients[c].architecture, self.clients[c].model),
                           dtype=np.float64).reshape(-1)
                for c in clients
            ]
        )
        kmeans = KMeans(n_clusters=num_clusters, n_init=10,
                        random_state=int(self.kmeans_rng.integers(2**31 - 1)))
        with warnings.catch_warnings():
            # Clients that adopted the same model have identical outputs; fewer
            # distinct points than clusters is expected then, not an error.
            warnings.simplefilter("ignore", ConvergenceWarning)
            labels = kmeans.fit_predict(outputs)
        return labels, num_clusters, time.perf_counter() - start

    def _train_message(self, server_round: int, config: ConfigRecord, pos: int) -> Message:
        dispatch = self._dispatch
        client = self.clients[dispatch.clients[pos]]
        partner_id = dispatch.clients[dispatch.partners[pos]]
        partner = self.clients[partner_id]
        content = ConfigRecord(
            {
                **dict(config.items()),
                "server-round": server_round,
                CLIENT_ID_KEY: dispatch.clients[pos],
                "personalized-architecture": client.architecture,
                "exchanged-architecture": partner.architecture,
                "exchanged-from": partner_id,
                "model-tuning": self.model_tuning,
                "mutual-learning": self.mutual_learning,
            }
        )
        records = RecordDict(
            {
                PERSONALIZED_KEY: to_arrayrecord(client.model),
                EXCHANGED_KEY: to_arrayrecord(partner.model),
                "config": content,
            }
        )
        return Message(content=records, message_type=MessageType.TRAIN, dst_node_id=client.node_id)

    def _collect_train_replies(
        self, server_round: int, replies: Iterable[Message], dispatch: _Dispatch
    ) -> dict[int, _TrainReply]:
        """Valid replies by position in the dispatch; the rest logged and dropped."""
        waiting = dict(dispatch.nodes)
        parsed: dict[int, _TrainReply] = {}
        for message in replies:
            node_id = message.metadata.src_node_id
            pos = waiting.pop(node_id, None)
            if pos is None:
                log(WARNING, "Round %s: ignored a reply from node %s, which was not sent models",
                    server_round, node_id)
                continue
            sent = (self.clients[dispatch.clients[pos]].model,
                    self.clients[dispatch.clients[dispatch.partners[pos]]].model)
            result = self._parse_train_reply(message, *sent)
            if isinstance(result, str):
                log(WARNING, "Round %s: dropped the reply of node %s (client %s): %s",
                    server_round, node_id, dispatch.clients[pos], result)
                continue
            parsed[pos] = result
        for node_id, pos in waiting.items():
            log(WARNING, "Round %s: no reply from node %s (client %s); its model is aggregated "
                "untrained", server_round, node_id, dispatch.clients[pos])
        log(INFO, "aggregate_train: %d of %d clients trained this round",
            len(parsed), len(dispatch.clients))
        return parsed

    def _parse_train_reply(
        self, message: Message, personalized: Model, exchanged: Model
    ) -> _TrainReply | str:
        """Both trained models and the choice of a reply, or why they cannot be used."""
        if message.has_error():
            return f"the node reported an error: {message.error.reason}"
        content = message.content
        missing = [k for k in (PERSONALIZED_KEY, EXCHANGED_KEY) if k not in content.array_records]
        metric_records = list(content.metric_records.values())
        if missing or len(metric_records) != 1:
            return (f"expected ArrayRecords '{PERSONALIZED_KEY}' and '{EXCHANGED_KEY}' and one "
                    f"MetricRecord, got {list(content.array_records)} and {len(metric_records)}")
        metrics = metric_records[0]
        weight, choice = metrics.get("num-examples"), metrics.get(CHOICE_KEY)
        if not isinstance(weight, (int, float)) or not np.isfinite(weight) or weight <= 0:
            return f"expected a positive 'num-examples', got {weight!r}"
        if choice not in (0, 1) or isinstance(choice, bool):
            return f"expected '{CHOICE_KEY}' 0 or 1, got {choice!r}"
        if choice == 1 and not self.model_tuning:
            return f"'{CHOICE_KEY}' is 1 but model tuning is off"
        trained = {}
        for key, sent in ((PERSONALIZED_KEY, personalized), (EXCHANGED_KEY, exchanged)):
            try:
                model = to_model(content.array_records[key])
            except Exception as err:  # pylint: disable=broad-exception-caught
                return f"{key} arrays cannot be read: {err}"
            problem = find_problem(sent, model)
            if problem is not None:
                return f"{key} model: {problem}"
            trained[key] = model
        return _TrainReply(trained[PERSONALIZED_KEY], trained[EXCHANGED_KEY], choice == 1, content)

    def _adopt(
        self, dispatch: _Dispatch, aggregated: list[Model], parsed: dict[int, _TrainReply]
    ) -> tuple[int, int]:
        """Make every client's chosen aggregated model its personalized model.

        Returns how many clients adopted the exchanged model, and how many of
        those changed architecture.
        """
        old_architectures = [self.clients[cid].architecture for cid in dispatch.clients]
        adopted = other_architecture = 0
        for pos, cid in enumerate(dispatch.clients):
            source = pos
            if pos in parsed and parsed[pos].chose_exchanged:
                source = dispatch.partners[pos]
                adopted += 1
                other_architecture += old_architectures[source] != old_architectures[pos]
            self.clients[cid].model = aggregated[source]
            self.clients[cid].architecture = old_architectures[source]
        return adopted, other_architecture


# pylint: disable=too-many-arguments,too-many-positional-arguments
def _check_arguments(
    architectures: Sequence[str],
    cluster_rounds: Sequence[int],
    fraction_train: float,
    min_train_nodes: int,
    evaluate_every: int,
    finetune_epochs: int,
) -> None:
    if not architectures:
        raise ValueError("architectures must name at least one architecture")
    if any(r < 1 for r in cluster_rounds):
        raise ValueError(f"cluster_rounds must be rounds >= 1, got {list(cluster_rounds)}")
    if not 0.0 < fraction_train <= 1.0:
        raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
    if min_train_nodes < 2:
        raise ValueError(
            f"min_train_nodes must be at least 2 (an exchange needs a partner), got {min_train_nodes}"
        )
    if evaluate_every < 1:
        raise ValueError(f"evaluate_every must be >= 1, got {evaluate_every}")
    if finetune_epochs < 0:
        raise ValueError(f"finetune_epochs must be >= 0, got {finetune_epochs}")
