"""What a strategy can do beyond Flower's ``Strategy``, as ``typing.Protocol`` s.

The round loop and the ServerApp ask ``isinstance(strategy, Stateful)``
rather than looking for methods by name, so any strategy, Flower's own
included, runs through the same code: fedx's strategies have all of these
that apply to them, Flower's FedAvg none.
"""

from typing import Any, Protocol, runtime_checkable

from fedx.ops import Model


@runtime_checkable
class RunAware(Protocol):
    """A strategy that learns the run's limits before round 1."""

    def begin_run(self, *, num_rounds: int, timeout: float) -> None:
        """Called once by the round loop before the first round it runs."""


@runtime_checkable
class Stateful(Protocol):
    """A strategy whose state between rounds goes into a checkpoint."""

    def state_dict(self) -> dict[str, Any]:
        """The state (nested dicts/lists of JSON values and numpy arrays)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state; raises ``ValueError`` when it does not fit."""


@runtime_checkable
class KeepsPersonalizedModels(Protocol):
    """A strategy that keeps one model per client instead of a global model.

    The ServerApp then evaluates no global model and saves these models.
    """

    def personalized_models(self) -> dict[int, tuple[str, Model]]:
        """Every client's architecture and model, by client id."""


def reads_packed_models(strategy: object) -> bool:
    """Whether ``strategy`` reads the models of replies in fedx's packed form as well.

    A strategy says so with a true ``reads_packed_models`` attribute (every
    fedx strategy does; Flower's own read standard ``ArrayRecord`` s only).
    Nodes that read the packed form are then sent it (:mod:`fedx.strategy_core.packing`).
    """
    return getattr(strategy, "reads_packed_models", False) is True


@runtime_checkable
class EvaluatesPerClient(Protocol):
    """A strategy that keeps every client's evaluation result, by round."""

    evaluations: dict[int, list[Any]]
