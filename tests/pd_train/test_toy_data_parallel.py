"""Toy steps data-parallel over host devices (``decompose(devices=2)``, the toy config's
``devices``): the state after N steps of the ``tms_5_2`` recipe (blocked CI MLPs, blocked draws,
the faithfulness warmup) matches one device's within float rounding while the run really is
partitioned (its state on both devices, each device's CI MLPs over its half of the blocks), a
resume at the same K and devices is bit-exact, and a device count the process or the batch
cannot serve is refused by field before anything runs. The tests' conftest gives the process 8
simulated CPU devices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.ci.mlp import blocked_over_rows, one_layer_forward, one_layer_pullback
from pd_train.cli.toy import load_toy_config
from pd_train.config.io import ConfigError
from pd_train.config.pd import FaithfulnessWarmup
from pd_train.run.checkpoints import Checkpoints
from pd_train.run.hooks import Hook, StepInfo
from pd_train.sources import uniform
from pd_train.targets.toys import (
    TOY_DATA_AXIS,
    decompose,
    make_target,
    toy_config,
    toy_data,
    toy_mesh,
    toy_trainer,
    toy_weights,
)
from pd_train.train import Trainer

TOY = toy_config("tms_5_2")  # the paper's recipe: CI MLPs blocked by 128, blocked draws
PD = attrs.evolve(
    TOY.pd, steps=20, batch_size=512, faithfulness_warmup=FaithfulnessWarmup(steps=3, lr=1e-2)
)
TARGET = make_target(TOY)


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    return toy_trainer(TARGET, PD)


class _Devices(Hook):
    """The number of devices the state's params are on after each call."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, info: StepInfo) -> None:
        leaf = jax.tree_util.tree_leaves(info.state.params)[0]
        self.seen.append(len(leaf.sharding.device_set))


def _run(trainer: Trainer, devices: int, **kw: Any) -> tuple[Any, dict[int, float], list[int]]:
    losses: dict[int, float] = {}
    where = _Devices()
    _, state = decompose(
        TARGET, toy_weights("tms_5_2"), PD, seed=5, feature_probability=TOY.feature_probability,
        data=toy_data(TOY), trainer=trainer, steps_per_call=10, log_every=10,
        on_step=lambda i, m: losses.__setitem__(i, float(m["loss/total"])),
        hooks=(where,), devices=devices, **kw,
    )  # fmt: skip
    return jax.device_get(state), losses, where.seen


def test_two_devices_match_one_device_within_rounding(trainer: Trainer) -> None:
    one, losses_one, where_one = _run(trainer, 1)
    two, losses_two, where_two = _run(trainer, 2)
    assert where_one == [1, 1] and where_two == [2, 2]  # it really ran on two devices
    assert sorted(losses_one) == sorted(losses_two) == [0, 10, 19]
    for i in losses_one:
        np.testing.assert_allclose(losses_two[i], losses_one[i], rtol=1e-5)
    assert int(one.step) == int(two.step) == 20
    for a, b in zip(
        jax.tree_util.tree_leaves(one.params), jax.tree_util.tree_leaves(two.params), strict=True
    ):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=1e-6)
    # A real trajectory: the params moved far more than that tolerance.
    init = jax.device_get(trainer.init_state(key=jax.random.fold_in(jax.random.key(5), 0)))
    moved = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(
            jax.tree_util.tree_leaves(init.params),
            jax.tree_util.tree_leaves(one.params),
            strict=True,
        )
    )
    assert moved > 1e-2


def test_a_resume_at_the_same_k_and_devices_is_bit_exact(trainer: Trainer, tmp_path: Path) -> None:
    whole, _, _ = _run(trainer, 2)
    ckpt = Checkpoints(tmp_path / "ckpt")
    _run(trainer, 2, max_steps=10, checkpoints=ckpt, checkpoint_every=10)
    assert ckpt.latest_step() == 10
    resumed, _, _ = _run(trainer, 2, checkpoints=ckpt, resume=True)
    ckpt.close()
    for a, b in zip(
        jax.tree_util.tree_leaves(whole.params),
        jax.tree_util.tree_leaves(resumed.params),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_the_ci_mlp_blocks_are_split_over_the_mesh_and_equal_one_devices() -> None:
    c, h, rows, block = 6, 16, 4 * 128, 128
    keys = jax.random.split(jax.random.key(1), 4)
    params = {
        "w0": jax.random.normal(keys[0], (c, h)),
        "b0": 0.1 * jax.random.normal(keys[1], (c, h)),
        "w_out": jax.random.normal(keys[2], (c, h)),
        "b_out": jnp.zeros((c,)),
    }
    inner = jax.random.normal(keys[3], (rows, 1, c))
    fn = blocked_over_rows(one_layer_forward, block, one_layer_pullback)

    def loss(p: Any, x: jax.Array) -> jax.Array:
        return jnp.sum(jnp.tanh(fn(p, x)) * jnp.arange(c))

    grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    want = grad(params, inner)
    mesh = toy_mesh(2, batch_size=rows)
    rows_sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(TOY_DATA_AXIS))
    with jax.set_mesh(mesh):
        x = jax.device_put(inner, rows_sharded)
        got = grad(params, x)
        hlo = grad.lower(params, x).compile().as_text()
    # Each device maps over its 2 blocks of 128 rows (not all 4), and the parameters'
    # gradients are summed over the devices.
    assert "f32[2,128,1,6]" in hlo and "f32[4,128,1,6]" not in hlo
    assert "all-reduce" in hlo
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_a_device_count_the_process_or_batch_cannot_serve_is_refused_by_field() -> None:
    for bad in (0, 1.5, True):
        with pytest.raises(ConfigError, match="devices: got"):
            toy_mesh(bad, batch_size=512)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"devices: got 3; must divide pd.batch_size \(512\)"):
        toy_mesh(3, batch_size=512)
    too_many = jax.device_count() + 1
    with pytest.raises(ConfigError, match=f"--simulate-devices {too_many}"):
        toy_mesh(too_many, batch_size=512 * too_many)
    assert toy_mesh(1, batch_size=512) is None
    with pytest.raises(ConfigError, match="devices: got 0; must be an int >= 1"):
        load_toy_config("builtin:tms_5_2", ["devices=0"])
    with pytest.raises(ConfigError, match=r"devices: got 3; must divide pd.batch_size \(4096\)"):
        load_toy_config("builtin:tms_5_2", ["devices=3"])
    assert load_toy_config("builtin:tms_5_2", ["devices=2"])["devices"] == 2


@pytest.mark.parametrize("shape", [(4096, 1, 21), (6, 1, 3), (2, 70001), (5, 3)])
def test_blocked_draws_under_a_mesh_draw_each_devices_rows_with_jaxs_bits(
    shape: tuple[int, ...],
) -> None:
    key = jax.random.fold_in(jax.random.key(7), 3)
    want = np.asarray(jax.random.uniform(key, shape))
    mesh = toy_mesh(2, batch_size=2)

    def draw(key: jax.Array) -> jax.Array:
        return uniform(key, shape, draws="blocked")

    with jax.set_mesh(mesh):
        got = np.asarray(jax.jit(draw)(key))
        jaxpr = str(jax.make_jaxpr(draw)(key))
    np.testing.assert_array_equal(got, want)
    # Rows that split evenly over the 2 devices are drawn per device; others as one program.
    assert ("shard_map" in jaxpr) == (shape[0] % 2 == 0)
