"""Squashing functions: forward values and every branch of lower_leaky_hard's custom VJP."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.squash import ALPHA, lower_leaky_hard, upper_leaky_hard

X = jnp.array([-2.0, -0.5, 0.0, 0.3, 1.0, 1.5, 3.0])


def _vjp(fn, x, g):
    _, pullback = jax.vjp(fn, x)
    return np.asarray(pullback(g)[0])


def test_lower_forward_is_clip() -> None:
    np.testing.assert_array_equal(
        np.asarray(lower_leaky_hard(X)), np.float32([0.0, 0.0, 0.0, 0.3, 1.0, 1.0, 1.0])
    )


def test_lower_vjp_positive_cotangent() -> None:
    # g > 0 (the loss wants x smaller): passes on (0, 1] only; nothing leaks below 0.
    g = jnp.full_like(X, 2.0)
    np.testing.assert_allclose(_vjp(lower_leaky_hard, X, g), [0, 0, 0, 2.0, 2.0, 0, 0])


def test_lower_vjp_negative_cotangent() -> None:
    # g < 0 (the loss wants x larger): passes on (0, 1], leaks ALPHA·g at x <= 0, 0 above 1.
    g = jnp.full_like(X, -2.0)
    want = [-2 * ALPHA, -2 * ALPHA, -2 * ALPHA, -2.0, -2.0, 0, 0]
    np.testing.assert_allclose(_vjp(lower_leaky_hard, X, g), want, rtol=1e-6)


def test_lower_vjp_mixed_and_zero_cotangent() -> None:
    g = jnp.array([-1.0, 1.0, -3.0, -1.0, 1.0, -1.0, 0.0])
    want = [-ALPHA, 0.0, -3 * ALPHA, -1.0, 1.0, 0.0, 0.0]
    np.testing.assert_allclose(_vjp(lower_leaky_hard, X, g), want, rtol=1e-6)
    # Differs from plain clip's autodiff exactly at the leak: that is what the custom VJP buys.
    plain = _vjp(lambda x: jnp.clip(x, 0.0, 1.0), X, g)
    assert plain[0] == 0.0 and plain[2] != -3 * ALPHA


def test_upper_forward_and_grad_on_every_branch() -> None:
    np.testing.assert_allclose(
        np.asarray(upper_leaky_hard(X)),
        [0.0, 0.0, 0.0, 0.3, 1.0, 1 + ALPHA * 0.5, 1 + ALPHA * 2.0],
        rtol=1e-6,
    )
    grad = jax.vmap(jax.grad(upper_leaky_hard))(X)
    np.testing.assert_allclose(np.asarray(grad), [0, 0, 0, 1, 1, ALPHA, ALPHA], rtol=1e-6)
