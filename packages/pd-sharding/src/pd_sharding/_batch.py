"""Global batches from each process's local rows, and back to host memory."""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pd_sharding._errors import ShardingError
from pd_sharding._mesh import DATA_AXES, axis_sizes
from pd_sharding._spec import check_spec


def _processes(mesh: Mesh) -> int:
    return len({d.process_index for d in mesh.devices.flat})


def global_batch(local_rows: np.ndarray, mesh: Mesh, *, name: str = "batch") -> jax.Array:
    """The global batch ``[B_local × processes, ...]`` from this process's rows ``[B_local, ...]``.

    Every process calls this with its own rows (same shape everywhere); process p's rows become
    global rows ``[p·B_local, (p+1)·B_local)`` when the mesh comes from :func:`make_mesh` (its
    replicate/data order follows process order). Rows are sharded over the data axes; nothing is
    gathered.
    """
    local_rows = np.asarray(local_rows)
    if local_rows.ndim < 1:
        msg = f"{name}: local rows must have a leading batch dim, got shape {local_rows.shape}"
        raise ShardingError(msg)
    global_shape = (local_rows.shape[0] * _processes(mesh), *local_rows.shape[1:])
    spec = PartitionSpec(DATA_AXES)
    check_spec(global_shape, spec, axis_sizes(mesh), name=name)
    sharding = NamedSharding(mesh, spec)
    return jax.make_array_from_process_local_data(sharding, local_rows, global_shape)


def local_rows(x: jax.Array) -> np.ndarray:
    """This process's rows of a batch sharded on its leading axis, in global order (exact)."""
    blocks: dict[int, np.ndarray] = {}
    for shard in x.addressable_shards:
        start = shard.index[0].start or 0
        blocks.setdefault(start, np.asarray(shard.data))
    return np.concatenate([blocks[k] for k in sorted(blocks)], axis=0)


def batch_to_host(x: jax.Array) -> np.ndarray:
    """The whole global array as numpy on every process (exact; an allgather across processes)."""
    if x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
