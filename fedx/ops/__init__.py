"""Server-side model operations: pure numpy on ``{name: np.ndarray}`` models.

Nothing here imports Flower or torch. Every function leaves its inputs
unchanged and takes randomness only from an explicit ``np.random.Generator``.
"""

from fedx.ops.aggregation import average
from fedx.ops.cross_aggregation import (
    SELECTIONS,
    collaborator_indices,
    cosine_similarity_matrix,
    cross_aggregate,
)
from fedx.ops.exchange import assign_exchanges, cluster_count, fedme_aggregate
from fedx.ops.mutation import dynamic_beta, mutate
from fedx.ops.recombination import GROUPINGS, layer_groups, recombine, segment_ids
from fedx.ops.typing import Model
from fedx.ops.validation import find_problem

__all__ = [
    "GROUPINGS",
    "Model",
    "SELECTIONS",
    "assign_exchanges",
    "average",
    "cluster_count",
    "collaborator_indices",
    "cosine_similarity_matrix",
    "cross_aggregate",
    "dynamic_beta",
    "fedme_aggregate",
    "find_problem",
    "layer_groups",
    "mutate",
    "recombine",
    "segment_ids",
]
