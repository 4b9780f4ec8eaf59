"""Optimizers: AdamW per parameter group with a warmup-cosine schedule and global-norm clipping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from pd_train.config.pd import OptimizerConfig

__all__ = [
    "clip_by_global_norm",
    "lr_schedule",
    "make_optimizer",
    "optimizer_hyperparams",
    "schedule_hyperparams",
    "scheduled_lr",
]


def schedule_hyperparams(config: OptimizerConfig, total_steps: int) -> dict[str, float]:
    """The scalars of :func:`lr_schedule` as data (for :func:`scheduled_lr`): lr, the warmup
    steps and their divisor max(warmup, 1), the hold steps, the cosine's divisor D − 1 (1 when
    D = 1) and whether it decays (1.0, else 0.0: the value is f·lr after warmup and hold), f
    and (1 − f)/2 (taken in double precision, as the constants of the traced schedule were)."""
    warmup, hold, final = config.warmup_steps, config.hold_steps, config.final_val_frac
    decay = config.decay_steps
    if decay is None:
        decay = max(total_steps - warmup - hold, 1)
    return {
        "lr": float(config.lr),
        "warmup": float(warmup),
        "warmup_div": float(max(warmup, 1)),
        "hold": float(hold),
        "decay_div": float(decay - 1 if decay > 1 else 1),
        "decays": 1.0 if decay > 1 else 0.0,
        "final": float(final),
        "half_span": (1 - final) * 0.5,
    }


def scheduled_lr(hp: Mapping[str, Any], step: Any) -> jax.Array:
    """lr(step) of :func:`lr_schedule` from :func:`schedule_hyperparams`' values (arrays or
    floats): the same ops as the schedule's trace, so the same values."""
    step = jnp.asarray(step, jnp.float32)
    lr = hp["lr"]
    warm = lr * (step + 1) / hp["warmup_div"]
    s = step - hp["warmup"] - hp["hold"]  # < 0 while held: progress 0, the value lr
    held = jnp.where(s < 0, 0.0, 1.0)  # D = 1: lr while held, then f·lr at once
    progress = jnp.where(hp["decays"] > 0, jnp.clip(s / hp["decay_div"], 0.0, 1.0), held)
    cosine = lr * (hp["final"] + hp["half_span"] * (1 + jnp.cos(jnp.pi * progress)))
    return jnp.where(step < hp["warmup"], warm, cosine)


def lr_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """lr(step), step counted from 0.

    Warmup: ``lr·(step + 1)/warmup_steps`` for step < warmup_steps (so the first step already
    moves). Then with s = step − warmup_steps − hold_steps and D = decay_steps (default:
    total_steps − warmup_steps − hold_steps): ``lr·(f + (1 − f)·(1 + cos(π·clip(s/(D − 1), 0,
    1)))/2)`` with f = final_val_frac: ``lr`` while held (s < 0), f·lr exactly at s = D − 1 (the
    last step). D = 1 gives f·lr after the hold.
    """
    hp = schedule_hyperparams(config, total_steps)
    return lambda step: scheduled_lr(hp, step)


def optimizer_hyperparams(config: OptimizerConfig, total_steps: int) -> dict[str, Any]:
    """Every scalar of :func:`make_optimizer` as data: the schedule's
    (:func:`schedule_hyperparams`), b1, b2, eps, weight decay and the clip norm (1.0 when
    ``clip`` is null: whether to clip is structural)."""
    return {
        "schedule": schedule_hyperparams(config, total_steps),
        "b1": float(config.b1),
        "b2": float(config.b2),
        "eps": float(config.eps),
        "weight_decay": float(config.weight_decay),
        "clip": float(config.clip) if config.clip is not None else 1.0,
    }


class ClipState(NamedTuple):
    pass


def clip_by_global_norm(max_norm: float | jax.Array) -> optax.GradientTransformation:
    """Scale updates by min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the global L2 norm (as PyTorch's
    ``clip_grad_norm_`` does; optax's own clip divides by ‖g‖ without the epsilon)."""

    def init(params: Any) -> ClipState:
        del params
        return ClipState()

    def update(updates: Any, state: ClipState, params: Any = None) -> tuple[Any, ClipState]:
        del params
        norm = optax.tree.norm(updates)
        scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))
        return jax.tree_util.tree_map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformation(init, update)


def make_optimizer(
    config: OptimizerConfig, total_steps: int, hp: Mapping[str, Any] | None = None
) -> optax.GradientTransformation:
    """Clip (when ``config.clip``), then AdamW with :func:`lr_schedule` and weight decay.

    ``hp``: :func:`optimizer_hyperparams`' values, e.g. arrays of a jitted step's argument, in
    place of ``config``'s (whose ``clip`` still decides whether to clip); the state has the same
    structure either way."""
    hp = optimizer_hyperparams(config, total_steps) if hp is None else hp
    schedule = hp["schedule"]
    adamw = optax.adamw(
        lambda count: scheduled_lr(schedule, count),
        b1=hp["b1"],
        b2=hp["b2"],
        eps=hp["eps"],
        weight_decay=hp["weight_decay"],
    )
    if config.clip is None:
        return adamw
    return optax.chain(clip_by_global_norm(hp["clip"]), adamw)
