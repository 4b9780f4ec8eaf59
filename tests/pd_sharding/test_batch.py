"""Global batches from local rows, read back exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import pd_sharding as ps


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_global_batch_round_trip_is_exact(mesh, dtype) -> None:
    rng = np.random.default_rng(0)
    rows = (
        rng.standard_normal((16, 5)).astype(dtype)
        if dtype == np.float32
        else rng.integers(0, 128256, (16, 5), dtype=dtype)
    )
    batch = ps.global_batch(rows, mesh)
    assert batch.shape == rows.shape and batch.dtype == dtype
    assert batch.sharding.spec == P(("replicate", "data"))
    n_data = mesh.shape["replicate"] * mesh.shape["data"]
    assert all(s.data.shape == (16 // n_data, 5) for s in batch.addressable_shards)
    np.testing.assert_array_equal(ps.batch_to_host(batch), rows)
    # one process here, so its local rows are the whole batch, in order
    np.testing.assert_array_equal(ps.local_rows(batch), rows)
    # and the batch feeds a jit that keeps it data-sharded
    layout = ps.Zero1Layout(mesh)
    out = jax.jit(lambda b: layout.constrain_batch(b * 2))(batch)
    np.testing.assert_array_equal(ps.batch_to_host(out), rows * 2)


def test_global_batch_rows_must_divide(mesh_2x4) -> None:
    with pytest.raises(ps.ShardingError) as info:
        ps.global_batch(np.zeros((12, 4), np.int32), mesh_2x4, name="tokens")
    msg = str(info.value)
    assert "tokens of shape (12, 4)" in msg and "of size 8" in msg and "8 or 16" in msg
    with pytest.raises(ps.ShardingError, match="leading batch dim"):
        ps.global_batch(np.int32(3), mesh_2x4)


def test_batch_to_host_of_a_computed_array(mesh_2x4) -> None:
    layout = ps.Zero1Layout(mesh_2x4)
    x = ps.place(lambda: jnp.arange(8 * 3, dtype=jnp.int32).reshape(8, 3), layout.batch((8, 3)))
    np.testing.assert_array_equal(ps.batch_to_host(x), np.arange(24).reshape(8, 3))
