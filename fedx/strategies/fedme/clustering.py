"""FedMe's clustering: KMeans on the personalized models' outputs, and the schedule of the cluster count.

The cluster count of a round is :func:`fedx.ops.cluster_count` of the rounds
at which it grows (``fedme-cluster-rounds``); the models' outputs on the
server's unlabeled set come from the app's ``predict_fn``.
"""

import warnings

import numpy as np

from fedx.method import comma_list


def cluster_outputs(outputs: np.ndarray, num_clusters: int, rng: np.random.Generator) -> np.ndarray:
    """KMeans labels of the rows of ``outputs`` (one flattened output per model), seeded from ``rng``."""
    # scikit-learn is imported here, not with the module: `fedx.strategies`
    # must import with numpy and Flower alone for the other strategies.
    from sklearn.cluster import KMeans  # pylint: disable=import-outside-toplevel
    from sklearn.exceptions import ConvergenceWarning  # pylint: disable=import-outside-toplevel

    kmeans = KMeans(n_clusters=num_clusters, n_init=10, random_state=int(rng.integers(2**31 - 1)))
    with warnings.catch_warnings():
        # Clients that adopted the same model have identical outputs; fewer
        # distinct points than clusters is expected then, not an error.
        warnings.simplefilter("ignore", ConvergenceWarning)
        return kmeans.fit_predict(outputs)


def parse_cluster_rounds(value: str) -> tuple[int, ...]:
    """``"10,15,18"`` -> ``(10, 15, 18)``."""
    return tuple(int(item) for item in comma_list(value))


def increasing_rounds(value: str) -> bool:
    """Whether ``value`` lists increasing rounds, each at least 2 (empty: yes)."""
    try:
        rounds = parse_cluster_rounds(value)
    except ValueError:
        return False
    return all(r >= 2 for r in rounds) and list(rounds) == sorted(set(rounds))
