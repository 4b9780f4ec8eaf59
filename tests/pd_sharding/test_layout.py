"""The ZeRO-1 layout: the spec of every role on each mesh, and the errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pd_sharding as ps

D = ("replicate", "data")
L = 4  # stacked layer axis


def _tensor(mesh) -> str | None:
    return "tensor" if mesh.shape["tensor"] > 1 else None


def _check(sharding, shape, spec, mesh) -> None:
    assert sharding.spec == spec
    assert sharding.mesh == mesh
    # the spec means what the layout says: dims over data axes cut replicate × data ways
    expect = []
    for dim, entry in zip(shape, list(spec) + [None] * (len(shape) - len(spec)), strict=True):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
        cut = 1
        for a in axes:
            cut *= mesh.shape[a]
        expect.append(dim // cut)
    assert sharding.shard_shape(shape) == tuple(expect)


def test_components_v_u(mesh) -> None:
    layout = ps.Zero1Layout(mesh)
    t = _tensor(mesh)
    v, u = (L, 64, 16), (L, 16, 32)
    _check(layout.v(v, name="q_proj.V"), v, P(None, D, t), mesh)
    _check(layout.u(u, name="q_proj.U"), u, P(None, t, D), mesh)
    # unstacked: no leading axis
    _check(layout.v((64, 16), name="V"), (64, 16), P(D, t), mesh)
    _check(layout.u((16, 32), name="U"), (16, 32), P(t, D), mesh)


def test_components_on_c(mesh) -> None:
    layout = ps.Zero1Layout(mesh, factor_dim="components")
    c_axes = D + (("tensor",) if mesh.shape["tensor"] > 1 else ())
    assert layout.v((L, 64, 16), name="V").spec == P(None, None, c_axes)
    assert layout.u((L, 16, 32), name="U").spec == P(None, c_axes, None)
    n = mesh.devices.size
    assert layout.v((L, 64, 16), name="V").shard_shape((L, 64, 16)) == (L, 64, 16 // n)


def test_ci_params_largest_divisible_dim(mesh) -> None:
    layout = ps.Zero1Layout(mesh)
    n = layout.data_size
    tree = {
        "q_proj": {
            "w1": jnp.zeros((L, 16, 8)),
            "w2": jnp.zeros((L, 8, 24)),
            "b1": jnp.zeros((L, 8)),
        },
        "down_proj": {"w1": jax.ShapeDtypeStruct((L, 12, 8), jnp.float32)},
        "scale": jnp.zeros((L,)),
    }
    out = layout.ci_params(tree, rules={"scale": "replicate"})
    assert out["q_proj"]["w1"].spec == P(None, D, None)  # 16 > 8
    assert out["q_proj"]["w2"].spec == P(None, None, D)  # 24 when divisible
    assert out["q_proj"]["b1"].spec == P(None, D)
    # 12 is the largest dim, but only where the data axes divide it
    expect = P(None, D, None) if 12 % n == 0 else P(None, None, D)
    assert out["down_proj"]["w1"].spec == expect
    assert out["scale"].spec == P()


def test_ci_params_explicit_rule_and_unstacked(mesh_2x4) -> None:
    layout = ps.Zero1Layout(mesh_2x4)
    tree = {"w": jnp.zeros((8, 4)), "v": jnp.zeros((8, 16))}
    out = layout.ci_params(tree, stacked=False, rules={"v": P(D, None)})
    assert out["w"].spec == P(D, None)  # dim 0 counts when not stacked
    assert out["v"].spec == P(D, None)  # the rule wins over the largest dim


def test_target_weights_fsdp_on_hidden(mesh) -> None:
    layout = ps.Zero1Layout(mesh)
    h = 64
    for shape, spec in [
        ((L, h, h), P(None, D, None)),  # q/o: d_in preferred
        ((L, h, 16), P(None, D, None)),  # k/v
        ((L, h, 128), P(None, D, None)),  # gate/up
        ((L, 128, h), P(None, None, D)),  # down
        ((h, 16), P(D, None)),  # unstacked
    ]:
        _check(layout.target_weight(shape, name="w", hidden_size=h), shape, spec, mesh)
    _check(layout.embedding((96, h), name="embed_tokens"), (96, h), P(None, D), mesh)
    _check(layout.lm_head((h, 96), name="lm_head"), (h, 96), P(D, None), mesh)
    _check(layout.norm((L, h), name="input_layernorm"), (L, h), P(), mesh)
    _check(layout.batch((16, 32)), (16, 32), P(D), mesh)
    assert layout.replicated().spec == P()


def _message(fn) -> str:
    with pytest.raises(ps.ShardingError) as info:
        fn()
    return str(info.value)


def test_divisibility_error_names_everything(mesh_2x4) -> None:
    layout = ps.Zero1Layout(mesh_2x4)
    msg = _message(lambda: layout.v((L, 100, 16), name="layers.q_proj.V"))
    for fragment in [
        "layers.q_proj.V",
        "(4, 100, 16)",
        "dim 1 (size 100)",
        "('replicate', 'data')",
        "of size 8 (replicate=2 × data=4)",
        "remainder of 4",
        "96 or 104",  # nearest multiples of 8
        "5 or 10",  # nearest divisors of 100 around 8
    ]:
        assert fragment in msg, (fragment, msg)
    msg = _message(lambda: layout.batch((12, 32), name="tokens"))
    assert "tokens" in msg and "dim 0 (size 12)" in msg and "8 or 16" in msg and "6 or 12" in msg
    msg = _message(lambda: layout.u((L, 16, 20), name="k_proj.U"))
    assert "dim 2 (size 20)" in msg and "16 or 24" in msg


def test_tensor_divisibility_error() -> None:
    layout = ps.Zero1Layout(ps.make_mesh(replicate=2, tensor=2))
    msg = _message(lambda: layout.v((L, 64, 15), name="V"))
    assert "dim 2 (size 15)" in msg and "('tensor',) of size 2 (tensor=2)" in msg
    assert "14 or 16" in msg


def test_no_silent_replication(mesh_2x4) -> None:
    layout = ps.Zero1Layout(mesh_2x4)
    msg = _message(lambda: layout.ci_params({"q": {"b": jnp.zeros((L, 3))}}))
    assert "ci.q.b" in msg and "(4, 3)" in msg and "rules={'q.b': 'replicate'}" in msg
    msg = _message(lambda: layout.ci_params({"scale": jnp.zeros((L,))}))
    assert "ci.scale" in msg and "no non-leading dim" in msg
    msg = _message(lambda: layout.ci_params({"w": jnp.zeros((L, 8))}, rules={"x": "replicate"}))
    assert "['x'] match no leaf" in msg and "['w']" in msg
    msg = _message(lambda: layout.ci_params({"w": jnp.zeros((L, 8))}, rules={"w": "whole"}))
    assert "'whole'" in msg
    msg = _message(lambda: layout.target_weight((L, 48, 32), name="w", hidden_size=64))
    assert "(4, 48, 32)" in msg and "hidden_size=64" in msg
    msg = _message(lambda: layout.v((64,), name="V"))
    assert "[..., d_in, C]" in msg and "(64,)" in msg
    msg = _message(lambda: layout.embedding((L, 96, 64), name="embed"))
    assert "[vocab, hidden]" in msg
    msg = _message(lambda: layout.named((8, 8), P(None, None, D), name="x"))
    assert "rank 2" in msg


def test_constraints_inside_jit() -> None:
    mesh = ps.make_mesh(replicate=2, tensor=2)
    layout = ps.Zero1Layout(mesh)
    x = jnp.arange(8 * 3 * 4, dtype=jnp.float32).reshape(8, 3, 4)

    @jax.jit
    def step(x):
        acts = layout.constrain_component_acts(x * 2.0)
        return layout.constrain_batch(x + 1.0), acts

    b, acts = step(x)
    assert b.sharding.is_equivalent_to(layout.batch(x.shape), x.ndim)
    assert acts.sharding.is_equivalent_to(
        jax.sharding.NamedSharding(mesh, P(D, None, "tensor")), x.ndim
    )
    np.testing.assert_array_equal(np.asarray(b), np.asarray(x) + 1.0)
    np.testing.assert_array_equal(np.asarray(acts), np.asarray(x) * 2.0)
    with pytest.raises(ps.ShardingError, match="x@V"):
        jax.jit(layout.constrain_component_acts)(jnp.zeros((8, 3)))
