"""Server-side model operations: pure numpy on ``{name: np.ndarray}`` models.

Nothing here imports Flower or torch. Every function leaves its inputs
unchanged, takes randomness only from an explicit ``np.random.Generator``,
has a defined result for degenerate inputs (zero models, identical models,
one or two models) and turns finite inputs into finite outputs.
"""

from fedx.ops.aggregation import average, weighted_sums
from fedx.ops.cross_aggregation import SELECTIONS, collaborator_indices, cross_aggregate
from fedx.ops.model import Model
from fedx.ops.model_exchange import assign_exchanges, cluster_count, fedme_aggregate
from fedx.ops.mutation import dynamic_beta, mutate
from fedx.ops.recombination import GROUPINGS, layer_groups, recombine, segment_ids
from fedx.ops.similarity import SIMILARITY_MEASURES, cosine_similarity_matrix, similarity_terms
from fedx.ops.validation import find_problem

__all__ = [
    "GROUPINGS",
    "Model",
    "SELECTIONS",
    "SIMILARITY_MEASURES",
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
    "similarity_terms",
    "weighted_sums",
]
