"""Smooth-L0 importance minimality (Geman–McClure with its gamma schedule) and the debiased
frequency EMA (param-decomp SPEC S8', S8'', S9): values written out from the formulas; the EMA
lives in the train state, is checkpointed, and a resume with it is bit-exact."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.config.pd import (
    MLPCI,
    DecompositionTarget,
    Faithfulness,
    OptimizerConfig,
    PDConfig,
    StochasticRecon,
)
from pd_train.losses import TermInputs
from pd_train.losses.smooth_l0 import (
    SmoothL0ImportanceMinimality,
    SmoothL0ImportanceMinimalityTerm,
    ema_frequency_penalty,
    gamma_at,
    smooth_l0_frequencies,
)
from pd_train.train import Trainer

from ._cli import _cli, _finish, tiny_config, train_losses, write_config
from ._pgd import FAST, TINY, _target

TERM = SmoothL0ImportanceMinimalityTerm()
# ci_upper [n_k=1, B=1, T=2, C=2]: position 0 (0.5, 0), position 1 (1, 2).
CI = jnp.array([[[[0.5, 0.0], [1.0, 2.0]]]], jnp.float32)


def _pd_config(term: SmoothL0ImportanceMinimality, steps: int = 11) -> PDConfig:
    return PDConfig(
        steps=steps,
        batch_size=4,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=4),),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=(Faithfulness(coeff=1.0), term, StochasticRecon(coeff=1.0)),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
    )


def _inputs(ci: jax.Array, step: int) -> TermInputs:
    return TermInputs(
        spec=None,  # type: ignore[arg-type]
        target=None,
        tokens=jnp.zeros((1, 2), jnp.int32),
        params={},
        components={},
        step=jnp.int32(step),
        ci_upper={"down_proj": ci},
    )


def _hp(config: SmoothL0ImportanceMinimality, steps: int = 11) -> dict:
    return jax.tree.map(jnp.float32, TERM.hyperparams(config, _pd_config(config, steps)))


def test_frequencies_are_the_geman_mcclure_means_written_out() -> None:
    # gamma 1: psi = ci² / (ci² + 1) = 0.2, 0 | 0.5, 0.8 -> f = (0.35, 0.4).
    f = smooth_l0_frequencies({"down_proj": CI}, 1.0)["down_proj"]
    np.testing.assert_allclose(np.asarray(f), [[0.35, 0.4]], rtol=1e-6)
    # gamma 0.5: psi = 0.25/0.5, 0 | 1/1.25, 4/4.25 -> f = (0.65, 0.470588...).
    f = smooth_l0_frequencies({"down_proj": CI}, 0.5)["down_proj"]
    np.testing.assert_allclose(np.asarray(f), [[(0.5 + 0.8) / 2, (4 / 4.25) / 2]], rtol=1e-6)


def test_term_value_is_activity_plus_weighted_frequency() -> None:
    config = SmoothL0ImportanceMinimality(
        coeff=2.0, gamma_start=1.0, gamma_end=1.0, frequency_coeff=0.5, reference_token_count=10
    )
    value, extras = TERM.value(
        config, _inputs(CI, 0), plan=None, hp=_hp(config), key=jax.random.key(0)
    )
    activity = 0.35 + 0.4
    freq = 0.35 * math.log2(1 + 10 * 0.35) + 0.4 * math.log2(1 + 10 * 0.4)
    assert float(extras["smooth_l0/activity"]) == pytest.approx(activity, rel=1e-6)
    assert float(extras["smooth_l0/frequency"]) == pytest.approx(freq, rel=1e-6)
    # The step adds coeff · value = 2 · activity + 0.5 · freq.
    assert 2.0 * float(value) == pytest.approx(2.0 * activity + 0.5 * freq, rel=1e-6)
    without = SmoothL0ImportanceMinimality(coeff=2.0, gamma_start=1.0, gamma_end=1.0)
    value, extras = TERM.value(
        without, _inputs(CI, 0), plan=None, hp=_hp(without), key=jax.random.key(0)
    )
    assert float(value) == pytest.approx(activity, rel=1e-6)
    assert "smooth_l0/frequency" not in extras


def test_gamma_goes_linearly_to_its_end_at_the_last_step() -> None:
    config = SmoothL0ImportanceMinimality(coeff=1.0, gamma_start=1.0, gamma_end=0.01)
    hp = _hp(config, steps=11)  # the last step is 10
    got = [float(gamma_at(hp, s)) for s in (0, 5, 10, 12)]
    np.testing.assert_allclose(got, [1.0, 0.505, 0.01, 0.01], rtol=1e-6)
    windowed = SmoothL0ImportanceMinimality(
        coeff=1.0, gamma_start=0.8, gamma_end=0.2, anneal_start_frac=0.2, anneal_end_frac=0.6
    )
    hp = _hp(windowed, steps=11)  # window steps 2..6
    got = [float(gamma_at(hp, s)) for s in (0, 2, 4, 6, 9)]
    np.testing.assert_allclose(got, [0.8, 0.8, 0.5, 0.2, 0.2], rtol=1e-6)


def test_the_coefficient_schedule_is_the_same_as_importance_minimality_s() -> None:
    """param-decomp gives both penalties the same schedule: over 20 steps, warmup to 0.5 over
    the first 10 % (steps 0-1), then 0.5 until 50 %, back to 1 by 100 %."""
    config = SmoothL0ImportanceMinimality(
        coeff=1.0,
        coeff_warmup_frac=0.1,
        coeff_peak_multiplier=0.5,
        coeff_anneal_start_frac=0.5,
        coeff_anneal_end_frac=1.0,
    )
    hp = _hp(config, steps=20)
    got = [float(TERM.coeff_multiplier(config, hp, jnp.asarray(s))) for s in (0, 1, 2, 10, 15)]
    np.testing.assert_allclose(got, [0.0, 0.25, 0.5, 0.5, 0.75], rtol=1e-6)


def test_ema_is_debiased_and_keeps_the_batch_gradient_scale() -> None:
    a = 10.0

    def phi(f: float) -> float:
        return f * math.log2(1 + a * f)

    def dphi(f: float) -> float:
        return math.log2(1 + a * f) + a * f / ((1 + a * f) * math.log(2))

    # Half-life 1 step: decay 0.5. Step 0: ema 0 -> 0.5·0.35 = 0.175, debiased 0.175/0.5 = f.
    f0 = jnp.array([[0.35]], jnp.float32)
    value, ema = ema_frequency_penalty(
        f0, jnp.zeros_like(f0), step=jnp.int32(0), halflife=1.0, reference_token_count=a
    )
    assert float(ema[0, 0]) == pytest.approx(0.175, rel=1e-6)
    assert float(value) == pytest.approx(phi(0.35), rel=1e-6)
    # Step 1 with f = 0.1: ema 0.5·0.175 + 0.5·0.1 = 0.1375, debiased 0.1375 / 0.75.
    f_hat = 0.1375 / 0.75

    def penalty(f: jax.Array) -> jax.Array:
        out, _ = ema_frequency_penalty(
            f, ema, step=jnp.int32(1), halflife=1.0, reference_token_count=a
        )
        return out

    f1 = jnp.array([[0.1]], jnp.float32)
    assert float(penalty(f1)) == pytest.approx(phi(f_hat), rel=1e-6)
    # The gradient is Φ'(f̂) at full scale (not shrunk by 1 − decay).
    assert float(jax.grad(penalty)(f1)[0, 0]) == pytest.approx(dphi(f_hat), rel=1e-6)
    # Half-life 2: decay 2^-0.5; step 0 is still debiased to f exactly.
    value, ema2 = ema_frequency_penalty(
        f0, jnp.zeros_like(f0), step=jnp.int32(0), halflife=2.0, reference_token_count=a
    )
    assert float(ema2[0, 0]) == pytest.approx((1 - 2**-0.5) * 0.35, rel=1e-6)
    assert float(value) == pytest.approx(phi(0.35), rel=1e-5)


def test_trainer_keeps_the_ema_in_the_train_state() -> None:
    config = SmoothL0ImportanceMinimality(
        coeff=1e-2, frequency_coeff=1e-3, reference_token_count=64, ema_halflife_steps=3.0
    )
    trainer = Trainer(TINY, _pd_config(config), compiler_options=FAST, seq_len=8)
    state = trainer.init_state(key=jax.random.key(0))
    ema = state.term_state["1"]["down_proj"]
    assert ema.shape == (2, 4) and ema.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(ema), 0.0)
    assert jax.tree.structure(trainer.abstract_state()) == jax.tree.structure(state)
    tokens = jax.random.randint(jax.random.key(1), (4, 8), 0, TINY.vocab_size)
    new, metrics = trainer.train_step(state, _target(), tokens, jax.random.key(3))
    ema1 = np.asarray(new.term_state["1"]["down_proj"])
    assert np.all(ema1 > 0)
    # At step 0 the debiased EMA is the batch's f: the frequency part equals Φ(f).
    assert float(metrics["smooth_l0/frequency"]) > 0
    decay = 2 ** (-1 / 3)
    f = ema1 / (1 - decay)
    want = float(np.sum(f * np.log2(1 + 64 * f)))
    assert float(metrics["smooth_l0/frequency"]) == pytest.approx(want, rel=1e-5)


BAD = [
    ({"coeff": 0.0}, "pd.loss_metrics[1].coeff: got 0.0; must be > 0"),
    ({"gamma_start": 0.0}, "pd.loss_metrics[1].gamma_start: got 0.0; must be > 0"),
    ({"gamma_end": -1.0}, "pd.loss_metrics[1].gamma_end: got -1.0; must be > 0"),
    ({"anneal_start_frac": 1.5}, "pd.loss_metrics[1].anneal_start_frac: got 1.5; must be in"),
    ({"anneal_end_frac": -0.1}, "pd.loss_metrics[1].anneal_end_frac: got -0.1; must be in"),
    (
        {"anneal_start_frac": 0.5, "anneal_end_frac": 0.2},
        "pd.loss_metrics[1].anneal_end_frac: got 0.2, below anneal_start_frac 0.5",
    ),
    ({"frequency_coeff": -1.0}, "pd.loss_metrics[1].frequency_coeff: got -1.0; must be >= 0"),
    ({"reference_token_count": 0}, "pd.loss_metrics[1].reference_token_count: got 0; must be > 0"),
    (
        {"ema_halflife_steps": 0.0, "frequency_coeff": 1.0},
        "pd.loss_metrics[1].ema_halflife_steps: got 0.0; must be > 0",
    ),
    (
        {"ema_halflife_steps": 10.0},
        "pd.loss_metrics[1].ema_halflife_steps: got 10.0 with frequency_coeff 0",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_smooth_l0_fields_are_refused_by_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, message: str
) -> None:
    from pd_train.cli import main

    config = tiny_config(tmp_path, tmp_path / "cache")
    term = {"type": "smooth_l0_importance_minimality", "coeff": 1e-3, **change}
    config["pd"]["loss_metrics"][1] = term
    assert main(["run", str(write_config(tmp_path, config, "bad.yaml"))]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_run_with_the_ema_resumes_bit_exactly(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, tmp_path / "cache")
    config["pd"]["loss_metrics"][1] = {
        "type": "smooth_l0_importance_minimality",
        "coeff": 1e-3,
        "frequency_coeff": 1e-3,
        "reference_token_count": 128,
        "ema_halflife_steps": 2.0,
    }
    path = write_config(tmp_path, config)
    full, part = tmp_path / "full", tmp_path / "part"
    _finish(_cli("run", str(path), "--run-dir", str(full)))
    _finish(_cli("run", str(path), "--run-dir", str(part), "--max-steps", "4"))
    _finish(_cli("run", "--resume", str(part)))
    want = train_losses(full)
    assert sorted(want) == list(range(8))
    assert train_losses(part) == want
