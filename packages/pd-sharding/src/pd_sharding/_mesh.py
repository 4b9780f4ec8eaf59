"""Device meshes with the axes ("replicate", "data", "tensor")."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType, Mesh

from pd_sharding._errors import MeshError

AXES: tuple[str, str, str] = ("replicate", "data", "tensor")
"""Mesh axis names, outermost first: replicate spans processes/nodes, data and tensor within."""

DATA_AXES: tuple[str, str] = ("replicate", "data")
"""The data-parallel axes: batches, ZeRO-1 state and FSDP weights shard over both."""

AnyMesh = Mesh | AbstractMesh


def _check_size(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"make_mesh: {name}={value!r} must be a positive int"
        raise MeshError(msg)
    return value


def _resolve_sizes(
    n_devices: int, replicate: int, data: int | None, tensor: int, where: str
) -> tuple[int, int, int]:
    replicate = _check_size("replicate", replicate)
    tensor = _check_size("tensor", tensor)
    if data is None:
        if n_devices % (replicate * tensor):
            msg = (
                f"make_mesh: data=None takes the devices left over, but replicate={replicate} × "
                f"tensor={tensor} = {replicate * tensor} does not divide the {n_devices} devices "
                f"({where}); choose replicate × tensor among the divisors of {n_devices}: "
                f"{_divisors(n_devices)}"
            )
            raise MeshError(msg)
        data = n_devices // (replicate * tensor)
    data = _check_size("data", data)
    if replicate * data * tensor != n_devices:
        msg = (
            f"make_mesh: replicate={replicate} × data={data} × tensor={tensor} = "
            f"{replicate * data * tensor} devices, but there are {n_devices} devices ({where}); "
            f"the product must equal the device count (pass data=None to use the rest)"
        )
        raise MeshError(msg)
    return replicate, data, tensor


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def make_mesh(
    *,
    replicate: int = 1,
    data: int | None = None,
    tensor: int = 1,
    devices: Sequence[Any] | None = None,
) -> Mesh:
    """A mesh of shape ``[replicate, data, tensor]`` over ``devices`` (default: all devices).

    ``data=None`` takes every device that replicate and tensor leave. With the default devices,
    devices are ordered by ``(process_index, id)`` before the row-major reshape, so consecutive
    replicate slices take consecutive processes: a replicate slice is process-local (its data and
    tensor collectives stay on one node) whenever ``replicate`` is a multiple of the process
    count. Explicit ``devices`` are used in the order given. Axis types are ``Auto`` (GSPMD
    propagation, shardings from ``jit``/``with_sharding_constraint``).

    Raises :class:`MeshError` when the product of the axis sizes differs from the device count.
    """
    if devices is None:
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        where = _describe_devices(devices)
    else:
        devices = list(devices)
        where = f"devices= given, {_describe_devices(devices)}"
    sizes = _resolve_sizes(len(devices), replicate, data, tensor, where)
    grid = np.empty(len(devices), dtype=object)
    grid[:] = devices
    grid = grid.reshape(sizes)
    if not _replicate_slices_aligned(_process_grid(grid)):
        warnings.warn(
            f"make_mesh: replicate={sizes[0]} slices straddle process boundaries ({where}); "
            f"data-axis collectives will cross nodes. Prefer replicate a multiple or divisor of "
            f"the process count.",
            stacklevel=2,
        )
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def abstract_mesh(*, replicate: int = 1, data: int, tensor: int = 1) -> AbstractMesh:
    """A device-less mesh with the same axes, for layouts and memory estimates at any scale."""
    sizes = _resolve_sizes(replicate * data * tensor, replicate, data, tensor, "abstract")
    return AbstractMesh(sizes, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def axis_sizes(mesh: AnyMesh | Mapping[str, int]) -> dict[str, int]:
    """``{axis name: size}`` for a Mesh, an AbstractMesh or a mapping; checks the axis names."""
    sizes = dict(mesh) if isinstance(mesh, Mapping) else dict(mesh.shape)
    if tuple(sizes) != AXES:
        msg = f"mesh axes {tuple(sizes)} are not {AXES}; build the mesh with pd_sharding.make_mesh"
        raise MeshError(msg)
    return sizes


def _describe_devices(devices: Sequence[Any]) -> str:
    processes = sorted({d.process_index for d in devices})
    if len(processes) == 1:
        return f"{len(devices)} devices in 1 process"
    return f"{len(devices)} devices in {len(processes)} processes"


def _process_grid(grid: np.ndarray) -> np.ndarray:
    """``[replicate, data × tensor]`` process indices of a device grid."""
    procs = np.vectorize(lambda d: d.process_index, otypes=[int])(grid)
    return procs.reshape(procs.shape[0], -1)


def _replicate_slices_aligned(procs: np.ndarray) -> bool:
    """Whether each replicate slice lies in one process or is a union of whole processes.

    ``procs`` is ``[replicate, data × tensor]`` process indices.
    """
    per_process = {
        int(p): int(c) for p, c in zip(*np.unique(procs, return_counts=True), strict=True)
    }
    for row in procs:
        owners = set(row.tolist())
        if len(owners) > 1 and any(int(np.sum(row == p)) != per_process[p] for p in owners):
            return False
    return True


def mesh_size(mesh: AnyMesh | Mapping[str, int]) -> int:
    """Total number of devices of a mesh."""
    return math.prod(axis_sizes(mesh).values())
