"""Optimizer-state shardings derived from the parameters' shardings by matching key paths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from pd_sharding._errors import ShardingError
from pd_sharding._layout import path_name


def opt_state_shardings(
    init: Callable[[Any], Any],
    params: Any,
    param_shardings: Any,
    *,
    mesh: Any = None,
) -> Any:
    """Shardings for ``init(params)`` (e.g. an optax ``tx.init``), without running it.

    The state's shapes come from ``jax.eval_shape(init, params)``. A state leaf whose key path
    ends with a parameter's key path and has that parameter's shape takes the parameter's
    sharding (Adam's ``mu``/``nu`` under chain, multi_transform, inject_hyperparams, masked
    states all nest the params tree that way; the longest matching path wins). Any other leaf of
    size 1 (step counts, injected hyperparameters) is replicated on ``mesh`` (default: the mesh
    of the first parameter sharding). Any other leaf (e.g. a factored second moment) is an
    error naming its path: such state needs shardings built by hand.

    ``params``: arrays or ShapeDtypeStructs; ``param_shardings``: the same tree of shardings.
    Returns a tree of the state's structure with a sharding at every leaf.
    """
    state = jax.eval_shape(init, params)
    param_leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    sharding_leaves = jax.tree_util.tree_leaves(
        param_shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )
    if len(sharding_leaves) != len(param_leaves):
        msg = (
            f"opt_state_shardings: param_shardings has {len(sharding_leaves)} leaves but params "
            f"has {len(param_leaves)}; pass one sharding per parameter, in the same tree"
        )
        raise ShardingError(msg)
    by_path = {
        tuple(path): (tuple(leaf.shape), sharding)
        for (path, leaf), sharding in zip(param_leaves, sharding_leaves, strict=True)
    }
    lengths = sorted({len(p) for p in by_path}, reverse=True)
    if mesh is None:
        named = [s for s in sharding_leaves if isinstance(s, NamedSharding)]
        if not named:
            msg = "opt_state_shardings: no NamedSharding among param_shardings; pass mesh="
            raise ShardingError(msg)
        mesh = named[0].mesh
    replicated = NamedSharding(mesh, PartitionSpec())

    def one(path: Any, leaf: Any) -> Any:
        path = tuple(path)
        shape = tuple(leaf.shape)
        for n in lengths:
            if n > len(path):
                continue
            match = by_path.get(path[len(path) - n :])
            if match is not None and match[0] == shape:
                return match[1]
        size = 1
        for d in shape:
            size *= d
        if size == 1:
            return replicated
        msg = (
            f"opt_state_shardings: optimizer state leaf {path_name(path)!r} of shape {shape} "
            f"matches no parameter path with that shape and is not a scalar; parameters are "
            f"{[path_name(p) for p in by_path]}"
        )
        raise ShardingError(msg)

    return jax.tree_util.tree_map_with_path(one, state)
