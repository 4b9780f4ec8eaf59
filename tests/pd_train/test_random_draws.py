"""``pd.recon.random_draws``: ``blocked`` computes the uniform draws (the masks' sources, the
recon routing, the TMS data) with pd's own Threefry-2x32 in a scan over blocks; it must give
``jax.random.uniform``'s bits exactly, so a run's trajectory is the same bit for bit, and the
default (``jax``) must stay jax's generator.

Pinned values: the Threefry-2x32 (20 rounds) known-answer vectors of Random123 (Salmon et al.
2011, ``kat_vectors``; the same vectors JAX's own tests use), and the bits of
``jax.random.uniform(jax.random.key(7), (6,))`` under jax 0.10.2's defaults, written out once by
``[hex(b) for b in jax.lax.bitcast_convert_type(jax.random.uniform(jax.random.key(7), (6,)),
jnp.uint32)]``.
"""

from __future__ import annotations

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.config.pd import FaithfulnessWarmup, ReconConfig
from pd_train.sources import DRAW_BLOCK, sample_source, threefry2x32, uniform
from pd_train.targets.toys import make_target, toy_config

from ._toy_params import final_params


def _bits(x: jax.Array) -> np.ndarray:
    return np.asarray(jax.lax.bitcast_convert_type(x, jnp.uint32))


@pytest.mark.parametrize(
    ("key", "counter", "expected"),
    [
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF,) * 2, (0xFFFFFFFF,) * 2, (0x1CB996FC, 0xBB002BE7)),
        ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
    ],
)
def test_threefry2x32_gives_the_known_answers(
    key: tuple[int, int], counter: tuple[int, int], expected: tuple[int, int]
) -> None:
    k0, k1, x0, x1 = (jnp.uint32(v) for v in (*key, *counter))
    out = jax.jit(threefry2x32)(k0, k1, x0, x1)
    assert tuple(int(v) for v in out) == expected


SHAPES = [(), (1,), (7,), (3, 5, 2), (4096, 1, 21), (DRAW_BLOCK + 3,), (3 * DRAW_BLOCK, 2)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_blocked_draws_are_jax_s_bits(shape: tuple[int, ...]) -> None:
    keys = [
        jax.random.key(0),
        jax.random.fold_in(jax.random.key(5), 3),
        jax.random.PRNGKey(9),  # a raw uint32[2] key
    ]
    for key in keys:
        expected = jax.random.uniform(key, shape)
        got = jax.jit(lambda k, s=shape: uniform(k, s, draws="blocked"))(key)
        assert got.shape == shape and got.dtype == jnp.float32
        np.testing.assert_array_equal(_bits(got), _bits(expected))


def test_blocked_draws_are_jax_s_bits_under_vmap_and_for_every_sampling() -> None:
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(1), i))(jnp.arange(4))
    shape = (64, 1, 9)
    for sampling in ("continuous", "binomial"):
        got = jax.jit(
            jax.vmap(lambda k, s=sampling: sample_source(s, shape, key=k, draws="blocked"))
        )(keys)
        ref = jax.vmap(lambda k, s=sampling: sample_source(s, shape, key=k))(keys)
        np.testing.assert_array_equal(_bits(got), _bits(ref))
    # binomial's "jax" path is jax.random.bernoulli's: the blocked one gives the same coins
    comp_key, _ = jax.random.split(keys[0])
    coins = jax.random.bernoulli(comp_key, 0.5, (64, 1, 8))
    np.testing.assert_array_equal(
        np.asarray(sample_source("binomial", shape, key=keys[0], draws="blocked"))[..., :-1],
        np.asarray(coins, np.float32),
    )


def test_the_default_draws_are_jax_s_threefry() -> None:
    """Fails if the default generator (or jax's) changes: the default's masks are pinned."""
    u = jax.jit(lambda k: sample_source("continuous", (6,), key=k))(jax.random.key(7))
    pinned = [0x3F2C9128, 0x3F79807E, 0x3E9B0E50, 0x3EE34E88, 0x3F3B1B62, 0x3F21849A]
    assert _bits(u).tolist() == pinned
    assert ReconConfig().random_draws == "jax"
    # ... and the blocked draw is the same stream
    assert _bits(uniform(jax.random.key(7), (6,), draws="blocked")).tolist() == pinned


def test_blocked_draws_are_uniform_and_independent_across_sites_and_blocks() -> None:
    base = jax.random.key(11)
    shape = (4096, 1, 21)  # two blocks of the flat index
    a = np.asarray(uniform(jax.random.fold_in(base, 0), shape, draws="blocked")).ravel()
    b = np.asarray(uniform(jax.random.fold_in(base, 1), shape, draws="blocked")).ravel()
    for x in (a, b):
        assert x.min() >= 0.0 and x.max() < 1.0
        assert abs(x.mean() - 0.5) < 0.01 and abs(x.var() - 1 / 12) < 0.003
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.02  # two sites' keys
    half = a.size // 2
    assert abs(np.corrcoef(a[:half], a[half : 2 * half])[0, 1]) < 0.02  # the draw's two blocks


def test_blocked_draws_fall_back_to_jax_where_its_bits_differ() -> None:
    """jax's original (non-partitionable) Threefry and a non-Threefry key draw other bits:
    ``blocked`` draws with jax.random there."""
    shape = (100, 3)
    rbg = jax.random.key(4, impl="rbg")
    np.testing.assert_array_equal(
        _bits(uniform(rbg, shape, draws="blocked")), _bits(jax.random.uniform(rbg, shape))
    )
    key = jax.random.key(4)
    jax.config.update("jax_threefry_partitionable", False)
    try:
        original = jax.random.uniform(key, shape)
        blocked = uniform(key, shape, draws="blocked")
    finally:
        jax.config.update("jax_threefry_partitionable", True)
    np.testing.assert_array_equal(_bits(blocked), _bits(original))
    assert not np.array_equal(_bits(original), _bits(jax.random.uniform(key, shape)))


def test_a_bad_draws_value_is_refused() -> None:
    with pytest.raises(ValueError, match="draws must be one of jax, blocked, got 'rbg'"):
        uniform(jax.random.key(0), (3,), draws="rbg")


def test_a_toy_trajectory_is_the_same_bit_for_bit_with_either_draws() -> None:
    """20 steps of the tms_5_2 recipe (its masks' sources, the layerwise term's routing, the
    data): the params after them equal exactly."""
    toy = toy_config("tms_5_2")
    assert toy.pd.recon.random_draws == "blocked"  # what the TMS recipes run
    pd = attrs.evolve(
        toy.pd, steps=20, batch_size=96, faithfulness_warmup=FaithfulnessWarmup(steps=0)
    )
    jax_pd = attrs.evolve(pd, recon=attrs.evolve(pd.recon, random_draws="jax"))
    jax_toy = attrs.evolve(toy, pd=jax_pd)  # its data drawn by jax.random too
    target = make_target(toy)
    blocked = final_params(toy, target, pd, seed=2)
    reference = final_params(jax_toy, target, jax_pd, seed=2)
    for x, y in zip(blocked, reference, strict=True):
        np.testing.assert_array_equal(x, y)
