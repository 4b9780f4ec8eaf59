"""Random sources and the masks they make.

A source r has C + 1 channels per position: r[..., :C] mixes into the component mask, the last
channel is the delta mask δ. ``continuous``: r ~ U[0, 1); ``binomial``: the component
channels r ∈ {0, 1} with probability 1/2 each, the delta channel δ ~ U[0, 1) as under
``continuous`` (both reference implementations draw the delta mask uniformly in either mode).
Under ``binomial`` the lower CI is also jittered before its squash (:func:`jitter_lower`), as
spd does.

Two fixed sources serve evaluation: ``zeros`` (m = ci_lower, δ = 0) and ``components_ones``
(m = 1, δ = 0: every component, no delta).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp

from pd_train.squash import unit_clip

__all__ = ["JITTER_FOLD", "jitter_lower", "jitter_lower_ci", "masks", "sample_source"]

#: Folded into the step key (or an eval batch key) for the binomial CI jitter's draw; far from
#: the loss-term indices folded into the same key.
JITTER_FOLD = 0x6A17_7E42

Sampling = Literal["continuous", "binomial"]


def sample_source(
    sampling: Sampling | str, shape: tuple[int, ...], *, key: jax.Array, dtype: Any = jnp.float32
) -> jax.Array:
    """A source of ``shape`` ([..., C + 1]) in ``dtype``."""
    if sampling == "continuous":
        return jax.random.uniform(key, shape, jnp.float32).astype(dtype)
    if sampling == "binomial":
        comp_key, delta_key = jax.random.split(key)
        components = jax.random.bernoulli(comp_key, 0.5, (*shape[:-1], shape[-1] - 1))
        delta = jax.random.uniform(delta_key, (*shape[:-1], 1), jnp.float32)
        return jnp.concatenate([components.astype(dtype), delta.astype(dtype)], axis=-1)
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


def jitter_lower(pre: jax.Array, *, key: jax.Array) -> jax.Array:
    """``1.05·pre − 0.05·u``, u ~ U[0, 1) per element (any shape, pre's dtype): the binomial
    mode's jitter of the CI pre-activations that feed the *lower* squash (spd's
    ``calc_causal_importances``: one fresh draw per CI evaluation, shared by every mask built
    from it; the upper squash reads the unjittered pre-activations)."""
    u = jax.random.uniform(key, pre.shape, jnp.float32)
    return (1.05 * pre.astype(jnp.float32) - 0.05 * u).astype(pre.dtype)


def jitter_lower_ci(pre: Mapping[str, jax.Array], *, key: jax.Array) -> dict[str, jax.Array]:
    """:func:`jitter_lower` per kind ({kind: [n_k, B, T, C]}), each kind's draw from
    ``fold_in(key, crc32(kind))`` (keys from names)."""
    return {
        k: jitter_lower(v, key=jax.random.fold_in(key, zlib.crc32(k.encode()) & 0x7FFFFFFF))
        for k, v in pre.items()
    }


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
