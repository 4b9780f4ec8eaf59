"""Squashing CI pre-activations into ``ci_lower`` (masks) and ``ci_upper`` (minimality).

``lower_leaky_hard`` is clip(x, 0, 1) forward with a custom backward: the gradient g passes on
(0, 1]; below and at 0 only a negative g passes, scaled by ``alpha`` (so a component pushed to 0
can still be pulled back up, never further down); above 1 nothing passes.
``upper_leaky_hard`` is 0 below 0, x on [0, 1], 1 + alpha·(x − 1) above 1, with ordinary autodiff.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["ALPHA", "lower_leaky_hard", "upper_leaky_hard"]

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


def upper_leaky_hard(x: jax.Array) -> jax.Array:
    """0 below 0, x on [0, 1], 1 + ALPHA·(x − 1) above 1; any shape."""
    return jnp.where(x > 1, 1 + ALPHA * (x - 1), jnp.where(x > 0, x, jnp.zeros_like(x)))
