"""``draw="counter"``: a group's whole stack is one elementwise expression of (member key, flat
index), hashed by pd-init's written-out threefry, and every value still equals the per-array
reference's, bit for bit."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p
from jax.sharding import NamedSharding, PartitionSpec

import pd_init
from pd_init import _counter

from ._bitwise import _assert_bitwise

INITS = (
    pd_init.Uniform(low=-0.3, high=0.7),
    pd_init.Normal(std=0.5, mean=-0.25),
    pd_init.TruncatedNormal(std=2.0),
)


def _specs(init, dtype, widths, *, lead=(2, 3), n=3, sharding=None, tag=""):
    return [
        pd_init.ArraySpec(
            name=f"layers.{i}.{tag}w{w}",
            shape=(*lead, w),
            dtype=dtype,
            init=init,
            group=f"{tag}w{w}",
            sharding=sharding,
        )
        for w in widths
        for i in range(n)
    ]


def _check(specs, key, *, counter_drawn):
    plan = pd_init.InitPlan(specs, draw="counter")
    assert plan.counter_drawn == counter_drawn
    stacked = plan.init_stacked(key=key)
    reference = plan.init_reference(key=key)
    for spec in specs:
        _assert_bitwise(stacked.member(spec.name), reference[spec.name], f"counter {spec.name}")
    return plan, stacked


def test_threefry_written_out_equals_jax_primitive():
    words = np.random.default_rng(0).integers(0, 2**32, size=(4, 257), dtype=np.uint32)
    words[:, :4] = [[0], [0xFFFFFFFF], [1], [0x1BD11BDA]]  # edge words in every position
    got = jax.jit(_counter.threefry2x32)(*words)
    want = threefry2x32_p.bind(*map(jnp.asarray, words))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("key", [jax.random.key(7), jax.random.PRNGKey(123456789)])
def test_fold_in_equals_jax_random_fold_in(key):
    data = np.array([0, 1, 2**31, 2**32 - 1, 0xDEADBEEF], dtype=np.uint32)
    got = np.asarray(jax.jit(_counter.fold_in, static_argnums=1)(key, tuple(data)))
    for d, row in zip(data, got, strict=True):
        want = _counter.key_data(jax.random.fold_in(key, d))
        np.testing.assert_array_equal(row, np.asarray(want), err_msg=f"data {d}")


@pytest.mark.parametrize(
    ("init", "dtype"),
    list(zip(INITS, (jnp.float32, jnp.bfloat16, jnp.float16), strict=True)),
    ids=lambda x: getattr(x, "__name__", type(x).__name__),
)
def test_counter_drawn_stacks_equal_the_reference(init, dtype):
    specs = _specs(init, dtype, (1, 5, 13), n=2)
    _check(specs, jax.random.key(3), counter_drawn=("w1", "w5", "w13"))


def test_groups_without_an_elementwise_unit_map_are_drawn_by_map():
    specs = _specs(INITS[0], jnp.float32, (4,), n=2)
    specs += _specs(pd_init.Zeros(), jnp.float32, (5,), n=2, tag="zeros.")
    custom = pd_init.Custom(fn=jax.random.normal)
    specs += [pd_init.ArraySpec(name=f"custom.{i}", shape=(3, 3), init=custom) for i in range(2)]
    plan, _ = _check(specs, jax.random.key(5), counter_drawn=("w4",))
    # A member of 2**32 elements needs the counter's high word: drawn by map (never run here).
    big = pd_init.ArraySpec(name="big", shape=(2**16, 2**16), init=INITS[0])
    assert pd_init.InitPlan([big], draw="counter").counter_drawn == ()
    assert plan.draw == "counter"


def test_zero_groups_are_a_broadcast_with_no_loop(mesh_of):
    batch = NamedSharding(mesh_of(8), PartitionSpec("data"))
    specs = _specs(pd_init.Zeros(), jnp.float32, (5, 9), lead=(8, 2), n=3, sharding=batch)
    specs += _specs(pd_init.Zeros(), jnp.int32, (4,), lead=(8, 2), sharding=batch, tag="i.")
    key = jax.eval_shape(lambda: jax.random.key(0))

    def whiles(draw):
        plan = pd_init.InitPlan(specs, draw=draw)
        return plan.stacked_fn.lower(key=key).as_text().count("stablehlo.while")

    assert (whiles("map"), whiles("counter")) == (3, 0)  # map: one loop per group
    _, stacked = _check(specs, jax.random.key(2), counter_drawn=())
    for name, stack in stacked.stacks.items():
        assert stack.sharding.spec == PartitionSpec(None, "data"), name
        assert not np.asarray(stack).any(), name
    assert stacked.stacks["i.w4"].dtype == jnp.int32


def test_sharded_counter_drawn_stacks_are_identical_and_keep_their_shardings(mesh_of):
    mesh = mesh_of(8)
    batch = NamedSharding(mesh, PartitionSpec("data"))  # a member [8, 4, w]: B over the mesh
    specs = _specs(INITS[0], jnp.float32, (3, 17), lead=(8, 4), n=2, sharding=batch)
    last = NamedSharding(mesh, PartitionSpec(None, None, "data"))  # the last dim sharded
    specs += _specs(INITS[1], jnp.float32, (8, 16), lead=(8, 4), n=2, sharding=last, tag="l.")
    _, stacked = _check(specs, jax.random.key(9), counter_drawn=("w3", "w17", "l.w8", "l.w16"))
    for name, stack in stacked.stacks.items():
        want = PartitionSpec(None, None, None, "data") if name.startswith("l.") else None
        assert stack.sharding.spec == (want or PartitionSpec(None, "data")), name


def test_raw_uint32_keys_draw_the_same_values():
    _check(_specs(INITS[1], jnp.float32, (2, 7)), jax.random.PRNGKey(4), counter_drawn=("w2", "w7"))


def test_other_key_implementations_fall_back_to_map():
    specs = _specs(INITS[0], jnp.float32, (3, 6), n=2)
    key = jax.random.key(11, impl="rbg")
    plan = pd_init.InitPlan(specs, draw="counter")
    stacked, reference = plan.init_stacked(key=key), plan.init_reference(key=key)
    for spec in specs:
        _assert_bitwise(stacked.member(spec.name), reference[spec.name], f"rbg {spec.name}")


def test_no_loop_and_a_program_that_does_not_grow_with_the_stacks():
    """What makes the compile cheap: 7 groups and not one ``while`` (``map`` has a loop and a
    threefry loop per group; the keys' fold_in is written out in both), and the program for 64 members of 4x the
    size is the same program with other numbers."""
    key = jax.eval_shape(lambda: jax.random.key(0))

    def lowered(draw, *, n=4, lead=(2, 3)):
        specs = _specs(INITS[0], jnp.float32, (3, 5, 9, 17, 33, 65, 129), n=n, lead=lead)
        return pd_init.InitPlan(specs, draw=draw).stacked_fn.lower(key=key).as_text()

    assert lowered("map").count("stablehlo.while") == 7 + 7
    small = lowered("counter")
    assert small.count("stablehlo.while") == 0

    def masked(text):  # numbers and constant payloads (the members' name hashes) masked
        return re.sub(r"\d+", "#", re.sub(r"dense<[^>]*>", "dense<#>", text))

    assert masked(small) == masked(lowered("counter", n=64, lead=(4, 6)))
    values = np.asarray(
        pd_init.InitPlan(_specs(INITS[0], jnp.float32, (129,), n=4), draw="counter")
        .init_stacked(key=jax.random.key(0))
        .stacks["w129"]
    )
    assert abs(values.std() - 12**-0.5) < 0.02 and values.min() >= -0.3 and values.max() < 0.7
