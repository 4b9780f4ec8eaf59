"""The default step's cheaper structures (issue 17 item 5): each must give the values of the
path it replaces (same loss terms, gradients and updates to float noise)."""

from __future__ import annotations

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.config.pd import PersistentPGDRecon, RematConfig, RuntimeConfig
from pd_train.models import llama
from pd_train.train import Trainer, step_key

from ._speed import PD, B, T
from ._tiny import FAST, TINY


def _one_step(pd: object, runtime: RuntimeConfig) -> tuple[Trainer, str, dict]:
    trainer = Trainer(TINY, pd, runtime, compiler_options=FAST, seq_len=T)  # type: ignore[arg-type]
    target = llama.init_params(TINY, key=jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (B, T)), jnp.int32)
    state = trainer.init_state(key=jax.random.key(1))
    key = step_key(jax.random.key(2), 0)
    text = jax.jit(trainer._step).lower(state, target, tokens, key).as_text(debug_info=True)
    state, metrics = trainer.train_step(state, target, tokens, key)
    return trainer, text, {"state": state, "metrics": metrics}


def _assert_same_step(a: dict, b: dict) -> None:
    for name, value in b["metrics"].items():
        np.testing.assert_allclose(
            jax.tree.leaves(a["metrics"][name]),
            jax.tree.leaves(value),
            rtol=2e-5,
            atol=1e-7,
            err_msg=name,
        )
    for x, y in zip(jax.tree.leaves(a["state"]), jax.tree.leaves(b["state"]), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("scope", ["bsc", "sc"])
def test_stochastic_and_persistent_pgd_terms_as_one_forward_keep_the_step(scope: str) -> None:
    """The stochastic recon term and the persistent-PGD term run as one forward of 2B rows
    (``paired_all_sites_loss``): both terms, every other metric, the new params, Adam moments
    and PGD sources equal the step with one forward each, for batch-wide and shared sources."""
    terms = tuple(
        attrs.evolve(t, scope=scope) if isinstance(t, PersistentPGDRecon) else t
        for t in PD.loss_metrics
    )
    pd = attrs.evolve(PD, loss_metrics=terms)
    runtime = RuntimeConfig(remat=RematConfig(recon_layers=True, ci_fn=True))
    trainer, paired_text, paired = _one_step(pd, runtime)
    assert trainer._all_site_pair() == (2, 4)
    assert "pd.term.all_sites_pair" in paired_text
    unpaired = attrs.evolve(pd, recon=attrs.evolve(pd.recon, pair_terms=False))
    trainer, separate_text, separate = _one_step(unpaired, runtime)
    assert trainer._all_site_pair() is None
    assert "pd.term.all_sites_pair" not in separate_text
    _assert_same_step(paired, separate)
    assert float(paired["metrics"]["loss/stochastic_recon"]) > 0
    assert float(paired["metrics"]["loss/persistent_pgd_recon"]) > 0


def test_the_pair_is_not_used_with_recon_remat() -> None:
    """With ``runtime.remat.recon`` (production-scale configs, memory-bound) the two terms keep
    one forward each: the pair's forward holds twice one forward's activations."""
    trainer = Trainer(TINY, PD, RuntimeConfig(remat=RematConfig(recon=True)), seq_len=T)
    assert trainer._all_site_pair() is None
    assert Trainer(TINY, PD, RuntimeConfig(), seq_len=T)._all_site_pair() == (2, 4)


@pytest.mark.parametrize("n", [7, 28, 64, 65])
def test_site_ranks_by_counting_are_the_stable_argsort_ranks(n: int) -> None:
    """The routing's ranks: counted comparisons (up to RANK_BY_COUNT_MAX_SITES sites) equal
    ``argsort(argsort(u))`` exactly, ties (forced here: few distinct values, dead sites at 2.0)
    broken by position as a stable sort does; the routing masks are then the same too."""
    from pd_train.losses.recon import RANK_BY_COUNT_MAX_SITES, routing_masks, site_ranks

    rng = np.random.default_rng(n)
    u = jnp.asarray(rng.integers(0, 5, (3, 50, n)) / 4.0, jnp.float32)  # many ties
    expected = np.argsort(np.argsort(np.asarray(u), axis=-1, kind="stable"), axis=-1)
    np.testing.assert_array_equal(np.asarray(jax.jit(site_ranks)(u)), expected)
    if n <= RANK_BY_COUNT_MAX_SITES:
        assert "sort" not in str(jax.make_jaxpr(site_ranks)(u))
    mask = jnp.asarray(rng.random(n) < 0.5).at[0].set(True)
    count = jnp.sum(mask).astype(jnp.int32)
    key = jax.random.key(n)
    routed = routing_masks(mask, count, (4, 16), key=key)
    k = jax.random.randint(jax.random.fold_in(key, 0), (4, 16), 1, count + 1)
    draws = jax.random.uniform(jax.random.fold_in(key, 1), (4, 16, n))
    ranks = jnp.argsort(jnp.argsort(jnp.where(mask, draws, 2.0), axis=-1), axis=-1)
    np.testing.assert_array_equal(np.asarray(routed), np.asarray(ranks < k[..., None]))
