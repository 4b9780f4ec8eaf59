"""Evaluation: the fixed sources make the masks the evaluation claims, and the evaluator's
metrics (one masked forward mapped over the four masks) equal a per-mask reference."""

import functools
import itertools
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pd_sharding
from pd_train._forward import CleanRunner, masked_forward, site_id
from pd_train.config.pd import (
    MLPCI,
    DecompositionTarget,
    Faithfulness,
    OptimizerConfig,
    PDConfig,
)
from pd_train.evaluate import (
    HIST_BINS,
    MASKS,
    Evaluator,
    batch_metrics,
    ci_histogram,
    lower_eval,
)
from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig
from pd_train.run.data import Batches, TokenDataset
from pd_train.sources import masks, sample_source
from pd_train.squash import lower_leaky_hard
from pd_train.train import Trainer, TrainState

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


TINY = LlamaConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
)
B, T = 4, 8
THRESHOLD = 0.1
# Same HLO as the default, compiled with less LLVM optimization: faster to compile on CPU.


@functools.cache
def _setup() -> tuple[Trainer, Any, Any, Batches]:
    """A trainer whose decomposition leaves layer 0 frozen and covers different kinds in layers 1
    and 2 (so the masked forward has several segments), random params and real eval batches."""
    pd = PDConfig(
        steps=10,
        batch_size=B,
        decomposition_targets=(
            DecompositionTarget(module_pattern="layers.[12].mlp.*", C=8),
            DecompositionTarget(module_pattern="layers.2.self_attn.[qo]_proj", C=4),
        ),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=(Faithfulness(coeff=1.0),),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
        l0_threshold=THRESHOLD,
    )
    mesh = pd_sharding.make_mesh(data=1, devices=jax.devices()[:1])
    trainer = Trainer(TINY, pd, mesh=mesh, compiler_options=FAST)
    # Random params of the right shapes (pd-init's init is tested elsewhere and costs a
    # compile): wide enough that ci_lower spreads over [0, 1].
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda a: jnp.asarray(0.4 * rng.standard_normal(a.shape), a.dtype),
        trainer.abstract_params(),
    )
    target = llama.init_params(TINY, key=jax.random.key(0))
    tmp = Path(tempfile.mkdtemp(prefix="pd-eval-test-"))
    np.save(tmp / "tokens.npy", rng.integers(0, TINY.vocab_size, 4_000).astype(np.uint16))
    data = TokenDataset(tmp / "tokens.npy", seq_len=T, dtype="uint16", vocab_size=TINY.vocab_size)
    batches = Batches(data, batch_size=B, seed=5, process_index=0, process_count=1)
    return trainer, params, target, batches


@functools.partial(jax.jit, static_argnames=("trainer",), compiler_options=FAST)
def _reference_logits(
    trainer: Trainer, params: Any, target: Any, tokens: jax.Array, key: jax.Array
) -> dict[str, jax.Array]:
    """{mask: logits [B, T, V]} and the clean logits: the model layer by layer in Python, one
    forward per mask, the site output written as ((x@V)·m)@U + δ·(x@(W − V@U)) and the mask
    built per site from its definition."""
    model = trainer.model
    comps = params["components"]
    clean = CleanRunner(trainer.forward_spec, target, tokens)
    _, pre = trainer.ci_fn.causal_importance(params["ci_fn"], comps, clean)
    ci_lower = {k: lower_leaky_hard(v) for k, v in pre.items()}
    sites = {(s.layer, s.kind): s for s in trainer.decomposition.sites}
    cos, sin = llama.rope_cos_sin(model, T, jnp.float32)

    def site_mask(mask: str, ci: jax.Array, layer: int, kind: str) -> tuple[jax.Array, jax.Array]:
        """m [B, T, C] and δ [B, T] of one site."""
        no_delta = jnp.zeros(ci.shape[:-1])
        if mask == "ci":
            return ci, no_delta
        if mask == "ones":
            return jnp.ones_like(ci), no_delta
        if mask == "rounded":
            return (ci > THRESHOLD).astype(ci.dtype), no_delta
        r = sample_source(
            trainer.pd.sampling,
            (*ci.shape[:-1], ci.shape[-1] + 1),
            key=jax.random.fold_in(key, site_id(layer, kind)),
        )
        return ci + (1 - ci) * r[..., :-1], r[..., -1]

    out = {"clean": llama.forward(target, tokens, model)}
    for mask in MASKS:
        h = llama.embed(target, tokens)
        for layer in range(model.num_hidden_layers):

            def linear(
                kind: str, x: jax.Array, w: jax.Array, layer: int = layer, mask: str = mask
            ) -> jax.Array:
                site = sites.get((layer, kind))
                if site is None:
                    return x @ w
                v, u = comps[kind]["V"][site.index], comps[kind]["U"][site.index]
                m, delta = site_mask(mask, ci_lower[kind][site.index], layer, kind)
                return ((x @ v) * m) @ u + delta[..., None] * (x @ (w - v @ u))

            layer_params = jax.tree.map(lambda a, i=layer: a[i], target["layers"])
            h = llama.decoder_layer(h, layer_params, cos, sin, model, linear)
        out[mask] = llama.unembed(target, h, model)
    return out


def _ce(logits: np.ndarray, tokens: np.ndarray) -> float:
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1).mean())


def _kl(clean: np.ndarray, masked: np.ndarray) -> float:
    lp = clean - np.log(np.exp(clean).sum(-1, keepdims=True))
    lq = masked - np.log(np.exp(masked).sum(-1, keepdims=True))
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


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
    for outcome in ("miss", "hit"):
        evaluator = Evaluator(trainer, batches, n_batches=1, mesh=trainer.mesh)
        evaluator.compile_ahead(target_dtype=jnp.float32, cache=cache, key="eval-key")
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
