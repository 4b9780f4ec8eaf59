"""Importance minimality (with its p annealing and its coefficient's schedule) and the L0 of
the causal importances.

The importance-minimality means are over the *global* batch before any nonlinearity: inside one
jit over globally sharded arrays, ``jnp.mean`` over the batch axes is already the global mean
(XLA inserts the cross-device reduction), so no explicit collective is needed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from pd_train.config.pd import CoeffScheduleFields, ImportanceMinimality, PDConfig
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term

if TYPE_CHECKING:
    from pd_train.census import CensusContext
    from pd_train.losses.plan import ReconPlan

__all__ = [
    "ImportanceMinimalityTerm",
    "ScheduledCoeffTerm",
    "annealed_pnorm",
    "coeff_multiplier",
    "coeff_schedule_hyperparams",
    "importance_minimality",
    "importance_terms",
    "l0",
    "linear_anneal",
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
    return linear_anneal(
        step, hp["anneal_start"], hp["anneal_span"], hp["pnorm_start"], hp["pnorm_delta"]
    )


def linear_anneal(step: Any, start: Any, span: Any, initial: Any, delta: Any) -> jax.Array:
    """f32 []: ``initial`` before step ``start``, ``initial + delta`` after ``start + span``,
    linear in between (a step function at ``start`` when ``span`` is 0). Arguments: arrays or
    floats (the schedules' scalars are data of the step)."""
    step = jnp.asarray(step, jnp.float32)
    ramp = jnp.clip((step - start) / jnp.where(span > 0, span, 1.0), 0.0, 1.0)
    frac = jnp.where(span > 0, ramp, (step >= start).astype(jnp.float32))
    return initial + delta * frac


def coeff_schedule_hyperparams(term: CoeffScheduleFields, total_steps: int) -> dict[str, float]:
    """The coefficient schedule's scalars as data (steps = fractions of ``total_steps``): the
    warmup's end, the peak multiplier, the anneal's start and its span."""
    start = term.coeff_anneal_start_frac * total_steps
    return {
        "coeff_warmup_end": term.coeff_warmup_frac * total_steps,
        "coeff_peak": float(term.coeff_peak_multiplier),
        "coeff_anneal_start": start,
        "coeff_anneal_span": term.coeff_anneal_end_frac * total_steps - start,
    }


def coeff_multiplier(hp: Mapping[str, Any], step: Any) -> jax.Array:
    """f32 []: the coefficient's multiplier at ``step`` from :func:`coeff_schedule_hyperparams`'
    values: peak · step / warmup_end during the warmup, then the peak until the anneal, linear
    from the peak to 1 across it, and 1 after it (a step to 1 at its start when it is empty)."""
    step = jnp.asarray(step, jnp.float32)
    warmup_end, peak = hp["coeff_warmup_end"], hp["coeff_peak"]
    ramp = peak * step / jnp.where(warmup_end > 0, warmup_end, 1.0)
    after = linear_anneal(step, hp["coeff_anneal_start"], hp["coeff_anneal_span"], peak, 1 - peak)
    return jnp.where(step < warmup_end, ramp, after)


def pnorm_at(term: ImportanceMinimality, step: jax.Array, total_steps: int) -> jax.Array:
    """p at ``step``: pnorm_start before anneal_start_frac·total_steps, pnorm_end after
    anneal_end_frac·total_steps, linear in between."""
    return annealed_pnorm(pnorm_hyperparams(term, total_steps), step)


def importance_terms(
    ci_upper: Mapping[str, jax.Array],
    *,
    pnorm: jax.Array | float,
    eps: jax.Array | float,
    reference_token_count: jax.Array | float | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """(activity, frequency): Σ_sites Σ_c f_c and Σ_sites Σ_c f_c·log2(1 + a·f_c), a =
    ``reference_token_count`` (None: no frequency term, returned as None).

    ci_upper[kind]: [n_k, B, T, C]; f_c = mean over (B, T) of (ci_upper + eps)^pnorm, per site
    and component: a global-batch mean taken before the log (see the module docstring).
    """
    activity = jnp.zeros((), jnp.float32)
    frequency = None if reference_token_count is None else jnp.zeros((), jnp.float32)
    for ci in ci_upper.values():
        f = jnp.mean((ci.astype(jnp.float32) + eps) ** pnorm, axis=(1, 2))  # [n_k, C]
        activity = activity + jnp.sum(f)
        if frequency is not None and reference_token_count is not None:
            frequency = frequency + jnp.sum(f * jnp.log2(1 + reference_token_count * f))
    return activity, frequency


def importance_minimality(
    ci_upper: Mapping[str, jax.Array],
    *,
    pnorm: jax.Array | float,
    eps: jax.Array | float,
    coeff: jax.Array | float = 1.0,
    frequency_coeff: jax.Array | float | None = None,
    reference_token_count: jax.Array | float = 65_536,
) -> jax.Array:
    """The importance loss with its coefficients applied: coeff·activity + frequency_coeff·
    frequency (:func:`importance_terms`; ``frequency_coeff`` None: no frequency term)."""
    activity, frequency = importance_terms(
        ci_upper,
        pnorm=pnorm,
        eps=eps,
        reference_token_count=None if frequency_coeff is None else reference_token_count,
    )
    total = coeff * activity
    if frequency is not None and frequency_coeff is not None:
        total = total + frequency_coeff * frequency
    return total


class ScheduledCoeffTerm(LossTerm):
    """A loss term whose coefficient follows param-decomp's schedule: its hyperparameters hold
    :func:`coeff_schedule_hyperparams`, and the step weighs it by coeff × :func:`coeff_multiplier`."""

    def coeff_multiplier(self, config: Any, hp: Hyperparams, step: jax.Array) -> jax.Array:
        del config
        return coeff_multiplier(hp, step)


class ImportanceMinimalityTerm(ScheduledCoeffTerm):
    """``importance_minimality``: reads ci_upper; reports ``pnorm``. Its value,
    which the step multiplies by ``coeff``, is activity + (frequency.coeff / coeff)·frequency,
    so the loss gains coeff·activity + frequency.coeff·frequency (the frequency term weighted by
    its own coefficient, param-decomp's convention; config validation keeps coeff > 0 when a
    frequency term is set). Values: coeff, eps, the p anneal (:func:`pnorm_hyperparams`),
    frequency.coeff and frequency.reference_token_count, the coefficient's schedule
    (:func:`coeff_schedule_hyperparams`). Structural: whether ``frequency`` is null (the
    frequency term is then left out)."""

    config_cls = ImportanceMinimality

    def hyperparams(self, config: Any, pd: PDConfig) -> dict[str, float | int]:
        out = {
            "coeff": float(config.coeff),
            "eps": float(config.eps),
            **pnorm_hyperparams(config, pd.steps),
            **coeff_schedule_hyperparams(config, pd.steps),
        }
        if config.frequency is not None:
            out["frequency_coeff"] = float(config.frequency.coeff)
            out["reference_token_count"] = float(config.frequency.reference_token_count)
        return out

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
        with_frequency = config.frequency is not None
        activity, frequency = importance_terms(
            inputs.ci_upper,
            pnorm=p,
            eps=hp["eps"],
            reference_token_count=hp["reference_token_count"] if with_frequency else None,
        )
        extra = {"pnorm": p}
        if frequency is None:
            return activity, extra
        coeff = hp["coeff"]
        ratio = hp["frequency_coeff"] / jnp.where(coeff > 0, coeff, 1.0)
        return activity + ratio * frequency, extra

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
