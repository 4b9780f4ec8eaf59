"""Evaluation: the fixed sources make the masks the evaluation claims, and the evaluator's
metrics (one masked forward mapped over the four masks) equal a per-mask reference."""

import functools
import itertools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pd_sharding
from pd_train._forward import masked_forward
from pd_train.evaluate import (
    HIST_BINS,
    MASKS,
    Evaluator,
    batch_metrics,
    ci_histogram,
    lower_eval,
)
from pd_train.sources import masks, sample_source
from pd_train.train import Trainer, TrainState

from ._evaluate import B, T, _ce, _kl, _reference_logits, _setup
from ._tiny import FAST


def test_zeros_source_gives_ci_masks_and_no_delta() -> None:
    ci = jnp.asarray([[0.0, 0.3, 1.0]])
    m, delta = masks(ci, sample_source("zeros", (1, 4), key=jax.random.key(0)))
    np.testing.assert_array_equal(m, ci)
    np.testing.assert_array_equal(delta, [0.0])


def test_components_ones_source_gives_all_components_and_no_delta() -> None:
    ci = jnp.asarray([[0.0, 0.3, 1.0]])
    m, delta = masks(ci, sample_source("components_ones", (1, 4), key=jax.random.key(0)))
    np.testing.assert_array_equal(m, [[1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(delta, [0.0])


# ---------------------------------------------------------------------------------------------
# The evaluator against a per-mask reference written out by hand


@pytest.mark.slow
def test_evaluator_matches_a_per_mask_reference() -> None:
    trainer, params, target, batches = _setup()
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state={})
    eval_key = jax.random.key(7)
    evaluator = Evaluator(trainer, batches, n_batches=2, mesh=trainer.mesh)
    record = evaluator(state, target, key=eval_key)

    expected: dict[str, float] = {}
    for i in range(2):
        tokens = jnp.asarray(batches.batch(i).astype(np.int32))
        ref = _reference_logits(trainer, params, target, tokens, jax.random.fold_in(eval_key, i))
        ref = {k: np.asarray(v, np.float64) for k, v in ref.items()}
        rows = np.asarray(tokens)
        values = {"ce_clean": _ce(ref["clean"], rows)}
        for mask in MASKS:
            values[f"ce_{mask}"] = _ce(ref[mask], rows)
            values[f"kl_{mask}"] = _kl(ref["clean"], ref[mask])
        for name, value in values.items():
            expected[f"eval/{name}"] = expected.get(f"eval/{name}", 0.0) + value / 2
    assert sorted(k for k in record if k.startswith("eval/")) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(record[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # The masks really differ: a mix-up of modes could not pass by coincidence.
    kls = [expected[f"eval/kl_{mask}"] for mask in MASKS]
    assert min(abs(a - b) for a, b in itertools.combinations(kls, 2)) > 1e-4, kls
    assert expected["eval/kl_ones"] > 0 and expected["eval/kl_stochastic"] > 0

    # L0 and histograms: every position and component of every site counted once per batch.
    for site in trainer.decomposition.sites:
        counts = record[f"ci_hist/{site.name}"]["counts"]
        assert sum(counts) == 2 * B * T * trainer.decomposition.kind(site.kind).C
        assert 0 < record[f"l0/{site.name}"] < trainer.decomposition.kind(site.kind).C


def test_eval_traces_one_masked_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The four masks share one traced masked forward (the point of the restructure)."""
    import pd_train.evaluate as evaluate

    calls = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["key"])
        return masked_forward(*args, **kwargs)

    monkeypatch.setattr(evaluate, "masked_forward", counting)
    trainer, params, target, batches = _setup()
    tokens = jnp.asarray(batches.batch(0).astype(np.int32))
    jax.make_jaxpr(functools.partial(batch_metrics, trainer))(
        params, target, tokens, jax.random.key(0)
    )
    assert len(calls) == 1


@pytest.mark.slow
def test_lower_eval_on_abstract_inputs_with_a_mesh() -> None:
    """``lower_eval`` (for ``pd-train compile``) lowers on sharded abstract inputs and compiles."""
    trainer, *_ = _setup()
    mesh = pd_sharding.make_mesh(data=2, devices=jax.devices()[:2])
    sharded = Trainer(trainer.model, trainer.pd, mesh=mesh, compiler_options=FAST)
    compiled = lower_eval(sharded, batch_size=B, seq_len=T, target_dtype=jnp.float32).compile()
    shapes = jax.tree.map(lambda a: a.shape, compiled.out_info)
    assert shapes["eval/kl_stochastic"] == ()
    assert shapes["ci_hist"]["down_proj"] == (2, HIST_BINS)


def test_ci_histogram_equals_jnp_histogram() -> None:
    """The bins of ``jnp.histogram`` over the same edges (what the evaluator used before):
    values on every edge, below 0 and above 1 (clipped first) included; exact int32 counts."""
    edges = np.asarray(jnp.linspace(0.0, 1.0, HIST_BINS + 1))
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.uniform(-0.2, 1.2, 1005), edges, edges, [0.0, 1.0, 1.0]])
    ci = values.astype(np.float32).reshape(1, 1, -1, 7) * np.ones((3, 1, 1, 1), np.float32)
    ci[1] = 0.5  # a site with every value in one bin
    counts = np.asarray(ci_histogram(jnp.asarray(ci)))
    assert counts.dtype == np.int32
    for site in range(3):
        clipped = jnp.clip(jnp.asarray(ci[site]), 0.0, 1.0)
        expected = jnp.histogram(clipped, bins=jnp.asarray(edges))[0]
        np.testing.assert_array_equal(counts[site], np.asarray(expected))
    assert counts[1, HIST_BINS // 2] == ci[1].size


def test_eval_compiled_ahead_gives_the_same_record_and_is_cached(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`Evaluator.compile_ahead` (the run starts it after step 0): the first eval uses the
    program compiled in the background, a second evaluator loads it from the executable cache,
    and a program that refuses the arguments falls back to the jit; every record is equal."""
    from pd_train.process_env import ExecutableCache

    trainer, params, target, batches = _setup()
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state={})
    key = jax.random.key(3)
    expected = Evaluator(trainer, batches, n_batches=1, mesh=trainer.mesh)(state, target, key=key)
    cache = ExecutableCache(tmp_path)
    records = []
    # A key of another source (an edit that changed no program): loaded by its lowered key.
    for key_name, outcome in (
        ("eval-key", "miss"),
        ("eval-key", "hit"),
        ("edited", "hit (lowered)"),
    ):
        evaluator = Evaluator(trainer, batches, n_batches=1, mesh=trainer.mesh)
        evaluator.compile_ahead(target_dtype=jnp.float32, cache=cache, key=key_name)
        records.append(evaluator(state, target, key=key))
        assert evaluator.ahead_outcome == outcome
    # Compiled for a bfloat16 target, called with float32 weights: refused, the jit runs.
    evaluator = Evaluator(trainer, batches, n_batches=1, mesh=trainer.mesh)
    evaluator.compile_ahead(target_dtype=jnp.bfloat16)
    with caplog.at_level("WARNING", logger="pd_train"):
        records.append(evaluator(state, target, key=key))
    assert "refused the arguments" in caplog.text
    for record in records:
        np.testing.assert_equal(record, expected)
