"""FedMe's model exchange: who receives whose model, and how the copies come back together.

(Not to be confused with :mod:`fedx.secure.exchange`, the clients' layer
exchange of FedMR's secure recombination.)

Matsuda et al., "FedMe: Federated Learning via Model Exchange", SDM 2022,
Sec. 4.2. Client i holds a personalized model; each round it also receives
the personalized model of another client (the exchanged model), trains both
and returns both. Model j is then averaged with every trained copy of j that
was exchanged out (eq. 8).
"""

from collections.abc import Sequence

import numpy as np

from fedx.ops.aggregation import average
from fedx.ops.model import Model, layout_problem


def cluster_count(server_round: int, increase_rounds: Sequence[int]) -> int:
    """FedMe's cluster-count schedule: 1 at first, one more from each listed round on.

    Parameters
    ----------
    server_round : int
        The round, from 1.
    increase_rounds : Sequence[int]
        Rounds at which the count grows by one (the paper uses 150, 225, 275
        of 300 rounds on FEMNIST: 1 to 4 clusters).

    Returns
    -------
    int
        ``1 + #{r in increase_rounds : r <= server_round}``.
    """
    return 1 + sum(1 for r in increase_rounds if r <= server_round)


def assign_exchanges(
    cluster_labels: Sequence[int] | np.ndarray, rng: np.random.Generator
) -> list[int]:
    """Choose every model's exchange partner from its cluster.

    Model i receives a uniformly random *other* member of its own cluster.
    When it is alone in its cluster it receives a uniformly random model of
    the other clusters (every other model is then in another cluster). No
    model is ever its own partner.

    Parameters
    ----------
    cluster_labels : sequence of int
        The cluster of each model (for example KMeans labels); with a single
        cluster every model gets a random other model.
    rng : np.random.Generator
        Source of the random choices: one draw per model, in order.

    Returns
    -------
    list[int]
        ``partners[i]``: the index of the model that model i's client receives.

    Raises
    ------
    ValueError
        With fewer than two models (nobody to exchange with) or labels that
        are not 1-D.
    """
    labels = np.asarray(cluster_labels)
    if labels.ndim != 1:
        raise ValueError(f"cluster_labels must be 1-D, got shape {labels.shape}")
    if len(labels) < 2:
        raise ValueError(f"model exchange needs at least two models, got {len(labels)}")
    everyone = np.arange(len(labels))
    partners = []
    for i, label in enumerate(labels):
        others = everyone[everyone != i]
        mates = others[labels[others] == label]
        candidates = mates if len(mates) else others
        partners.append(int(candidates[rng.integers(len(candidates))]))
    return partners


def fedme_aggregate(
    personalized: Sequence[Model],
    exchanged: Sequence[Model | None],
    exchanged_from: Sequence[int],
) -> list[Model]:
    """Average every personalized model with the trained copies of it (eq. 8).

    ``w_i <- (w_i + sum_{j : from[j] = i} v_j) / (s_i + 1)``, where ``v_j`` is
    the exchanged model client j trained, ``from[j]`` the index of the
    personalized model it is a copy of, and ``s_i`` the number of copies of
    model i that came back. Models of different architectures never meet:
    a copy has the architecture of the model it was copied from.

    Parameters
    ----------
    personalized : Sequence[Model]
        ``w_i``: client i's personalized model after this round's training
        (or, where client i's reply was dropped, the model it was sent).
    exchanged : Sequence[Model or None]
        ``v_j``: the exchanged model client j trained; ``None`` where client
        j's reply was dropped, so the copy is left out of the average.
    exchanged_from : Sequence[int]
        ``from[j]``: which personalized model client j received, never j.

    Returns
    -------
    list[Model]
        The aggregated personalized models, one per client, with the names
        and dtypes of ``personalized`` (integer tensors are averaged in
        float64 and rounded). A model no copy came back for is returned as
        it is (the same object). Inputs are not modified.

    Raises
    ------
    ValueError
        If the lengths differ, an index is out of range or points at its own
        client, or a copy does not have its original's names and shapes.
    """
    count = len(personalized)
    if len(exchanged) != count or len(exchanged_from) != count:
        raise ValueError(
            f"need one exchanged model and source per client: {count} personalized, "
            f"{len(exchanged)} exchanged, {len(exchanged_from)} sources"
        )
    copies: list[list[Model]] = [[] for _ in range(count)]
    for j, (copy, source) in enumerate(zip(exchanged, exchanged_from, strict=True)):
        if not 0 <= source < count or source == j:
            raise ValueError(
                f"client {j} received model {source}: must be another of 0..{count - 1}"
            )
        if copy is None:
            continue
        problem = layout_problem(personalized[source], copy)
        if problem is not None:
            raise ValueError(
                f"the copy of model {source} trained by client {j} does not match the model: "
                f"{problem}"
            )
        copies[source].append(copy)
    return [
        average([model, *received]) if received else model
        for model, received in zip(personalized, copies, strict=True)
    ]
