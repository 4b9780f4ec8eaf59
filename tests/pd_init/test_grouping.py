"""Grouping: explicit groups, automatic (shape, dtype, init) groups, stack shardings, results."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

import pd_init


def test_explicit_group_keeps_the_given_member_order():
    names = [f"layers.{i}.mlp.down_proj.V" for i in (2, 0, 1)]
    specs = [pd_init.ArraySpec(name=n, shape=(6, 4), group="layers.mlp.down_proj.V") for n in names]
    plan = pd_init.InitPlan(specs)
    (group,) = plan.groups
    assert group.name == "layers.mlp.down_proj.V"
    assert group.members == tuple(names)
    assert group.stacked_shape == (3, 6, 4)
    assert plan.index["layers.0.mlp.down_proj.V"] == ("layers.mlp.down_proj.V", 1)


def test_automatic_groups_by_shape_dtype_and_initializer():
    specs = [
        pd_init.ArraySpec(name="a", shape=(4, 2)),
        pd_init.ArraySpec(name="b", shape=(4, 2), dtype=jnp.bfloat16),
        pd_init.ArraySpec(name="c", shape=(4, 2), init=pd_init.Normal(std=2.0)),
        pd_init.ArraySpec(name="d", shape=(2, 4)),
        pd_init.ArraySpec(name="e", shape=(4, 2)),
        pd_init.ArraySpec(name="f", shape=[4, 2], init=pd_init.Normal(std=1)),
        pd_init.ArraySpec(name="g", shape=(4, 2), group="mine"),
    ]
    plan = pd_init.InitPlan(specs)
    assert [g.members for g in plan.groups] == [("a", "e", "f"), ("b",), ("c",), ("d",), ("g",)]
    assert plan.groups[0].name == "float32[4,2]/normal(mean=0.0, std=1.0)"


def test_custom_initializers_group_by_function_identity():
    def draw(key, shape, dtype):
        return jax.random.normal(key, shape, dtype)

    def make():
        def draw(key, shape, dtype):  # same qualname, different function
            return jax.random.normal(key, shape, dtype)

        return draw

    other = make()
    specs = [
        pd_init.ArraySpec(name="a", shape=(3,), init=draw),
        pd_init.ArraySpec(name="b", shape=(3,), init=pd_init.Custom(draw)),
        pd_init.ArraySpec(name="c", shape=(3,), init=other),
    ]
    plan = pd_init.InitPlan(specs)
    assert [g.members for g in plan.groups] == [("a", "b"), ("c",)]
    assert plan.groups[0].name != plan.groups[1].name
    stacked = plan.init_stacked(key=jax.random.key(0))
    reference = plan.init_reference(key=jax.random.key(0))
    for name in "abc":
        assert np.array_equal(np.asarray(stacked.member(name)), np.asarray(reference[name]))


def test_initializers_are_hashable_value_objects():
    assert pd_init.Normal(std=0.5) == pd_init.Normal(std=0.5)
    assert hash(pd_init.Normal(std=0.5)) == hash(pd_init.Normal(std=0.5))
    assert pd_init.Normal(std=0.5) != pd_init.Normal(std=0.25)
    assert pd_init.Uniform(low=-1, high=1) == pd_init.Uniform(low=-1.0, high=1.0)
    assert pd_init.Zeros() == pd_init.Zeros()
    assert pd_init.Normal() != pd_init.Zeros()

    def f(key, shape, dtype):
        return jnp.zeros(shape, dtype)

    def g(key, shape, dtype):
        return jnp.zeros(shape, dtype)

    assert pd_init.Custom(f) == pd_init.Custom(f)
    assert hash(pd_init.Custom(f)) == hash(pd_init.Custom(f))
    assert pd_init.Custom(f) != pd_init.Custom(g)
    assert len({pd_init.Normal(std=0.5), pd_init.Normal(std=0.5), pd_init.Custom(f)}) == 2


def test_caller_given_stack_sharding_is_taken_unchanged(mesh_of):
    mesh = mesh_of(4)
    member = NamedSharding(mesh, PartitionSpec(None, "data"))
    # pd-sharding may lay a [L, d_in, C] stack out differently from P(None, *member_spec).
    stack = NamedSharding(mesh, PartitionSpec(None, "data", None))
    specs = [
        pd_init.ArraySpec(name=f"layers.{i}.V", shape=(8, 4), sharding=member, group="layers.V")
        for i in range(3)
    ]
    plan = pd_init.InitPlan(specs, group_shardings={"layers.V": stack})
    assert plan.groups[0].sharding is stack
    key = jax.random.key(5)
    stacked = plan.init_stacked(key=key)
    assert stacked.stacks["layers.V"].sharding == stack
    reference = plan.init_reference(key=key)
    fanned = plan.fan_out(stacked)
    for spec in specs:
        assert fanned[spec.name].sharding.is_equivalent_to(member, 2)
        assert np.array_equal(np.asarray(fanned[spec.name]), np.asarray(reference[spec.name]))


def test_members_without_sharding_follow_the_given_stack_sharding(mesh_of):
    mesh = mesh_of(4)
    stack = NamedSharding(mesh, PartitionSpec(None, None, "data"))
    specs = [pd_init.ArraySpec(name=f"l{i}", shape=(2, 8), group="g") for i in range(2)]
    plan = pd_init.InitPlan(specs, group_shardings={"g": stack})
    assert (
        plan.groups[0].member_shardings == (NamedSharding(mesh, PartitionSpec(None, "data")),) * 2
    )
    out = plan.init_per_array(key=jax.random.key(0))
    assert out["l1"].sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec(None, "data")), 2)


def test_result_maps_groups_to_stacks_and_names_to_positions():
    specs = [pd_init.ArraySpec(name=f"w{i}", shape=(2, 3)) for i in range(3)]
    specs.append(pd_init.ArraySpec(name="b", shape=(3,), init=pd_init.Zeros()))
    stacked = pd_init.init_stacked(specs, key=jax.random.key(1))
    group = "float32[2,3]/normal(mean=0.0, std=1.0)"
    assert set(stacked.stacks) == {group, "float32[3]/zeros"}
    assert stacked.stacks[group].shape == (3, 2, 3)
    assert stacked.index["w2"] == (group, 2)
    assert np.array_equal(np.asarray(stacked.member("w2")), np.asarray(stacked.stacks[group][2]))
    reference = pd_init.init_reference(specs, key=jax.random.key(1))
    per_array = pd_init.init_per_array(specs, key=jax.random.key(1))
    for spec in specs:
        assert np.array_equal(np.asarray(per_array[spec.name]), np.asarray(reference[spec.name]))
