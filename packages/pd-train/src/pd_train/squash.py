"""Squashing CI pre-activations into ``ci_lower`` (masks) and ``ci_upper`` (minimality).

``lower_leaky_hard`` is clip(x, 0, 1) forward with a custom backward: the gradient g passes on
(0, 1]; below and at 0 only a negative g passes, scaled by ``alpha`` (so a component pushed to 0
can still be pulled back up, never further down); above 1 nothing passes.
``upper_leaky_hard`` is 0 below 0, x on [0, 1], 1 + alpha·(x − 1) above 1, with ordinary autodiff.

``lower_leaky_hard`` in two halves, so that the step never materializes ``ci_lower`` next to
the pre-activations it is a clip of (one all-site CI buffer less per device, docs/findings.md
section 8): ``lower_leaky_hard_deferred`` is the identity forward whose backward is
``lower_leaky_hard``'s on the *summed* gradient of every use, and ``unit_clip`` (clip(x, 0, 1)
forward, the identity backward) clips at each use. ``unit_clip(lower_leaky_hard_deferred(x))``
equals ``lower_leaky_hard(x)`` in value and gradient however many uses there are, because the
leak rule (which depends on the sign of the gradient) sees the same sum; ``unit_clip`` of an
already clipped value changes neither value nor gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = [
    "ALPHA",
    "lower_leaky_hard",
    "lower_leaky_hard_deferred",
    "unit_clip",
    "upper_leaky_hard",
]

ALPHA = 0.01


@jax.custom_vjp
def lower_leaky_hard(x: jax.Array) -> jax.Array:
    """clip(x, 0, 1), any shape; see the module docstring for the gradient."""
    return jnp.clip(x, 0.0, 1.0)


def _lower_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.clip(x, 0.0, 1.0), x


def _lower_bwd(x: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    inside = (x > 0) & (x <= 1)
    leak = (x <= 0) & (g < 0)
    zero = jnp.zeros_like(g)
    return (jnp.where(inside, g, jnp.where(leak, ALPHA * g, zero)),)


lower_leaky_hard.defvjp(_lower_fwd, _lower_bwd)


@jax.custom_vjp
def lower_leaky_hard_deferred(x: jax.Array) -> jax.Array:
    """x itself, any shape; the backward is :func:`lower_leaky_hard`'s. Its uses must clip
    with :func:`unit_clip` (see the module docstring)."""
    return x


def _deferred_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x, x


lower_leaky_hard_deferred.defvjp(_deferred_fwd, _lower_bwd)


@jax.custom_vjp
def unit_clip(x: jax.Array) -> jax.Array:
    """clip(x, 0, 1), any shape; the gradient passes unchanged (straight through)."""
    return jnp.clip(x, 0.0, 1.0)


def _unit_clip_fwd(x: jax.Array) -> tuple[jax.Array, None]:
    return jnp.clip(x, 0.0, 1.0), None


def _unit_clip_bwd(_: None, g: jax.Array) -> tuple[jax.Array]:
    return (g,)


unit_clip.defvjp(_unit_clip_fwd, _unit_clip_bwd)


def upper_leaky_hard(x: jax.Array) -> jax.Array:
    """0 below 0, x on [0, 1], 1 + ALPHA·(x − 1) above 1; any shape."""
    return jnp.where(x > 1, 1 + ALPHA * (x - 1), jnp.where(x > 0, x, jnp.zeros_like(x)))
