"""Checking a PartitionSpec against an array shape, with errors that say what would work."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from jax.sharding import PartitionSpec

from pd_sharding._errors import ShardingError


def entry_axes(entry: str | Sequence[str] | None) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry, as a tuple (``None`` → ``()``)."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(entry)


def entry_size(entry: str | Sequence[str] | None, sizes: Mapping[str, int]) -> int:
    """How many shards one PartitionSpec entry cuts its dimension into."""
    return math.prod(sizes[a] for a in entry_axes(entry))


def shard_shape(shape: Sequence[int], spec: PartitionSpec, sizes: Mapping[str, int]) -> tuple:
    """The per-device block shape of ``shape`` under ``spec`` (spec assumed valid)."""
    entries = list(spec) + [None] * (len(shape) - len(spec))
    return tuple(d // entry_size(e, sizes) for d, e in zip(shape, entries, strict=True))


def check_spec(
    shape: Sequence[int], spec: PartitionSpec, sizes: Mapping[str, int], *, name: str
) -> None:
    """Raise :class:`ShardingError` unless every sharded dim of ``shape`` divides evenly."""
    shape = tuple(int(d) for d in shape)
    if len(spec) > len(shape):
        msg = f"{name}: spec {spec} has {len(spec)} entries but the shape {shape} has rank {len(shape)}"
        raise ShardingError(msg)
    for dim, entry in enumerate(spec):
        axes = entry_axes(entry)
        unknown = [a for a in axes if a not in sizes]
        if unknown:
            msg = f"{name}: spec {spec} names axes {unknown} that the mesh {dict(sizes)} lacks"
            raise ShardingError(msg)
        n = entry_size(entry, sizes)
        if shape[dim] % n:
            raise ShardingError(divisibility_message(name, shape, dim, axes, sizes))


def divisibility_message(
    name: str, shape: tuple[int, ...], dim: int, axes: tuple[str, ...], sizes: Mapping[str, int]
) -> str:
    n = math.prod(sizes[a] for a in axes)
    size = shape[dim]
    parts = " × ".join(f"{a}={sizes[a]}" for a in axes)
    lower = (size // n) * n
    works = [w for w in (lower, lower + n) if w > 0]
    divisors = [k for k in range(1, size + 1) if size % k == 0]
    below = [k for k in divisors if k < n]
    above = [k for k in divisors if k > n]
    near = ([below[-1]] if below else []) + ([above[0]] if above else [])
    return (
        f"cannot shard {name} of shape {shape}: dim {dim} (size {size}) over mesh axes "
        f"{axes} of size {n} ({parts}) leaves a remainder of {size % n}. "
        f"Sizes of dim {dim} that would work: {' or '.join(map(str, works))} "
        f"(multiples of {n}); axis sizes that would divide {size}: "
        f"{' or '.join(map(str, near))}."
    )
