"""Random sources and the masks they make.

A source r has C + 1 channels per position: r[..., :C] mixes into the component mask, the last
channel is the delta mask δ. ``continuous``: r ~ U[0, 1); ``binomial``: r ∈ {0, 1} with
probability 1/2 each.

Two fixed sources serve evaluation: ``zeros`` (m = ci_lower, δ = 0) and ``components_ones``
(m = 1, δ = 0: every component, no delta).
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp

from pd_train.squash import unit_clip

__all__ = ["masks", "sample_source"]

Sampling = Literal["continuous", "binomial"]


def sample_source(
    sampling: Sampling | str, shape: tuple[int, ...], *, key: jax.Array, dtype: Any = jnp.float32
) -> jax.Array:
    """A source of ``shape`` ([..., C + 1]) in ``dtype``."""
    if sampling == "continuous":
        return jax.random.uniform(key, shape, jnp.float32).astype(dtype)
    if sampling == "binomial":
        return jax.random.bernoulli(key, 0.5, shape).astype(dtype)
    if sampling == "zeros":
        return jnp.zeros(shape, dtype)
    if sampling == "components_ones":
        return jnp.concatenate(
            [jnp.ones((*shape[:-1], shape[-1] - 1), dtype), jnp.zeros((*shape[:-1], 1), dtype)],
            axis=-1,
        )
    msg = (
        f"sampling must be 'continuous' or 'binomial' (or 'zeros', 'components_ones' for "
        f"evaluation), got {sampling!r}"
    )
    raise ValueError(msg)


def masks(ci_lower: jax.Array, source: jax.Array) -> tuple[jax.Array, jax.Array]:
    """m = ci_lower + (1 − ci_lower)·r[..., :C] [..., C] and δ = r[..., C] [...].

    ci_lower [..., C]; source [..., C + 1]. ci_lower is clipped to [0, 1] here with a
    straight-through gradient (:func:`pd_train.squash.unit_clip`: no change for a clipped
    ci_lower), so the train step can pass its pre-activations under
    :func:`pd_train.squash.lower_leaky_hard_deferred` without materializing the clip.
    """
    ci = unit_clip(ci_lower)
    r = source.astype(ci.dtype)
    return ci + (1 - ci) * r[..., :-1], r[..., -1]
