"""``pd.ci.batch_block``: the ``mlp`` CI function blocked over the batch×seq rows gives the
CI pre-activations and the gradients of a formula-level reference (plain jnp, written out here)
and of today's whole-batch program within float rounding, with a remainder block or without;
the field is refused by path when not a positive int; a toy run's state after N steps matches
the whole-batch program's."""

from __future__ import annotations

import math

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.ci import MLPCIFunction
from pd_train.cli.toy import load_toy_config
from pd_train.config.io import ConfigError
from pd_train.config.pd import MLPCI, FaithfulnessWarmup
from pd_train.decomposition import KindLayout
from pd_train.targets.toys import make_target, toy_config
from pd_train.train import Trainer

from ._toy_params import final_params

#: Rounding tolerance (fp32): the blocked forward sums the 16 hidden units in another order and
#: takes Φ as (1 + erf(h/√2))/2 (torch's formula) instead of jax's erfc(-h/√2)/2; a gradient is
#: summed per block, then over blocks. Values are O(1)-O(100) (sums over rows).
RTOL, ATOL = 2e-5, 2e-5


def _reference(p: dict, inner: jax.Array) -> jax.Array:
    """Σ_h w_out[c,h]·gelu(inner[..,c]·w0[c,h] + b0[c,h]) + b_out[c], gelu(x) = x·Φ(x),
    Φ(x) = (1 + erf(x/√2))/2: the formula, no pd code."""
    h = inner[..., None] * p["w0"] + p["b0"]
    gelu = h * 0.5 * (1.0 + jax.scipy.special.erf(h / math.sqrt(2.0)))
    return jnp.sum(gelu * p["w_out"], axis=-1) + p["b_out"]


def _params(c: int, hidden: tuple[int, ...], seed: int) -> dict:
    fn = MLPCIFunction(hidden_dims=hidden)
    specs = fn.param_specs(KindLayout(kind="linear1", layers=(0,), C=c, d_in=1, d_out=1))
    rng = np.random.default_rng(seed)
    return {k: jnp.asarray(rng.standard_normal(v.shape), jnp.float32) for k, v in specs.items()}


def _value_and_grads(f, p: dict, inner: jax.Array, g: jax.Array):
    """(f(p, inner), its VJP at g: d p, d inner), one jitted program."""

    @jax.jit
    def run(p, inner, g):
        out, vjp = jax.vjp(f, p, inner)
        return out, *vjp(g)

    return run(p, inner, g)


def _assert_close(a, b) -> None:
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("b", "t", "block", "units"),
    # blocks only; a remainder; T > 1; < 1 block; resid_mlp3's 128 units
    [(64, 1, 16, 16), (50, 1, 16, 16), (7, 3, 4, 16), (5, 1, 8, 16), (40, 1, 16, 128)],
)
def test_blocked_one_layer_matches_the_formula_and_today_s_program(
    b: int, t: int, block: int, units: int
) -> None:
    c = 6
    p = _params(c, (units,), seed=b)
    rng = np.random.default_rng(1)
    inner = jnp.asarray(2.0 * rng.standard_normal((b, t, c)), jnp.float32)
    g = jnp.asarray(rng.standard_normal((b, t, c)), jnp.float32)
    whole = MLPCIFunction(hidden_dims=(units,))
    blocked = whole.blocked(block)
    got = _value_and_grads(blocked, p, inner, g)
    assert got[0].shape == (b, t, c) and got[2].shape == (b, t, c)
    _assert_close(got, _value_and_grads(_reference, p, inner, g))
    _assert_close(got, _value_and_grads(whole.site_apply, p, inner, g))
    # The grads are real: a parameter's gradient sums over all rows, not one block's.
    one_block = _value_and_grads(blocked, p, inner[:block], g[:block])[1]["b_out"]
    if b * t > block:
        assert not np.allclose(np.asarray(got[1]["b_out"]), np.asarray(one_block), atol=1e-3)
    np.testing.assert_allclose(np.asarray(got[1]["b_out"]), np.asarray(g.sum((0, 1))), rtol=1e-5)


def test_blocked_two_layers_matches_today_s_program() -> None:
    c, hidden = 5, (4, 3)
    p = _params(c, hidden, seed=3)
    rng = np.random.default_rng(2)
    inner = jnp.asarray(rng.standard_normal((21, 2, c)), jnp.float32)
    g = jnp.asarray(rng.standard_normal((21, 2, c)), jnp.float32)
    whole = MLPCIFunction(hidden_dims=hidden)
    _assert_close(
        _value_and_grads(whole.blocked(8), p, inner, g),
        _value_and_grads(whole.site_apply, p, inner, g),
    )


def test_site_fn_uses_the_block_only_when_set() -> None:
    c = 4
    p = _params(c, (16,), seed=5)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((12, 1, 3)), jnp.float32)
    V = jnp.asarray(np.random.default_rng(4).standard_normal((3, c)), jnp.float32)
    whole = MLPCIFunction(hidden_dims=(16,))
    blocked = MLPCIFunction(hidden_dims=(16,), batch_block=5)
    want = whole.site_fn(p, x, V)
    np.testing.assert_allclose(blocked.site_fn(p, x, V), want, rtol=RTOL, atol=ATOL)
    # Today's path is untouched: None gives exactly site_apply's value.
    np.testing.assert_array_equal(want, whole.site_apply(p, x @ V))
    hlo = jax.jit(blocked.site_fn).lower(p, x, V).as_text()
    assert "while" in hlo and "while" not in jax.jit(whole.site_fn).lower(p, x, V).as_text()


@pytest.mark.parametrize("bad", ["0", "-4", "2.5", "many"])
def test_a_bad_batch_block_is_refused_by_field(bad: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_toy_config("builtin:tms_40_10", [f"pd.ci.batch_block={bad}"])
    assert "pd.ci.batch_block" in str(err.value) and bad in str(err.value)
    assert MLPCI().batch_block is None  # the default: today's program


def test_a_toy_run_blocked_matches_the_whole_batch_program() -> None:
    """20 steps of tms_5_2's recipe (its four loss terms, blocked by 128 as shipped) at batch
    96, blocked by 64 (a remainder block of 32) and whole: the same state within rounding."""
    toy = toy_config("tms_5_2")
    assert toy.pd.ci.batch_block == toy_config("tms_40_10_fast").pd.ci.batch_block == 128
    pd = attrs.evolve(
        toy.pd, steps=20, batch_size=96, faithfulness_warmup=FaithfulnessWarmup(steps=2, lr=1e-2)
    )
    target = make_target(toy)
    states = []
    for block in (64, None):
        run_pd = attrs.evolve(pd, ci=attrs.evolve(pd.ci, batch_block=block))
        states.append(final_params(toy, target, run_pd, seed=2))
    for a, b in zip(*states, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5)
    # A real trajectory: the params moved far more than that tolerance from their init.
    fresh = Trainer(target, pd).init_state(key=jax.random.fold_in(jax.random.key(2), 0))
    init = jax.tree_util.tree_leaves(jax.device_get(fresh.params))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(init, states[1], strict=True))
    assert moved > 1e-2
