"""Building arrays directly in their sharding, and restore targets for checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from pd_sharding._errors import ShardingError
from pd_sharding._layout import path_name
from pd_sharding._spec import check_spec


def _is_sharding(x: Any) -> bool:
    return isinstance(x, jax.sharding.Sharding)


def _pairs(abstract: Any, shardings: Any, where: str) -> list[tuple[str, Any, Any]]:
    """``(name, abstract leaf, sharding)`` per leaf; checks structure and divisibility."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    s_leaves, s_treedef = jax.tree_util.tree_flatten(shardings, is_leaf=_is_sharding)
    if len(s_leaves) != len(leaves) or not all(_is_sharding(s) for s in s_leaves):
        msg = (
            f"{where}: shardings must be a tree of Sharding with the structure of the arrays "
            f"({treedef}); got {s_treedef}"
        )
        raise ShardingError(msg)
    out = []
    for (path, leaf), sharding in zip(leaves, s_leaves, strict=True):
        name = path_name(path) or "array"
        if isinstance(sharding, jax.sharding.NamedSharding):
            check_spec(leaf.shape, sharding.spec, dict(sharding.mesh.shape), name=name)
        out.append((name, leaf, sharding))
    return out


def place(fn: Callable[..., Any], shardings: Any, /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` computed by one jit whose outputs land in ``shardings``.

    Each device computes only its own shard of each output, so no full host or single-device
    copy ever exists. Output shapes are checked against the shardings first (via
    ``jax.eval_shape``), so an indivisible dim fails with its output path before any compile.
    """
    _pairs(jax.eval_shape(fn, *args, **kwargs), shardings, "place")
    return jax.jit(fn, out_shardings=shardings)(*args, **kwargs)


def zeros_like_sharded(abstract: Any, shardings: Any) -> Any:
    """Zeros with the shapes/dtypes of ``abstract`` (a tree of ShapeDtypeStructs), sharded."""

    def zeros() -> Any:
        return jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), abstract)

    return place(zeros, shardings)


def restore_targets(abstract: Any, shardings: Any) -> Any:
    """``ShapeDtypeStruct(shape, dtype, sharding=...)`` per leaf: what to restore onto.

    ``abstract`` is the saved tree's structure (arrays or ShapeDtypeStructs, e.g. from
    ``jax.eval_shape`` of the init); ``shardings`` are the current mesh's shardings from the
    layout. Pass the result as the restore target of an orbax ``StandardRestore`` /
    ``PyTreeRestore`` and each process reads only its shards.
    """
    pairs = _pairs(abstract, shardings, "restore_targets")
    treedef = jax.tree_util.tree_structure(abstract)
    targets = [jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s) for _, leaf, s in pairs]
    return jax.tree_util.tree_unflatten(treedef, targets)
