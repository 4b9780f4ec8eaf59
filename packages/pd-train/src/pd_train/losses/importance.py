"""Importance minimality (with its p annealing) and the L0 of the causal importances.

The importance-minimality means are over the *global* batch before any nonlinearity: inside one
jit over globally sharded arrays, ``jnp.mean`` over the batch axes is already the global mean
(XLA inserts the cross-device reduction), so no explicit collective is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from pd_train.config import ImportanceMinimality, PDConfig
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term

if TYPE_CHECKING:
    from pd_train.flops import CensusContext
    from pd_train.losses.recon import ReconPlan

__all__ = [
    "ImportanceMinimalityTerm",
    "annealed_pnorm",
    "importance_minimality",
    "l0",
    "pnorm_at",
    "pnorm_hyperparams",
]


def pnorm_hyperparams(term: ImportanceMinimality, total_steps: int) -> dict[str, float]:
    """The p anneal's scalars as data: its start and end steps, their span, p at the start and
    its change (spans and changes taken in double precision, as the traced constants were)."""
    start = term.anneal_start_frac * total_steps
    end = term.anneal_end_frac * total_steps
    return {
        "anneal_start": start,
        "anneal_span": end - start,
        "pnorm_start": float(term.pnorm_start),
        "pnorm_delta": term.pnorm_end - term.pnorm_start,
    }


def annealed_pnorm(hp: Mapping[str, Any], step: Any) -> jax.Array:
    """p at ``step`` from :func:`pnorm_hyperparams`' values (arrays or floats): pnorm_start
    before the window, pnorm_end after it, linear in between (a step function at anneal_start
    when the window is empty)."""
    step = jnp.asarray(step, jnp.float32)
    span = hp["anneal_span"]
    ramp = jnp.clip((step - hp["anneal_start"]) / jnp.where(span > 0, span, 1.0), 0.0, 1.0)
    frac = jnp.where(span > 0, ramp, (step >= hp["anneal_start"]).astype(jnp.float32))
    return hp["pnorm_start"] + hp["pnorm_delta"] * frac


def pnorm_at(term: ImportanceMinimality, step: jax.Array, total_steps: int) -> jax.Array:
    """p at ``step``: pnorm_start before anneal_start_frac·total_steps, pnorm_end after
    anneal_end_frac·total_steps, linear in between."""
    return annealed_pnorm(pnorm_hyperparams(term, total_steps), step)


def importance_minimality(
    ci_upper: Mapping[str, jax.Array],
    *,
    pnorm: jax.Array | float,
    eps: jax.Array | float,
    frequency_coeff: jax.Array | float = 0.0,
    reference_token_count: jax.Array | float = 65_536,
) -> jax.Array:
    """Σ_sites Σ_c [f_c + frequency_coeff · f_c · log2(1 + reference_token_count · f_c)].

    ci_upper[kind]: [n_k, B, T, C]; f_c = mean over (B, T) of (ci_upper + eps)^pnorm, per site
    and component: a global-batch mean taken before the log (see the module docstring). A
    Python-float ``frequency_coeff`` of 0 leaves the frequency term out of the program (an
    array coefficient always keeps it).
    """
    with_frequency = isinstance(frequency_coeff, jax.Array) or frequency_coeff != 0
    total = jnp.zeros((), jnp.float32)
    for ci in ci_upper.values():
        f = jnp.mean((ci.astype(jnp.float32) + eps) ** pnorm, axis=(1, 2))  # [n_k, C]
        total = total + jnp.sum(f)
        if with_frequency:
            total = total + frequency_coeff * jnp.sum(f * jnp.log2(1 + reference_token_count * f))
    return total


class ImportanceMinimalityTerm(LossTerm):
    """``importance_minimality``: reads ci_upper; reports ``pnorm``. Values: coeff, eps, the p
    anneal (:func:`pnorm_hyperparams`), frequency_coeff, reference_token_count (a float).
    Structural: whether frequency_coeff is 0 (the frequency term is then left out)."""

    config_cls = ImportanceMinimality

    def hyperparams(self, config: Any, pd: PDConfig) -> dict[str, float | int]:
        return {
            "coeff": float(config.coeff),
            "eps": float(config.eps),
            "frequency_coeff": float(config.frequency_coeff),
            "reference_token_count": float(config.reference_token_count),
            **pnorm_hyperparams(config, pd.steps),
        }

    def value(
        self,
        config: Any,
        inputs: TermInputs,
        *,
        plan: ReconPlan | None,
        hp: Hyperparams,
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        del plan, key
        assert inputs.ci_upper is not None
        p = annealed_pnorm(hp, inputs.step)
        value = importance_minimality(
            inputs.ci_upper,
            pnorm=p,
            eps=hp["eps"],
            frequency_coeff=hp["frequency_coeff"] if config.frequency_coeff else 0.0,
            reference_token_count=hp["reference_token_count"],
        )
        return value, {"pnorm": p}

    def flops(self, config: Any, census: CensusContext, *, plan: ReconPlan | None) -> None:
        del config, census, plan  # elementwise on ci_upper only


register_loss_term(ImportanceMinimalityTerm())


def l0(ci_lower: Mapping[str, jax.Array], threshold: float) -> dict[str, jax.Array]:
    """Per site, the mean over positions of the number of components with ci_lower > threshold.

    ci_lower[kind]: [n_k, B, T, C] -> {kind: [n_k]} (fp32).
    """
    return {
        kind: jnp.mean(jnp.sum((ci > threshold).astype(jnp.float32), axis=-1), axis=(1, 2))
        for kind, ci in ci_lower.items()
    }
