"""FedMe's clients joining: who a node is, and the architecture a new client starts with.

A node seen for the first time is asked which client it is (a ``query``
message, :func:`~fedx.strategy_core.client_identity.query_client_ids`); a
client new to the strategy gets its first architecture, by the local choice
(each candidate trained on the client's own data, the best on its validation
split kept), round-robin by client id, or one fixed architecture, and its
first model from ``initial_model_fn``. :class:`ClientRegistration` is the
part of :class:`~fedx.strategies.FedMe` that does this.
"""

import time
from collections.abc import Callable
from logging import INFO
from typing import Any

from flwr.app import ConfigRecord
from flwr.common import log
from flwr.serverapp import Grid

from fedx.messaging import send_and_collect
from fedx.ops import Model
from fedx.strategies.fedme.clients import ClientState, choice_message, parse_choice
from fedx.strategy_core.base import RoundInFlight
from fedx.strategy_core.client_identity import query_client_ids

#: How clients get their first architecture: ``"fixed:<name>"`` besides these.
INITIAL_ARCHITECTURES = ("local-best", "round-robin")
FIXED = "fixed:"


def initial_architecture_form(value: Any) -> bool:
    """``local-best``, ``round-robin`` or ``fixed:<name>`` (the name checked against the list later)."""
    return value in INITIAL_ARCHITECTURES or (
        isinstance(value, str) and value.startswith(FIXED) and bool(value[len(FIXED) :].strip())
    )


class ClientRegistration:
    """FedMe's registry of clients: which node each client is on, and each client's first architecture.

    A mixin of :class:`~fedx.strategies.FedMe`, which sets the attributes
    below in its constructor.
    """

    architectures: tuple[str, ...]
    initial_architecture: str
    architecture_offset: int
    choice_epochs: int
    initial_model_fn: Callable[[str, int], Model]
    clients: dict[int, ClientState]
    _node_clients: dict[int, int]
    round_timeout: float

    def architecture_for(self, client_id: int) -> str:
        """The architecture a client starts with unless it chooses one.

        The fixed architecture, else round-robin from the seeded offset (also
        the fallback of a client that does not answer the local choice).
        """
        if self.initial_architecture.startswith(FIXED):
            return self.initial_architecture[len(FIXED) :].strip()
        return self.architectures[(client_id + self.architecture_offset) % len(self.architectures)]

    @property
    def candidate_architectures(self) -> tuple[str, ...]:
        """The architectures a client tries in the local choice: each name once, in order."""
        return tuple(dict.fromkeys(self.architectures))

    def _register(
        self, grid: Grid, node_ids: list[int], server_round: int, config: ConfigRecord
    ) -> dict[str, float]:
        """Ask nodes seen for the first time which client they are; set up new clients.

        Returns the round's metrics of the clients that joined: how many
        start with each architecture (``initial-<name>``) and, with the local
        choice, the seconds it took.
        """
        unknown = [n for n in node_ids if n not in self._node_clients]
        if not unknown:
            return {}
        identified = query_client_ids(grid, unknown, self.round_timeout, server_round)
        new = {node: cid for node, cid in identified.items() if cid not in self.clients}
        choices: dict[int, str] = {}
        metrics: dict[str, float] = {}
        if new and self.initial_architecture == "local-best":
            start = time.perf_counter()
            choices = self._choose_architectures(grid, new, server_round, config)
            metrics["architecture-choice-seconds"] = time.perf_counter() - start
        for node_id, client_id in identified.items():
            self._attach(node_id, client_id, choices)
        for client_id in set(new.values()):
            key = f"initial-{self.clients[client_id].architecture}"
            metrics[key] = metrics.get(key, 0) + 1
        return metrics

    def _choose_architectures(
        self, grid: Grid, new: dict[int, int], server_round: int, config: ConfigRecord
    ) -> dict[int, str]:
        """Ask new clients (node id -> client id) to choose their architecture.

        Returns the valid choices by client id; the other clients are logged
        (they start with their round-robin architecture).
        """
        candidates = list(self.candidate_architectures)
        messages = [
            choice_message(server_round, config, node_id, client_id, candidates, self.choice_epochs)
            for node_id, client_id in new.items()
        ]
        in_flight = RoundInFlight(
            server_round,
            dict(new),
            messages,
            describe=lambda cid: f"client {cid}, architecture choice",
            consequence="it starts with its round-robin architecture",
        )
        choices: dict[int, str] = {}
        for answer in in_flight.match(send_and_collect(grid, messages, self.round_timeout)):
            choice = parse_choice(answer.message, candidates)
            if isinstance(choice, str):
                in_flight.dropped(answer, choice)
                continue
            choices[answer.target] = choice.architecture
            log(
                INFO,
                "Client %s chose architecture %s (validation accuracy %s)",
                answer.target,
                choice.architecture,
                ", ".join(f"{name} {acc:.3f}" for name, acc in choice.accuracies.items()),
            )
        return choices

    def _attach(self, node_id: int, client_id: int, choices: dict[int, str] | None = None) -> None:
        known = self.clients.get(client_id)
        if known is None:
            chosen = (choices or {}).get(client_id)
            architecture = chosen or self.architecture_for(client_id)
            model = self.initial_model_fn(architecture, client_id)
            self.clients[client_id] = ClientState(node_id, architecture, model)
            how = self.initial_architecture
            if how == "local-best" and chosen is None:
                how = "round-robin: no valid architecture choice"
            log(
                INFO,
                "Client %s (node %s) joined with architecture %s (%s)",
                client_id,
                node_id,
                architecture,
                how,
            )
        elif known.node_id != node_id:
            # A SuperNode restarted under a new node id: same client, same model.
            log(INFO, "Client %s moved from node %s to node %s", client_id, known.node_id, node_id)
            self._node_clients.pop(known.node_id, None)
            known.node_id = node_id
        self._node_clients[node_id] = client_id
