"""FedMe: personalized federated learning via model exchange.

Matsuda et al., "FedMe: Federated Learning via Model Exchange", SDM 2022
(arXiv:2110.07868), Sec. 4.
"""

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedx.checks import FRACTION, ArgumentError, Flag, Integer, Rule, check
from fedx.ops import Model, assign_exchanges, cluster_count, fedme_aggregate
from fedx.protocol import fedme as protocol
from fedx.strategies.fedme.clients import (
    ClientState,
    TrainReply,
    evaluate_message,
    parse_train_reply,
    train_message,
)
from fedx.strategies.fedme.clustering import (
    cluster_outputs,
)
from fedx.strategies.fedme.registration import (
    FIXED,
    ClientRegistration,
    initial_architecture_form,
)
from fedx.strategy_core.base import FedxStrategy, RoundInFlight
from fedx.strategy_core.personalized import ClientEvaluation, PerClientEvaluation

#: ``predict_fn(architecture, model)``: softmax outputs ``(U, M)`` on the unlabeled set.
PredictFn = Callable[[str, Model], np.ndarray]
#: ``initial_model_fn(architecture, client_id)``: a client's first personalized model.
InitialModelFn = Callable[[str, int], Model]


@dataclass(frozen=True)
class _ExchangeRound:
    """The training round in flight: who got what."""

    clients: tuple[int, ...]  # client ids, one per message
    partners: tuple[int, ...]  # positions in `clients`: whose model each one received
    in_flight: RoundInFlight[int]  # node id -> position
    info: dict[str, float]  # cluster count and clustering time, for the round's metrics


# pylint: disable=too-many-instance-attributes
class FedMe(ClientRegistration, PerClientEvaluation, FedxStrategy[_ExchangeRound]):
    """FedMe: every client keeps a personalized model; clients exchange models each round.

    Each round the server clusters the sampled clients' models by their
    outputs on an unlabeled set (``predict_fn``, KMeans), sends each client
    its model and a random other member of its cluster, and averages every
    model with its trained copies (eq. 8); each client keeps whichever it
    chose. The methods page (docs/methods.md, "FedMe") says how clients join,
    choose their first architecture, fail and are evaluated; the messages
    are :mod:`fedx.protocol.fedme`'s. ``finetune_epochs`` and
    ``evaluate_every`` are :class:`~fedx.strategy_core.personalized.PerClientEvaluation`'s,
    ``seed`` and ``node_wait_timeout`` :class:`~fedx.strategies.FedxStrategy`'s.

    Parameters
    ----------
    architectures : Sequence[str]
        The architectures clients may have (in the fedx app: ``model``
        names), assigned round-robin by client id or the local choice's candidates.
    initial_model_fn : callable
        ``(architecture, client_id) -> Model``: a client's first model.
    predict_fn : callable
        ``(architecture, model) -> np.ndarray``: the model's class
        probabilities on the server's unlabeled set, shape ``(U, M)``.
    cluster_rounds : Sequence[int] (default: (10, 15, 18))
        Increasing rounds (>= 2) at which the cluster count, 1 at first,
        grows by one (the paper's schedule for 20 rounds); empty: one cluster.
    model_tuning : bool (default: True)
        Clients may adopt the exchanged model; False: never (ablation).
    mutual_learning : bool (default: True)
        KL terms in the clients' losses; False: cross-entropy only (ablation).
    clustering : bool (default: True)
        Cluster by outputs; False: one cluster, random partners (ablation).
    initial_architecture : str (default: "local-best")
        A new client's first architecture: ``"local-best"`` (the best of the
        candidates on its own data), ``"round-robin"`` or ``"fixed:<name>"``.
    choice_epochs : int (default: 5)
        ``"local-best"``: local epochs each candidate trains before the choice.
    fraction_train : float (default: 1.0)
        Fraction of registered, connected clients trained per round.
    min_train_nodes : int (default: 2)
        Minimum number of clients per round; at least two (an exchange needs a partner).
    min_available_nodes : int (default: 2)
        Nodes to wait for (at most ``node_wait_timeout`` seconds) each round.
    weighted_by_key : str (default: "num-examples")
        The reply's metric that must be positive and weights the training metrics.

    Examples
    --------
    Two architectures of a numpy model, outputs of 5 samples of 3 classes:

    >>> import numpy as np
    >>> from fedx.strategies import FedMe
    >>> def initial_model(architecture, client_id):
    ...     return {"weight": np.zeros((3, {"small": 4, "large": 16}[architecture]), np.float32)}
    >>> strategy = FedMe(
    ...     architectures=["small", "large"], initial_model_fn=initial_model,
    ...     predict_fn=lambda architecture, model: np.full((5, 3), 1 / 3), seed=0,
    ... )
    >>> strategy.architectures, strategy.cluster_rounds
    (('small', 'large'), (10, 15, 18))
    """

    # "offset" draws the architecture assignment's offset, once.
    random_streams = ("sampling", "exchange", "kmeans", "offset")

    # pylint: disable=too-many-arguments,too-many-locals
    def __init__(
        self,
        *,
        architectures: Sequence[str],
        initial_model_fn: InitialModelFn,
        predict_fn: PredictFn,
        cluster_rounds: Sequence[int] = (10, 15, 18),
        model_tuning: bool = True,
        mutual_learning: bool = True,
        clustering: bool = True,
        initial_architecture: str = "local-best",
        choice_epochs: int = 5,
        fraction_train: float = 1.0,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        evaluate_every: int = 1,
        finetune_epochs: int = 1,
        seed: int | None = None,
        node_wait_timeout: float = 60.0,
        weighted_by_key: str = "num-examples",
    ) -> None:
        super().__init__(seed=seed, node_wait_timeout=node_wait_timeout)
        self.architectures = tuple(architectures)
        if not self.architectures:
            raise ArgumentError("architectures", architectures, "at least one architecture name")
        self.cluster_rounds = tuple(cluster_rounds)
        if any(r < 2 for r in self.cluster_rounds) or list(self.cluster_rounds) != sorted(
            set(self.cluster_rounds)
        ):
            raise ArgumentError("cluster_rounds", cluster_rounds, "increasing rounds >= 2")
        self.initial_model_fn = initial_model_fn
        self.predict_fn = predict_fn
        self.model_tuning = check("model_tuning", model_tuning, Flag())
        self.mutual_learning = check("mutual_learning", mutual_learning, Flag())
        self.clustering = check("clustering", clustering, Flag())
        self.initial_architecture = check(
            "initial_architecture",
            initial_architecture,
            Rule(
                str,
                lambda v: (
                    initial_architecture_form(v)
                    and (not v.startswith(FIXED) or v[len(FIXED) :].strip() in self.architectures)
                ),
                f"local-best, round-robin or fixed:<name> with <name> one of {self.architectures}",
            ),
        )
        self.choice_epochs = check("choice_epochs", choice_epochs, Integer(1))
        self.fraction_train = check("fraction_train", fraction_train, FRACTION)
        # An exchange needs a partner.
        self.min_train_nodes = check("min_train_nodes", min_train_nodes, Integer(2))
        self.min_available_nodes = check("min_available_nodes", min_available_nodes, Integer(1))
        self.evaluate_every = check("evaluate_every", evaluate_every, Integer(1))
        self.finetune_epochs = check("finetune_epochs", finetune_epochs, Integer(0))
        self.weighted_by_key = weighted_by_key
        self.architecture_offset = int(self.random["offset"].integers(len(self.architectures)))
        self.clients: dict[int, ClientState] = {}
        self.evaluations: dict[int, list[ClientEvaluation]] = {}
        self._node_clients: dict[int, int] = {}
        self.evaluating: RoundInFlight[int] | None = None  # node id -> client id

    # ------------------------------------------------------------------
    # Public helpers
    # ------------------------------------------------------------------

    def personalized_models(self) -> dict[int, tuple[str, Model]]:
        """Every registered client's architecture and personalized model, by client id."""
        return {cid: (c.architecture, c.model) for cid, c in sorted(self.clients.items())}

    # ------------------------------------------------------------------
    # Flower Strategy interface
    # ------------------------------------------------------------------

    def summary(self) -> None:
        """Log summary configuration of the strategy."""
        self.log_settings(
            "FedMe settings",
            {
                "Architectures": ", ".join(self.architectures),
                "Initial architectures": self.initial_architecture
                + (
                    f" ({self.choice_epochs} local epoch(s) per candidate)"
                    if self.initial_architecture == "local-best"
                    else ""
                ),
                "Cluster count +1 at rounds": list(self.cluster_rounds) or "never",
                "Model tuning / mutual learning / clustering": f"{self.model_tuning} / {self.mutual_learning} / {self.clustering}",
                "Fraction train": f"{self.fraction_train} (min {self.min_train_nodes} nodes)",
                "Evaluate every": f"{self.evaluate_every} round(s), fine-tuning {self.finetune_epochs} epoch(s)",
                "Seed": self.seed,
            },
        )

    def checkpoint_state(self) -> dict[str, Any]:
        """Every client's architecture and personalized model (besides the random streams).

        Node ids are left out: nodes may come back under new ids, and the
        identification query attaches them to their client again.
        """
        return {
            "clients": {
                str(client_id): {"architecture": client.architecture, "model": dict(client.model)}
                for client_id, client in self.clients.items()
            },
        }

    def restore_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`checkpoint_state` returned.

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
        """Cluster the sampled clients' models and send each its model and an exchanged one.

        ``arrays`` is not used: there is no global model, every client's
        first model comes from ``initial_model_fn``.
        """
        del arrays
        node_ids = sorted(self.connected_nodes(grid))
        joined = self._register(grid, node_ids, server_round, config)
        clients = self._sample_clients(node_ids)
        if len(clients) < 2:
            log(
                WARNING,
                "Round %s: %d registered client(s) connected; FedMe needs two to exchange "
                "models, skipping the round",
                server_round,
                len(clients),
            )
            self.training.put(_ExchangeRound((), (), RoundInFlight(server_round, {}, []), {}))
            return []
        labels, num_clusters, seconds = self._cluster(server_round, clients)
        partners = assign_exchanges(labels, self.random["exchange"])
        log(
            INFO,
            "configure_train: %d clients in %d cluster(s) (%.2fs), exchanges %s",
            len(clients),
            num_clusters,
            seconds,
            {cid: clients[p] for cid, p in zip(clients, partners, strict=True)},
        )
        messages = [
            train_message(
                server_round,
                config,
                cid,
                clients[partner],
                self.clients,
                model_tuning=self.model_tuning,
                mutual_learning=self.mutual_learning,
            )
            for cid, partner in zip(clients, partners, strict=True)
        ]
        in_flight = RoundInFlight(
            server_round,
            {self.clients[cid].node_id: pos for pos, cid in enumerate(clients)},
            messages,
            describe=lambda pos: f"client {clients[pos]}",
            consequence="its model is aggregated untrained",
        )
        self.training.put(
            _ExchangeRound(
                tuple(clients),
                tuple(partners),
                in_flight,
                {"num-clusters": num_clusters, "clustering-seconds": seconds, **joined},
            )
        )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate by eq. 8 and give every client the model it chose."""
        exchange = self.training.take()
        parsed = self._collect_train_replies(exchange, replies)
        if not parsed:
            return None, None
        start = time.perf_counter()
        sent = [self.clients[cid].model for cid in exchange.clients]
        aggregated = fedme_aggregate(
            [parsed[p].personalized if p in parsed else sent[p] for p in range(len(sent))],
            [parsed[p].exchanged if p in parsed else None for p in range(len(sent))],
            list(exchange.partners),
        )
        adopted, other_architecture = self._adopt(exchange, aggregated, parsed)
        metrics = aggregate_metricrecords(
            [r.content for r in parsed.values()], self.weighted_by_key
        )
        if protocol.CHOSE_EXCHANGED in metrics:
            del metrics[
                protocol.CHOSE_EXCHANGED
            ]  # a weighted mean of choices means little; counts follow
        metrics.update(
            {
                **exchange.info,
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
        self.evaluating = None
        if not self.evaluation_due(server_round, self.evaluate_every):
            return []
        connected = set(grid.get_node_ids())
        messages, targets = [], {}
        for cid, client in sorted(self.clients.items()):
            if client.node_id not in connected:
                continue
            messages.append(
                evaluate_message(server_round, config, cid, client, self.finetune_epochs)
            )
            targets[client.node_id] = cid
        self.evaluating = RoundInFlight(
            server_round, targets, messages, describe=lambda cid: f"client {cid}"
        )
        return messages

    def evaluated_client(self, target: int) -> tuple[int | None, str]:
        """The client a node was asked to evaluate for, and its model's architecture."""
        return target, self.clients[target].architecture

    # ------------------------------------------------------------------
    # Helpers
    # ------------------------------------------------------------------

    def _sample_clients(self, node_ids: list[int]) -> list[int]:
        """Sample registered, connected clients; ids in ascending order (not node order)."""
        connected = set(node_ids)
        available = sorted(
            cid
            for node, cid in self._node_clients.items()
            if node in connected and self.clients[cid].node_id == node
        )
        size = min(
            max(int(len(available) * self.fraction_train), self.min_train_nodes), len(available)
        )
        positions = self.random["sampling"].choice(len(available), size=size, replace=False)
        return sorted(available[int(p)] for p in positions)

    def _cluster(self, server_round: int, clients: list[int]) -> tuple[np.ndarray, int, float]:
        """KMeans on the models' outputs on the unlabeled set; (labels, cluster count, seconds)."""
        wanted = cluster_count(server_round, self.cluster_rounds) if self.clustering else 1
        num_clusters = min(wanted, len(clients))
        if num_clusters == 1:
            return np.zeros(len(clients), dtype=np.int64), 1, 0.0
        start = time.perf_counter()
        outputs = np.stack(
            [
                np.asarray(
                    self.predict_fn(self.clients[c].architecture, self.clients[c].model),
                    dtype=np.float64,
                ).reshape(-1)
                for c in clients
            ]
        )
        labels = cluster_outputs(outputs, num_clusters, self.random["kmeans"])
        return labels, num_clusters, time.perf_counter() - start

    def _collect_train_replies(
        self, exchange: _ExchangeRound, replies: Iterable[Message]
    ) -> dict[int, TrainReply]:
        """Valid replies by position in the exchange; the rest logged and dropped."""
        parsed: dict[int, TrainReply] = {}
        for answer in exchange.in_flight.match(replies):
            pos = answer.target
            sent = (
                self.clients[exchange.clients[pos]].model,
                self.clients[exchange.clients[exchange.partners[pos]]].model,
            )
            result = parse_train_reply(
                answer.message,
                *sent,
                weighted_by_key=self.weighted_by_key,
                model_tuning=self.model_tuning,
            )
            if isinstance(result, str):
                exchange.in_flight.dropped(answer, result)
                continue
            parsed[pos] = result
        log(
            INFO,
            "aggregate_train: %d of %d clients trained this round",
            len(parsed),
            len(exchange.clients),
        )
        return parsed

    def _adopt(
        self, exchange: _ExchangeRound, aggregated: list[Model], parsed: dict[int, TrainReply]
    ) -> tuple[int, int]:
        """Make every client's chosen aggregated model its personalized model.

        Returns how many clients adopted the exchanged model, and how many of
        those changed architecture.
        """
        old_architectures = [self.clients[cid].architecture for cid in exchange.clients]
        adopted = other_architecture = 0
        for pos, cid in enumerate(exchange.clients):
            source = pos
            if pos in parsed and parsed[pos].chose_exchanged:
                source = exchange.partners[pos]
                adopted += 1
                other_architecture += old_architectures[source] != old_architectures[pos]
            self.clients[cid].model = aggregated[source]
            self.clients[cid].architecture = old_architectures[source]
        return adopted, other_architecture
