"""Fixtures for pd-init's tests: small spec sets and meshes over the 8 simulated devices."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pd_init


def truncated(key: jax.Array, shape: tuple[int, ...], dtype: object) -> jax.Array:
    """A user initializer: standard normal truncated to [-2, 2]."""
    return jax.random.truncated_normal(key, -2.0, 2.0, shape, dtype)


def _mesh(n_devices: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:n_devices]), ("data",))


def _zero1(mesh: Mesh | None, shape: tuple[int, ...]) -> NamedSharding | None:
    """Shard the largest dimension the data axis divides, as a ZeRO-1 layout would."""
    if mesh is None:
        return None
    ways = mesh.shape["data"]
    dims = [d for d, size in enumerate(shape) if size % ways == 0]
    spec: list[str | None] = [None] * len(shape)
    if dims:
        spec[max(dims, key=lambda d: shape[d])] = "data"
    return NamedSharding(mesh, PartitionSpec(*spec))


def _mixed_specs(n_layers: int, mesh: Mesh | None) -> list[pd_init.ArraySpec]:
    """Auto groups of odd size, an explicit group, and groups of one; every initializer kind.

    Per layer: V [16, 8] normal (auto group), U [8, 24] uniform (auto group), down.V [24, 8]
    normal in an explicit group. Once: a [24] zeros bias and a [4, 8] custom-init array (groups
    of one), and a [42] bf16 normal array (a group of one that neither 4 nor 8 devices divide,
    so it stays replicated).
    """
    specs = []
    for layer in range(n_layers):
        for name, shape, init, group in (
            ("V", (16, 8), pd_init.Normal(std=0.5), None),
            ("U", (8, 24), pd_init.Uniform(low=-0.1, high=0.3), None),
            ("down.V", (24, 8), pd_init.Normal(std=2.0, mean=1.0), "layers.down.V"),
        ):
            specs.append(
                pd_init.ArraySpec(
                    name=f"layers.{layer}.{name}",
                    shape=shape,
                    init=init,
                    sharding=_zero1(mesh, shape),
                    group=group,
                )
            )
    specs += [
        pd_init.ArraySpec(
            name="head.bias", shape=(24,), init=pd_init.Zeros(), sharding=_zero1(mesh, (24,))
        ),
        pd_init.ArraySpec(
            name="embed.extra", shape=(4, 8), init=truncated, sharding=_zero1(mesh, (4, 8))
        ),
        pd_init.ArraySpec(
            name="norm.scale",
            shape=(42,),
            dtype=jnp.bfloat16,
            init=pd_init.Normal(std=0.02),
            sharding=_zero1(mesh, (42,)),
        ),
    ]
    return specs


@pytest.fixture
def mesh_of() -> Callable[[int], Mesh]:
    """A 1-D mesh, axis "data", over the first n simulated devices."""
    return _mesh


@pytest.fixture
def mixed_specs() -> Callable[[int, Mesh | None], list[pd_init.ArraySpec]]:
    return _mixed_specs


_PLANS: dict[tuple[int | None, int], pd_init.InitPlan] = {}


@pytest.fixture
def mixed_plan() -> Callable[[int | None, int], pd_init.InitPlan]:
    """``mixed_plan(n_devices or None, n_layers)``: one plan per configuration for the session,
    so tests that share a configuration share its compiled functions."""

    def get(n_devices: int | None, n_layers: int) -> pd_init.InitPlan:
        if (n_devices, n_layers) not in _PLANS:
            mesh = None if n_devices is None else _mesh(n_devices)
            _PLANS[n_devices, n_layers] = pd_init.InitPlan(_mixed_specs(n_layers, mesh))
        return _PLANS[n_devices, n_layers]

    return get


@pytest.fixture
def zero1() -> Callable[[Mesh | None, tuple[int, ...]], NamedSharding | None]:
    return _zero1
