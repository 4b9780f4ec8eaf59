"""Bad input raises an InitSpecError naming the array (or group) and what is wrong."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import pd_init


def spec(name: str = "w", **kwargs: object) -> pd_init.ArraySpec:
    kwargs.setdefault("shape", (8, 4))
    return pd_init.ArraySpec(name=name, **kwargs)  # type: ignore[arg-type]


def test_empty_spec_list():
    with pytest.raises(pd_init.InitSpecError, match="specs is empty"):
        pd_init.InitPlan([])


def test_duplicate_names():
    with pytest.raises(
        pd_init.InitSpecError, match=r"duplicate array name 'b' at specs\[1\] and specs\[2\]"
    ):
        pd_init.InitPlan([spec("a"), spec("b"), spec("b", shape=(2,))])


def test_not_a_spec():
    with pytest.raises(pd_init.InitSpecError, match=r"specs\[1\] must be an ArraySpec"):
        pd_init.InitPlan([spec("a"), {"name": "b"}])  # type: ignore[list-item]


def test_axis_that_does_not_divide_a_dimension(mesh_of):
    mesh = mesh_of(8)
    with pytest.raises(
        pd_init.InitSpecError,
        match=r"array 'layers.0.U': dimension 1 of shape \(8, 12\) has size 12.*8 ways",
    ):
        spec("layers.0.U", shape=(8, 12), sharding=NamedSharding(mesh, PartitionSpec(None, "data")))


def test_two_axes_on_one_dimension_count_together():
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec(("data", "model")))
    spec("ok", shape=(16, 3), sharding=sharding)
    with pytest.raises(
        pd_init.InitSpecError, match=r"array 'bad'.*size 12.*\('data', 'model'\) \(8 ways\)"
    ):
        spec("bad", shape=(12, 3), sharding=sharding)


def test_spec_longer_than_shape(mesh_of):
    with pytest.raises(
        pd_init.InitSpecError,
        match=r"array 'w': sharding spec .* has 2 entries but the array has 1",
    ):
        spec(shape=(8,), sharding=NamedSharding(mesh_of(8), PartitionSpec(None, "data")))


def test_group_sharding_must_divide_the_stacked_shape(mesh_of):
    mesh = mesh_of(4)
    specs = [spec(f"l{i}", group="g") for i in range(3)]
    bad = NamedSharding(mesh, PartitionSpec("data", None, None))  # 3 members over 4 devices
    with pytest.raises(
        pd_init.InitSpecError, match=r"group_shardings\['g'\]: dimension 0 .* size 3"
    ):
        pd_init.InitPlan(specs, group_shardings={"g": bad})


def test_unknown_group_in_group_shardings(mesh_of):
    sharding = NamedSharding(mesh_of(1), PartitionSpec())
    with pytest.raises(
        pd_init.InitSpecError, match=r"group_shardings names unknown groups \['nope'\]"
    ):
        pd_init.InitPlan([spec("a", group="g")], group_shardings={"nope": sharding})


@pytest.mark.parametrize("dtype", ["int32", "bool", "complex64", "U4"])
def test_random_draws_need_a_floating_dtype(dtype):
    with pytest.raises(
        pd_init.InitSpecError, match=f"array 'w': dtype {dtype!r} is not supported by normal"
    ):
        spec(dtype=dtype, init=pd_init.Normal())


def test_zeros_and_custom_accept_integer_dtypes_but_not_strings():
    assert spec(dtype="int32", init=pd_init.Zeros()).dtype == jnp.int32
    with pytest.raises(
        pd_init.InitSpecError, match="array 'w': dtype 'U4' is not supported by zeros"
    ):
        spec(dtype="U4", init=pd_init.Zeros())


def test_float64_without_x64_is_refused_not_silently_downcast():
    assert not jax.config.jax_enable_x64
    with pytest.raises(
        pd_init.InitSpecError, match="array 'w': dtype float64 needs jax_enable_x64"
    ):
        spec(dtype=np.float64)


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((8, -1), "shape must be a tuple of non-negative ints"),
        (8, "shape must be"),
        ((2.5,), "shape must be"),
    ],
)
def test_bad_shapes(shape, match):
    with pytest.raises(pd_init.InitSpecError, match=f"array 'w': {match}"):
        spec(shape=shape)


def test_bad_name_and_group():
    with pytest.raises(pd_init.InitSpecError, match="name must be a non-empty string"):
        spec("")
    with pytest.raises(pd_init.InitSpecError, match="array 'w': group must be a non-empty string"):
        spec(group="")


def test_bad_initializer():
    with pytest.raises(
        TypeError,
        match="init must be Normal, TruncatedNormal, Uniform, Zeros, Custom or a function",
    ):
        spec(init="normal")
    with pytest.raises(ValueError, match="low must be below high"):
        pd_init.Uniform(low=1.0, high=1.0)


def test_explicit_group_members_must_agree_and_the_error_names_both():
    specs = [
        spec("layers.0.mlp.down_proj.V", shape=(8, 4), group="layers.mlp.down_proj.V"),
        spec("layers.1.mlp.down_proj.V", shape=(8, 4), group="layers.mlp.down_proj.V"),
        spec("layers.2.mlp.down_proj.V", shape=(8, 6), group="layers.mlp.down_proj.V"),
    ]
    with pytest.raises(
        pd_init.InitSpecError,
        match=r"group 'layers.mlp.down_proj.V': arrays 'layers.0.mlp.down_proj.V' and "
        r"'layers.2.mlp.down_proj.V' differ in shape \(\(8, 4\) vs \(8, 6\)\)",
    ):
        pd_init.InitPlan(specs)
    with pytest.raises(pd_init.InitSpecError, match="'a' and 'b' differ in dtype"):
        pd_init.InitPlan([spec("a", group="g"), spec("b", group="g", dtype=jnp.bfloat16)])
    with pytest.raises(pd_init.InitSpecError, match="'a' and 'b' differ in init"):
        pd_init.InitPlan([spec("a", group="g"), spec("b", group="g", init=pd_init.Normal(std=2.0))])


def test_members_with_different_shardings_need_an_explicit_stack_sharding(mesh_of):
    mesh = mesh_of(4)
    rows = NamedSharding(mesh, PartitionSpec("data", None))
    cols = NamedSharding(mesh, PartitionSpec(None, "data"))
    specs = [spec("a", group="g", sharding=rows), spec("b", group="g", sharding=cols)]
    with pytest.raises(
        pd_init.InitSpecError,
        match=r"group 'g': arrays 'a' .* and 'b' .* different shardings.*group_shardings\['g'\]",
    ):
        pd_init.InitPlan(specs)
    stack = NamedSharding(mesh, PartitionSpec(None, "data", None))
    plan = pd_init.InitPlan(specs, group_shardings={"g": stack})
    key = jax.random.key(0)
    out = plan.init_per_array(key=key)
    ref = plan.init_reference(key=key)
    assert out["b"].sharding.is_equivalent_to(cols, 2) and out["a"].sharding.is_equivalent_to(
        rows, 2
    )
    for name in "ab":
        assert np.array_equal(np.asarray(out[name]), np.asarray(ref[name]))


def test_sharded_and_unsharded_arrays_cannot_mix(mesh_of):
    sharded = NamedSharding(mesh_of(8), PartitionSpec("data", None))
    with pytest.raises(pd_init.InitSpecError, match=r"array 'b'\) has no sharding while group"):
        pd_init.InitPlan([spec("a", sharding=sharded), spec("b", shape=(3,))])


def test_user_function_returning_the_wrong_shape_names_the_array():
    def wrong(key, shape, dtype):
        return jax.random.normal(key, (2, *shape), dtype)

    plan = pd_init.InitPlan([spec("w", init=wrong)])
    with pytest.raises(
        pd_init.InitSpecError,
        match=r"array 'w': the initializer returned float32\[2, 8, 4\], expected float32\[8, 4\]",
    ):
        plan.init_reference(key=jax.random.key(0))
    with pytest.raises(
        pd_init.InitSpecError, match=r"group .*custom\(.*wrong\).*returned float32\[1, 2, 8, 4\]"
    ):
        plan.init_stacked(key=jax.random.key(0))


def test_member_of_unknown_name():
    stacked = pd_init.init_stacked([spec("a")], key=jax.random.key(0))
    with pytest.raises(KeyError, match="no array named 'b'"):
        stacked.member("b")


def test_fan_out_rejects_stacks_from_another_plan():
    a = pd_init.InitPlan([spec("a", group="g"), spec("b", group="g")])
    other = pd_init.InitPlan(
        [spec("a", shape=(2, 2), group="g"), spec("b", shape=(2, 2), group="g")]
    )
    stacked = other.init_stacked(key=jax.random.key(0))
    with pytest.raises(
        pd_init.InitSpecError,
        match=r"stack of group 'g' is float32\[2, 2, 2\], expected float32\[2, 8, 4\]",
    ):
        a.fan_out(stacked)
    missing = pd_init.InitPlan([spec("a", group="h")]).init_stacked(key=jax.random.key(0))
    with pytest.raises(pd_init.InitSpecError, match=r"stacked has no stack for groups \['g'\]"):
        a.fan_out(missing)


def test_threefry_partitionable_off_is_refused():
    assert jax.config.jax_threefry_partitionable
    plan = pd_init.InitPlan([spec("a")])
    jax.config.update("jax_threefry_partitionable", False)
    try:
        with pytest.raises(
            pd_init.InitSpecError, match=r"needs jax.config.jax_threefry_partitionable = True"
        ):
            pd_init.InitPlan([spec("a")])
        # A plan built before the switch refuses too: the check runs when the init is traced.
        with pytest.raises(pd_init.InitSpecError, match="jax_threefry_partitionable"):
            plan.init_stacked(key=jax.random.key(0))
        with pytest.raises(pd_init.InitSpecError, match="jax_threefry_partitionable"):
            plan.init_reference(key=jax.random.key(0))
    finally:
        jax.config.update("jax_threefry_partitionable", True)
    assert jax.config.jax_threefry_partitionable
    plan.init_stacked(key=jax.random.key(0))


def test_unknown_draw_mode():
    with pytest.raises(
        pd_init.InitSpecError, match="draw must be 'map', 'vmap' or 'counter', got 'scan'"
    ):
        pd_init.InitPlan([spec("a")], draw="scan")  # type: ignore[arg-type]


def test_fan_out_checks_every_stack_before_consuming_any():
    plan = pd_init.InitPlan([spec("a", group="g"), spec("b", shape=(2,), group="h")])
    stacked = plan.init_stacked(key=jax.random.key(0))
    bad = pd_init.StackedArrays(
        stacks={"g": stacked.stacks["g"], "h": stacked.stacks["g"]}, index=stacked.index
    )
    with pytest.raises(pd_init.InitSpecError, match=r"stack of group 'h' is float32\[1, 8, 4\]"):
        plan.fan_out(bad, consume=True)
    assert not stacked.stacks["g"].is_deleted()  # nothing was consumed
    plan.fan_out(stacked, consume=True)
    with pytest.raises(pd_init.InitSpecError, match="stack of group 'g' was deleted"):
        plan.fan_out(stacked)
