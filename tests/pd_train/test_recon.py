"""Masked forwards and recon plans: the component path by hand, routing, scan vs unroll."""

from __future__ import annotations

import functools

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train._forward import CleanRunner, masked_forward, site_id
from pd_train.losses.recon import _routing, all_sites_plan, chunkwise_plan, recon_loss
from pd_train.models import llama
from pd_train.sources import masks, sample_source

from ._recon import DEC, MODEL, SPEC, B, T, _chi2, _data


def test_routing_draws_k_and_the_subset_per_position() -> None:
    """spd's uniform-k routing: at every position independently k ~ U{1..n_live}, then a
    uniformly random k-subset of the live sites. 200 draws × 64 positions."""
    mask = jnp.asarray(np.array([0, 1, 1, 0, 1, 1, 1, 0], bool))
    draws = jax.jit(jax.vmap(lambda k: _routing(mask, jnp.int32(5), (64,), key=k)))(
        jax.random.split(jax.random.key(0), 200)
    )
    draws = np.asarray(draws).reshape(-1, 8)  # [12800 positions, 8 sites]
    assert not draws[:, ~np.asarray(mask)].any()
    k = draws.sum(-1)
    # k differs between the positions of one draw (a per-draw k would make these all equal).
    per_draw = k.reshape(200, 64)
    assert (per_draw != per_draw[:, :1]).any(axis=1).all()
    # k uniform on 1..5: chi-square with 4 degrees of freedom, p = 0.001 critical value 18.47.
    counts = np.bincount(k, minlength=6)
    assert counts[0] == 0
    assert _chi2(counts[1:]) < 18.47, counts
    # Given k = 2, each of the C(5, 2) = 10 subsets equally likely (9 dof: 27.88).
    live = np.flatnonzero(np.asarray(mask))
    pairs = draws[k == 2][:, live]
    codes = pairs @ (1 << np.arange(5))
    subset_counts = np.array([np.sum(codes == c) for c in np.unique(codes)])
    assert subset_counts.size == 10
    assert _chi2(subset_counts) < 27.88, subset_counts
    # Each live site is routed at a position with probability E[k]/5 = 3/5.
    np.testing.assert_allclose(draws[:, live].mean(0), 0.6, atol=0.03)


def test_no_live_site_gives_the_target_forward() -> None:
    target, comps, ci, tokens = _data()
    live = jnp.zeros((MODEL.num_hidden_layers, len(DEC.kinds)), bool)
    got = jax.jit(
        lambda: masked_forward(
            SPEC,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            live=live,
            routed=None,
            key=jax.random.key(1),
        )
    )()
    want = jax.jit(llama.forward, static_argnums=2)(target, tokens, MODEL)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)

    def clean_run() -> tuple:
        clean = CleanRunner(SPEC, target, tokens)
        logits, _ = clean.run(lambda kind, x, xs: None, {})
        return logits, clean.stream

    logits, stream = jax.jit(clean_run)()
    np.testing.assert_allclose(np.asarray(logits), np.asarray(want), atol=1e-5)
    h0 = np.asarray(llama.embed(target, tokens))
    assert stream.shape == (MODEL.num_hidden_layers + 1, B, T, MODEL.hidden_size)
    np.testing.assert_array_equal(np.asarray(stream[0]), h0)


@pytest.mark.parametrize("sampling", ["continuous", "binomial"])
def test_one_live_site_matches_the_delta_formula_by_hand(sampling: str) -> None:
    """Live site layers.1.mlp.down_proj routes half its positions; the rest of the model is frozen.
    The hand version uses ((x@V)·m)@U + δ·(x@(W − V@U)), the other form of the site output."""
    target, comps, ci, tokens = _data()
    spec = attrs.evolve(SPEC, sampling=sampling)
    kinds = DEC.kind_names
    live = np.zeros((2, len(kinds)), bool)
    live[1, kinds.index("down_proj")] = True
    routed = np.zeros((2, len(kinds), B, T), bool)
    routed[1, kinds.index("down_proj")] = (
        np.random.default_rng(1).integers(0, 2, (B, T)).astype(bool)
    )
    key = jax.random.key(7)

    def forward() -> jax.Array:
        stream = None
        if sampling == "binomial":  # also: layer 0 copies the clean stream instead of running
            clean = CleanRunner(spec, target, tokens)
            clean.run(lambda kind, x, xs: None, {})
            stream = clean.stream
        return masked_forward(
            spec,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            live=jnp.asarray(live),
            routed=jnp.asarray(routed),
            key=key,
            clean_stream=stream,
        )

    got = jax.jit(forward)()

    def by_hand() -> jax.Array:
        h = llama.embed(target, tokens)
        cos, sin = llama.rope_cos_sin(MODEL, T, h.dtype)
        for layer in range(2):
            lp = {k: v[layer] for k, v in target["layers"].items()}

            def linear(kind: str, x: jax.Array, w: jax.Array, layer: int = layer) -> jax.Array:
                if (layer, kind) != (1, "down_proj"):
                    return x @ w
                slot = DEC.kind("down_proj").slot(1)
                v, u = comps["down_proj"]["V"][slot], comps["down_proj"]["U"][slot]
                c = v.shape[1]
                r = sample_source(
                    sampling, (B, T, c + 1), key=jax.random.fold_in(key, site_id(1, "down_proj"))
                )
                m, delta = masks(ci["down_proj"][slot], r)
                out = ((x @ v) * m) @ u + delta[..., None] * (x @ (w - v @ u))
                route = jnp.asarray(routed[1, kinds.index("down_proj")])
                return jnp.where(route[..., None], out, x @ w)

            h = llama.decoder_layer(h, lp, cos, sin, MODEL, linear)
        return llama.unembed(target, h, MODEL)

    want = jax.jit(by_hand)()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=2e-5)
    frozen = jax.jit(llama.forward, static_argnums=2)(target, tokens, MODEL)
    assert not np.allclose(np.asarray(got), np.asarray(frozen), atol=1e-3)


# Only the LLVM optimization level differs from the default: compiles ~2x faster on CPU, same HLO.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


@functools.cache
def _loss_and_grads(
    n_chunks: int, *, chunk_unroll: bool, layer_unroll: bool = False, remat: bool = False
) -> tuple:
    target, comps, ci, tokens = _data()
    plan = chunkwise_plan(DEC, 8 // n_chunks)
    assert plan.n_chunks == n_chunks
    spec = attrs.evolve(SPEC, layer_unroll=layer_unroll, remat_layers=remat)

    def loss(comps: dict, ci: dict) -> jax.Array:
        # The clean run gives the logits and the stream the masked forwards copy up to their
        # first live layer (a traced switch in the scan, a static start in the unrolled loop).
        clean = CleanRunner(spec, target, tokens)
        logits, _ = clean.run(lambda kind, x, xs: None, {})
        return recon_loss(
            spec,
            plan,
            n_samples=2 if n_chunks == 1 else 1,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            clean_logits=logits,
            clean_stream=clean.stream,
            key=jax.random.key(3),
            unroll=chunk_unroll,
            remat=remat,
        )

    grad_fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)), compiler_options=FAST_COMPILE)
    value, grads = grad_fn(comps, ci)
    return float(value), jax.device_get(grads)


def _assert_same(a: tuple, b: tuple) -> None:
    assert a[0] == pytest.approx(b[0], rel=1e-6, abs=1e-7)
    flat_a, flat_b = jax.tree_util.tree_leaves(a[1]), jax.tree_util.tree_leaves(b[1])
    assert len(flat_a) == len(flat_b)
    for x, y in zip(flat_a, flat_b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    assert any(np.abs(x).max() > 0 for x in flat_a)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("n_chunks", "layer_unroll", "remat"),
    [(1, False, True), (4, True, False), (8, False, False)],
    ids=["1-chunk-unroll-rematerialized", "4-chunks-layers-unrolled-too", "8-chunks"],
)
def test_scan_and_unroll_give_equal_loss_and_grads(
    n_chunks: int, layer_unroll: bool, remat: bool
) -> None:
    """Scan: chunk and layer loops are scans, each layer picks copy/frozen/live with a switch.
    Unroll: every chunk traced on its own with static liveness (at 4 chunks the layer loop
    unrolled as well; at 1 chunk under ``runtime.remat.recon``), so the two share no control
    flow."""
    scanned = _loss_and_grads(n_chunks, chunk_unroll=False)
    unrolled = _loss_and_grads(n_chunks, chunk_unroll=True, layer_unroll=layer_unroll, remat=remat)
    assert scanned[0] > 0
    _assert_same(scanned, unrolled)


def test_stochastic_plan_is_one_chunk_of_every_site() -> None:
    plan = all_sites_plan(DEC)
    assert plan.chunks == (tuple(range(8)),) and plan.routing == "all"
    four = chunkwise_plan(DEC, 3)
    assert four.chunks == ((0, 1, 2), (3, 4, 5), (6, 7))
    assert four.n_live().tolist() == [3, 3, 2]
