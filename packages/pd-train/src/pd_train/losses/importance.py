"""Importance minimality (with its p annealing) and the L0 of the causal importances.

The importance-minimality means are over the *global* batch before any nonlinearity: inside one
jit over globally sharded arrays, ``jnp.mean`` over the batch axes is already the global mean
(XLA inserts the cross-device reduction), so no explicit collective is needed.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from pd_train.config import ImportanceMinimality

__all__ = ["importance_minimality", "l0", "pnorm_at"]


def pnorm_at(term: ImportanceMinimality, step: jax.Array, total_steps: int) -> jax.Array:
    """p at ``step``: pnorm_start before anneal_start_frac·total_steps, pnorm_end after
    anneal_end_frac·total_steps, linear in between."""
    start = term.anneal_start_frac * total_steps
    end = term.anneal_end_frac * total_steps
    step = jnp.asarray(step, jnp.float32)
    if end <= start:
        frac = (step >= start).astype(jnp.float32)
    else:
        frac = jnp.clip((step - start) / (end - start), 0.0, 1.0)
    return term.pnorm_start + (term.pnorm_end - term.pnorm_start) * frac


def importance_minimality(
    ci_upper: Mapping[str, jax.Array],
    *,
    pnorm: jax.Array | float,
    eps: float,
    frequency_coeff: float = 0.0,
    reference_token_count: int = 65_536,
) -> jax.Array:
    """Σ_sites Σ_c [f_c + frequency_coeff · f_c · log2(1 + reference_token_count · f_c)].

    ci_upper[kind]: [n_k, B, T, C]; f_c = mean over (B, T) of (ci_upper + eps)^pnorm, per site
    and component: a global-batch mean taken before the log (see the module docstring).
    """
    total = jnp.zeros((), jnp.float32)
    for ci in ci_upper.values():
        f = jnp.mean((ci.astype(jnp.float32) + eps) ** pnorm, axis=(1, 2))  # [n_k, C]
        total = total + jnp.sum(f)
        if frequency_coeff:
            total = total + frequency_coeff * jnp.sum(f * jnp.log2(1 + reference_token_count * f))
    return total


def l0(ci_lower: Mapping[str, jax.Array], threshold: float) -> dict[str, jax.Array]:
    """Per site, the mean over positions of the number of components with ci_lower > threshold.

    ci_lower[kind]: [n_k, B, T, C] -> {kind: [n_k]} (fp32).
    """
    return {
        kind: jnp.mean(jnp.sum((ci > threshold).astype(jnp.float32), axis=-1), axis=(1, 2))
        for kind, ci in ci_lower.items()
    }
