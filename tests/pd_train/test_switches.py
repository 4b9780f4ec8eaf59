"""Switches of issue 28 item 5: the delta component off, a rounding threshold apart from the L0
threshold. Each checked against a forward written out layer by layer in Python."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train._forward import CleanRunner, site_id
from pd_train.evaluate import batch_metrics
from pd_train.models import llama
from pd_train.sources import sample_source
from pd_train.squash import lower_leaky_hard
from pd_train.train import Trainer

from ._cli import tiny_config, write_config
from ._evaluate import THRESHOLD, TINY, _kl, _setup
from ._tiny import FAST

ROUNDING = 0.5


@functools.cache
def _no_delta() -> tuple[Trainer, Any, Any, jax.Array]:
    base, params, target, batches = _setup()
    pd = attrs.evolve(base.pd, use_delta_component=False, rounding_threshold=ROUNDING)
    trainer = Trainer(TINY, pd, mesh=base.mesh, compiler_options=FAST)
    tokens = jnp.asarray(batches.batch(0).astype(np.int32))
    return trainer, params, target, tokens


def _reference(trainer: Trainer, params: Any, target: Any, tokens: jax.Array, key: jax.Array):
    """{mask: logits} for ``stochastic`` and ``rounded`` with the site output ((x@V)·m)@U: no
    delta term; the stochastic source has C channels, m = ci + (1 − ci)·r."""
    model = trainer.model
    comps = params["components"]
    clean = CleanRunner(trainer.forward_spec, target, tokens)
    _, pre = trainer.ci_fn.causal_importance(params["ci_fn"], comps, clean)
    ci_lower = {k: lower_leaky_hard(v) for k, v in pre.items()}
    sites = {(s.layer, s.kind): s for s in trainer.decomposition.sites}
    cos, sin = llama.rope_cos_sin(model, tokens.shape[1], jnp.float32)

    def mask_of(mask: str, ci: jax.Array, layer: int, kind: str) -> jax.Array:
        if mask == "rounded":
            return (ci > ROUNDING).astype(ci.dtype)
        r = sample_source(
            trainer.pd.sampling, ci.shape, key=jax.random.fold_in(key, site_id(layer, kind))
        )
        return ci + (1 - ci) * r

    out = {"clean": llama.forward(target, tokens, model)}
    for mask in ("stochastic", "rounded"):
        h = llama.embed(target, tokens)
        for layer in range(model.num_hidden_layers):

            def linear(kind: str, x: jax.Array, w: jax.Array, layer=layer, mask=mask):
                site = sites.get((layer, kind))
                if site is None:
                    return x @ w
                v, u = comps[kind]["V"][site.index], comps[kind]["U"][site.index]
                return ((x @ v) * mask_of(mask, ci_lower[kind][site.index], layer, kind)) @ u

            layer_params = jax.tree.map(lambda a, i=layer: a[i], target["layers"])
            h = llama.decoder_layer(h, layer_params, cos, sin, model, linear)
        out[mask] = llama.unembed(target, h, model)
    return out, ci_lower


@pytest.mark.slow
def test_delta_off_and_the_rounding_threshold_match_a_written_out_forward() -> None:
    trainer, params, target, tokens = _no_delta()
    key = jax.random.key(7)
    record = jax.jit(batch_metrics, static_argnums=0, compiler_options=FAST)(
        trainer, params, target, tokens, key
    )
    ref, ci_lower = jax.jit(_reference, static_argnums=0, compiler_options=FAST)(
        trainer, params, target, tokens, key
    )
    clean = np.asarray(ref["clean"], np.float64)
    for mask in ("stochastic", "rounded"):
        want = _kl(clean, np.asarray(ref[mask], np.float64))
        got = float(record[f"eval/kl_{mask}"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=mask)
    # L0 still counts at l0_threshold (0.1), not at the rounding threshold (0.5).
    for kind, ci in ci_lower.items():
        ci = np.asarray(ci)
        want = (ci > THRESHOLD).sum(-1).mean(axis=(1, 2))
        np.testing.assert_allclose(np.asarray(record["l0"][kind]), want, rtol=1e-6)
        assert not np.allclose(want, (ci > ROUNDING).sum(-1).mean(axis=(1, 2)))
    # The delta really is off: the same params with it on give another stochastic KL.
    base, *_ = _setup()
    with_delta = jax.jit(batch_metrics, static_argnums=0, compiler_options=FAST)(
        base, params, target, tokens, key
    )
    assert abs(float(with_delta["eval/kl_stochastic"]) - float(record["eval/kl_stochastic"])) > 1e-4


def test_a_train_step_runs_without_the_delta_component() -> None:
    trainer, params, target, tokens = _no_delta()
    from pd_train.config.pd import StochasticRecon

    pd = attrs.evolve(trainer.pd, loss_metrics=(StochasticRecon(coeff=1.0),), steps=2)
    on = Trainer(TINY, attrs.evolve(pd, use_delta_component=True), compiler_options=FAST)
    off = Trainer(TINY, pd, compiler_options=FAST)
    key = jax.random.key(3)
    values = {}
    for name, t in (("on", on), ("off", off)):
        total, _ = jax.jit(t.loss, compiler_options=FAST)(params, target, tokens, jnp.int32(0), key)
        values[name] = float(total)
    assert np.isfinite(values["off"]) and values["off"] > 0
    assert values["off"] != pytest.approx(values["on"], rel=1e-4)


BAD = [
    ({"rounding_threshold": 1.5}, "pd.rounding_threshold: got 1.5; must be in [0.0, 1.0)"),
    ({"rounding_threshold": -0.1}, "pd.rounding_threshold: got -0.1; must be in [0.0, 1.0)"),
    ({"use_delta_component": "maybe"}, "pd.use_delta_component"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_switch_values_are_refused_by_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, message: str
) -> None:
    from pd_train.cli import main

    config = tiny_config(tmp_path, tmp_path / "cache", **change)
    assert main(["run", str(write_config(tmp_path, config, "bad.yaml"))]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()


def test_terms_of_one_type_report_under_their_names() -> None:
    from pd_train.config.pd import ChunkwiseSubsetRecon, StochasticRecon

    trainer, params, target, tokens = _no_delta()
    terms = (
        StochasticRecon(coeff=1.0),
        ChunkwiseSubsetRecon(coeff=0.5, sites_per_chunk=1, name="layerwise"),
        ChunkwiseSubsetRecon(coeff=2.0, sites_per_chunk=2, name="chunked"),
    )
    pd = attrs.evolve(trainer.pd, loss_metrics=terms, use_delta_component=True)
    named = Trainer(TINY, pd, compiler_options=FAST)
    total, aux = jax.jit(named.loss, compiler_options=FAST)(
        params, target, tokens, jnp.int32(0), jax.random.key(3)
    )
    values = {k: float(v) for k, v in aux["terms"].items()}
    assert sorted(values) == ["chunked", "layerwise", "stochastic_recon"]
    assert all(v > 0 for v in values.values())
    assert values["layerwise"] != pytest.approx(values["chunked"], rel=1e-4)
    want = values["stochastic_recon"] + 0.5 * values["layerwise"] + 2.0 * values["chunked"]
    assert float(total) == pytest.approx(want, rel=1e-6)


CHUNKED = {"type": "chunkwise_subset_recon", "coeff": 1.0, "sites_per_chunk": 2}
BAD_NAMES = [
    (
        [CHUNKED, CHUNKED],
        "pd.loss_metrics[4].type: type 'chunkwise_subset_recon' appears twice (also at"
        " pd.loss_metrics[3]) without a name",
    ),
    (
        [{**CHUNKED, "name": "sub"}, {**CHUNKED, "name": "sub"}],
        "pd.loss_metrics[4].name: got 'sub', also the metric name of pd.loss_metrics[3]",
    ),
    (
        [{**CHUNKED, "name": "stochastic_recon"}],
        "pd.loss_metrics[3].name: got 'stochastic_recon', also the metric name of"
        " pd.loss_metrics[2]",
    ),
    ([{**CHUNKED, "name": "a b"}], "pd.loss_metrics[3].name: got 'a b'; must be a non-empty"),
    ([{**CHUNKED, "name": ""}], "pd.loss_metrics[3].name: got ''; must be a non-empty"),
]


@pytest.mark.parametrize(("extra", "message"), BAD_NAMES, ids=[str(i) for i in range(5)])
def test_repeated_terms_need_distinct_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list, message: str
) -> None:
    from pd_train.cli import main

    config = tiny_config(tmp_path, tmp_path / "cache")
    config["pd"]["loss_metrics"].extend(extra)
    assert main(["run", str(write_config(tmp_path, config, "bad.yaml"))]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()


def _single_term_loss(term: Any) -> float:
    trainer, params, target, tokens = _no_delta()
    pd = attrs.evolve(trainer.pd, loss_metrics=(term,), use_delta_component=True)
    t = Trainer(TINY, pd, compiler_options=FAST)
    total, _ = jax.jit(t.loss, compiler_options=FAST)(
        params, target, tokens, jnp.int32(0), jax.random.key(3)
    )
    return float(total)


def test_static_probability_routing_at_its_ends() -> None:
    from pd_train.config.pd import StaticProbabilitySubsetRecon, StochasticRecon

    every = _single_term_loss(StochasticRecon(coeff=1.0))
    # p = 1: every site routed everywhere, the same draw keys: the stochastic recon's value.
    assert _single_term_loss(StaticProbabilitySubsetRecon(coeff=1.0, p=1.0)) == pytest.approx(
        every, rel=1e-6
    )
    # p = 0: every site frozen: the clean forward, KL 0.
    assert _single_term_loss(StaticProbabilitySubsetRecon(coeff=1.0, p=0.0)) == pytest.approx(
        0.0, abs=1e-6
    )
    half = _single_term_loss(StaticProbabilitySubsetRecon(coeff=1.0, p=0.5, sites_per_chunk=2))
    assert 0 < half < every


def test_static_probability_routes_each_live_site_with_probability_p() -> None:
    from pd_train.losses.recon import _static_routing

    grid = np.array([[0, -1], [1, 2], [-1, 3]], np.int32)  # 3 layers, 2 kinds, 4 sites
    site_mask = np.array([True, True, False, True])
    routed = np.asarray(
        _static_routing(site_mask, 0.3, (64, 256), grid, jax.random.key(0))
    )  # [L, K, B, T]
    assert routed.shape == (3, 2, 64, 256)
    assert not routed[0, 1].any() and not routed[2, 0].any()  # no site there
    assert not routed[1, 1].any()  # site 2 is not live in this chunk
    n = 64 * 256
    for layer, kind in ((0, 0), (1, 0), (2, 1)):
        frac = routed[layer, kind].mean()
        assert abs(frac - 0.3) < 4 * math.sqrt(0.3 * 0.7 / n), frac
    # Sites are routed independently: the joint rate is p² (not p, as one shared draw gives).
    both = (routed[0, 0] & routed[1, 0]).mean()
    assert abs(both - 0.09) < 4 * math.sqrt(0.09 * 0.91 / n), both


BAD_STATIC = [
    ({"p": 1.5}, "pd.loss_metrics[3].p: got 1.5; must be in [0.0, 1.0]"),
    ({"p": -0.5}, "pd.loss_metrics[3].p: got -0.5; must be in [0.0, 1.0]"),
    ({"sites_per_chunk": 0}, "pd.loss_metrics[3].sites_per_chunk: got 0; must be > 0"),
    ({"n_samples": 0}, "pd.loss_metrics[3].n_samples: got 0; must be > 0"),
    ({"coeff": -1.0}, "pd.loss_metrics[3].coeff: got -1.0; must be >= 0"),
]


@pytest.mark.parametrize(("change", "message"), BAD_STATIC, ids=[m[:22] for _, m in BAD_STATIC])
def test_bad_static_probability_fields_are_refused_by_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, message: str
) -> None:
    from pd_train.cli import main

    config = tiny_config(tmp_path, tmp_path / "cache")
    term = {"type": "static_probability_subset_recon", "coeff": 1.0, "p": 0.5, **change}
    config["pd"]["loss_metrics"].append(term)
    assert main(["run", str(write_config(tmp_path, config, "bad.yaml"))]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()


def test_ci_masked_and_unmasked_recon_as_training_terms_match_a_written_out_forward() -> None:
    from pd_train.config.pd import CIMaskedRecon, UnmaskedRecon

    from ._evaluate import _reference_logits

    base, params, target, batches = _setup()
    tokens = jnp.asarray(batches.batch(0).astype(np.int32))
    pd = attrs.evolve(base.pd, loss_metrics=(CIMaskedRecon(coeff=1.0), UnmaskedRecon(coeff=2.0)))
    trainer = Trainer(TINY, pd, compiler_options=FAST)
    key = jax.random.key(3)

    def loss(params: Any) -> Any:
        return trainer.loss(params, target, tokens, jnp.int32(0), key)

    (total, aux), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    ref = _reference_logits(base, params, target, tokens, key)
    clean = np.asarray(ref["clean"], np.float64)
    want_ci = _kl(clean, np.asarray(ref["ci"], np.float64))
    want_ones = _kl(clean, np.asarray(ref["ones"], np.float64))
    np.testing.assert_allclose(float(aux["terms"]["ci_masked_recon"]), want_ci, rtol=1e-5)
    np.testing.assert_allclose(float(aux["terms"]["unmasked_recon"]), want_ones, rtol=1e-5)
    assert float(total) == pytest.approx(want_ci + 2.0 * want_ones, rel=1e-5)
    assert want_ci > 0 and want_ones > 0 and abs(want_ci - want_ones) > 1e-4
    # Only the CI-masked term reaches the CI function.
    ci_grad = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads["ci_fn"]))
    assert ci_grad > 0
    pd_ones = attrs.evolve(base.pd, loss_metrics=(UnmaskedRecon(coeff=1.0),))
    ones_only = Trainer(TINY, pd_ones, compiler_options=FAST)
    g = jax.jit(jax.grad(lambda p: ones_only.loss(p, target, tokens, jnp.int32(0), key)[0]))(params)
    assert all(float(jnp.max(jnp.abs(x))) == 0 for x in jax.tree.leaves(g["ci_fn"]))


@pytest.mark.parametrize("kind", ["ci_masked_recon", "unmasked_recon"])
def test_bad_fixed_mask_recon_coeff_is_refused_by_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    from pd_train.cli import main

    config = tiny_config(tmp_path, tmp_path / "cache")
    config["pd"]["loss_metrics"].append({"type": kind, "coeff": -2.0})
    assert main(["run", str(write_config(tmp_path, config, "bad.yaml"))]) == 2
    err = capsys.readouterr().err
    assert "pd.loss_metrics[3].coeff: got -2.0; must be >= 0" in err, err
