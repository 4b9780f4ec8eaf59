"""Binomial sources as the references draw them.
Expectations are written out (distributions, hand formulas), never built with pd's sampler."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.sources import jitter_lower, masks, sample_source
from pd_train.squash import lower_leaky_hard


def test_binomial_delta_is_uniform_and_components_are_fair_coins() -> None:
    r = np.asarray(sample_source("binomial", (4096, 5), key=jax.random.key(3)))
    comps, delta = r[:, :4], r[:, 4]
    assert set(np.unique(comps)) == {0.0, 1.0}
    assert abs(comps.mean() - 0.5) < 0.02
    # U[0, 1): mean 1/2, variance 1/12, every decile about a tenth of the draws.
    assert delta.min() >= 0.0 and delta.max() < 1.0
    assert abs(delta.mean() - 0.5) < 0.02 and abs(delta.var() - 1 / 12) < 0.005
    counts, _ = np.histogram(delta, bins=10, range=(0, 1))
    assert counts.min() > 0.08 * 4096 and counts.max() < 0.12 * 4096
    # The masks keep the raw δ: m = ci + (1 − ci)·r, δ = r[C].
    ci = np.full((4096, 4), 0.25, np.float32)
    m, d = masks(jnp.asarray(ci), jnp.asarray(r))
    np.testing.assert_allclose(np.asarray(m), 0.25 + 0.75 * comps, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(d), delta)


def test_binomial_jitter_is_1_05_x_minus_0_05_u() -> None:
    """spd's calc_causal_importances under binomial: lower = lower_leaky(1.05·x − 0.05·u),
    u ~ U[0, 1) per element; written out for a few pre-activations."""
    n = 20_000
    x = np.repeat(np.array([-0.3, 0.0, 0.5, 1.0, 1.4], np.float32)[None], n, axis=0)
    got = np.asarray(lower_leaky_hard(jitter_lower(jnp.asarray(x), key=jax.random.key(5))))
    # x = 0.5: 1.05·0.5 − 0.05·u = 0.525 − 0.05u ∈ (0.475, 0.525], mean 0.5, sd 0.05/√12.
    mid = got[:, 2]
    assert mid.min() > 0.475 and mid.max() <= 0.525
    assert abs(mid.mean() - 0.5) < 1e-3 and abs(mid.std() - 0.05 / np.sqrt(12)) < 1e-3
    # x ≤ 0 stays at 0 (the jitter only lowers); x ≥ 1 stays at 1 (1.05·x − 0.05u > 1).
    np.testing.assert_array_equal(got[:, 0], 0.0)
    np.testing.assert_array_equal(got[:, 1], 0.0)
    np.testing.assert_array_equal(got[:, 3], 1.0)
    np.testing.assert_array_equal(got[:, 4], 1.0)
    # Inside (0, 1] the gradient is 1.05 (the chain through the jitter).
    grad = jax.grad(lambda v: jnp.sum(lower_leaky_hard(jitter_lower(v, key=jax.random.key(5)))))
    np.testing.assert_allclose(np.asarray(grad(jnp.full((8,), 0.5))), 1.05, rtol=1e-6)
