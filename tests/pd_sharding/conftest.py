"""Meshes shared by pd-sharding's tests: sub-meshes of the 8 simulated CPU devices."""

from __future__ import annotations

import jax
import pytest

import pd_sharding as ps

# (name, devices, replicate, data, tensor)
MESHES = [
    ("1", 1, 1, 1, 1),
    ("4", 4, 1, 4, 1),
    ("8", 8, 1, 8, 1),
    ("2x4", 8, 2, 4, 1),
    ("2x2x2", 8, 2, 2, 2),
]


@pytest.fixture(params=MESHES, ids=[m[0] for m in MESHES])
def mesh(request: pytest.FixtureRequest) -> jax.sharding.Mesh:
    _, n, replicate, data, tensor = request.param
    return ps.make_mesh(replicate=replicate, data=data, tensor=tensor, devices=jax.devices()[:n])


@pytest.fixture
def mesh_2x4() -> jax.sharding.Mesh:
    return ps.make_mesh(replicate=2, data=4)
