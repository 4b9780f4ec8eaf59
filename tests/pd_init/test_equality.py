"""Stacked and stacked + fan-out inits equal the per-array jitted reference, bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import pd_init


def _bits(x: jax.Array) -> np.ndarray:
    return np.asarray(x).view(np.uint8)


def _assert_same(a: jax.Array, b: jax.Array, name: str) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, name
    assert np.array_equal(np.asarray(a), np.asarray(b)), name
    # Also bit for bit: array_equal alone would accept -0.0 for 0.0.
    assert np.array_equal(_bits(a), _bits(b)), name


@pytest.mark.parametrize(
    ("n_devices", "n_layers"),
    [(None, 3), (1, 3), (4, 3), (8, 3)],
    ids=["unsharded", "1dev", "4dev", "8dev"],
)
def test_stacked_and_fan_out_equal_reference(n_devices, n_layers, mixed_plan):
    plan = mixed_plan(n_devices, n_layers)
    specs = list(plan.specs)
    mesh = None if n_devices is None else specs[0].sharding.mesh
    sizes = sorted(len(g.members) for g in plan.groups)
    assert sizes.count(1) == 3 and sizes.count(n_layers) == 3 and n_layers % 2 == 1

    key = jax.random.key(7)
    reference = plan.init_reference(key=key)
    stacked = plan.init_stacked(key=key)
    fanned = plan.fan_out(stacked)
    for spec in specs:
        _assert_same(stacked.member(spec.name), reference[spec.name], spec.name)
        _assert_same(fanned[spec.name], reference[spec.name], spec.name)
        if mesh is not None:
            ndim = len(spec.shape)
            assert fanned[spec.name].sharding.is_equivalent_to(spec.sharding, ndim), spec.name
            assert reference[spec.name].sharding.is_equivalent_to(spec.sharding, ndim), spec.name
    if mesh is not None:
        for group in plan.groups:
            member = specs[[s.name for s in specs].index(group.members[0])].sharding
            expected = NamedSharding(mesh, PartitionSpec(None, *member.spec))
            assert stacked.stacks[group.name].sharding.is_equivalent_to(
                expected, 1 + len(group.shape)
            )

    # Values are real draws: distinct arrays differ, and no random array is constant.
    v0, v1 = np.asarray(reference["layers.0.V"]), np.asarray(reference["layers.1.V"])
    assert not np.array_equal(v0, v1) and v0.std() > 0.1
    assert np.all(np.asarray(reference["head.bias"]) == 0)


def test_fan_out_consuming_stacks_equals_reference(mixed_plan):
    plan = mixed_plan(8, 3)
    specs = plan.specs
    key = jax.random.key(3)
    reference = plan.init_reference(key=key)
    stacked = plan.init_stacked(key=key)
    fanned = plan.fan_out(stacked, consume=True)
    assert all(stack.is_deleted() for stack in stacked.stacks.values())
    for spec in specs:
        _assert_same(fanned[spec.name], reference[spec.name], spec.name)
    per_array = plan.init_per_array(key=key)
    assert list(per_array) == [s.name for s in specs]
    for spec in specs:
        _assert_same(per_array[spec.name], reference[spec.name], spec.name)


def test_vmap_draw_mode_equals_the_reference(mesh_of, zero1):
    """draw="map" (the default) is what every other test here uses."""
    draw = "vmap"
    mesh = mesh_of(8)
    specs = [
        pd_init.ArraySpec(name=f"layers.{i}.{k}", shape=shape, sharding=zero1(mesh, shape), group=k)
        for k, shape in (("V", (16, 8)), ("U", (8, 24)))
        for i in range(3)
    ]
    plan = pd_init.InitPlan(specs, draw=draw)
    key = jax.random.key(9)
    reference = plan.init_reference(key=key)
    stacked = plan.init_stacked(key=key)
    for spec in specs:
        _assert_same(stacked.member(spec.name), reference[spec.name], spec.name)


def test_raw_uint32_root_key_gives_the_same_guarantees(mesh_of, zero1):
    mesh = mesh_of(4)
    specs = [
        pd_init.ArraySpec(name=f"layers.{i}.U", shape=(8, 24), sharding=zero1(mesh, (8, 24)))
        for i in range(3)
    ]
    plan = pd_init.InitPlan(specs)
    raw = jax.random.PRNGKey(11)
    reference = plan.init_reference(key=raw)
    stacked = plan.init_stacked(key=raw)
    for spec in specs:
        _assert_same(stacked.member(spec.name), reference[spec.name], spec.name)
    # The raw key and the typed key wrapping the same bits give the same values.
    typed = plan.init_stacked(key=jax.random.wrap_key_data(raw))
    _assert_same(typed.member("layers.2.U"), stacked.member("layers.2.U"), "layers.2.U")


def _layer_specs(layers: range) -> list[pd_init.ArraySpec]:
    specs = []
    for layer in layers:
        for kind, shape in (("q.V", (8, 4)), ("down.V", (16, 6))):
            specs.append(
                pd_init.ArraySpec(
                    name=f"layers.{layer}.{kind}",
                    shape=shape,
                    init=pd_init.Normal(std=0.1),
                    group=f"layers.{kind}",
                )
            )
    return specs


def test_layers_24_to_31_alone_equal_those_layers_of_a_32_layer_init():
    key = jax.random.key(2024)
    full_plan = pd_init.InitPlan(_layer_specs(range(32)))
    full = full_plan.init_stacked(key=key)
    part_specs = _layer_specs(range(24, 32))
    part = pd_init.InitPlan(part_specs).init_stacked(key=key)
    assert part.stacks["layers.q.V"].shape == (8, 8, 4)
    assert full.stacks["layers.q.V"].shape == (32, 8, 4)
    for spec in part_specs:
        _assert_same(part.member(spec.name), full.member(spec.name), spec.name)
    # Reordering the arrays moves them within their stacks but keeps every value.
    reordered = [s for s in part_specs if s.group == "layers.q.V"][::-1]
    shuffled = pd_init.InitPlan(reordered).init_stacked(key=key)
    assert shuffled.index["layers.31.q.V"] == ("layers.q.V", 0)
    for spec in reordered:
        _assert_same(shuffled.member(spec.name), full.member(spec.name), spec.name)
    # And the values do depend on the root key.
    other = full_plan.init_stacked(key=jax.random.key(2025)).member("layers.24.q.V")
    assert not np.array_equal(np.asarray(other), np.asarray(full.member("layers.24.q.V")))


def test_builtin_initializer_called_outside_jit_equals_the_jitted_inits():
    """A built-in initializer called on its own runs its draw as one jit (as jax.random.normal
    does), with its parameters behind an optimization barrier, so it gives the very bits of the
    per-array and stacked inits. (Before, the scaling ran op by op outside jit and differed by
    about 1 ULP on some values.)"""
    inits = [
        pd_init.Normal(std=0.02),
        pd_init.Normal(std=3.0, mean=1.0),
        pd_init.Uniform(low=-0.1, high=0.3),
        pd_init.TruncatedNormal(std=0.02),
    ]
    specs = [
        pd_init.ArraySpec(name=f"a{i}", shape=(64, 128), init=init) for i, init in enumerate(inits)
    ]
    key = jax.random.key(0)
    plan = pd_init.InitPlan(specs)
    jitted = plan.init_reference(key=key)
    stacked = plan.init_stacked(key=key)
    for spec in specs:
        eager = spec.init(pd_init.derive_key(key, spec.name), spec.shape, spec.dtype)
        _assert_same(eager, jitted[spec.name], spec.name)
        _assert_same(stacked.member(spec.name), jitted[spec.name], spec.name)
