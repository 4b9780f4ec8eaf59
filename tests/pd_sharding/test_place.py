"""Placement: arrays built in their sharding, zeros, and checkpoint restore targets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pd_sharding as ps

L = 2


def _init(seed):
    # cheap to compile (jax.random under sharded out_shardings compiles for seconds on CPU);
    # only correctly rounded ops, so any partitioning gives identical bits
    def block(shape, salt):
        n = np.prod(shape)
        return ((jnp.arange(n, dtype=jnp.float32) % 13 - 6) * seed + salt).reshape(shape)

    return {"V": block((L, 32, 8), 0.5), "U": block((L, 8, 16), 1.5)}


def test_place_builds_each_output_in_its_sharding(mesh) -> None:
    layout = ps.Zero1Layout(mesh)
    shardings = {"V": layout.v((L, 32, 8), name="V"), "U": layout.u((L, 8, 16), name="U")}
    seed = jnp.float32(0.37)
    placed = ps.place(_init, shardings, seed)
    reference = jax.jit(_init)(seed)
    for name in ("V", "U"):
        assert placed[name].sharding == shardings[name]
        np.testing.assert_array_equal(np.asarray(placed[name]), np.asarray(reference[name]))
        n = mesh.devices.size
        # each device holds exactly its block, never the whole array
        block = shardings[name].shard_shape(placed[name].shape)
        assert all(s.data.shape == block for s in placed[name].addressable_shards)
        # V and U are cut over every device of every mesh here (data axes, and tensor on C)
        assert np.prod(block) * n == placed[name].size
        assert len(placed[name].addressable_shards) == n


def test_place_checks_shapes_before_compiling(mesh_2x4) -> None:
    layout = ps.Zero1Layout(mesh_2x4)
    wrong = {
        "V": layout.v((L, 32, 8), name="V"),
        "U": jax.sharding.NamedSharding(mesh_2x4, P(None, None, ("replicate", "data"))),
    }

    def init(seed):
        return {"V": jnp.zeros((L, 32, 8)), "U": jnp.zeros((L, 8, 12))}

    with pytest.raises(ps.ShardingError, match=r"cannot shard U of shape \(2, 8, 12\): dim 2"):
        ps.place(init, wrong, jnp.float32(0.0))
    with pytest.raises(ps.ShardingError, match="tree of Sharding"):
        ps.place(init, {"V": wrong["V"]}, jnp.float32(0.0))


def test_zeros_like_sharded(mesh_2x4) -> None:
    layout = ps.Zero1Layout(mesh_2x4)
    abstract = {
        "w": jax.ShapeDtypeStruct((L, 16, 4), jnp.bfloat16),
        "n": jax.ShapeDtypeStruct((L, 4), jnp.float32),
    }
    shardings = {
        "w": layout.target_weight((L, 16, 4), name="w", hidden_size=16),
        "n": layout.norm((L, 4), name="n"),
    }
    out = ps.zeros_like_sharded(abstract, shardings)
    assert out["w"].dtype == jnp.bfloat16 and out["w"].sharding == shardings["w"]
    assert out["n"].sharding.spec == P()
    assert not np.asarray(out["w"], np.float32).any()


def test_restore_targets_onto_another_mesh(tmp_path, mesh_2x4) -> None:
    """Save on a 1×4 mesh, restore straight into the 2×4 layout with orbax."""
    ocp = pytest.importorskip("orbax.checkpoint")
    small = ps.make_mesh(data=4, devices=jax.devices()[:4])
    small_layout = ps.Zero1Layout(small)
    shardings = {
        "V": small_layout.v((L, 32, 8), name="V"),
        "U": small_layout.u((L, 8, 16), name="U"),
    }
    saved = ps.place(_init, shardings, jnp.float32(1.3))
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(tmp_path / "ckpt", saved)

    layout = ps.Zero1Layout(mesh_2x4)
    abstract = jax.eval_shape(_init, jnp.float32(0.0))
    new = {"V": layout.v((L, 32, 8), name="V"), "U": layout.u((L, 8, 16), name="U")}
    targets = ps.restore_targets(abstract, new)
    assert targets["V"].sharding == new["V"] and targets["V"].shape == (L, 32, 8)
    with ocp.StandardCheckpointer() as ckpt:
        restored = ckpt.restore(tmp_path / "ckpt", targets)
    for name in ("V", "U"):
        assert restored[name].sharding == new[name]
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(saved[name]))


def test_restore_targets_check_divisibility(mesh_2x4) -> None:
    layout = ps.Zero1Layout(mesh_2x4)
    abstract = {"layers": {"V": jax.ShapeDtypeStruct((L, 12, 8), jnp.float32)}}
    bad = {"layers": {"V": jax.sharding.NamedSharding(mesh_2x4, P(None, ("replicate", "data")))}}
    with pytest.raises(ps.ShardingError, match=r"layers\.V of shape \(2, 12, 8\)"):
        ps.restore_targets(abstract, bad)
    assert layout.v((L, 16, 8), name="ok").spec == P(None, ("replicate", "data"), None)
