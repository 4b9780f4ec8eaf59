"""pd's executable-cache key holds a config's structural fields only, and that is safe.

For each value field of :data:`pd_train.config.hyperparameters.FIELDS`, two tiny configs that differ in
it alone lower the programs it reaches (the train step, the eval, the faithfulness warm-up) to
the same text (so the same persistent-cache key: JAX hashes the module without its debug
info, the compile options and the backend, all equal here) and get the same executable-cache
key (:func:`pd_train.run.trainer_program_key`); a handful of structural fields change both.
And a train step compiled under config A, loaded under a config B that differs in values
(lr, coefficients, steps), computes B's losses, not A's.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.config import hyperparameters
from pd_train.config.io import parse_path, structure, unstructure
from pd_train.config.pd import (
    MLPCI,
    ChunkwiseSubsetRecon,
    CIMaskedRecon,
    DecompositionTarget,
    Faithfulness,
    FaithfulnessWarmup,
    FrequencyPenalty,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    PersistentPGDRecon,
    PGDEval,
    PGDOptimizer,
    PGDRecon,
    RuntimeConfig,
    SmoothL0ImportanceMinimality,
    StaticProbabilitySubsetRecon,
    StochasticHiddenActsRecon,
    StochasticRecon,
    SubsetRecon,
    UnmaskedRecon,
)
from pd_train.evaluate import lower_eval
from pd_train.run import trainer_program_key
from pd_train.train import Trainer, step_key

from ._tiny import FAST, TINY

B, T = 4, 8

#: A coefficient schedule whose every halved value is still a valid one.
_SCHEDULE = dict(
    coeff_warmup_frac=0.1,
    coeff_peak_multiplier=2.0,
    coeff_anneal_start_frac=0.4,
    coeff_anneal_end_frac=0.8,
)

#: One instance of every loss term, each value on the side of its switch that is a value
#: (smooth-L0's frequency weight non-zero, its EMA on; importance minimality's frequency on).
TERMS: dict[str, Any] = {
    "faithfulness": Faithfulness(coeff=1.0),
    "importance_minimality": ImportanceMinimality(
        coeff=1e-3,
        pnorm_start=2.0,
        pnorm_end=1.0,
        anneal_start_frac=0.1,
        anneal_end_frac=0.5,
        eps=1e-6,
        frequency=FrequencyPenalty(coeff=1e-5, reference_token_count=1000),
        **_SCHEDULE,
    ),
    "smooth_l0_importance_minimality": SmoothL0ImportanceMinimality(
        coeff=1e-3,
        gamma_start=1.0,
        gamma_end=0.1,
        anneal_start_frac=0.1,
        anneal_end_frac=0.5,
        frequency_coeff=1e-5,
        reference_token_count=1000,
        ema_halflife_steps=10,
        **_SCHEDULE,
    ),
    "stochastic_recon": StochasticRecon(coeff=1.0),
    "chunkwise_subset_recon": ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=1),
    "subset_recon": SubsetRecon(coeff=1.0),
    "pgd_recon": PGDRecon(coeff=1.0, n_steps=1, step_size=0.1),
    "persistent_pgd_recon": PersistentPGDRecon(
        coeff=1.0,
        n_warmup_steps=1,
        optimizer=PGDOptimizer(lr=0.01, warmup_frac=0.1, final_val_frac=0.5),
    ),
    "static_probability_subset_recon": StaticProbabilitySubsetRecon(coeff=1.0, p=0.5),
    "ci_masked_recon": CIMaskedRecon(coeff=1.0),
    "unmasked_recon": UnmaskedRecon(coeff=1.0),
    "stochastic_hidden_acts_recon": StochasticHiddenActsRecon(coeff=1.0),
}


def _pd(*terms: Any, **overrides: Any) -> PDConfig:
    """The tiny base: one MLP site per layer (C 4), every optional value set (clips, decay
    steps, the rounding threshold, the eval's fresh PGD, a warm-up), so that a change of one
    stays on its side of any structural switch."""
    config: dict[str, Any] = dict(
        steps=20,
        batch_size=B,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=4),),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=terms or (Faithfulness(coeff=1.0), StochasticRecon(coeff=1.0)),
        components=OptimizerConfig(
            lr=3e-3, warmup_steps=2, final_val_frac=0.1, weight_decay=0.01, clip=1.0
        ),
        ci_fn=OptimizerConfig(lr=3e-3, warmup_steps=2, final_val_frac=0.1, clip=0.5),
        faithfulness_warmup=FaithfulnessWarmup(steps=2, lr=1e-2, weight_decay=0.1),
        l0_threshold=0.1,
        rounding_threshold=0.3,
        eval_pgd=PGDEval(n_steps=1, step_size=0.1),
    )
    config.update(overrides)
    return PDConfig(**config)


def _term_of(field: str) -> str | None:
    """The loss term type a schema path belongs to (``pd.loss_metrics[type=X]...``), or None."""
    prefix = "pd.loss_metrics[type="
    return field[len(prefix) :].split("]", 1)[0] if field.startswith(prefix) else None


def _base(field: str) -> PDConfig:
    """The base config holding ``field``: its term beside faithfulness, or the general one."""
    term = _term_of(field)
    if term is None:
        return _pd()
    if term == "faithfulness":
        return _pd(TERMS["faithfulness"])
    return _pd(TERMS["faithfulness"], TERMS[term])


#: Values the generic perturbation (x 0.5, 0 -> 0.25, an int + 1) cannot derive: a field that
#: is null in the base (null versus a number is no switch for these).
EXCEPTIONS: dict[str, Any] = {
    "pd.components.decay_steps": 15,
    "pd.ci_fn.decay_steps": 15,
}


def _perturbed(value: Any, field: str) -> Any:
    if field in EXCEPTIONS:
        return EXCEPTIONS[field]
    if isinstance(value, bool) or value is None:
        msg = f"{field}: no generic perturbation of {value!r}; add it to EXCEPTIONS"
        raise AssertionError(msg)
    if isinstance(value, int):
        return value + 1
    return value * 0.5 if value != 0 else 0.25


def _changed(pd: PDConfig, field: str) -> PDConfig:
    """``pd`` with the value of the (schema) ``field`` perturbed, validated as a config."""
    raw = {"pd": unstructure(pd)}
    paths = [
        p
        for p in hyperparameters.config_leaves(raw)
        if hyperparameters.schema_path(p, raw) == field
    ]
    assert len(paths) == 1, (field, paths)
    *parents, last = parse_path(paths[0])
    node: Any = raw
    for part in parents:
        node = node[part]
    new = _perturbed(node[last], field)
    assert new != node[last]
    node[last] = new
    return structure(raw["pd"], PDConfig)


def _trainer(pd: PDConfig, runtime: RuntimeConfig | None = None) -> Trainer:
    return Trainer(TINY, pd, runtime, compiler_options=FAST, seq_len=T)


def _programs(field: str) -> tuple[str, ...]:
    """The programs ``field`` reaches (the ones lowered for it)."""
    if field.startswith("pd.faithfulness_warmup."):
        return ("warmup",)
    if field.startswith("pd.eval_pgd.") or field == "pd.rounding_threshold":
        return ("eval",)
    if field == "pd.l0_threshold":
        return ("train_step", "eval")
    return ("train_step",)


def _digest(trainer: Trainer, program: str) -> str:
    """sha256 of ``program``'s lowered text (no compile)."""
    if program == "train_step":
        lowered = trainer.lower_step(batch_size=B, seq_len=T, target_dtype=jnp.float32)
    elif program == "eval":
        lowered = lower_eval(trainer, batch_size=B, seq_len=T, target_dtype=jnp.float32)
    else:  # the warm-up's step and its optimizer's init
        components = trainer.abstract_params()["components"]
        init = trainer._warmup_init.lower(components).as_text()
        return _sha(str(trainer.lower_warmup(jnp.float32).as_text()) + str(init))
    return _sha(str(lowered.as_text()))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@functools.cache
def _base_digests(pd: PDConfig, programs: tuple[str, ...]) -> dict[str, str]:
    """The lowered baseline, shared by every field of one base."""
    trainer = _trainer(pd)
    return {p: _digest(trainer, p) for p in programs}


def _key(trainer: Trainer, program: str = "train_step") -> str:
    return trainer_program_key(program, trainer, jnp.float32, "source")


#: The value fields of the run config that no trainer program sees: ``seed`` makes the run key,
#: an argument of the init programs and (folded per step) of the step.
OUTSIDE_THE_TRAINER = ("seed",)
VALUE_FIELDS = [f for f in hyperparameters.value_fields() if f not in OUTSIDE_THE_TRAINER]


@pytest.mark.parametrize("field", VALUE_FIELDS)
def test_a_value_change_keeps_every_cache_key(field: str) -> None:
    pd = _base(field)
    other = _changed(pd, field)
    assert other != pd
    programs = _programs(field)
    base, changed = _trainer(pd), _trainer(other)
    assert {p: _key(changed, p) for p in programs} == {p: _key(base, p) for p in programs}
    here = {p: _digest(changed, p) for p in programs}
    assert here == _base_digests(pd, programs), f"{field} changes {programs}' program text"


def test_the_seed_enters_the_init_programs_as_an_argument() -> None:
    """The run key (from ``seed``) is an argument of every init program: two keys lower each to
    the same text, and the states differ."""
    texts: dict[int, dict[str, str]] = {}
    states = {}
    for seed in (0, 7):
        trainer = _trainer(_pd())
        seen: dict[str, str] = {}

        def programs(name: str, jit: Any, args: Any, kwargs: Any, seen: Any = seen) -> Any:
            seen[name] = str(jit.lower(*args, **kwargs).as_text())
            return jit

        trainer.programs = programs
        states[seed] = trainer.init_state(key=jax.random.key(seed))
        texts[seed] = seen
    assert texts[0] and texts[0] == texts[7]
    a, b = (jax.tree.leaves(states[s].params) for s in (0, 7))
    assert any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True))


STRUCTURAL_CHANGES: dict[str, Any] = {
    "pd.batch_size": lambda pd: attrs.evolve(pd, batch_size=2 * B),
    "pd.decomposition_targets[*].C": lambda pd: attrs.evolve(
        pd,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=5),),
    ),
    "pd.ci[type=mlp].hidden_dims": lambda pd: attrs.evolve(pd, ci=MLPCI(hidden_dims=(5,))),
    "pd.ci[type=mlp].batch_block": lambda pd: attrs.evolve(
        pd, ci=attrs.evolve(pd.ci, batch_block=2)
    ),
    "pd.recon.random_draws": lambda pd: attrs.evolve(
        pd, recon=attrs.evolve(pd.recon, random_draws="blocked")
    ),
    "pd.loss_metrics[type=stochastic_recon].n_samples": lambda pd: attrs.evolve(
        pd, loss_metrics=(pd.loss_metrics[0], StochasticRecon(coeff=1.0, n_samples=2))
    ),
    "pd.components.clip is null": lambda pd: attrs.evolve(
        pd, components=attrs.evolve(pd.components, clip=None)
    ),
    "pd.loss_metrics[type=importance_minimality].frequency": lambda pd: attrs.evolve(
        pd, loss_metrics=(*pd.loss_metrics, attrs.evolve(TERMS["importance_minimality"]))
    ),
}


@pytest.mark.parametrize("field", list(STRUCTURAL_CHANGES))
def test_a_structural_change_changes_the_keys(field: str) -> None:
    pd = _pd()
    other = STRUCTURAL_CHANGES[field](pd)
    trainer = _trainer(other)
    assert _key(trainer) != _key(_trainer(pd))
    if field == "pd.batch_size":  # lower_step takes the batch size apart from the config
        return
    assert _digest(trainer, "train_step") != _base_digests(pd, ("train_step",))["train_step"]


def test_frequency_on_or_off_is_structural_its_values_are_not() -> None:
    with_frequency = _pd(TERMS["faithfulness"], TERMS["importance_minimality"])
    term = attrs.evolve(TERMS["importance_minimality"], frequency=None)
    without = _pd(TERMS["faithfulness"], term)
    assert _key(_trainer(with_frequency)) != _key(_trainer(without))


def test_runtime_structure_is_in_the_key_the_cache_s_own_settings_are_not(tmp_path: Path) -> None:
    from pd_train.config.pd import CompileCacheConfig

    pd = _pd()
    key = _key(_trainer(pd, RuntimeConfig()))
    elsewhere = RuntimeConfig(compile_cache=CompileCacheConfig(dir=str(tmp_path)))
    assert _key(_trainer(pd, elsewhere)) == key
    assert _key(_trainer(pd, RuntimeConfig(compute_dtype="bfloat16"))) != key


# ---------------------------------------------------------------------------------------------
# Safety: a program compiled under A, loaded under B, computes B's numbers


def _ab_configs() -> tuple[PDConfig, PDConfig]:
    terms = (
        Faithfulness(coeff=10.0),
        ImportanceMinimality(coeff=1e-3, pnorm_start=2.0, pnorm_end=1.0, eps=1e-6),
        StochasticRecon(coeff=1.0),
    )
    a = _pd(*terms, eval_pgd=None, faithfulness_warmup=FaithfulnessWarmup())
    b_terms = (terms[0], attrs.evolve(terms[1], coeff=0.1), attrs.evolve(terms[2], coeff=2.0))
    b = attrs.evolve(
        a,
        steps=40,
        loss_metrics=b_terms,
        components=attrs.evolve(a.components, lr=1e-2, warmup_steps=4),
    )
    return a, b


def test_a_step_compiled_under_one_value_runs_another_s(tmp_path: Path) -> None:
    """Config B differs from A in the components' lr and warm-up, two coefficients and the
    step count. Their step has one executable-cache key; A's launch compiles and stores it, B's
    loads it (no trace, no compile) and gets B's numbers: loss/total = Σ B's coeff·term (written
    out here), B's scheduled lr, and after two steps the same metrics and state as B's own jit
    (bit for bit: one program text, compiled twice), not A's."""
    from jax._src import compilation_cache

    from pd_probe import Recorder
    from pd_train.run import StepProgram

    from ._tiny import _target

    config_a, config_b = _ab_configs()
    trainer_a, trainer_b = _trainer(config_a), _trainer(config_b)
    assert _key(trainer_a) == _key(trainer_b)
    target = jax.tree.map(lambda x: x.astype(jnp.float32), _target())
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (B, T)), jnp.int32)

    def two_steps(trainer: Trainer, step: Any) -> tuple[list[dict[str, float]], list[Any]]:
        state = trainer.init_state(key=jax.random.key(1))
        out = []
        for i in range(2):
            state, metrics = step(state, target, tokens, step_key(jax.random.key(2), i))
            out.append(trainer.metrics_to_host(metrics))
        return out, jax.tree.leaves(state)

    def launch(trainer: Trainer) -> tuple[str, Any]:
        program = StepProgram(
            trainer, target_dtype=jnp.float32, recorder=recorder, cache_dir=tmp_path
        )
        program.start()
        program._thread.join()
        return program.outcome, program

    # JAX's persistent cache off: A's program must be compiled here to be stored.
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        with Recorder(tmp_path / "compile.json") as recorder:
            outcome_a, program_a = launch(trainer_a)
            assert outcome_a == "miss"
            metrics_a, _ = two_steps(trainer_a, program_a)
            outcome_b, program_b = launch(trainer_b)
            assert outcome_b == "hit"
            metrics_b, state_b = two_steps(trainer_b, program_b)
        fresh_b, fresh_state_b = two_steps(trainer_b, trainer_b.train_step)
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()

    first = metrics_b[0]
    coeffs = {"faithfulness": 10.0, "importance_minimality": 0.1, "stochastic_recon": 2.0}
    total = sum(c * first[f"loss/{name}"] for name, c in coeffs.items())
    np.testing.assert_allclose(first["loss/total"], total, rtol=1e-6)
    np.testing.assert_allclose(first["lr/components"], 1e-2 * 1 / 4, rtol=1e-6)
    assert metrics_b == fresh_b
    for x, y in zip(state_b, fresh_state_b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # A's numbers are another run's: its coefficients and lr.
    np.testing.assert_allclose(metrics_a[0]["lr/components"], 3e-3 / 2, rtol=1e-6)
    assert metrics_a[0]["loss/total"] != pytest.approx(first["loss/total"], rel=1e-3)
    assert metrics_a[1]["loss/faithfulness"] != pytest.approx(
        metrics_b[1]["loss/faithfulness"], rel=1e-4
    )
