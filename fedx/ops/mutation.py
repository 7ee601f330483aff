"""FedMut's stochastic model mutation (Hu et al., AAAI'24, Sec. "Model Mutation").

The server turns the aggregated global model into K models that lie around it:
with ``g = w_glb - w_glb_previous``, mutated model ``i`` is
``w_glb + alpha * v_i * g`` layer by layer (eq. 2), where each layer's values
``v`` over the models are half ``+1`` and half ``-1 + beta`` in a random order
(Algorithm 2, eq. 4; dynamic preference, eq. 5).
"""

import math

import numpy as np

from fedx.ops.model import Model, layout_problem


def dynamic_beta(beta0: float, round_index: int, beta_rounds: int) -> float:
    """Dynamic preference ``beta_t = max(beta0 * (1 - t / T_b), 0)`` (eq. 5).

    Parameters
    ----------
    beta0 : float
        Starting preference in [0, 1]; the paper uses 0.3 (CNN, VGG-16) and
        0.5 (ResNet-18).
    round_index : int
        ``t``, the number of rounds done so far, non-negative.
    beta_rounds : int
        ``T_b``, the round at which the preference reaches zero, positive
        (100 in the authors' code).

    Returns
    -------
    float
        ``beta_t`` in ``[0, beta0]``, falling linearly to zero at ``T_b``.
    """
    _check_unit_interval("beta0", beta0)
    if round_index < 0:
        raise ValueError(f"round_index must be >= 0, got {round_index}")
    if beta_rounds <= 0:
        raise ValueError(f"beta_rounds must be > 0, got {beta_rounds}")
    return max(beta0 * (1.0 - round_index / beta_rounds), 0.0)


def mutate(
    global_model: Model,
    previous_global: Model,
    rng: np.random.Generator,
    *,
    k: int,
    alpha: float,
    beta: float = 0.0,
) -> list[Model]:
    """Mutate the global model along its last update: FedMut's ModelMutation.

    For every floating-point tensor (a "layer") a list of ``2 * (k // 2)``
    mutation values, half ``+1`` and half ``-1 + beta``, is shuffled on its
    own; mutated model ``i`` takes ``global + alpha * v_i * g`` for that
    layer. With ``beta = 0`` the mutated models average to the global model
    and each mutated layer is ``alpha * ||g_l||`` away from the global one.

    Parameters
    ----------
    global_model : Model
        ``w_glb``, this round's aggregated model. Not modified.
    previous_global : Model
        ``w_glb`` of the previous round, same names and shapes. Not modified.
    rng : np.random.Generator
        Source of the per-layer shuffles.
    k : int
        Number of models to return, at least 1.
    alpha : float
        Mutation range, non-negative (paper: 4.0).
    beta : float
        Dynamic preference ``beta_t`` in [0, 1]; see :func:`dynamic_beta`.

    Returns
    -------
    list[Model]
        ``k`` models in the state-dict order of ``global_model``. The first
        ``2 * (k // 2)`` are mutated; for odd ``k`` the last one is the global
        model itself. Per layer there are only two distinct mutated arrays
        (for ``+1`` and for ``-1 + beta``), which the models share; integer
        tensors are the global model's own arrays. Treat all of them as
        read-only. Finite inputs give finite models: where the mutation
        leaves the dtype's range (a diverging run), values saturate at its
        largest finite magnitude.
    """
    _check_mutation_arguments(global_model, previous_global, k=k, alpha=alpha, beta=beta)
    num_mutated = 2 * (k // 2)
    mutated: list[Model] = [{} for _ in range(num_mutated)]
    for name, weights in global_model.items():
        if not np.issubdtype(weights.dtype, np.floating):
            for model in mutated:
                model[name] = weights
            continue
        forward, backward = _mutated_layers(weights, previous_global[name], alpha, beta)
        # True marks the models that move along +g; exactly half of them.
        moves_forward = rng.permutation(num_mutated) < num_mutated // 2
        for model, forward_here in zip(mutated, moves_forward, strict=True):
            model[name] = forward if forward_here else backward
    if k % 2 == 1:
        mutated.append(dict(global_model))
    return mutated


def _mutated_layers(
    weights: np.ndarray, previous: np.ndarray, alpha: float, beta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``weights + alpha * g`` and ``weights + alpha * (beta - 1) * g``.

    Two output arrays and no other temporaries: the update ``g`` is written
    into the first output, scaled in place, then the second output is built
    from it before the first is finished. If an operation overflows (an
    update beyond the dtype's range), both are computed again by
    :func:`_saturated_mutation`.
    """
    scalar = weights.dtype.type
    forward = np.empty_like(weights)
    backward = np.empty_like(weights)
    try:
        # numpy checks the FPU's overflow flag after every ufunc call anyway:
        # raising on it costs nothing until a layer overflows.
        with np.errstate(over="raise", invalid="raise"):
            np.subtract(weights, previous, out=forward)
            np.multiply(forward, scalar(alpha * (beta - 1.0)), out=backward)
            backward += weights
            forward *= scalar(alpha)
            forward += weights
    except FloatingPointError:
        with np.errstate(over="ignore", invalid="ignore"):
            forward[...] = _saturated_mutation(weights, previous, alpha)
            backward[...] = _saturated_mutation(weights, previous, alpha * (beta - 1.0))
    return forward, backward


def _saturated_mutation(weights: np.ndarray, previous: np.ndarray, factor: float) -> np.ndarray:
    """``weights + factor * (weights - previous)`` without overflow on the way.

    Computed in float64 (or wider) on inputs halved, so the difference
    cannot overflow, then doubled back; values beyond ``weights``' dtype
    saturate at its largest finite value. Finite inputs give a finite
    result; NaN or Inf in the inputs stay NaN or Inf.
    """
    wide = np.promote_types(weights.dtype, np.float64)
    half = weights.astype(wide) * 0.5
    # asarray: on a 0-d layer (a scalar parameter) numpy's arithmetic gives a
    # scalar, which in-place operations below cannot write into.
    moved = np.asarray(half + factor * (half - previous.astype(wide) * 0.5))
    moved *= 2.0
    if np.isfinite(weights).all() and np.isfinite(previous).all():
        largest = np.finfo(weights.dtype).max
        np.clip(moved, -largest, largest, out=moved)
    return moved.astype(weights.dtype)


def _check_mutation_arguments(
    global_model: Model, previous_global: Model, *, k: int, alpha: float, beta: float
) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be finite and >= 0, got {alpha}")
    _check_unit_interval("beta", beta)
    problem = layout_problem(global_model, previous_global)
    if problem is not None:
        raise ValueError(f"previous_global does not match global_model: {problem}")


def _check_unit_interval(argument: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{argument} must be in [0, 1], got {value}")
