"""Layer-aligned recon chunks: each chunk reads its own window of the CI, and the chunk loop's
backward (pd_train.losses.chunk_vjp) starts its accumulators from the term's forward value, not
from constant zeros that XLA may allocate at the start of the step (docs/findings.md section 8:
one CI-sized buffer, 4.75 GiB per device, less at the production topology's peak)."""

from __future__ import annotations

from typing import Any

import attrs
import jax
import numpy as np
import pytest
from jax.extend.core import Literal

import pd_train.losses.recon as recon_module
from pd_train._forward import CleanRunner
from pd_train.losses import all_sites_plan, chunkwise_plan, recon_loss
from pd_train.losses.recon import layer_windows

from ._hlo import _entry_constant_shapes
from ._recon import DEC, SPEC, B, T, _data
from ._tiny import FAST


def _grad_fn(sites_per_chunk: int) -> tuple[Any, Any, Any]:
    target, comps, ci, tokens = _data()
    plan = chunkwise_plan(DEC, sites_per_chunk)

    def loss(comps: dict, ci: dict) -> jax.Array:
        clean = CleanRunner(SPEC, target, tokens)
        logits, _ = clean.run(lambda kind, x, xs: None, {})
        return recon_loss(
            SPEC,
            plan,
            n_samples=1,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            clean_logits=logits,
            clean_stream=clean.stream,
            key=jax.random.key(3),
            remat=True,
        )

    return jax.value_and_grad(loss, argnums=(0, 1)), comps, ci


def _constant_broadcast_shapes(jaxpr: Any) -> set[tuple[int, ...]]:
    """Shapes of every broadcast of a literal (constant zeros), nested jaxprs included except
    the bodies of while loops (their buffers exist only while the loop runs)."""
    out = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "broadcast_in_dim" and isinstance(eqn.invars[0], Literal):
            out.add(tuple(eqn.outvars[0].aval.shape))
        if eqn.primitive.name == "while":
            continue
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's Jaxpr
                if hasattr(sub, "eqns"):
                    out |= _constant_broadcast_shapes(sub)
    return out


def test_layer_windows_of_plans() -> None:
    assert layer_windows(DEC, chunkwise_plan(DEC, 4)) == 1  # 4 sites a layer, 2 layers
    assert layer_windows(DEC, chunkwise_plan(DEC, 8)) == 2  # one chunk of both layers
    assert layer_windows(DEC, chunkwise_plan(DEC, 2)) is None  # chunks cut a layer
    assert layer_windows(DEC, chunkwise_plan(DEC, 3)) is None


def test_the_backward_starts_no_all_sites_ci_buffer_from_constant_zeros(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The chunk loop's CI-gradient accumulator (a kind's whole CI stack, or every chunk's
    window) is not a broadcast of a constant: before, JAX's transposed scan started it so."""
    grad, comps, ci = _grad_fn(4)
    all_ci = {tuple(c.shape) for c in ci.values()}
    stacked = {(2, 1, *c.shape[1:]) for c in ci.values()}
    got = _constant_broadcast_shapes(jax.make_jaxpr(grad)(comps, ci).jaxpr)
    assert not got & (all_ci | stacked)
    monkeypatch.setattr(recon_module, "layer_windows", lambda *a: None)
    grad, comps, ci = _grad_fn(4)
    before = _constant_broadcast_shapes(jax.make_jaxpr(grad)(comps, ci).jaxpr)
    assert before & all_ci  # the transposed scan's carry: what this test guards against


def test_windowed_chunks_equal_the_chunks_over_all_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exactly the loss and gradients (components and CI) of the scan over the whole CI."""
    grad, comps, ci = _grad_fn(4)
    got = jax.jit(grad, compiler_options=FAST)(comps, ci)
    monkeypatch.setattr(recon_module, "layer_windows", lambda *a: None)
    grad, comps, ci = _grad_fn(4)
    want = jax.jit(grad, compiler_options=FAST)(comps, ci)
    assert float(got[0]) > 0.0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert all(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(got[1][1]))


def _one_chunk_grad_fn() -> tuple[Any, Any, Any, Any]:
    """The persistent-PGD term's shape: one all-sites (chunk, draw) with given sources."""
    target, comps, ci, tokens = _data()
    rng = np.random.default_rng(1)
    sources = {
        k: jax.numpy.asarray(rng.uniform(0, 1, (c.shape[0], 1, T, c.shape[-1] + 1)), np.float32)
        for k, c in ci.items()
    }

    spec = attrs.evolve(SPEC, remat_layers=True)  # as remat.recon: per layer, only h is kept

    def loss(comps: dict, ci: dict, sources: dict) -> jax.Array:
        clean = CleanRunner(spec, target, tokens)
        logits, _ = clean.run(lambda kind, x, xs: None, {})
        return recon_loss(
            spec,
            all_sites_plan(DEC),
            n_samples=1,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            clean_logits=logits,
            clean_stream=clean.stream,
            key=jax.random.key(3),
            remat=True,
            sources=sources,
        )

    return jax.value_and_grad(loss, argnums=(0, 1, 2)), comps, ci, sources


def test_one_chunk_backward_allocates_no_constant_zeros_at_the_top_level(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The persistent-PGD-shaped term (late_vjp): no CI- or sources-sized constant zeros in
    the compiled program's top level; the plain checkpointed term has them (its transposed
    layer scan's gradient stacks)."""
    big = {f"f32[{c.shape[0]},{B},{T},{c.shape[-1]}]" for c in _data()[2].values()}
    big |= {f"f32[{c.shape[0]},1,{T},{c.shape[-1] + 1}]" for c in _data()[2].values()}

    def shapes() -> set[str]:
        grad, comps, ci, sources = _one_chunk_grad_fn()
        return _entry_constant_shapes(jax.jit(grad).lower(comps, ci, sources).compile().as_text())

    assert not shapes() & big
    monkeypatch.setattr(recon_module, "late_vjp", lambda fn, *a: jax.checkpoint(fn)(*a))
    assert shapes() & big


def test_one_chunk_late_vjp_equals_the_checkpointed_term(monkeypatch: pytest.MonkeyPatch) -> None:
    grad, comps, ci, sources = _one_chunk_grad_fn()
    got = jax.jit(grad, compiler_options=FAST)(comps, ci, sources)
    monkeypatch.setattr(recon_module, "late_vjp", lambda fn, *a: jax.checkpoint(fn)(*a))
    grad, comps, ci, sources = _one_chunk_grad_fn()
    want = jax.jit(grad, compiler_options=FAST)(comps, ci, sources)
    assert float(got[0]) > 0.0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert all(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(got[1][2]))
