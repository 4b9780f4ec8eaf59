"""One process of the two-process test (run by test_multiprocess.py, not collected by pytest).

usage: python mp_worker.py PORT PROCESS_ID OUT_JSON

Builds a 2×2 (replicate × data) mesh over 2 processes × 2 CPU devices, a ZeRO-1-sharded V and a
global batch from this process's rows, computes sums in one jit and writes them as JSON.
``compute`` is shared with the test, which runs it in one process on 4 devices.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

V_SHAPE = (3, 8, 4)
LOCAL_ROWS = (4, 8)


def rows_of(process_id: int) -> np.ndarray:
    """Process ``process_id``'s batch rows ``[4, 8]`` (int32, distinct per process)."""
    return (np.arange(np.prod(LOCAL_ROWS), dtype=np.int32).reshape(LOCAL_ROWS) * 3) + (
        1000 * (process_id + 1)
    )


def compute(mesh: Any, local: np.ndarray) -> dict[str, Any]:
    """Sums over a ZeRO-1-sharded V and a global batch, read back exactly, as JSON-able data."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    import pd_sharding as ps

    layout = ps.Zero1Layout(mesh)
    v_sharding = layout.v(V_SHAPE, name="V")

    def make_v() -> jax.Array:
        # halves of small ints: every sum below is exact in fp32, whatever the reduction order
        return jnp.arange(np.prod(V_SHAPE), dtype=jnp.float32).reshape(V_SHAPE) * 0.5 - 7.0

    v = ps.place(make_v, v_sharding)
    batch = ps.global_batch(local, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())

    @jax.jit
    def sums(v: jax.Array, batch: jax.Array) -> dict[str, jax.Array]:
        b = layout.constrain_batch(batch.astype(jnp.float32))
        return {
            "v_sum": v.sum(),
            "v_layer_sums": v.sum(axis=(1, 2)),
            "v_din_sums": v.sum(axis=(0, 2)),
            "batch_sum": b.sum(),
            "batch_row_sums": b.sum(axis=1),
            "batch_at_v": (b[:, : V_SHAPE[1]] @ v[1]).sum(axis=0),
        }

    out = jax.jit(sums, out_shardings=replicated)(v, batch)
    result: dict[str, Any] = {k: np.asarray(x.addressable_data(0)).tolist() for k, x in out.items()}
    result["v_spec"] = str(v.sharding.spec)
    result["batch_spec"] = str(batch.sharding.spec)
    result["batch_shape"] = list(batch.shape)
    result["batch_host"] = ps.batch_to_host(batch).tolist()
    result["local_rows"] = ps.local_rows(batch).tolist()
    # each addressable V shard equals the same slice of the unsharded V
    full = np.arange(np.prod(V_SHAPE), dtype=np.float32).reshape(V_SHAPE) * 0.5 - 7.0
    result["v_shards_exact"] = all(
        np.array_equal(np.asarray(s.data), full[s.index]) for s in v.addressable_shards
    )
    result["replicate_rows_processes"] = [
        sorted({d.process_index for d in row.flat}) for row in mesh.devices
    ]
    return result


def main() -> None:
    port, process_id, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    import pd_sharding as ps

    mesh = ps.make_mesh(replicate=2, data=2)
    result = compute(mesh, rows_of(process_id))
    result["process_count"] = jax.process_count()
    result["device_count"] = jax.device_count()
    with open(out_path, "w") as f:
        json.dump(result, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
