"""``stochastic_hidden_acts_recon`` (spd's and param-decomp's ``StochasticHiddenActsReconLoss``):
pinned to numbers written out with numpy from the definition — per decomposed site the output
of its matmul in the masked model (every site live, each reading the masked model's input) and
in the clean target, Σ over draws, sites and elements of the squared difference, divided by
n_samples · Σ_sites numel — on the two-site TMS toy of test_loss_pins.py and on the tiny Llama
(through the train step, drawn sources regenerated from their keys); the FLOP census entry; bad
field values refused by field path; a few train steps with the term."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train._forward import CleanRunner, ForwardSpec, site_id
from pd_train.config.pd import StochasticHiddenActsRecon, StochasticRecon
from pd_train.flops import step_census
from pd_train.losses import hidden_acts_recon
from pd_train.models import llama
from pd_train.squash import lower_leaky_hard
from pd_train.train import Trainer

from ._cli import tiny_config, write_config
from ._loss_pins import CI, KINDS, SPEC, C, R, U, V, W, X, _f32, _pd_inputs
from ._tiny import FAST, TINY, _pd, _run, _target, _tokens

TERM = "stochastic_hidden_acts_recon"


# ---------------------------------------------------------------- the TMS toy, in numpy
def _site(kind: str, x: np.ndarray, r: np.ndarray | None, *, delta: bool = True) -> np.ndarray:
    """A site's output: clean x@W (r None) or live ((x@V)·m)@U + δ·(x@(W − V@U))."""
    if r is None:
        return x @ W[kind]
    m = CI[kind] + (1 - CI[kind]) * r[..., :C]
    out = ((x @ V[kind]) * m) @ U[kind]
    if delta:
        out = out + r[..., C:] * (x @ (W[kind] - V[kind] @ U[kind]))
    return out


def _hidden_mse(r: dict[str, np.ndarray], *, delta: bool = True) -> float:
    """linear1 reads the input, linear2 linear1's output (TMS: out = relu(x@W1@W2 + b)), in
    each model; (Σ over both sites of Σ (masked − clean)²) / (numel(y1) + numel(y2))."""
    y1c = _site("linear1", X, None)
    y2c = _site("linear2", y1c, None)
    y1m = _site("linear1", X, r["linear1"], delta=delta)
    y2m = _site("linear2", y1m, r["linear2"], delta=delta)
    total = np.sum((y1m - y1c) ** 2) + np.sum((y2m - y2c) ** 2)
    return float(total / (y1c.size + y2c.size))


def _pd_value(spec: ForwardSpec = SPEC, **kw: Any) -> float:
    d = _pd_inputs()
    value = hidden_acts_recon(
        spec,
        target=d["target"],
        tokens=d["x"],
        components=d["comps"],
        ci_lower=d["ci"],
        key=jax.random.key(0),
        **kw,
    )
    return float(value)


def test_hidden_acts_recon_by_hand() -> None:
    """Given sources; n_samples draws of the same sources give the same mean; the second site's
    error includes the first's, propagated (its clean input is not the masked one)."""
    want = _hidden_mse(R)
    assert want > 1e-3
    sources = _pd_inputs()["sources"]
    np.testing.assert_allclose(_pd_value(sources=sources), want, rtol=1e-5)
    np.testing.assert_allclose(_pd_value(sources=sources, n_samples=3), want, rtol=1e-5)
    # Not the same as comparing linear2 on the clean input (errors do propagate).
    y1c = _site("linear1", X, None)
    y2c = _site("linear2", y1c, None)
    local = np.sum((_site("linear1", X, R["linear1"]) - y1c) ** 2) + np.sum(
        (_site("linear2", y1c, R["linear2"]) - y2c) ** 2
    )
    assert abs(local / (y1c.size + y2c.size) - want) > 1e-3 * want


def test_hidden_acts_recon_without_the_delta_component_by_hand() -> None:
    spec = attrs.evolve(SPEC, use_delta=False)
    want = _hidden_mse(R, delta=False)
    assert abs(want - _hidden_mse(R)) > 1e-4
    np.testing.assert_allclose(_pd_value(spec, sources=_pd_inputs()["sources"]), want, rtol=1e-5)


def test_drawn_sources_are_each_draws_uniforms_from_the_term_key() -> None:
    """Draw d's source of a site: U[0, 1) from fold_in(fold_in(fold_in(fold_in(key, 0), d), 0),
    site_id) (stochastic_recon's keys); the value is the mean over the draws."""
    key = jax.random.key(0)

    def drawn(d: int) -> dict[str, np.ndarray]:
        k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, 0), d), 0)
        return {
            kind: np.asarray(
                jax.random.uniform(
                    jax.random.fold_in(k, site_id(0, kind, KINDS)), R[kind].shape, jnp.float32
                ),
                np.float64,
            )
            for kind in KINDS
        }

    want = np.mean([_hidden_mse(drawn(d)) for d in range(2)])
    np.testing.assert_allclose(_pd_value(n_samples=2), want, rtol=1e-5)
    assert abs(_hidden_mse(drawn(0)) - _hidden_mse(drawn(1))) > 1e-4 * want


# ---------------------------------------------------------------- the tiny Llama
@functools.cache
def _llama() -> tuple[Trainer, Any, jax.Array]:
    pd = _pd(loss_metrics=(StochasticHiddenActsRecon(coeff=1.0, n_samples=2),))
    trainer = Trainer(TINY, pd, compiler_options=FAST)
    params = trainer.init_state(key=jax.random.key(1)).params
    return trainer, params, _tokens()


def _llama_reference(trainer: Trainer, params: Any, target: Any, tokens: jax.Array, key: Any):
    """The term written out with the Llama layer and a recording site hook: per draw d the
    masked model (every decomposed site ((x@V)·(m − δ))@U + δ·(x@W), m = ci + (1 − ci)·r[:C],
    δ = r[C], r ~ U[0, 1) from the draw's key folded with site_id) beside the clean one."""
    model, comps = trainer.model, params["components"]
    clean = CleanRunner(trainer.forward_spec, target, tokens)
    _, pre = trainer.ci_fn.causal_importance(params["ci_fn"], comps, clean)
    ci = {k: lower_leaky_hard(v) for k, v in pre.items()}
    sites = {(s.layer, s.kind): s for s in trainer.decomposition.sites}
    cos, sin = llama.rope_cos_sin(model, tokens.shape[1], jnp.float32)
    term_key = jax.random.fold_in(key, 0)  # the term's index in pd.loss_metrics

    def outputs(draw: int | None) -> list[jax.Array]:
        k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(term_key, 0), draw or 0), 0)
        recorded: list[jax.Array] = []
        h = llama.embed(target, tokens)
        for layer in range(model.num_hidden_layers):

            def linear(kind: str, x: jax.Array, w: jax.Array, layer: int = layer) -> jax.Array:
                xw = x @ w
                site = sites.get((layer, kind))
                if site is None:
                    return xw
                if draw is None:
                    recorded.append(xw)
                    return xw
                c = jnp.clip(ci[kind][site.index], 0.0, 1.0)
                r = jax.random.uniform(
                    jax.random.fold_in(k, site_id(layer, kind)), (*c.shape[:-1], c.shape[-1] + 1)
                )
                m, delta = c + (1 - c) * r[..., :-1], r[..., -1:]
                v, u = comps[kind]["V"][site.index], comps[kind]["U"][site.index]
                y = ((x @ v) * (m - delta)) @ u + delta * xw
                recorded.append(y)
                return y

            layer_params = jax.tree.map(lambda a, i=layer: a[i], target["layers"])
            h = llama.decoder_layer(h, layer_params, cos, sin, model, linear)
        return recorded

    clean_out = outputs(None)
    total = sum(
        jnp.sum((m - c) ** 2) for d in range(2) for m, c in zip(outputs(d), clean_out, strict=True)
    )
    return total / (2 * sum(c.size for c in clean_out))


@pytest.mark.slow
def test_the_term_in_the_train_step_matches_a_written_out_llama_forward() -> None:
    trainer, params, tokens = _llama()
    target, key = _target(), jax.random.key(5)

    def loss(params: Any) -> Any:
        return trainer.loss(params, target, tokens, jnp.int32(0), key)

    (total, aux), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    want = float(jax.jit(_llama_reference, static_argnums=0)(trainer, params, target, tokens, key))
    assert want > 0
    np.testing.assert_allclose(float(aux["terms"][TERM]), want, rtol=1e-5)
    np.testing.assert_allclose(float(total), want, rtol=1e-5)
    # It trains both the components and the CI function.
    for group in ("components", "ci_fn"):
        assert max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads[group])) > 0


def test_a_few_train_steps_with_the_term() -> None:
    trainer, _, tokens = _llama()
    metrics = _run(trainer, 3, target=_target(), tokens=tokens)
    values = [m[f"loss/{TERM}"] for m in metrics]
    assert all(np.isfinite(v) and v > 0 for v in values), values
    assert values[0] != values[-1]


# ---------------------------------------------------------------- census, config errors
def test_census_counts_the_masked_forwards_without_the_lm_head() -> None:
    """Per draw the term runs stochastic_recon's masked forward and backward but no LM head
    (the LM head is not a site here)."""
    pd = _pd(
        loss_metrics=(
            StochasticRecon(coeff=1.0, n_samples=2),
            StochasticHiddenActsRecon(coeff=1.0, n_samples=2),
        )
    )
    census = step_census(TINY, pd, seq_len=16)
    mine = [e for e in census.entries if e.term == TERM]
    theirs = [e for e in census.entries if e.term == "stochastic_recon"]
    assert mine and not any(e.part == "lm_head" for e in mine)
    head = sum(e.total for e in theirs if e.part == "lm_head")
    n, d, v = pd.batch_size * 16, TINY.hidden_size, TINY.vocab_size
    assert head == 2 * (2 * n * d * v) * 2  # two draws; forward and the input gradient
    assert sum(e.total for e in mine) == sum(e.total for e in theirs) - head
    assert sum(e.total for e in mine) > 0


BAD = [
    ({"coeff": -1.0}, "pd.loss_metrics[3].coeff: got -1.0; must be >= 0"),
    ({"n_samples": 0}, "pd.loss_metrics[3].n_samples: got 0; must be > 0"),
    ({"n_samples": 1.5}, "pd.loss_metrics[3].n_samples"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_fields_are_refused_by_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, message: str
) -> None:
    from pd_train.cli import main

    config = tiny_config(tmp_path, tmp_path / "cache")
    config["pd"]["loss_metrics"].append({"type": TERM, "coeff": 1.0, **change})
    assert main(["run", str(write_config(tmp_path, config, "bad.yaml"))]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- global sites
GLOBAL_CASES = {
    "embed_layer1_head": ("embed_tokens", "layers.1.*", "lm_head"),
    "layer1_head": ("layers.1.*", "lm_head"),
}


@pytest.mark.parametrize("case", list(GLOBAL_CASES))
def test_embedding_and_lm_head_sites_by_a_written_out_forward(case: str) -> None:
    """The embedding contributes its looked-up rows V[tokens] path vs W[tokens], the LM head its
    logits; layers before the first decomposed one are the clean model's (no embedding site:
    the pass starts at layer 1)."""
    from pd_train.config.pd import DecompositionTarget
    from pd_train.decomposition import build_decomposition

    c = 6
    dec = build_decomposition(
        TINY, [DecompositionTarget(module_pattern=p, C=c) for p in GLOBAL_CASES[case]]
    )
    spec = ForwardSpec(model=TINY, decomposition=dec)
    target, tokens = _target(), _tokens()
    rng = np.random.default_rng(3)
    b, t = tokens.shape
    comps, ci, sources = {}, {}, {}
    for k in dec.kinds:
        n = len(k.layers)
        comps[k.kind] = {
            "V": _f32(rng.standard_normal((n, k.d_in, c)) * 0.3),
            "U": _f32(rng.standard_normal((n, c, k.d_out)) * 0.3),
        }
        ci[k.kind] = _f32(rng.uniform(0, 1, (n, b, t, c)))
        sources[k.kind] = _f32(rng.uniform(0, 1, (n, b, t, c + 1)))
    sites = {(s.layer, s.kind): s for s in dec.sites}

    def live(kind: str, index: int, inner: jax.Array, xw: jax.Array) -> jax.Array:
        m = ci[kind][index] + (1 - ci[kind][index]) * sources[kind][index][..., :c]
        delta = sources[kind][index][..., c:]
        return ((inner * (m - delta)) @ comps[kind]["U"][index]) + delta * xw

    def outputs(masked: bool) -> list[jax.Array]:
        rec: list[jax.Array] = []
        rows = target["embed_tokens"][tokens]
        if "embed_tokens" in dec.kind_names:
            if masked:
                rows = live("embed_tokens", 0, comps["embed_tokens"]["V"][0][tokens], rows)
            rec.append(rows)
        h = rows
        cos, sin = llama.rope_cos_sin(TINY, t, jnp.float32)
        for layer in range(TINY.num_hidden_layers):

            def linear(kind: str, x: jax.Array, w: jax.Array, layer: int = layer) -> jax.Array:
                y = x @ w
                site = sites.get((layer, kind))
                if site is not None:
                    if masked:
                        y = live(kind, site.index, x @ comps[kind]["V"][site.index], y)
                    rec.append(y)
                return y

            layer_params = jax.tree.map(lambda a, i=layer: a[i], target["layers"])
            h = llama.decoder_layer(h, layer_params, cos, sin, TINY, linear)

        def head(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
            y = x @ w
            if masked:
                y = live("lm_head", 0, x @ comps["lm_head"]["V"][0], y)
            rec.append(y)
            return y

        llama.unembed(target, h, TINY, head)
        return rec

    clean_out, masked_out = outputs(False), outputs(True)
    want = sum(float(jnp.sum((m - cl) ** 2)) for m, cl in zip(masked_out, clean_out, strict=True))
    want /= sum(x.size for x in clean_out)
    got = jax.jit(
        lambda: hidden_acts_recon(
            spec,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            key=jax.random.key(0),
            sources=sources,
        )
    )()
    assert want > 0
    np.testing.assert_allclose(float(got), want, rtol=1e-5)
