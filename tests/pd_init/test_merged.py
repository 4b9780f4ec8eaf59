"""``draw="merged"``: groups that differ only in their last dimension share one loop and one
threefry kernel, and every value still equals the per-array reference's, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import pd_init

from .test_bit_identity import _assert_bitwise

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


def _check(specs, key, *, merged):
    plan = pd_init.InitPlan(specs, draw="merged")
    assert plan.merged == merged
    stacked = plan.init_stacked(key=key)
    reference = plan.init_reference(key=key)
    for spec in specs:
        _assert_bitwise(stacked.member(spec.name), reference[spec.name], f"merged {spec.name}")
    return plan, stacked


@pytest.mark.parametrize(
    ("init", "dtype"),
    list(zip(INITS, (jnp.float32, jnp.bfloat16, jnp.float16), strict=True)),
    ids=lambda x: getattr(x, "__name__", type(x).__name__),
)
def test_groups_differing_only_in_their_last_dim_are_drawn_together(init, dtype):
    _check(_specs(init, dtype, (1, 5, 13), n=2), jax.random.key(3), merged=(("w1", "w5", "w13"),))


def test_only_groups_alike_but_for_the_last_dim_are_merged():
    init = INITS[0]
    specs = _specs(init, jnp.float32, (1, 5), n=2)
    # Another member count (a set of its own), another initializer, another leading dim, and
    # Zeros (nothing to draw): none of them joins the first set.
    specs += _specs(init, jnp.float32, (4, 6), n=1, tag="one.")
    specs += _specs(pd_init.Uniform(low=0.0, high=2.0), jnp.float32, (3,), n=2, tag="other.")
    specs += _specs(init, jnp.float32, (5,), lead=(3, 2), n=2, tag="lead.")
    specs += _specs(pd_init.Zeros(), jnp.float32, (5, 7), n=2, tag="zeros.")
    _check(specs, jax.random.key(3), merged=(("w1", "w5"), ("one.w4", "one.w6")))


def test_sharded_merged_groups_are_identical_and_keep_their_shardings(mesh_of):
    mesh = mesh_of(8)
    batch = NamedSharding(mesh, PartitionSpec("data"))  # a member [8, 4, w]: B over the mesh
    specs = _specs(INITS[0], jnp.float32, (3, 9, 17), lead=(8, 4), n=2, sharding=batch)
    # A sharded last dim cannot be drawn as a slice of a concatenation: drawn alone.
    last = NamedSharding(mesh, PartitionSpec(None, None, "data"))
    specs += _specs(INITS[0], jnp.float32, (8, 16), lead=(8, 4), n=2, sharding=last, tag="l.")
    _, stacked = _check(specs, jax.random.key(9), merged=(("w3", "w9", "w17"),))
    for name, stack in stacked.stacks.items():
        want = PartitionSpec(None, None, None, "data") if name.startswith("l.") else None
        assert stack.sharding.spec == (want or PartitionSpec(None, "data")), name


def test_raw_uint32_keys_draw_the_same_values():
    specs = _specs(INITS[1], jnp.float32, (2, 7))
    _check(specs, jax.random.PRNGKey(4), merged=(("w2", "w7"),))


def test_one_loop_and_one_threefry_kernel_for_a_merged_set():
    """What makes the compile cheap: 7 groups, one loop and one draw (plus the keys' fold_in),
    where "map" has a loop and a draw per group. Counted in the lowered module."""
    specs = _specs(INITS[0], jnp.float32, (3, 5, 9, 17, 33, 65, 129), n=4)
    key = jax.eval_shape(lambda: jax.random.key(0))

    def count(draw, op):
        text = pd_init.InitPlan(specs, draw=draw).stacked_fn.lower(key=key).as_text()
        return text.count(op)

    assert count("map", "stablehlo.while") == 7 + 7 + 1  # group loops, threefry loops, keys
    assert count("merged", "stablehlo.while") == 1 + 1 + 1
    values = np.asarray(
        pd_init.InitPlan(specs, draw="merged").init_stacked(key=jax.random.key(0)).stacks["w129"]
    )
    assert abs(values.std() - 12**-0.5) < 0.02 and values.min() >= -0.3 and values.max() < 0.7
