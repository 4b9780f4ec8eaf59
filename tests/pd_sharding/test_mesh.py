"""Meshes: shapes, axis order, device order and the errors for sizes that do not fit."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

import pd_sharding as ps
from pd_sharding._mesh import _replicate_slices_aligned


@pytest.mark.parametrize(
    ("n", "kwargs", "shape"),
    [
        (1, {}, (1, 1, 1)),
        (4, {}, (1, 4, 1)),
        (8, {}, (1, 8, 1)),
        (8, {"replicate": 2}, (2, 4, 1)),
        (8, {"replicate": 2, "data": 4}, (2, 4, 1)),
        (8, {"replicate": 2, "tensor": 2}, (2, 2, 2)),
    ],
)
def test_mesh_shapes(n: int, kwargs: dict, shape: tuple) -> None:
    devices = jax.devices()[:n]
    mesh = ps.make_mesh(devices=devices, **kwargs)
    assert mesh.axis_names == ps.AXES == ("replicate", "data", "tensor")
    assert tuple(mesh.shape.values()) == shape
    assert mesh.axis_types == (AxisType.Auto,) * 3
    # row-major over the given devices: replicate outermost, tensor innermost
    assert [d.id for d in mesh.devices.flat] == [d.id for d in devices]


def test_default_devices_are_all_devices_in_process_order() -> None:
    mesh = ps.make_mesh(replicate=2)
    assert mesh.devices.size == jax.device_count() == 8
    assert [d.id for d in mesh.devices.flat] == sorted(d.id for d in jax.devices())
    assert ps.DATA_AXES == ("replicate", "data")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (
            {"replicate": 3, "data": 2},
            "replicate=3 × data=2 × tensor=1 = 6 devices, but there are 8 devices",
        ),
        ({"data": 16}, "= 16 devices, but there are 8 devices"),
        ({"replicate": 3}, "does not divide the 8 devices"),
        ({"tensor": 0}, "tensor=0 must be a positive int"),
        ({"data": 2.0}, "data=2.0 must be a positive int"),
    ],
)
def test_mesh_size_mismatch_names_the_device_count(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ps.MeshError) as info:
        ps.make_mesh(**kwargs)
    assert fragment in str(info.value)


def test_mesh_mismatch_on_a_sub_list_says_its_count() -> None:
    with pytest.raises(ps.MeshError) as info:
        ps.make_mesh(replicate=2, data=4, devices=jax.devices()[:4])
    assert "there are 4 devices" in str(info.value)


def test_abstract_mesh_needs_no_devices() -> None:
    mesh = ps.abstract_mesh(replicate=16, data=8)
    assert dict(mesh.shape) == {"replicate": 16, "data": 8, "tensor": 1}
    assert ps.axis_sizes(mesh) == {"replicate": 16, "data": 8, "tensor": 1}


def test_axis_sizes_rejects_foreign_meshes() -> None:
    mesh = jax.make_mesh((8,), ("batch",))
    with pytest.raises(ps.MeshError, match="are not"):
        ps.Zero1Layout(mesh)


@pytest.mark.parametrize(
    ("procs", "aligned"),
    [
        # 2 processes × 4 devices, replicate=2: each slice is one process
        ([[0, 0, 0, 0], [1, 1, 1, 1]], True),
        # replicate=4 over 2 processes: slices within a process
        ([[0, 0], [0, 0], [1, 1], [1, 1]], True),
        # replicate=1: the one slice is both whole processes
        ([[0, 0, 1, 1]], True),
        # replicate=2 over 4 processes: each slice is two whole processes
        ([[0, 0, 1, 1], [2, 2, 3, 3]], True),
        # 3 processes × 2 devices, replicate=2: the middle process is split between slices
        ([[0, 0, 1], [1, 2, 2]], False),
    ],
)
def test_replicate_slice_alignment(procs: list, aligned: bool) -> None:
    assert _replicate_slices_aligned(np.array(procs)) is aligned
