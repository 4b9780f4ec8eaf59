"""Each loss term, the masks and the optimizer pieces against hand computations on small arrays."""

from __future__ import annotations

import math

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pd_train.config.pd import DecompositionTarget, ImportanceMinimality, OptimizerConfig
from pd_train.decomposition import build_decomposition
from pd_train.losses import (
    coeff_multiplier,
    coeff_schedule_hyperparams,
    faithfulness,
    importance_minimality,
    kl_clean_masked,
    l0,
    pnorm_at,
)
from pd_train.models.llama_config import LlamaConfig
from pd_train.optim import clip_by_global_norm, lr_schedule
from pd_train.sources import masks, sample_source

RNG = np.random.default_rng(0)
MODEL = LlamaConfig(
    vocab_size=8,
    hidden_size=4,
    intermediate_size=6,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
)


def test_faithfulness_by_hand() -> None:
    targets = (
        DecompositionTarget(module_pattern="layers.*.self_attn.q_proj", C=3),
        DecompositionTarget(module_pattern="layers.[02].mlp.down_proj", C=2),  # layers 0 and 2
    )
    dec = build_decomposition(MODEL, targets)
    q_w = RNG.standard_normal((3, 4, 4)).astype(np.float32)
    down_w = RNG.standard_normal((3, 6, 4)).astype(np.float32)
    comps = {
        "q_proj": {"V": RNG.standard_normal((3, 4, 3)), "U": RNG.standard_normal((3, 3, 4))},
        "down_proj": {"V": RNG.standard_normal((2, 6, 2)), "U": RNG.standard_normal((2, 2, 4))},
    }
    total = sum(
        np.sum((q_w[i] - comps["q_proj"]["V"][i] @ comps["q_proj"]["U"][i]) ** 2) for i in range(3)
    )
    for slot, layer in enumerate((0, 2)):
        diff = down_w[layer] - comps["down_proj"]["V"][slot] @ comps["down_proj"]["U"][slot]
        total += np.sum(diff**2)
    want = total / (3 * 4 * 4 + 2 * 6 * 4)
    got = faithfulness(
        {"q_proj": jnp.asarray(q_w), "down_proj": jnp.asarray(down_w)},
        jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), comps),
        dec,
    )
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


@pytest.mark.parametrize("frequency_coeff", [0.0, 0.3])
def test_importance_minimality_by_hand(frequency_coeff: float) -> None:
    ci = {
        "q_proj": RNG.uniform(0, 1.2, (2, 3, 5, 4)).astype(np.float32),  # [n_k, B, T, C]
        "up_proj": RNG.uniform(0, 1.0, (1, 3, 5, 2)).astype(np.float32),
    }
    p, eps, a = 0.7, 1e-3, 100
    want = 0.0
    for arr in ci.values():
        for site in arr:
            for c in range(site.shape[-1]):
                f = np.sum((site[..., c].astype(np.float64) + eps) ** p) / (3 * 5)
                want += f + frequency_coeff * f * math.log2(1 + a * f)
    got = importance_minimality(
        {k: jnp.asarray(v) for k, v in ci.items()},
        pnorm=p,
        eps=eps,
        frequency_coeff=frequency_coeff,
        reference_token_count=a,
    )
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_pnorm_anneals_linearly_inside_its_window() -> None:
    term = ImportanceMinimality(
        coeff=1.0, pnorm_start=2.0, pnorm_end=0.4, anneal_start_frac=0.2, anneal_end_frac=0.6
    )
    values = [float(pnorm_at(term, jnp.asarray(s), 100)) for s in (0, 20, 40, 60, 99)]
    np.testing.assert_allclose(values, [2.0, 2.0, 1.2, 0.4, 0.4], rtol=1e-6)


def _multipliers(term: ImportanceMinimality, steps: list[int], total: int) -> list[float]:
    hp = {k: jnp.float32(v) for k, v in coeff_schedule_hyperparams(term, total).items()}
    return [float(jax.jit(coeff_multiplier)(hp, s)) for s in steps]


def test_the_coefficient_schedule_is_param_decomps() -> None:
    """Warmup 0 -> peak over the first 10 % of 100 steps, the peak until 50 %, back to 1 by
    90 %: written out from param-decomp's definition (fraction of training = step / steps)."""
    term = ImportanceMinimality(
        coeff=1.0,
        coeff_warmup_frac=0.1,
        coeff_peak_multiplier=3.0,
        coeff_anneal_start_frac=0.5,
        coeff_anneal_end_frac=0.9,
    )
    steps = [0, 5, 9, 10, 49, 50, 70, 89, 90, 99]
    want = [0.0, 1.5, 2.7, 3.0, 3.0, 3.0, 2.0, 1.05, 1.0, 1.0]
    np.testing.assert_allclose(_multipliers(term, steps, 100), want, rtol=1e-6)
    # A release below 1 and back (peak 0.5: half the coefficient until the anneal).
    half = attrs.evolve(term, coeff_peak_multiplier=0.5, coeff_warmup_frac=0.0)
    np.testing.assert_allclose(
        _multipliers(half, [0, 49, 70, 90], 100), [0.5, 0.5, 0.75, 1.0], rtol=1e-6
    )
    # The defaults are no schedule; an empty anneal window steps to 1 at its start.
    assert _multipliers(ImportanceMinimality(coeff=1.0), [0, 50, 99], 100) == [1.0, 1.0, 1.0]
    step = attrs.evolve(term, coeff_anneal_end_frac=0.5)
    assert _multipliers(step, [49, 50], 100) == [3.0, 1.0]


_IM = "pd.loss_metrics[1]."
BAD_SCHEDULES = [
    (["coeff_peak_multiplier=-1.0"], "coeff_peak_multiplier: got -1.0; must be >= 0"),
    (["coeff_warmup_frac=1.5"], "coeff_warmup_frac: got 1.5; must be in [0.0, 1.0]"),
    (
        ["coeff_warmup_frac=0.6", "coeff_anneal_start_frac=0.5"],
        "coeff_warmup_frac: got 0.6, above coeff_anneal_start_frac 0.5",
    ),
    (
        ["coeff_anneal_start_frac=0.5", "coeff_anneal_end_frac=0.2"],
        "coeff_anneal_end_frac: got 0.2, below coeff_anneal_start_frac 0.5",
    ),
]


@pytest.mark.parametrize(("sets", "message"), BAD_SCHEDULES, ids=[m for _, m in BAD_SCHEDULES])
def test_a_bad_coefficient_schedule_is_refused_by_field_path(sets: list[str], message: str) -> None:
    from pd_train.config.io import ConfigError
    from pd_train.config.pd import check_pd_config
    from pd_train.config.run import load_config

    with pytest.raises(ConfigError) as info:
        config, _ = load_config("configs/cpu-example.yaml", overrides=[_IM + s for s in sets])
        check_pd_config(config.pd)
    assert _IM + message in str(info.value)


def test_kl_by_hand_and_zero_on_equal_logits() -> None:
    clean = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    masked = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    p = np.exp(clean) / np.exp(clean).sum(-1, keepdims=True)
    q = np.exp(masked) / np.exp(masked).sum(-1, keepdims=True)
    want = np.mean(np.sum(p * (np.log(p) - np.log(q)), -1))
    got = kl_clean_masked(jnp.asarray(clean), jnp.asarray(masked))
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
    assert abs(float(kl_clean_masked(jnp.asarray(clean), jnp.asarray(clean)))) < 1e-6
    # Gradient flows only into the masked side.
    g_clean, g_masked = jax.grad(kl_clean_masked, argnums=(0, 1))(
        jnp.asarray(clean), jnp.asarray(masked)
    )
    assert not np.any(np.asarray(g_clean)) and np.any(np.asarray(g_masked))


def test_l0_counts_components_above_threshold() -> None:
    ci = np.array([[[[0.0, 0.2, 0.9], [0.5, 0.0, 0.0]]]], np.float32)  # [1, 1, 2, 3]
    got = l0({"v_proj": jnp.asarray(ci)}, 0.1)
    np.testing.assert_allclose(np.asarray(got["v_proj"]), [(2 + 1) / 2])


def test_masks_and_delta() -> None:
    ci = np.array([[0.0, 0.5, 1.0]], np.float32)
    r = np.array([[0.2, 0.4, 0.9, 0.7]], np.float32)
    m, delta = masks(jnp.asarray(ci), jnp.asarray(r))
    np.testing.assert_allclose(np.asarray(m), [[0.2, 0.5 + 0.5 * 0.4, 1.0]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(delta), [0.7])


def test_sources() -> None:
    key = jax.random.key(0)
    cont = np.asarray(sample_source("continuous", (64, 9), key=key))
    assert cont.min() >= 0 and cont.max() < 1 and len(np.unique(cont)) > 500
    binom = np.asarray(sample_source("binomial", (64, 9), key=key))
    # Components r ∈ {0, 1}, half each; the delta channel stays δ ~ U[0, 1) (spd and
    # param-decomp draw it uniformly under binomial too).
    comps, delta = binom[:, :-1], binom[:, -1]
    assert set(np.unique(comps)) == {0.0, 1.0} and 0.4 < comps.mean() < 0.6
    assert delta.min() >= 0 and delta.max() < 1 and len(np.unique(delta)) == 64
    with pytest.raises(ValueError, match="binomial"):
        sample_source("gaussian", (2,), key=key)  # type: ignore[arg-type]


def test_lr_schedule_warmup_then_cosine_to_final() -> None:
    config = OptimizerConfig(lr=1.0, warmup_steps=4, final_val_frac=0.1, decay_steps=11)
    sched = lr_schedule(config, total_steps=100)
    got = [float(sched(s)) for s in range(0, 20)]
    np.testing.assert_allclose(got[:4], [0.25, 0.5, 0.75, 1.0], rtol=1e-6)
    # Decay step s = step - 4 over denominator decay_steps - 1 = 10.
    for step in range(4, 20):
        progress = min((step - 4) / 10, 1.0)
        want = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        assert got[step] == pytest.approx(want, rel=1e-5)
    assert got[14] == pytest.approx(0.1) and got[4] == pytest.approx(1.0)
    # Default decay_steps: the steps after warmup, ending at final on the last step.
    default = lr_schedule(OptimizerConfig(lr=2.0, final_val_frac=0.5), total_steps=10)
    assert float(default(0)) == pytest.approx(2.0) and float(default(9)) == pytest.approx(1.0)


def test_lr_schedule_holds_then_decays_over_the_last_steps() -> None:
    """warmup 2, hold 5, then the cosine over the remaining 20 - 7 = 13 steps (divisor 12),
    written out by hand."""
    config = OptimizerConfig(lr=2.0, warmup_steps=2, hold_steps=5, final_val_frac=0.25)
    sched = lr_schedule(config, total_steps=20)
    got = [float(sched(s)) for s in range(20)]
    assert got[:2] == pytest.approx([1.0, 2.0])
    assert got[2:8] == pytest.approx([2.0] * 6)  # held through step 6; step 7 is s = 0
    for step in range(7, 20):
        want = 2.0 * (0.25 + 0.75 * 0.5 * (1 + math.cos(math.pi * (step - 7) / 12)))
        assert got[step] == pytest.approx(want, rel=1e-6)
    assert got[19] == pytest.approx(0.5)
    # An explicit decay_steps shortens the cosine after the hold; then final_val_frac·lr.
    short = lr_schedule(attrs.evolve(config, decay_steps=3), total_steps=20)
    assert [float(short(s)) for s in (7, 8, 9, 15)] == pytest.approx([2.0, 1.25, 0.5, 0.5])
    # decay_steps 1: lr through the hold, then final_val_frac·lr at once.
    step = lr_schedule(attrs.evolve(config, decay_steps=1), total_steps=20)
    assert [float(step(s)) for s in (2, 6, 7, 19)] == pytest.approx([2.0, 2.0, 0.5, 0.5])


def test_clip_scales_by_max_over_norm_plus_eps() -> None:
    grads = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([[4.0]])}  # global norm 5
    tx = clip_by_global_norm(1.0)
    out, _ = tx.update(grads, tx.init(grads))
    scale = 1.0 / (5.0 + 1e-6)
    np.testing.assert_allclose(np.asarray(out["a"]), [3 * scale, 0.0], rtol=1e-7)
    # Below the max nothing changes.
    small, _ = clip_by_global_norm(10.0).update(grads, optax.EmptyState())
    np.testing.assert_array_equal(np.asarray(small["b"]), [[4.0]])
