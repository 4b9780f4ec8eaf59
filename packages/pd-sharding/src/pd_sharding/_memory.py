"""Per-device memory of params, gradients and optimizer state for a layout and mesh."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from pd_sharding._mesh import AnyMesh, axis_sizes
from pd_sharding._spec import check_spec, shard_shape


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArrayGroup:
    """A named group of arrays for :func:`memory_estimate`.

    ``arrays``: a pytree of ShapeDtypeStructs (or arrays); ``shardings``: the same tree of
    NamedShardings or PartitionSpecs. ``trainable`` groups carry a gradient and
    ``moments`` optimizer moments (Adam: 2) in the params' dtype, sharded like the params;
    frozen groups carry neither.
    """

    name: str
    arrays: Any
    shardings: Any
    trainable: bool = True
    moments: int = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryRow:
    """One group's element count and its bytes on each device (every device holds the same)."""

    group: str
    params: int
    param_bytes: int
    grad_bytes: int
    opt_bytes: int

    @property
    def state_bytes(self) -> int:
        """Params (fp32 masters) + optimizer moments: 12 bytes per fp32 Adam param, sharded."""
        return self.param_bytes + self.opt_bytes

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.opt_bytes


def _spec_of(s: Any) -> PartitionSpec:
    return s if isinstance(s, PartitionSpec) else s.spec


def memory_estimate(
    groups: Sequence[ArrayGroup], mesh: AnyMesh | Mapping[str, int]
) -> list[MemoryRow]:
    """Per-device bytes of each group on ``mesh`` (a Mesh, AbstractMesh or axis-size mapping).

    Nothing is allocated: the bytes are shard shapes × itemsize from the specs and axis sizes.
    The last row, ``"total"``, sums the others.
    """
    sizes = axis_sizes(mesh)
    rows = []
    for group in groups:
        leaves = jax.tree_util.tree_leaves(group.arrays)
        specs = jax.tree_util.tree_leaves(
            group.shardings, is_leaf=lambda x: isinstance(x, PartitionSpec | jax.sharding.Sharding)
        )
        if len(specs) != len(leaves):
            msg = f"memory_estimate: group {group.name!r} has {len(leaves)} arrays but {len(specs)} shardings"
            raise ValueError(msg)
        count = 0
        per_device = 0
        for leaf, s in zip(leaves, specs, strict=True):
            spec = _spec_of(s)
            check_spec(leaf.shape, spec, sizes, name=group.name)
            count += math.prod(leaf.shape)
            per_device += (
                math.prod(shard_shape(leaf.shape, spec, sizes)) * np.dtype(leaf.dtype).itemsize
            )
        rows.append(
            MemoryRow(
                group=group.name,
                params=count,
                param_bytes=per_device,
                grad_bytes=per_device if group.trainable else 0,
                opt_bytes=per_device * group.moments if group.trainable else 0,
            )
        )
    rows.append(
        MemoryRow(
            group="total",
            params=sum(r.params for r in rows),
            param_bytes=sum(r.param_bytes for r in rows),
            grad_bytes=sum(r.grad_bytes for r in rows),
            opt_bytes=sum(r.opt_bytes for r in rows),
        )
    )
    return rows


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def memory_table(rows: Sequence[MemoryRow], *, title: str | None = None) -> str:
    """A markdown table of :func:`memory_estimate` rows, sizes in GiB per device."""
    lines = [f"**{title}**", ""] if title else []
    lines += [
        "| group | params | params GiB/dev | Adam moments GiB/dev | params + moments GiB/dev "
        "| grads GiB/dev | total GiB/dev |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.group} | {r.params:,} | {_gib(r.param_bytes)} | {_gib(r.opt_bytes)} "
            f"| {_gib(r.state_bytes)} | {_gib(r.grad_bytes)} | {_gib(r.total_bytes)} |"
        )
    return "\n".join(lines)
