"""Optimizer-state shardings mirror the parameters through optax's wrappers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pd_sharding as ps

L = 2


def _params():
    return {
        "components": {
            "q_proj": {
                "V": jax.ShapeDtypeStruct((L, 16, 8), jnp.float32),
                "U": jax.ShapeDtypeStruct((L, 8, 32), jnp.float32),
            },
            "down_proj": {
                "V": jax.ShapeDtypeStruct((L, 32, 8), jnp.float32),
                "U": jax.ShapeDtypeStruct((L, 8, 16), jnp.float32),
            },
        },
        "ci": {"q_proj": {"w1": jax.ShapeDtypeStruct((L, 8, 16), jnp.float32)}},
    }


def _shardings(layout, params):
    comps = {
        kind: {
            "V": layout.v(p["V"].shape, name=f"{kind}.V"),
            "U": layout.u(p["U"].shape, name=f"{kind}.U"),
        }
        for kind, p in params["components"].items()
    }
    return {"components": comps, "ci": layout.ci_params(params["ci"])}


def _two_groups():
    """The production shape of the optimizer: two AdamW groups, clip, injected schedule."""
    components = optax.chain(
        optax.clip_by_global_norm(0.01),
        optax.inject_hyperparams(optax.adamw)(learning_rate=optax.cosine_decay_schedule(1e-3, 10)),
    )
    ci = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.0))
    return optax.multi_transform(
        {"components": components, "ci": ci}, {"components": "components", "ci": "ci"}
    )


TXS = {
    "adamw": lambda: optax.adamw(1e-3),
    "chain_clip_adamw": lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)),
    "inject_hyperparams": lambda: optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3),
    "multi_transform": _two_groups,
}


def _by_param(state_shardings, state, params, shardings):
    """Every state leaf whose path ends with a param path, paired with that param's sharding."""
    param_paths = {
        tuple(p): s
        for (p, _), s in zip(
            jax.tree_util.tree_flatten_with_path(params)[0],
            jax.tree_util.tree_leaves(shardings, is_leaf=lambda x: isinstance(x, NamedSharding)),
            strict=True,
        )
    }
    mirrored, scalars = 0, 0
    flat_state = jax.tree_util.tree_flatten_with_path(state)[0]
    flat_sh = jax.tree_util.tree_leaves(
        state_shardings, is_leaf=lambda x: isinstance(x, NamedSharding)
    )
    assert len(flat_state) == len(flat_sh)
    for (path, leaf), s in zip(flat_state, flat_sh, strict=True):
        owners = [pp for pp in param_paths if tuple(path)[-len(pp) :] == pp]
        if leaf.shape == ():
            assert s.spec == P(), path
            scalars += 1
        else:
            assert len(owners) == 1, path
            assert s == param_paths[owners[0]], path
            mirrored += 1
    return mirrored, scalars


@pytest.mark.parametrize("name", list(TXS))
def test_state_mirrors_params(name: str, mesh) -> None:
    layout = ps.Zero1Layout(mesh)
    params = _params()
    shardings = _shardings(layout, params)
    tx = TXS[name]()
    out = ps.opt_state_shardings(tx.init, params, shardings)
    state = jax.eval_shape(tx.init, params)
    assert jax.tree_util.tree_structure(out, is_leaf=lambda x: isinstance(x, NamedSharding)) == (
        jax.tree_util.tree_structure(state)
    )
    mirrored, scalars = _by_param(out, state, params, shardings)
    assert mirrored == 2 * 5  # mu and nu for each of the 5 params
    assert scalars >= 1  # at least one count


def test_state_placed_directly_in_its_sharding(mesh_2x4) -> None:
    layout = ps.Zero1Layout(mesh_2x4)
    abstract = _params()
    shardings = _shardings(layout, abstract)
    params = ps.zeros_like_sharded(abstract, shardings)
    tx = _two_groups()
    state_shardings = ps.opt_state_shardings(tx.init, params, shardings)
    state = ps.place(tx.init, state_shardings, params)
    for leaf, s in zip(
        jax.tree_util.tree_leaves(state),
        jax.tree_util.tree_leaves(state_shardings, is_leaf=lambda x: isinstance(x, NamedSharding)),
        strict=True,
    ):
        assert leaf.sharding.is_equivalent_to(s, leaf.ndim)
    mu = state.inner_states["components"].inner_state[1].inner_state[0].mu
    v = mu["components"]["down_proj"]["V"]
    assert v.sharding.spec == P(None, ("replicate", "data"), None)
    assert v.addressable_shards[0].data.shape == (L, 4, 8)  # 32 / (2 × 4)
    np.testing.assert_array_equal(np.asarray(v), np.zeros((L, 32, 8), np.float32))


def test_unmatched_state_leaf_is_an_error(mesh_2x4) -> None:
    layout = ps.Zero1Layout(mesh_2x4)
    params = {"w": jax.ShapeDtypeStruct((8, 16), jnp.float32)}
    shardings = {"w": layout.v((8, 16), name="w")}

    def init(p):  # a factored second moment (adafactor-like) has no parameter's shape
        return {"row": jnp.zeros(p["w"].shape[:1]), "count": jnp.zeros((), jnp.int32)}

    with pytest.raises(ps.ShardingError) as info:
        ps.opt_state_shardings(init, params, shardings)
    assert "'row'" in str(info.value) and "(8,)" in str(info.value) and "['w']" in str(info.value)
    with pytest.raises(ps.ShardingError, match="1 leaves but params has 2"):
        ps.opt_state_shardings(init, {**params, "b": params["w"]}, shardings)
