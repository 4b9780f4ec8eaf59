"""Memory of the all-sites recon's backward (docs/memory.md): ``runtime.remat.save_sources``
(a rematerialized layer keeps its drawn sources, or draws them again in the backward) gives the
same values either way, and a one-(chunk, draw) term's backward (``chunk_vjp.late_vjp``) starts
no zero copy of its differentiated inputs outside the backward."""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from pd_train._forward import CleanRunner, masked_forward
from pd_train.config.pd import (
    DecompositionTarget,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    PersistentPGDRecon,
    PGDOptimizer,
    RematConfig,
    RuntimeConfig,
    SharedMLPCI,
    SubsetRecon,
)
from pd_train.losses import all_sites_plan, recon_loss
from pd_train.losses.recon import site_grid
from pd_train.models import llama
from pd_train.train import Trainer

from ._hlo import _entry_scalar_broadcast_shapes
from ._recon import DEC, SPEC, B, T, _data
from ._tiny import FAST, TINY


def test_redrawn_sources_give_the_saved_sources_values() -> None:
    """Static liveness (the all-sites forward), per-position routing, every layer
    rematerialized: ``save_sources=False`` draws each live site's source again in the backward
    (more draws in the gradient's program) and gives exactly the same loss, and the same
    gradients to float rounding (rtol 1e-5: the two programs fuse and order their sums
    differently; 6e-6 seen)."""
    target, comps, ci, tokens = _data()
    grid = site_grid(DEC)
    routed = jax.random.bernoulli(jax.random.key(7), 0.5, (*grid.shape, B, T))

    def loss(comps: dict, ci: dict, spec: Any) -> jax.Array:
        logits = masked_forward(
            spec,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            live=grid >= 0,
            routed=routed,
            key=jax.random.key(5),
        )
        return jnp.mean(jnp.square(logits))

    grad = jax.value_and_grad(loss, (0, 1))
    saved = attrs.evolve(SPEC, remat_layers=True)
    redrawn = attrs.evolve(saved, save_sources=False)
    draws = [
        str(jax.make_jaxpr(grad, static_argnums=2)(comps, ci, s)).count("name=_uniform")
        for s in (saved, redrawn)
    ]
    assert draws[1] > draws[0] > 0
    (v1, g1), (v2, g2) = grad(comps, ci, saved), grad(comps, ci, redrawn)
    assert float(v1) > 0
    np.testing.assert_array_equal(np.asarray(v1), np.asarray(v2))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):  # XLA's rounding
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)


def _production_like(save_sources: bool) -> Trainer:
    """The production recipe's terms at tiny shapes: subset recon over all sites beside
    persistent PGD (bsc, one warm-up ascent), recon remat on."""
    pd = PDConfig(
        steps=10,
        batch_size=2,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*", C=4),),
        ci=SharedMLPCI(hidden_dims=(8,)),
        loss_metrics=(
            ImportanceMinimality(coeff=1e-3, pnorm_start=2.0, pnorm_end=0.4, eps=1e-6),
            SubsetRecon(coeff=2.0),
            PersistentPGDRecon(
                coeff=0.5, scope="bsc", n_warmup_steps=1, optimizer=PGDOptimizer(lr=0.01)
            ),
        ),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
    )
    runtime = RuntimeConfig(remat=RematConfig(recon=True, save_sources=save_sources))
    return Trainer(TINY, pd, runtime, seq_len=8, compiler_options=FAST)


def _step_values(save_sources: bool) -> Any:
    """(total, aux), gradients w.r.t. params and the PPGD offset of the tiny step's loss."""
    tr = _production_like(save_sources)
    assert tr.forward_spec.save_sources is save_sources
    state = tr.init_state(key=jax.random.key(1))
    target = llama.init_params(TINY, key=jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, TINY.vocab_size)
    adversary = jax.tree.map(jnp.asarray, state.adversary)

    def loss(params: Any, offset: Any) -> tuple[jax.Array, Any]:
        return tr.loss(
            params,
            target,
            tokens,
            jnp.int32(0),
            jax.random.key(3),
            adversary=adversary,
            source_offset=offset,
        )

    offset = jax.tree.map(jnp.zeros_like, adversary["sources"])
    return jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(state.params, offset)


def test_the_step_s_losses_and_gradients_do_not_depend_on_save_sources() -> None:
    """The tiny production-recipe step with ``runtime.remat.save_sources`` true and false:
    every term and the total equal, every gradient equal to float rounding (rtol 1e-5: the
    redrawn sources are the same bits, but the two programs fuse differently)."""
    (total1, aux1), grads1 = _step_values(True)
    (total2, aux2), grads2 = _step_values(False)
    assert float(aux1["terms"]["subset_recon"]) > 0
    for name in aux1["terms"]:
        np.testing.assert_array_equal(np.asarray(aux1["terms"][name]), aux2["terms"][name])
    np.testing.assert_array_equal(np.asarray(total1), np.asarray(total2))
    for a, b in zip(jax.tree.leaves(grads1), jax.tree.leaves(grads2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)


def test_a_one_chunk_backward_starts_no_zero_copy_of_its_inputs_at_the_top_level() -> None:
    """``late_vjp``'s backward (the all-sites subset recon's and persistent PGD's) runs under a
    ``lax.cond``: no CI- or sources-sized array computed from a scalar (the old one-trip
    ``while`` loop's carry, zeros started from ``0 · value`` that XLA computed right after the
    forward and kept across the other terms' backward) in the compiled program's top level."""
    target, comps, ci, tokens = _data()
    rng = np.random.default_rng(1)
    sources = {
        k: jnp.asarray(rng.uniform(0, 1, (c.shape[0], 1, T, c.shape[-1] + 1)), jnp.float32)
        for k, c in ci.items()
    }
    spec = attrs.evolve(SPEC, remat_layers=True)

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

    big = {f"f32[{c.shape[0]},{B},{T},{c.shape[-1]}]" for c in ci.values()}
    big |= {f"f32[{c.shape[0]},1,{T},{c.shape[-1] + 1}]" for c in ci.values()}
    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    hlo = grad.lower(comps, ci, sources).compile().as_text()
    assert "conditional(" in hlo
    assert not _entry_scalar_broadcast_shapes(hlo) & big
