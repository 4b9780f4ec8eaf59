"""Slow-eval recon metrics: hidden-activation MSE per site and attention-pattern KL per layer
against a layer-by-layer reference written out by hand, zero when the masked model reproduces
the clean weights, the evaluator's slow flag, and the slow-eval cadence's config errors."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train._forward import CleanRunner, ForwardSpec, site_id
from pd_train.analysis.recon_eval import (
    RECON_MASKS,
    ReconStats,
    attention_kl,
    recon_batch_metrics,
    recon_layers,
    slow_eval_due,
)
from pd_train.config.io import ConfigError
from pd_train.config.pd import DecompositionTarget
from pd_train.decomposition import build_decomposition
from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig
from pd_train.sources import sample_source

from ._recon import random_recon_data
from ._tiny import FAST

MODEL = LlamaConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
)
# Layer 0 frozen (the scan starts at layer 1), layer 2 frozen between decomposed layers, and two
# kinds of different shapes in layer 3: segments [0] frozen, [1] mlp, [2] frozen, [3] q, o.
# C >= d_in of every kind, so the zero test can set V = [I | 0], U = [W; 0].
DEC = build_decomposition(
    MODEL,
    [
        DecompositionTarget(module_pattern="layers.1.mlp.*", C=32),
        DecompositionTarget(module_pattern="layers.3.self_attn.[qo]_proj", C=16),
    ],
)
SPEC = ForwardSpec(model=MODEL, decomposition=DEC)
B, T = 2, 6


@functools.cache
def _data() -> tuple[Any, Any, Any, Any]:
    return random_recon_data(MODEL, DEC, B, T)


def _recon(target: Any, comps: Any, ci: Any, tokens: Any, key: Any, stream: Any = None) -> Any:
    fn = jax.jit(
        lambda target, comps, ci, tokens, key, stream: recon_batch_metrics(
            SPEC,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            key=key,
            clean_stream=stream,
        ),
        compiler_options=FAST,
    )
    return jax.device_get(fn(target, comps, ci, tokens, key, stream))


def _np_probs(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Causal softmax attention [B, H, T, T] from q [B, T, H, hd], k [B, T, KV, hd] in numpy
    (float64), query head h reading kv head h // (H // KV)."""
    heads, kv = q.shape[2], k.shape[2]
    k = np.repeat(k, heads // kv, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    scores = np.where(np.tril(np.ones((q.shape[1],) * 2, bool)), scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    e = np.exp(scores)
    return e / e.sum(-1, keepdims=True)


def _reference(
    target: Any, comps: Any, ci: Any, tokens: Any, key: Any, mask: str
) -> tuple[dict[str, float], list[float]]:
    """({site: MSE}, [KL of layers 1..3]) under ``mask``: the clean and the masked model run
    layer by layer in Python, each site's output recorded, the masked site written as
    ((x@V)·m)@U + δ·(x@(W − V@U)) with its mask built from the definition, and the attention
    probabilities recomputed in numpy from the recorded q/k projections."""
    sites = {(s.layer, s.kind): s for s in DEC.sites}
    cos, sin = llama.rope_cos_sin(MODEL, T, jnp.float32)
    hd = MODEL.resolved_head_dim

    def run(masked: bool) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        outs: dict[str, np.ndarray] = {}
        probs: list[np.ndarray] = []
        h = llama.embed(target, tokens)
        for layer in range(MODEL.num_hidden_layers):
            qk: dict[str, np.ndarray] = {}

            def linear(
                kind: str, x: jax.Array, w: jax.Array, layer: int = layer, qk: dict = qk
            ) -> jax.Array:
                y = x @ w
                site = sites.get((layer, kind))
                if masked and site is not None:
                    v, u = comps[kind]["V"][site.index], comps[kind]["U"][site.index]
                    c = ci[kind][site.index]
                    r = sample_source(
                        "continuous",
                        (B, T, c.shape[-1] + 1),
                        key=jax.random.fold_in(key, site_id(layer, kind)),
                    )
                    scale = 1.0 if mask == "stochastic" else 0.0
                    m, delta = c + (1 - c) * scale * r[..., :-1], scale * r[..., -1]
                    y = ((x @ v) * m) @ u + delta[..., None] * (x @ (w - v @ u))
                if site is not None:
                    outs[site.name] = np.asarray(y, np.float64)
                if kind in ("q_proj", "k_proj"):
                    qk[kind] = np.asarray(y, np.float64)
                return y

            layer_params = jax.tree.map(lambda a, i=layer: a[i], target["layers"])
            h = llama.decoder_layer(h, layer_params, cos, sin, MODEL, linear)
            q = qk["q_proj"].reshape(B, T, MODEL.num_attention_heads, hd)
            k = qk["k_proj"].reshape(B, T, MODEL.num_key_value_heads, hd)
            q = np.asarray(llama.apply_rope(jnp.asarray(q), cos, sin), np.float64)
            k = np.asarray(llama.apply_rope(jnp.asarray(k), cos, sin), np.float64)
            probs.append(_np_probs(q, k))
        return outs, probs

    clean, p_clean = run(False)
    masked, p_masked = run(True)
    mse = {name: float(np.mean((masked[name] - clean[name]) ** 2)) for name in clean}
    kls = []
    for layer in recon_layers(SPEC):
        p, q = p_clean[layer], p_masked[layer]
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1) / np.where(p > 0, q, 1)), 0.0)
        kls.append(float(terms.sum(-1).mean()))
    return mse, kls


def _clean_stream(target: Any, tokens: Any) -> jax.Array:
    runner = CleanRunner(SPEC, target, tokens)
    runner.run(lambda kind, x, xs: None, {})
    assert runner.stream is not None
    return runner.stream


def test_recon_matches_a_layer_by_layer_reference() -> None:
    target, comps, ci, tokens = _data()
    key = jax.random.key(3)
    with_stream = _recon(target, comps, ci, tokens, key, _clean_stream(target, tokens))
    from_embedding = _recon(target, comps, ci, tokens, key)
    assert recon_layers(SPEC) == (1, 2, 3)
    for i, mask in enumerate(RECON_MASKS):
        mse, kls = _reference(target, comps, ci, tokens, key, mask)
        for site in DEC.sites:
            for got in (with_stream, from_embedding):
                np.testing.assert_allclose(
                    got["hidden_mse"][site.kind][i, site.index], mse[site.name], rtol=2e-4
                )
        for got in (with_stream, from_embedding):
            np.testing.assert_allclose(got["attn_kl"][i], kls, rtol=2e-4, atol=1e-9)
        # Layer 1's attention is before any masked site; layer 2's reads layer 1's masked MLP.
        assert kls[0] == 0 and kls[1] > 1e-6 and kls[2] > kls[1]
        assert min(mse.values()) > 1e-4
    # The two masks give different numbers (a mode mix-up could not pass by coincidence).
    assert not np.allclose(with_stream["attn_kl"][0], with_stream["attn_kl"][1])


def test_recon_with_all_ones_ci_equals_the_v_at_u_model() -> None:
    """Under the CI mask with ci = 1 (no delta) the masked model is the target with every
    decomposed W replaced by V@U: hidden MSE and attention KL against that model's forward."""
    target, comps, _, tokens = _data()
    ones = {k: jnp.ones((len(DEC.kind(k).layers), B, T, DEC.kind(k).C)) for k in DEC.kind_names}
    got = _recon(target, comps, ones, tokens, jax.random.key(0))
    swapped = jax.tree.map(lambda a: a, target)
    for site in DEC.sites:
        vu = comps[site.kind]["V"][site.index] @ comps[site.kind]["U"][site.index]
        swapped["layers"][site.kind] = swapped["layers"][site.kind].at[site.layer].set(vu)
    cos, sin = llama.rope_cos_sin(MODEL, T, jnp.float32)

    def run(params: Any) -> tuple[dict[tuple[int, str], np.ndarray], list[np.ndarray]]:
        outs, probs = {}, []
        h = llama.embed(params, tokens)
        for layer in range(MODEL.num_hidden_layers):

            def linear(kind: str, x: jax.Array, w: jax.Array, layer: int = layer) -> jax.Array:
                outs[layer, kind] = np.asarray(x @ w, np.float64)
                return x @ w

            layer_params = jax.tree.map(lambda a, i=layer: a[i], params["layers"])
            h, p = llama.decoder_layer_with_attention(h, layer_params, cos, sin, MODEL, linear)
            probs.append(np.asarray(p, np.float64))
        return outs, probs

    clean, p_clean = run(target)
    vu_model, p_vu = run(swapped)
    for site in DEC.sites:
        expected = np.mean((vu_model[site.layer, site.kind] - clean[site.layer, site.kind]) ** 2)
        np.testing.assert_allclose(got["hidden_mse"][site.kind][0, site.index], expected, rtol=1e-4)
    expected_kl = [float(attention_kl(p_clean[i], p_vu[i])) for i in recon_layers(SPEC)]
    np.testing.assert_allclose(got["attn_kl"][0], expected_kl, rtol=1e-4, atol=1e-9)
    assert expected_kl[-1] > 0


def test_recon_is_zero_when_the_masks_reproduce_the_clean_weights() -> None:
    """V = [I | 0], U = [W; 0] (V@U = W, Δ = 0) and ci = 1: every mask gives m = 1, so with
    the delta on (stochastic: δ drawn per position) each site output is (1 − δ)·x@W + δ·x@W."""
    target, _, _, tokens = _data()
    comps, ones = {}, {}
    for layout in DEC.kinds:
        w = jnp.stack([target["layers"][layout.kind][i] for i in layout.layers])
        eye = jnp.eye(layout.d_in, layout.C)
        u = jnp.zeros((len(layout.layers), layout.C, layout.d_out)).at[:, : layout.d_in].set(w)
        comps[layout.kind] = {"V": jnp.broadcast_to(eye, (len(layout.layers), *eye.shape)), "U": u}
        ones[layout.kind] = jnp.ones((len(layout.layers), B, T, layout.C))
    got = _recon(target, comps, ones, tokens, jax.random.key(1))
    for kind, mse in got["hidden_mse"].items():
        assert np.all(np.abs(mse) < 1e-12), (kind, mse)
    assert np.all(np.abs(got["attn_kl"]) < 1e-6), got["attn_kl"]


def test_attention_kl_by_hand() -> None:
    p = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]])
    q = np.array([[1.0, 0.0, 0.0], [0.25, 0.75, 0.0]])
    expected = (0.0 + 0.5 * np.log(0.5 / 0.25) + 0.5 * np.log(0.5 / 0.75)) / 2
    np.testing.assert_allclose(float(attention_kl(jnp.asarray(p), jnp.asarray(q))), expected)
    assert float(attention_kl(jnp.asarray(p), jnp.asarray(p))) == 0.0


def test_recon_stats_record_means_over_batches() -> None:
    stats = ReconStats(SPEC)
    layout = {k: len(DEC.kind(k).layers) for k in DEC.kind_names}
    batches = []
    for b in range(2):
        batches.append(
            {
                "hidden_mse": {
                    k: np.arange(2 * n, dtype=np.float32).reshape(2, n) + b
                    for k, n in layout.items()
                },
                "attn_kl": np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]) * (b + 1),
            }
        )
        stats.add(batches[-1])
    record = stats.record()
    site = DEC.sites[1]  # layers.1.mlp.up_proj
    assert record[f"hidden_mse_ci/{site.name}"] == site.index + 0.5
    assert record[f"hidden_mse_stochastic/{site.name}"] == layout[site.kind] + site.index + 0.5
    assert record["attn_kl_stochastic/layers.2"] == 4.0 * 1.5
    assert record["eval/attn_kl_ci"] == pytest.approx(1.5)
    d_out = {s.name: DEC.kind(s.kind).d_out for s in DEC.sites}
    weighted = sum(record[f"hidden_mse_ci/{n}"] * d for n, d in d_out.items())
    assert record["eval/hidden_mse_ci"] == pytest.approx(weighted / sum(d_out.values()))
    assert sorted(k for k in record if k.startswith("eval/")) == [
        "eval/attn_kl_ci",
        "eval/attn_kl_stochastic",
        "eval/hidden_mse_ci",
        "eval/hidden_mse_stochastic",
    ]


def test_slow_eval_due_every_n_steps_and_at_the_end() -> None:
    due = [s for s in range(1, 11) if slow_eval_due(4, s, 10)]
    assert due == [4, 8, 10]
    assert not any(slow_eval_due(0, s, 10) for s in range(1, 11))


def _raw_config(**sections: Any) -> dict[str, Any]:
    architecture = {
        "vocab_size": 32,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    raw = {
        "run_name": "x",
        "target": {"architecture": architecture},
        "data": {"seq_len": 8},
        "pd": {
            "steps": 8,
            "decomposition_targets": [{"module_pattern": "layers.*.mlp.up_proj", "C": 4}],
            "loss_metrics": [{"type": "faithfulness", "coeff": 1.0}],
            "components": {"lr": 1e-3},
            "ci_fn": {"lr": 1e-3},
        },
        "cadence": {"train_log_every": 1},
    }
    for name, values in sections.items():
        raw[name] = {**raw[name], **values}
    return raw


def test_l0_groups_in_the_run_config() -> None:
    """``pd.l0_groups`` is checked against the decomposed sites before anything runs."""
    from pd_train.run import prepare

    bad = _raw_config(pd={"l0_groups": {"attn": ["layers.*.self_attn.*"], "up": ["*.up_proj"]}})
    with pytest.raises(ConfigError) as info:
        prepare(bad, for_run=False)
    assert "pd.l0_groups.attn[0]: 'layers.*.self_attn.*' matches no decomposed site" in str(
        info.value
    )
    assert "pd.l0_groups.up" not in str(info.value)
    good = _raw_config(pd={"l0_groups": {"up": ["*.up_proj"], "first": ["layers.0.*"]}})
    groups = prepare(good, for_run=False).config.pd.l0_groups
    assert groups == {"up": ("*.up_proj",), "first": ("layers.0.*",)}


@pytest.mark.parametrize(
    ("cadence", "message"),
    [
        ({"eval_every": 2, "slow_eval_every": 3}, "not a multiple of cadence.eval_every (2)"),
        ({"eval_every": 0, "slow_eval_every": 4}, "cadence.eval_every is 0"),
        ({"eval_every": 2, "slow_eval_every": -2}, "slow_eval_every"),
    ],
)
def test_slow_eval_cadence_errors_name_the_field(cadence: dict[str, int], message: str) -> None:
    from pd_train.run import prepare

    with pytest.raises(ConfigError) as info:
        prepare(_raw_config(cadence=cadence), for_run=False)
    text = str(info.value)
    assert "cadence.slow_eval_every" in text and message in text, text
    ok = _raw_config(cadence={"eval_every": 2, "slow_eval_every": 4})
    assert prepare(ok, for_run=False).config.cadence.slow_eval_every == 4


def test_evaluator_slow_flag_adds_the_recon_metrics_of_its_own_batches(tmp_path: Any) -> None:
    """``Evaluator(..., slow=True)``: the regular metrics are the same as without it, and the
    recon entries are :func:`recon_batch_metrics` on the Trainer's ci_lower with the batch's
    eval key (so the stochastic mask is the eval's), averaged over the batches."""
    import pd_sharding
    from pd_train.analysis.statistics import ci_lower_of
    from pd_train.config.pd import MLPCI, Faithfulness, OptimizerConfig, PDConfig
    from pd_train.evaluate import Evaluator
    from pd_train.run.data import Batches, TokenDataset
    from pd_train.train import Trainer, TrainState

    from ._tiny import TINY

    model = TINY
    pd = PDConfig(
        steps=2,
        batch_size=2,
        decomposition_targets=(
            DecompositionTarget(module_pattern="layers.1.self_attn.k_proj", C=4),
            DecompositionTarget(module_pattern="layers.[01].mlp.up_proj", C=4),
        ),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=(Faithfulness(coeff=1.0),),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
        l0_threshold=0.1,
    )
    mesh = pd_sharding.make_mesh(data=1, devices=jax.devices()[:1])
    trainer = Trainer(model, pd, mesh=mesh, compiler_options=FAST)
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda a: jnp.asarray(0.4 * rng.standard_normal(a.shape), a.dtype),
        trainer.abstract_params(),
    )
    target = llama.init_params(model, key=jax.random.key(0))
    np.save(tmp_path / "t.npy", rng.integers(0, 32, 500).astype(np.uint16))
    data = TokenDataset(tmp_path / "t.npy", seq_len=6, dtype="uint16", vocab_size=32)
    batches = Batches(data, batch_size=2, seed=1, process_index=0, process_count=1)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state={})
    evaluator = Evaluator(trainer, batches, n_batches=2, mesh=mesh)
    key = jax.random.key(9)
    plain = evaluator(state, target, key=key)
    slow = evaluator(state, target, key=key, slow=True)
    assert not [k for k in plain if "hidden_mse" in k or "attn_kl" in k]
    for name, value in plain.items():
        if name.startswith("eval/"):
            assert slow[name] == value, name

    @functools.partial(jax.jit, compiler_options=FAST)
    def reference(tokens: jax.Array, key: jax.Array) -> Any:
        comps = jax.tree.map(lambda a: a.astype(trainer.compute_dtype), params["components"])
        return recon_batch_metrics(
            trainer.forward_spec,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci_lower_of(trainer, params, target, tokens),
            key=key,
        )

    stats = ReconStats(trainer.forward_spec)
    for i in range(2):
        tokens = jnp.asarray(batches.batch(i).astype(np.int32))
        stats.add(jax.device_get(reference(tokens, jax.random.fold_in(key, i))))
    expected = stats.record()
    assert sorted(k for k in slow if "hidden_mse" in k or "attn_kl" in k) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(slow[name], value, rtol=1e-5, atol=1e-12, err_msg=name)
    assert expected["eval/hidden_mse_stochastic"] > 0 and expected["attn_kl_ci/layers.1"] > 0
