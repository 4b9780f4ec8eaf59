"""Loss terms, each a pure function of small arrays, reduced in fp32.

The importance-minimality means are over the *global* batch before any nonlinearity: inside one
jit over globally sharded arrays, ``jnp.mean`` over the batch axes is already the global mean
(XLA inserts the cross-device reduction), so no explicit collective is needed.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.config import ImportanceMinimality
from pd_train.decomposition import Decomposition

__all__ = [
    "faithfulness",
    "importance_minimality",
    "kl_clean_masked",
    "l0",
    "pnorm_at",
]


def _layers_of(stack: jax.Array, layers: tuple[int, ...]) -> jax.Array:
    """``stack[list(layers)]``, as a static slice when the layers are contiguous."""
    if layers == tuple(range(layers[0], layers[0] + len(layers))):
        return jax.lax.slice_in_dim(stack, layers[0], layers[0] + len(layers))
    return jnp.take(stack, np.asarray(layers), axis=0)


def faithfulness(
    target_layers: Mapping[str, jax.Array],
    components: Mapping[str, Mapping[str, jax.Array]],
    decomposition: Decomposition,
) -> jax.Array:
    """Σ_sites ‖W − V@U‖² / Σ_sites numel(W), fp32.

    target_layers[kind]: [L, d_in, d_out]; components[kind]: V [n_k, d_in, C], U [n_k, C, d_out].
    One layer at a time (``lax.map``), so no [n_k, d_in, d_out] product is ever materialized.
    """
    total = jnp.zeros((), jnp.float32)
    numel = 0
    for layout in decomposition.kinds:
        w = _layers_of(target_layers[layout.kind], layout.layers)
        v, u = components[layout.kind]["V"], components[layout.kind]["U"]

        def site(args: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
            w_l, v_l, u_l = args
            diff = w_l.astype(jnp.float32) - v_l.astype(jnp.float32) @ u_l.astype(jnp.float32)
            return jnp.sum(diff * diff)

        total = total + jnp.sum(jax.lax.map(site, (w, v, u)))
        numel += len(layout.layers) * layout.d_in * layout.d_out
    # A Python float: at Llama-8B size numel is ~7e9, beyond the int32 a Python int becomes.
    return total / float(numel)


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


def kl_clean_masked(clean_logits: jax.Array, masked_logits: jax.Array) -> jax.Array:
    """KL(softmax(clean) ‖ softmax(masked)), summed over vocab, mean over positions; fp32.

    Both [B, T, vocab]; the clean side carries no gradient.
    """
    clean = jax.lax.stop_gradient(clean_logits.astype(jnp.float32))
    log_p = jax.nn.log_softmax(clean, axis=-1)
    log_q = jax.nn.log_softmax(masked_logits.astype(jnp.float32), axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1))


def l0(ci_lower: Mapping[str, jax.Array], threshold: float) -> dict[str, jax.Array]:
    """Per site, the mean over positions of the number of components with ci_lower > threshold.

    ci_lower[kind]: [n_k, B, T, C] -> {kind: [n_k]} (fp32).
    """
    return {
        kind: jnp.mean(jnp.sum((ci > threshold).astype(jnp.float32), axis=-1), axis=(1, 2))
        for kind, ci in ci_lower.items()
    }
