"""The batch's mesh axis for programs that split their rows over devices by hand
(``shard_map``): the blocked CI MLPs (:func:`pd_train.ci.mlp.blocked_over_rows`) and the blocked
draws (:func:`pd_train.sources.uniform`) of a data-parallel toy step."""

from __future__ import annotations

import jax

__all__ = ["ROW_SHARD_AXIS", "row_shard_axis"]

#: The mesh axis the rows are split over: pd-sharding's data axis.
ROW_SHARD_AXIS = "data"


def row_shard_axis(batch: int) -> str | None:
    """:data:`ROW_SHARD_AXIS` where the context mesh (``jax.set_mesh``, seen while tracing) has
    it with n > 1 devices and n divides ``batch``; else None (one device's program)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or ROW_SHARD_AXIS not in mesh.axis_names:
        return None
    n = mesh.shape[ROW_SHARD_AXIS]
    return ROW_SHARD_AXIS if n > 1 and batch % n == 0 else None
