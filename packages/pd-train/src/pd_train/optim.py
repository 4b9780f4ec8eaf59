"""Optimizers: AdamW per parameter group with a warmup-cosine schedule and global-norm clipping."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from pd_train.config import OptimizerConfig

__all__ = ["clip_by_global_norm", "lr_schedule", "make_optimizer"]


def lr_schedule(config: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """lr(step), step counted from 0.

    Warmup: ``lr·(step + 1)/warmup_steps`` for step < warmup_steps (so the first step already
    moves). Then with s = step − warmup_steps and D = decay_steps (default: total_steps −
    warmup_steps): ``lr·(f + (1 − f)·(1 + cos(π·min(s/(D − 1), 1)))/2)`` with f =
    final_val_frac, which reaches f·lr exactly at s = D − 1 (the last step). D = 1 gives f·lr.
    """
    lr, warmup, final = config.lr, config.warmup_steps, config.final_val_frac
    decay = config.decay_steps if config.decay_steps is not None else max(total_steps - warmup, 1)

    def schedule(step: Any) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        warm = lr * (step + 1) / max(warmup, 1)
        s = step - warmup
        progress = jnp.clip(s / (decay - 1), 0.0, 1.0) if decay > 1 else jnp.ones_like(s)
        cosine = lr * (final + (1 - final) * 0.5 * (1 + jnp.cos(jnp.pi * progress)))
        return jnp.where(step < warmup, warm, cosine)

    return schedule


class ClipState(NamedTuple):
    pass


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
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


def make_optimizer(config: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    """Clip (when ``config.clip``), then AdamW with :func:`lr_schedule` and weight decay."""
    adamw = optax.adamw(
        lr_schedule(config, total_steps),
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
    )
    if config.clip is None:
        return adamw
    return optax.chain(clip_by_global_norm(config.clip), adamw)
