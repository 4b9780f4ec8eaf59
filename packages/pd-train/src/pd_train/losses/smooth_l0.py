"""``smooth_l0_importance_minimality``: importance minimality with the smooth-L0
(Geman–McClure) penalty and an annealed width γ, and optionally a debiased EMA of the component
frequencies for the frequency part (param-decomp's SPEC S8', S8'', S9).

Per site and component, over the *global* batch (``jnp.mean`` inside one jit over globally
sharded arrays is the global mean, as in :mod:`pd_train.losses.importance`)::

    f_c      = mean_{b,t} ci² / (ci² + γ²)                    ci = ci_upper [n_k, B, T, C]
    activity = Σ_sites Σ_c f_c
    freq     = Σ_sites Σ_c Φ(f_c),   Φ(f) = f · log2(1 + a · f),   a = reference_token_count

The term contributes ``coeff · activity + frequency_coeff · freq`` (independent coefficients);
its value (what the step multiplies by ``coeff``) is ``activity + (frequency_coeff / coeff) ·
freq``. γ goes linearly from ``gamma_start`` to ``gamma_end`` between ``anneal_start_frac`` and
``anneal_end_frac`` of ``pd.steps − 1`` (the end value is reached at the last step).

With ``ema_halflife_steps = h`` the frequency part reads a debiased EMA of f kept in the train
state (``TrainState.term_state``, one ``{kind: [n_k, C]}`` f32 per such term)::

    decay = 2^(−1/h);  ema' = decay · ema + (1 − decay) · sg(f);  f̂ = ema' / (1 − decay^(step+1))
    freq  = Σ Φ(f̂) + sg(Φ'(f̂)) · (f − sg(f))       (value Φ(f̂), gradient Φ'(f̂) · ∂f)

so f̂ = f exactly at step 0 and the gradient keeps the current batch's full scale.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from pd_train.config.pd import PDConfig, SmoothL0ImportanceMinimality
from pd_train.losses._term import Hyperparams, TermInputs, register_loss_term
from pd_train.losses.importance import (
    ScheduledCoeffTerm,
    coeff_schedule_hyperparams,
    linear_anneal,
)

if TYPE_CHECKING:
    from pd_train.census import CensusContext
    from pd_train.decomposition import Decomposition
    from pd_train.losses.plan import ReconPlan

__all__ = [
    "SmoothL0ImportanceMinimality",
    "SmoothL0ImportanceMinimalityTerm",
    "ema_frequency_penalty",
    "gamma_at",
    "smooth_l0_frequencies",
]


def gamma_hyperparams(term: SmoothL0ImportanceMinimality, total_steps: int) -> dict[str, float]:
    """γ's schedule as data: window start (in steps), its span, γ at the start and its change."""
    last = max(total_steps - 1, 0)
    start = term.anneal_start_frac * last
    end = term.anneal_end_frac * last
    return {
        "gamma_anneal_start": start,
        "gamma_anneal_span": end - start,
        "gamma_start": float(term.gamma_start),
        "gamma_delta": term.gamma_end - term.gamma_start,
    }


def gamma_at(hp: Mapping[str, Any], step: Any) -> jax.Array:
    """γ at ``step`` from :func:`gamma_hyperparams`' values: gamma_start before the window,
    gamma_end after it, linear in between (a step at the window start when it is empty)."""
    return linear_anneal(
        step,
        hp["gamma_anneal_start"],
        hp["gamma_anneal_span"],
        hp["gamma_start"],
        hp["gamma_delta"],
    )


def smooth_l0_frequencies(
    ci_upper: Mapping[str, jax.Array], gamma: jax.Array | float
) -> dict[str, jax.Array]:
    """{kind: [n_k, C]}: mean over (B, T) of ci² / (ci² + γ²), ci_upper[kind] [n_k, B, T, C]."""
    out = {}
    for kind, ci in ci_upper.items():
        sq = jnp.square(ci.astype(jnp.float32))
        out[kind] = jnp.mean(sq / (sq + jnp.square(gamma)), axis=(1, 2))
    return out


def _phi(f: jax.Array, a: jax.Array | float) -> jax.Array:
    return f * jnp.log2(1 + a * f)


def _phi_prime(f: jax.Array, a: jax.Array | float) -> jax.Array:
    return jnp.log2(1 + a * f) + a * f / ((1 + a * f) * math.log(2))


def ema_frequency_penalty(
    f: jax.Array,
    ema: jax.Array,
    *,
    step: jax.Array,
    halflife: jax.Array | float,
    reference_token_count: jax.Array | float,
) -> tuple[jax.Array, jax.Array]:
    """(Σ Φ(f̂) with gradient Φ'(f̂)·∂f, the new EMA) for one site stack: f, ema [n_k, C]."""
    decay = jnp.exp2(-1.0 / jnp.asarray(halflife, jnp.float32))
    sg_f = jax.lax.stop_gradient(f)
    new_ema = decay * ema + (1 - decay) * sg_f
    steps_seen = jnp.asarray(step, jnp.float32) + 1
    f_hat = new_ema / (1 - jnp.power(decay, steps_seen))
    a = reference_token_count
    surrogate = _phi(f_hat, a) + jax.lax.stop_gradient(_phi_prime(f_hat, a)) * (f - sg_f)
    return jnp.sum(surrogate), new_ema


class SmoothL0ImportanceMinimalityTerm(ScheduledCoeffTerm):
    """Reads ci_upper; reports ``gamma``, ``smooth_l0/activity`` and ``smooth_l0/frequency``
    (both before their coefficients). Values: coeff, frequency_coeff, reference_token_count,
    the γ schedule, ema_halflife_steps. Structural: whether frequency_coeff is 0 and whether
    an EMA is kept (it adds ``{kind: [n_k, C]}`` f32 to the train state)."""

    config_cls = SmoothL0ImportanceMinimality

    def hyperparams(self, config: Any, pd: PDConfig) -> dict[str, float | int]:
        hp: dict[str, float | int] = {
            "coeff": float(config.coeff),
            "frequency_coeff": float(config.frequency_coeff),
            "reference_token_count": float(config.reference_token_count),
            **gamma_hyperparams(config, pd.steps),
            **coeff_schedule_hyperparams(config, pd.steps),
        }
        if config.ema_halflife_steps is not None:
            hp["ema_halflife_steps"] = float(config.ema_halflife_steps)
        return hp

    def state(self, config: Any, decomposition: Decomposition) -> dict[str, Any] | None:
        """The EMA's shapes ({kind: ShapeDtypeStruct [n_k, C] f32}; zeros at step 0), or None."""
        if config.ema_halflife_steps is None:
            return None
        return {
            k.kind: jax.ShapeDtypeStruct((len(k.layers), k.C), jnp.float32)
            for k in decomposition.kinds
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
        value, extras, _ = self.stateful_value(config, inputs, None, plan=plan, hp=hp, key=key)
        return value, extras

    def stateful_value(
        self,
        config: Any,
        inputs: TermInputs,
        state: Mapping[str, jax.Array] | None,
        *,
        plan: ReconPlan | None,
        hp: Hyperparams,
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array], dict[str, jax.Array] | None]:
        """(value, extra metrics, the new EMA or None); ``state``: the EMA (None: no EMA)."""
        del plan, key
        assert inputs.ci_upper is not None
        gamma = gamma_at(hp, inputs.step)
        freqs = smooth_l0_frequencies(inputs.ci_upper, gamma)
        activity = sum((jnp.sum(f) for f in freqs.values()), jnp.zeros((), jnp.float32))
        extras = {"gamma": gamma, "smooth_l0/activity": activity}
        value = activity
        new_state = None
        if config.frequency_coeff:
            a = hp["reference_token_count"]
            freq = jnp.zeros((), jnp.float32)
            if state is None:
                for f in freqs.values():
                    freq = freq + jnp.sum(_phi(f, a))
            else:
                new_state = {}
                for kind, f in freqs.items():
                    part, new_state[kind] = ema_frequency_penalty(
                        f,
                        state[kind],
                        step=inputs.step,
                        halflife=hp["ema_halflife_steps"],
                        reference_token_count=a,
                    )
                    freq = freq + part
            extras["smooth_l0/frequency"] = freq
            value = value + hp["frequency_coeff"] / hp["coeff"] * freq
        return value, extras, new_state

    def flops(self, config: Any, census: CensusContext, *, plan: ReconPlan | None) -> None:
        del config, census, plan  # elementwise on ci_upper only


register_loss_term(SmoothL0ImportanceMinimalityTerm())
