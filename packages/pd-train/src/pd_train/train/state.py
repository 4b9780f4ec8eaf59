"""The train state, its two optimizer groups and the step key.

Keys. The run key is folded with the step number to give the step key
(:func:`step_key`); the step is a pure function of (state, target, batch, step key). Inside, the
term key of ``pd.loss_metrics[i]`` is ``fold_in(step_key, i)``; recon terms fold it with the chunk
number, then the draw number (see :mod:`pd_train.losses.recon` for the folds below that). Nothing else
is random in the step, so the same run key and data give bit-identical steps.

Parameters (fp32 masters) are ``{"components": {kind: {"V": [n_k, d_in, C], "U": [n_k, C,
d_out]}}, "ci_fn": {kind: {name: [n_k, ...]}}}``, stacked per kind over the layers the kind
covers. Two optimizer groups, ``components`` and ``ci_fn``, each AdamW with its own schedule.
With a mesh, params and both Adam moments are ZeRO-1 sharded (pd-sharding), the target FSDP,
the batch over the data axes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

__all__ = ["GROUPS", "TrainState", "group_name", "step_key"]

#: The two optimizer groups, in order.
GROUPS = ("components", "ci_fn")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything the step updates (donated to it). ``step``: int32 []; ``params`` and
    ``opt_state``: ``{"components": ..., "ci_fn": ...}``; ``adversary``: with a
    ``persistent_pgd_recon`` term ``{"sources": {kind: [n_k, B | 1, T, C + 1]}, "opt_state":
    {"count": int32 [], "m"/"v" (adam): like sources}}``, else ``{}``; ``term_state``: per loss
    term with state (:meth:`pd_train.losses.LossTerm.state`), ``{str(index in pd.loss_metrics):
    its state}`` (e.g. a smooth-L0 term's frequency EMA ``{kind: [n_k, C]}``), else ``{}``."""

    step: Any
    params: dict[str, Any]
    opt_state: dict[str, Any]
    adversary: dict[str, Any] = dataclasses.field(default_factory=dict)
    term_state: dict[str, Any] = dataclasses.field(default_factory=dict)


def group_name(path: Any) -> str:
    """A params leaf's pd-init group: its dotted path (``ci_fn.blocks.wq``)."""
    return jax.tree_util.keystr(path, simple=True, separator=".")


def step_key(run_key: jax.Array, step: int | jax.Array) -> jax.Array:
    """The key of step ``step``: ``fold_in(run_key, step)``."""
    return jax.random.fold_in(run_key, step)
