"""The residual MLP's masked forward on a reduced stream (:meth:`ResidMLPTarget.reduced_stream`)
computes today's stream forward: outputs and every gradient (components, CI) agree within fp32
rounding on small models (1 and 2 layers, with and without biases, T = 1), for the all-site,
the one-site-a-chunk (layerwise) and the traced-liveness forwards, with and without routing;
the clean forward gives the CI the same x@V (values, CI pre-activations, gradients); and a few
train steps of the resid_mlp1 and resid_mlp2 recipes agree on every parameter. Tolerances: fp32
rounding of sums over d_embed taken in another order (rtol 1e-5 on outputs, 1e-4 on gradients
and params, atol a small fraction of each array's largest entry)."""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train._forward import ForwardSpec, masked_forward
from pd_train.config.pd import DecompositionTarget
from pd_train.decomposition import build_decomposition
from pd_train.targets.resid_mlp import ResidMLPConfig, ResidMLPTarget, resid_mlp_features

from ._tiny import FAST

F, D, M, C, B = 5, 40, 3, 6, 16


def _setup(n_layers: int, bias: bool) -> tuple[ForwardSpec, Any, Any, Any, jax.Array]:
    target = ResidMLPTarget(
        config=ResidMLPConfig(n_features=F, d_embed=D, d_mlp=M, n_layers=n_layers, bias=bias)
    )
    keys = jax.random.split(jax.random.key(0), 8)
    params = target.init_params(key=keys[0])
    if bias:
        params["layers"]["b_in"] = 0.3 * jax.random.normal(keys[1], (n_layers, M))
        params["layers"]["b_out"] = 0.1 * jax.random.normal(keys[2], (n_layers, D))
    d = build_decomposition(target, [DecompositionTarget(module_pattern="layers.*", C=C)])
    comps = {}
    for i, layout in enumerate(d.kinds):
        kv, ku = jax.random.split(keys[3 + i])
        comps[layout.kind] = {
            "V": jax.random.normal(kv, (n_layers, layout.d_in, C)) / layout.d_in**0.5,
            "U": jax.random.normal(ku, (n_layers, C, layout.d_out)) / C**0.5,
        }
    ci = {
        k.kind: jax.random.uniform(jax.random.fold_in(keys[5], i), (n_layers, B, 1, C))
        for i, k in enumerate(d.kinds)
    }
    x = resid_mlp_features(key=keys[6], batch_size=B, n_features=F, feature_probability=0.5)
    return ForwardSpec(model=target, decomposition=d), params, comps, ci, x


def _loss(spec: ForwardSpec, params: Any, x: jax.Array, live: Any, routed: Any) -> Any:
    def loss(comps: Any, ci: Any) -> tuple[jax.Array, jax.Array]:
        out = masked_forward(
            spec, target=params, tokens=x, components=comps, ci_lower=ci,
            live=live, routed=routed, key=jax.random.key(7),
        )  # fmt: skip
        return jnp.sum(jnp.sin(3.0 * out)), out

    # One compiled program instead of an op-by-op dispatch of each primitive (several times
    # faster on CPU); ``live`` stays what it was (a numpy array static, a jax array traced).
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True), compiler_options=FAST)


def _lives(n_layers: int) -> list[tuple[str, Any]]:
    full = np.ones((n_layers, 2), bool)
    one = np.zeros((n_layers, 2), bool)
    one[n_layers - 1, 0] = True  # one site a chunk (layerwise): the last layer's mlp_in
    first_out = np.zeros((n_layers, 2), bool)
    first_out[0, 1] = True
    return [
        ("all", full),
        ("one_site", one),
        ("first_mlp_out", first_out),
        ("traced", jnp.asarray(one | first_out)),
    ]


@pytest.mark.parametrize("use_delta", [True, False])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n_layers", [1, 2])
def test_reduced_stream_masked_forward_and_gradients(
    n_layers: int, bias: bool, use_delta: bool
) -> None:
    spec, params, comps, ci, x = _setup(n_layers, bias)
    spec = attrs.evolve(spec, use_delta=use_delta)
    stream = attrs.evolve(spec, reduce_stream="never")
    reduced = attrs.evolve(spec, reduce_stream="always")
    assert spec.target.reduced_stream(params, comps, force=True) is not None
    routed = jax.random.bernoulli(jax.random.key(9), 0.7, (n_layers, 2, B, 1))
    for name, live in _lives(n_layers):
        for r in (None, routed) if name in ("all", "traced") else (None,):
            (want, want_out), want_g = _loss(stream, params, x, live, r)(comps, ci)
            (got, got_out), got_g = _loss(reduced, params, x, live, r)(comps, ci)
            assert want_out.shape == got_out.shape == (B, 1, F)
            np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=2e-6, err_msg=name)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
            flat_w, tree_w = jax.tree_util.tree_flatten(want_g)
            flat_g, tree_g = jax.tree_util.tree_flatten(got_g)
            assert tree_w == tree_g
            for a, b in zip(flat_g, flat_w, strict=True):
                scale = float(jnp.max(jnp.abs(b))) + 1e-12
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * scale, err_msg=name)


@pytest.mark.parametrize("name", ["resid_mlp1", "resid_mlp2"])
def test_reduced_stream_train_steps_match(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three steps of the toy's recipe (the shipped d_embed-1000 target, batch 16, C 20, no
    warmup): stochastic recon, layerwise recon and importance minimality through the reduced
    stream give the stream forward's params (components and CI MLPs) within fp32 rounding."""
    from pd_train.config.pd import FaithfulnessWarmup
    from pd_train.targets.toys import (
        decompose,
        make_target,
        toy_compiler_options,
        toy_config,
        toy_weights,
    )
    from pd_train.train import Trainer

    toy = toy_config(name)
    pd = attrs.evolve(
        toy.pd,
        steps=3,
        batch_size=16,
        faithfulness_warmup=FaithfulnessWarmup(steps=0),
        decomposition_targets=tuple(attrs.evolve(t, C=20) for t in toy.pd.decomposition_targets),
    )
    target = make_target(toy)
    weights = jax.tree_util.tree_map(jnp.asarray, toy_weights(name))
    calls = []
    original = ResidMLPTarget.reduced_stream

    def counted(self: ResidMLPTarget, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(ResidMLPTarget, "reduced_stream", counted)
    finals = {}
    for mode in ("never", "always"):
        # The toy trainer's options, and unoptimized XLA code (compiles faster).
        trainer = Trainer(target, pd, compiler_options={**toy_compiler_options(), **FAST})
        trainer.forward_spec = attrs.evolve(trainer.forward_spec, reduce_stream=mode)
        calls.clear()
        _, state = decompose(
            target, weights, pd, seed=0, feature_probability=toy.feature_probability,
            trainer=trainer,
        )  # fmt: skip
        assert (mode == "always") == (bool(calls) and all(calls)), (mode, calls)
        finals[mode] = jax.tree_util.tree_map(np.asarray, state.params)
    flat_s, _ = jax.tree_util.tree_flatten_with_path(finals["never"])
    flat_r = jax.tree_util.tree_leaves(finals["always"])
    assert len(flat_s) == len(flat_r)
    moved = 0.0
    # Three Adam steps divide each gradient element by its running RMS, so an element whose
    # gradient is near zero carries its rounding into the params at the size of a step: with
    # the paper's faithfulness term and no delta component one of resid_mlp1's CI biases ends
    # 2.4e-5 of its leaf's scale apart (below 4e-6 with the delta component). The gradients
    # themselves agree to 1e-5 both ways (test_reduced_stream_masked_forward_and_gradients).
    for (path, want), got in zip(flat_s, flat_r, strict=True):
        scale = float(np.max(np.abs(want))) + 1e-12
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=5e-5 * scale, err_msg=str(path))
        moved = max(moved, scale)
    assert moved > 0


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n_layers", [1, 2])
def test_reduced_stream_clean_run_gives_the_ci_the_same_inputs(n_layers: int, bias: bool) -> None:
    """The clean forward on the reduced stream (a CI reading x@V only: ``pd.ci.type: mlp``):
    the same output, stream, CI pre-activations and gradients (CI params and V)."""
    from pd_train._forward import CleanRunner
    from pd_train.ci.mlp import MLPCIFunction

    spec, params, comps, _, x = _setup(n_layers, bias)
    fn = MLPCIFunction(hidden_dims=(4,))
    ci_params = {}
    for layout in spec.decomposition.kinds:
        specs = fn.param_specs(layout)
        ci_params[layout.kind] = {
            k: 0.5 * jax.random.normal(jax.random.key(i), (n_layers, *v.shape))
            for i, (k, v) in enumerate(specs.items())
        }

    def run(mode: str, ci_params: Any, comps: Any) -> tuple[jax.Array, Any]:
        clean = CleanRunner(attrs.evolve(spec, reduce_stream=mode), params, x, ci_reads_inner=True)
        out, pre = fn.causal_importance(ci_params, comps, clean)
        return jnp.sum(jnp.sin(sum(jnp.sum(jnp.cos(v)) for v in pre.values()))), (
            out, pre, clean.stream,
        )  # fmt: skip

    grad = jax.jit(
        jax.value_and_grad(run, argnums=(1, 2), has_aux=True),
        static_argnums=0,
        compiler_options=FAST,
    )
    (_, want), want_g = grad("never", ci_params, comps)
    (_, got), got_g = grad("always", ci_params, comps)
    assert want[2].shape == got[2].shape == (n_layers + 1, B, 1, D)
    for a, b in zip(
        jax.tree_util.tree_leaves((got, got_g)),
        jax.tree_util.tree_leaves((want, want_g)),
        strict=True,
    ):
        scale = float(jnp.max(jnp.abs(b))) + 1e-12
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5 * scale)
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree_util.tree_leaves(got_g))


def test_auto_reduces_only_where_the_basis_is_narrow() -> None:
    """``auto`` (``force=False``): resid_mlp1's recipe (C 100: R = 100 + 100 + 50 = 250 of 1000)
    is reduced, resid_mlp2's (C 400: R = 100 + 2·(400 + 25) = 950) is not; the clean forward's
    basis has no component slots (R = 100 + L·d_mlp); a decomposition of some layers only is
    never reduced."""
    from pd_train.targets.toys import make_target, toy_config, toy_weights

    for name, c_out, want in [("resid_mlp1", 100, 250), ("resid_mlp2", 400, None)]:
        toy = toy_config(name)
        target = make_target(toy)
        cfg = target.config
        params = jax.tree_util.tree_map(jnp.asarray, toy_weights(name))
        comps = {
            "mlp_in": {
                "V": jnp.zeros((cfg.n_layers, cfg.d_embed, c_out)),
                "U": jnp.zeros((cfg.n_layers, c_out, cfg.d_mlp)),
            },
            "mlp_out": {
                "V": jnp.zeros((cfg.n_layers, cfg.d_mlp, c_out)),
                "U": jnp.zeros((cfg.n_layers, c_out, cfg.d_embed)),
            },
        }
        out = target.reduced_stream(params, comps, force=False)
        assert (None if out is None else out[0].config.d_embed) == want, name
        clean = target.reduced_stream(params, None, force=False)
        assert clean is not None and clean[0].config.d_embed == 100 + cfg.n_layers * cfg.d_mlp
        assert clean[1]["basis"].shape == (100 + cfg.n_layers * cfg.d_mlp, cfg.d_embed)
        partial = {k: {n: a[:0] for n, a in v.items()} for k, v in comps.items()}
        assert target.reduced_stream(params, partial, force=True) is None


@pytest.mark.parametrize("bias", [False, True])
def test_a_layer_s_basis_products_form_only_the_rows_its_input_holds(bias: bool) -> None:
    """Layer l's input holds coefficients on E's rows and on the slots of layers < l only, so
    its reduced mlp_in weights (basis·W_in[l], basis·V_in[l]) are those rows' products and
    exact zeros after them; the read-off is every row's product with Eᵀ. Without the causal
    rows, the last layer's U_out would reach mlp_in's reduced weights (a gradient that the
    forward multiplies by zero coefficients, computed for nothing)."""
    n_layers = 3
    spec, params, comps, _, _ = _setup(n_layers, bias)
    target = spec.target
    reduced, rparams, rcomps = target.reduced_stream(params, comps, force=True)
    slot = C + M + (1 if bias else 0)
    width = F + n_layers * slot
    assert reduced.config.d_embed == width
    basis = np.asarray(rparams["basis"])
    for name, got, w in [
        ("W_in", rparams["layers"]["mlp_in"], params["layers"]["mlp_in"]),
        ("V_in", rcomps["mlp_in"]["V"], comps["mlp_in"]["V"]),
    ]:
        for layer in range(n_layers):
            seen = F + layer * slot
            want = basis[:seen] @ np.asarray(w[layer])
            np.testing.assert_allclose(got[layer, :seen], want, rtol=1e-5, atol=1e-6, err_msg=name)
            assert not np.any(np.asarray(got[layer, seen:])), (name, layer)
    want_read = basis @ np.asarray(params["embed"]).T
    np.testing.assert_allclose(rparams["read"], want_read, rtol=1e-5, atol=1e-6)

    def into_mlp_in(u_out: jax.Array) -> jax.Array:
        c = {**comps, "mlp_out": {**comps["mlp_out"], "U": u_out}}
        _, p, rc = target.reduced_stream(params, c, force=True)
        return jnp.sum(p["layers"]["mlp_in"]) + jnp.sum(rc["mlp_in"]["V"])

    grad = np.asarray(jax.grad(into_mlp_in)(comps["mlp_out"]["U"]))
    assert np.any(grad[: n_layers - 1]) and not np.any(grad[n_layers - 1])
