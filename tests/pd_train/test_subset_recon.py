"""``subset_recon``: all sites in one forward per draw, per-position uniform-k routing (the
shipped configs' recon plan, param-decomp SPEC S10′)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pd_train._forward import CleanRunner
from pd_train.config.pd import SubsetRecon
from pd_train.losses import LOSS_TERMS, all_sites_subset_plan, recon_loss, routing_masks

from ._recon import DEC, SPEC, _chi2, _data

FAST = {"xla_backend_optimization_level": 0}


def test_the_plan_is_one_chunk_of_every_site_with_subset_routing() -> None:
    plan = LOSS_TERMS["subset_recon"].plan(SubsetRecon(coeff=1.0), DEC)
    assert plan == all_sites_subset_plan(DEC)
    assert plan.chunks == (tuple(range(8)),) and plan.routing == "subset"
    assert plan.n_live().tolist() == [8]


def test_k_is_uniform_over_all_sites_per_position() -> None:
    """k ~ U{1..8} at each position (χ², 7 dof, p = 0.001 critical value 24.32)."""
    mask = jnp.ones((8,), bool)
    draws = jax.jit(jax.vmap(lambda k: routing_masks(mask, jnp.int32(8), (64,), key=k)))(
        jax.random.split(jax.random.key(4), 200)
    )
    k = np.asarray(draws).reshape(-1, 8).sum(-1)
    counts = np.bincount(k, minlength=9)
    assert counts[0] == 0 and _chi2(counts[1:]) < 24.32, counts
    per_draw = k.reshape(200, 64)
    assert (per_draw != per_draw[:, :1]).any(axis=1).all()  # per position, not per draw


def test_scanned_and_unrolled_all_sites_loss_agree() -> None:
    target, comps, ci, tokens = _data()
    plan = all_sites_subset_plan(DEC)

    def loss(comps: dict, ci: dict, unroll: bool) -> jax.Array:
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
            unroll=unroll,
        )

    got = {
        unroll: jax.jit(
            jax.value_and_grad(lambda c, u=unroll: loss(c, ci, u)), compiler_options=FAST
        )(comps)
        for unroll in (False, True)
    }
    (v0, g0), (v1, g1) = got[False], got[True]
    assert float(v0) > 0
    np.testing.assert_allclose(float(v0), float(v1), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
