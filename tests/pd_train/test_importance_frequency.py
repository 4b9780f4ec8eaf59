"""Importance minimality's frequency term has its own coefficient (param-decomp's convention,
SPEC S8'): expectations written out with numpy from the formula, never from pd's functions."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.config.io import ConfigError
from pd_train.config.pd import FrequencyPenalty, ImportanceMinimality, check_pd_config
from pd_train.config.run import load_config
from pd_train.losses import LOSS_TERMS, TermInputs

RNG = np.random.default_rng(7)
PRODUCTION = "configs/llama8b-full32L.yaml"


def _f(ci: np.ndarray, p: float, eps: float) -> np.ndarray:
    """f_c per site: ci [n_k, B, T, C] -> [n_k, C], float64."""
    return ((ci.astype(np.float64) + eps) ** p).mean(axis=(1, 2))


def _term_value(config: ImportanceMinimality, pd, ci: dict[str, np.ndarray]) -> float:
    """coeff · value of the registered term: its contribution to the step's total."""
    term = LOSS_TERMS["importance_minimality"]
    hp = {k: jnp.asarray(v, jnp.float32) for k, v in term.hyperparams(config, pd).items()}
    inputs = TermInputs(
        spec=None,
        target=None,
        tokens=None,
        params={},
        components={},
        step=jnp.asarray(0, jnp.int32),
        ci_upper={k: jnp.asarray(v) for k, v in ci.items()},
    )
    value, _ = term.value(config, inputs, plan=None, hp=hp, key=None)
    return float(hp["coeff"] * value)


def _sparse_ci(shape: tuple[int, ...], rate: float) -> np.ndarray:
    """CI that fires (≈1) on a fraction ``rate`` of positions, else ≈0."""
    fire = RNG.random(shape) < rate
    return np.where(fire, RNG.uniform(0.8, 1.1, shape), RNG.uniform(0, 1e-3, shape)).astype(
        np.float32
    )


def test_the_loss_is_coeff_activity_plus_frequency_coeff_frequency() -> None:
    config, _ = load_config("configs/cpu-example.yaml")
    ci = {"q_proj": _sparse_ci((2, 3, 5, 4), 0.2), "down_proj": _sparse_ci((1, 3, 5, 6), 0.1)}
    im = ImportanceMinimality(
        coeff=2e-3, eps=1e-3, frequency=FrequencyPenalty(coeff=5e-4, reference_token_count=100)
    )
    want = 0.0
    for arr in ci.values():
        f = _f(arr, 2.0, 1e-3)
        want += 2e-3 * f.sum() + 5e-4 * (f * np.log2(1 + 100 * f)).sum()
    got = _term_value(im, config.pd, ci)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # Without a frequency block the loss is the activity term alone.
    bare = ImportanceMinimality(coeff=2e-3, eps=1e-3)
    want_bare = sum(2e-3 * _f(arr, 2.0, 1e-3).sum() for arr in ci.values())
    np.testing.assert_allclose(_term_value(bare, config.pd, ci), want_bare, rtol=1e-5)


def test_production_frequency_share_matches_param_decomp_s_convention() -> None:
    """On the production recipe's shapes (7 kinds, 2 layers, small C) and a sparse CI, the
    frequency part's share of the importance loss is within 2× of param-decomp's (imp 5e-6,
    freq 1e-6, a' = B·T of the production batch = 128·512). The old nesting (1e-6 inside
    coeff) gave a share ~1e-5 of that."""
    config, _ = load_config(PRODUCTION)
    (im,) = (t for t in config.pd.loss_metrics if t.type == "importance_minimality")
    c_by_kind = {"q_proj": 16, "k_proj": 16, "v_proj": 32, "o_proj": 32, "gate_proj": 64}
    c_by_kind |= {"up_proj": 64, "down_proj": 80}
    ci = {k: _sparse_ci((2, 4, 32, c), 0.02) for k, c in c_by_kind.items()}
    total = _term_value(im, config.pd, ci)
    activity = sum(_f(arr, im.pnorm_start, im.eps).sum() for arr in ci.values())
    pd_share = (total - im.coeff * activity) / total

    a = 128 * 512
    freq = sum(
        (_f(arr, 2.0, 1e-6) * np.log2(1 + a * _f(arr, 2.0, 1e-6))).sum() for arr in ci.values()
    )
    act = sum(_f(arr, 2.0, 1e-6).sum() for arr in ci.values())
    reference_share = 1e-6 * freq / (5e-6 * act + 1e-6 * freq)
    assert 0.5 <= pd_share / reference_share <= 2.0, (pd_share, reference_share)
    assert reference_share > 0.1  # the two parts are of the same order in the loss


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("pd.loss_metrics[1].frequency_coeff=0.2", "frequency_coeff"),
        ("pd.loss_metrics[1].reference_token_count=512", "reference_token_count"),
    ],
)
def test_the_old_nested_form_is_refused_with_how_to_convert(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("configs/cpu-example.yaml", overrides=[override])
    text = str(info.value)
    assert f"pd.loss_metrics[1].{field}: got" in text
    assert "frequency: {coeff: X" in text and "coeff × the old frequency_coeff" in text


def test_a_frequency_term_needs_a_positive_coeff() -> None:
    config, _ = load_config("configs/cpu-example.yaml", overrides=["pd.loss_metrics[1].coeff=0.0"])
    with pytest.raises(ConfigError, match=r"pd\.loss_metrics\[1\]\.coeff: got coeff 0"):
        check_pd_config(config.pd)


def test_bad_frequency_values_are_refused_by_path() -> None:
    for override, path in [
        ("pd.loss_metrics[1].frequency.coeff=-1.0", "pd.loss_metrics[1].frequency.coeff"),
        (
            "pd.loss_metrics[1].frequency.reference_token_count=0",
            "pd.loss_metrics[1].frequency.reference_token_count",
        ),
    ]:
        with pytest.raises(ConfigError) as info:
            load_config("configs/cpu-example.yaml", overrides=[override])
        assert f"{path}: got" in str(info.value)
