"""Ahead-of-time lowering and compiling on abstract inputs, without allocating the arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import pd_init


def _live_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays())


def test_lower_and_compile_every_arm_on_abstract_keys(mesh_of, zero1):
    mesh = mesh_of(8)
    # Large enough (64 MiB per stack) that allocating them would show in the live bytes.
    specs = [
        pd_init.ArraySpec(
            name=f"layers.{i}.V", shape=(1024, 2048), sharding=zero1(mesh, (1024, 2048)), group="V"
        )
        for i in range(8)
    ]
    plan = pd_init.InitPlan(specs)
    before = _live_bytes()
    for abstract_key in (
        jax.eval_shape(lambda: jax.random.key(0)),
        jax.ShapeDtypeStruct((2,), jnp.uint32),
    ):
        compiled = plan.stacked_fn.lower(key=abstract_key).compile()
        assert compiled.output_shardings["V"].is_equivalent_to(plan.groups[0].sharding, 3)
        shapes = jax.eval_shape(plan.stacked_fn, key=abstract_key)
        assert shapes["V"].shape == (8, 1024, 2048) and shapes["V"].dtype == jnp.float32
    lowered = plan.lower_fan_out()
    assert len(lowered) == 1  # one executable serves all 8 members
    lowered[0].compile()
    assert _live_bytes() - before < 1 << 20


def test_abstract_stacks_describe_the_real_stacks(mixed_plan):
    plan = mixed_plan(8, 3)
    abstract = plan.abstract_stacks()
    real = plan.init_stacked(key=jax.random.key(0)).stacks
    assert set(abstract) == set(real)
    for name, struct in abstract.items():
        assert struct.shape == real[name].shape and struct.dtype == real[name].dtype
        assert real[name].sharding.is_equivalent_to(struct.sharding, len(struct.shape))
    assert sum(g.nbytes for g in plan.groups) == sum(a.nbytes for a in real.values())
    np.testing.assert_equal(len(plan.lower_fan_out()), len(plan.groups))
