"""Scalar hyperparameters are data: configs that differ only in a value lower the train step to
the same program, structural fields change it, and the values match the step with the same
numbers baked in as constants."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.config.pd import (
    MLPCI,
    ChunkwiseSubsetRecon,
    DecompositionTarget,
    Faithfulness,
    FaithfulnessWarmup,
    FrequencyPenalty,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    PersistentPGDRecon,
    PGDOptimizer,
    PGDRecon,
    StochasticRecon,
)
from pd_train.models import llama
from pd_train.optim import lr_schedule, schedule_hyperparams, scheduled_lr
from pd_train.train import Trainer, step_key

from ._tiny import FAST, TINY

B, T = 4, 8


def _pd(**overrides: Any) -> PDConfig:
    config: dict[str, Any] = dict(
        steps=20,
        batch_size=B,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*.mlp.*", C=4),),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=(
            Faithfulness(coeff=10.0),
            ImportanceMinimality(
                coeff=1e-3,
                pnorm_start=2.0,
                pnorm_end=1.0,
                anneal_end_frac=0.5,
                eps=1e-6,
                frequency=FrequencyPenalty(coeff=1e-5),
            ),
            StochasticRecon(coeff=1.0),
            PGDRecon(coeff=0.5, n_steps=1, step_size=0.1),
            PersistentPGDRecon(
                coeff=0.5,
                n_warmup_steps=1,
                optimizer=PGDOptimizer(lr=0.01, warmup_frac=0.1, final_val_frac=0.5),
            ),
        ),
        components=OptimizerConfig(lr=3e-3, warmup_steps=2, final_val_frac=0.1, clip=1.0),
        ci_fn=OptimizerConfig(lr=3e-3, warmup_steps=2, weight_decay=0.01),
    )
    config.update(overrides)
    return PDConfig(**config)


def _term(pd: PDConfig, i: int, **changes: Any) -> PDConfig:
    terms = list(pd.loss_metrics)
    terms[i] = attrs.evolve(terms[i], **changes)
    return attrs.evolve(pd, loss_metrics=tuple(terms))


def _text(pd: PDConfig) -> str:
    trainer = Trainer(TINY, pd, compiler_options=FAST, seq_len=T)
    return str(trainer.lower_step(batch_size=B, seq_len=T, target_dtype=jnp.float32).as_text())


@functools.cache
def _base_text() -> str:
    return _text(_pd())


VALUE_CHANGES = {
    "pd.steps": lambda pd: attrs.evolve(pd, steps=600),
    "pd.components.lr, warmup, final_val_frac, clip": lambda pd: attrs.evolve(
        pd,
        components=attrs.evolve(
            pd.components, lr=4e-3, warmup_steps=5, final_val_frac=0.3, clip=2.0
        ),
    ),
    "pd.ci_fn.b1, b2, eps, weight_decay, decay_steps": lambda pd: attrs.evolve(
        pd,
        ci_fn=attrs.evolve(pd.ci_fn, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1, decay_steps=7),
    ),
    "pd.l0_threshold": lambda pd: attrs.evolve(pd, l0_threshold=0.1),
    "pd.loss_metrics[0].coeff": lambda pd: _term(pd, 0, coeff=1e3),
    "pd.loss_metrics[1] coeff, p, anneal window, eps, frequency": lambda pd: _term(
        pd,
        1,
        coeff=3e-4,
        pnorm_start=1.5,
        pnorm_end=0.4,
        anneal_start_frac=0.1,
        anneal_end_frac=0.9,
        eps=1e-5,
        frequency=FrequencyPenalty(coeff=3e-5, reference_token_count=1000),
    ),
    "pd.loss_metrics[1] coefficient schedule": lambda pd: _term(
        pd,
        1,
        coeff_warmup_frac=0.1,
        coeff_peak_multiplier=4.0,
        coeff_anneal_start_frac=0.3,
        coeff_anneal_end_frac=0.6,
    ),
    "pd.loss_metrics[3].step_size": lambda pd: _term(pd, 3, step_size=0.3),
    "pd.loss_metrics[4] coeff, optimizer lr, warmup, final, betas, eps": lambda pd: _term(
        pd,
        4,
        coeff=2.0,
        optimizer=PGDOptimizer(
            lr=0.05, warmup_frac=0.0, final_val_frac=1.0, b1=0.5, b2=0.9, eps=1e-6
        ),
    ),
}


@pytest.mark.parametrize("name", list(VALUE_CHANGES))
def test_a_value_change_lowers_to_the_same_program(name: str) -> None:
    assert _text(VALUE_CHANGES[name](_pd())) == _base_text()


STRUCTURAL_CHANGES = {
    "C": lambda pd: attrs.evolve(
        pd, decomposition_targets=(DecompositionTarget(module_pattern="layers.*.mlp.*", C=5),)
    ),
    "frequency null (the term is left out)": lambda pd: _term(pd, 1, frequency=None),
    "pgd n_steps": lambda pd: _term(pd, 3, n_steps=2),
    "stochastic n_samples": lambda pd: _term(pd, 2, n_samples=2),
}


@pytest.mark.parametrize("name", list(STRUCTURAL_CHANGES))
def test_a_structural_change_changes_the_program(name: str) -> None:
    assert _text(STRUCTURAL_CHANGES[name](_pd())) != _base_text()


def test_subset_chunking_is_structural() -> None:
    pd = _pd(
        loss_metrics=(Faithfulness(coeff=1.0), ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=2))
    )
    other = _term(pd, 1, sites_per_chunk=3)
    assert _text(pd) != _text(other)


def test_schedule_from_data_is_the_formula() -> None:
    """The lr schedule fed as data matches the cosine-with-warmup formula written out here."""
    config = OptimizerConfig(lr=2e-3, warmup_steps=3, final_val_frac=0.2)
    hp = {k: jnp.float32(v) for k, v in schedule_hyperparams(config, 13).items()}
    for step in range(13):
        if step < 3:
            want = 2e-3 * (step + 1) / 3
        else:
            s = (step - 3) / (10 - 1)
            want = 2e-3 * (0.2 + 0.8 * 0.5 * (1 + np.cos(np.pi * min(s, 1.0))))
        got = float(jax.jit(scheduled_lr)(hp, step))
        np.testing.assert_allclose(got, want, rtol=2e-6)
        np.testing.assert_allclose(got, float(lr_schedule(config, 13)(step)), rtol=2e-7)


def test_values_as_data_match_values_as_constants() -> None:
    """Three steps with the hyperparameters as the jit's argument against the same steps with
    them baked in as constants (``Trainer.step(..., hp=None)``): equal to float rounding
    (metrics rtol 1e-5; state rtol 1e-5, atol 1e-6). They differ at all because optax computes
    1 − b1 in f32 from an f32 b1, where a Python b1 gave it in double precision."""
    pd = _pd()
    trainer = Trainer(TINY, pd, compiler_options=FAST, seq_len=T)
    target = llama.init_params(TINY, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    const_step = jax.jit(lambda s, t, x, k: trainer.step(s, t, x, k))
    a = trainer.init_state(key=jax.random.key(1))
    b = trainer.init_state(key=jax.random.key(1))
    for i in range(3):
        tokens = jnp.asarray(rng.integers(0, TINY.vocab_size, (B, T)), jnp.int32)
        key = step_key(jax.random.key(2), i)
        a, ma = trainer.train_step(a, target, tokens, key)
        b, mb = const_step(b, target, tokens, key)
        ha, hb = trainer.metrics_to_host(ma), trainer.metrics_to_host(mb)
        assert ha.keys() == hb.keys()
        for name in ha:
            np.testing.assert_allclose(ha[name], hb[name], rtol=1e-5, atol=1e-12, err_msg=name)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        # Absolute 1e-6: the persistent sources (in [0, 1]) move by Adam's normalized m/sqrt(v),
        # which turns a rounding difference of a tiny gradient into one of ~1e-7 in a source.
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_the_warmup_lr_is_data_and_is_used() -> None:
    trainers = [
        Trainer(TINY, _pd(faithfulness_warmup=FaithfulnessWarmup(steps=2, lr=lr)), seq_len=T)
        for lr in (1e-2, 3e-3)
    ]
    texts = [str(t.lower_warmup(jnp.float32).as_text()) for t in trainers]
    assert texts[0] == texts[1]
    target = llama.init_params(TINY, key=jax.random.key(0))
    losses = []
    for t in trainers:
        state = t.init_state(key=jax.random.key(1))
        _, values = t.faithfulness_warmup(state, target)
        losses.append(values)
    assert losses[0][0] == losses[1][0]  # the same start
    assert losses[0][1] < losses[1][1] < losses[1][0]  # the larger lr moved further


def _eval_text(pd: PDConfig) -> str:
    from pd_train.evaluate import lower_eval

    trainer = Trainer(TINY, pd, compiler_options=FAST, seq_len=T)
    return str(lower_eval(trainer, batch_size=B, seq_len=T, target_dtype=jnp.float32).as_text())


def test_the_eval_takes_its_threshold_and_pgd_step_size_as_data() -> None:
    """issue 27 item 1 for the eval programs: pd.l0_threshold and pd.eval_pgd.step_size change
    no eval program text; the eval's fresh-PGD n_steps does."""
    from pd_train.config.pd import PGDEval

    base = _pd(eval_pgd=PGDEval(n_steps=2, step_size=0.1))
    text = _eval_text(base)
    assert _eval_text(attrs.evolve(base, l0_threshold=0.2)) == text
    assert _eval_text(attrs.evolve(base, eval_pgd=PGDEval(n_steps=2, step_size=0.3))) == text
    assert _eval_text(attrs.evolve(base, eval_pgd=PGDEval(n_steps=3, step_size=0.1))) != text


def test_the_eval_uses_the_threshold_it_is_given() -> None:
    """The threshold passed as data is the one the eval's L0 counts with: the L0 of a CI at
    thresholds 0 and 1 (no CI exceeds 1) is > 0 and exactly 0."""
    from pd_train.evaluate import eval_hyperparam_arrays, eval_jit

    trainer = Trainer(TINY, _pd(), compiler_options=FAST, seq_len=T)
    target = llama.init_params(TINY, key=jax.random.key(0))
    state = trainer.init_state(key=jax.random.key(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 32, (B, T)), jnp.int32)
    run = eval_jit(trainer)
    hp = eval_hyperparam_arrays(trainer)
    l0 = {}
    for threshold in (0.0, 1.0):
        hp = {**hp, "l0_threshold": jnp.asarray(threshold, jnp.float32)}
        out = run(state.params, target, tokens, jax.random.key(2), state.adversary or None, hp)
        l0[threshold] = sum(float(np.sum(v)) for v in out["l0"].values())
    assert l0[0.0] > 0 and l0[1.0] == 0.0


def test_the_step_weighs_importance_by_its_scheduled_coefficient() -> None:
    """At step 2 of 20 with a warmup to peak 4 over the first 20 % (multiplier 4·2/4 = 2) the
    step reports ``coeff_multiplier`` 2 and its total exceeds the unscheduled step's by
    (2 − 1)·coeff·``loss/importance_minimality``, the term's value (reported unscaled, the same
    in both)."""
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (B, T)), jnp.int32)
    target = llama.init_params(TINY, key=jax.random.key(0))
    out = []
    for pd in (_pd(), _term(_pd(), 1, coeff_warmup_frac=0.2, coeff_peak_multiplier=4.0)):
        trainer = Trainer(TINY, pd, compiler_options=FAST, seq_len=T)
        state = trainer.init_state(key=jax.random.key(1))
        state = dataclasses.replace(state, step=jnp.asarray(2, state.step.dtype))
        _, metrics = trainer.train_step(state, target, tokens, step_key(jax.random.key(2), 2))
        out.append(trainer.metrics_to_host(metrics))
    plain, scheduled = out
    assert plain["coeff_multiplier"] == 1.0 and scheduled["coeff_multiplier"] == 2.0
    imp = plain["loss/importance_minimality"]
    assert imp > 0 and scheduled["loss/importance_minimality"] == imp
    np.testing.assert_allclose(
        scheduled["loss/total"] - plain["loss/total"], 1e-3 * imp, rtol=1e-3, atol=0
    )
