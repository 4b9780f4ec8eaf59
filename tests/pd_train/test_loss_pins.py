"""Every recon loss pinned to numbers computed outside pd: a two-site toy (TMS 5-3: linear1
[5, 3] then linear2 [3, 5], out = relu(x@W1@W2 + b), its output read as logits), fixed weights,
components, CI and sources, and the expected value written out with numpy from the method's
formulas (DESIGN.md "The method, precisely"): a live site gives ((x@V)·m)@U + δ·(x@(W − V@U))
with m = ci + (1 − ci)·r[:C], δ = r[C]; a frozen one x@W; the loss is KL(softmax(clean) ‖
softmax(masked)) summed over the vocabulary, mean over positions. Faithfulness and importance
minimality are pinned in test_losses.py and test_importance_frequency.py."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.config.pd import PersistentPGDRecon, PGDOptimizer
from pd_train.losses import LOSS_TERMS, TermInputs, all_sites_plan, chunkwise_plan, recon_loss
from pd_train.losses.pgd import FreshPGD

from ._loss_pins import (
    DEC,
    KINDS,
    SPEC,
    B,
    C,
    R,
    _kl,
    _out,
    _pd_inputs,
)


def _recon(plan: Any, **kw: Any) -> float:
    d = _pd_inputs()
    value = recon_loss(
        SPEC,
        plan,
        n_samples=1,
        target=d["target"],
        tokens=d["x"],
        components=d["comps"],
        ci_lower=d["ci"],
        clean_logits=d["clean"],
        key=jax.random.key(0),
        **kw,
    )
    return float(value)


def test_stochastic_recon_kl_by_hand() -> None:
    """Every site live at every position, the given sources: KL(clean ‖ masked)."""
    want = _kl(_out(dict.fromkeys(KINDS, True), R))
    assert want > 1e-3
    got = _recon(all_sites_plan(DEC), sources=_pd_inputs()["sources"])
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_subset_recon_by_hand() -> None:
    """Chunks of one site: k ~ U{1..1} routes that site at every position, the other frozen;
    the value is the mean over the two chunks."""
    want = np.mean([_kl(_out({k: k == live for k in KINDS}, R)) for live in KINDS])
    got = _recon(chunkwise_plan(DEC, 1), sources=_pd_inputs()["sources"])
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_persistent_pgd_recon_term_by_hand() -> None:
    """The persistent-PGD term's value: every site live under the persistent sources."""
    d = _pd_inputs()
    config = PersistentPGDRecon(coeff=0.5, optimizer=PGDOptimizer(lr=0.01))
    term = LOSS_TERMS["persistent_pgd_recon"]
    inputs = TermInputs(
        spec=SPEC,
        target=d["target"],
        tokens=d["x"],
        params={},
        components=d["comps"],
        step=jnp.asarray(0, jnp.int32),
        ci_lower=d["ci"],
        clean_logits=d["clean"],
        sources=d["sources"],
    )
    value, _ = term.value(config, inputs, plan=term.plan(config, DEC), hp={}, key=jax.random.key(0))
    np.testing.assert_allclose(float(value), _kl(_out(dict.fromkeys(KINDS, True), R)), rtol=1e-4)


def test_fresh_pgd_recon_by_hand() -> None:
    """Fresh PGD from zeros, one sign ascent of step 0.5: s = clip(0.5·sign(∂KL/∂s), 0, 1)
    with the gradient taken by central differences on the numpy reference (float64)."""
    zeros = {k: np.zeros((B, 1, C + 1)) for k in KINDS}

    def kl_at(s: dict[str, np.ndarray]) -> float:
        return _kl(_out(dict.fromkeys(KINDS, True), s))

    ascended = {}
    eps = 1e-6
    for kind in KINDS:
        grad = np.zeros_like(zeros[kind])
        for idx in np.ndindex(grad.shape):
            up = {k: v.copy() for k, v in zeros.items()}
            down = {k: v.copy() for k, v in zeros.items()}
            up[kind][idx] += eps
            down[kind][idx] -= eps
            grad[idx] = (kl_at(up) - kl_at(down)) / (2 * eps)
        assert np.all((np.abs(grad) > 1e-7) | (grad == 0)), grad  # no sign left to rounding
        ascended[kind] = np.clip(0.5 * np.sign(grad), 0.0, 1.0)
    want = kl_at(ascended)
    pgd = FreshPGD(init="zeros", n_steps=1, step_size=0.5, mask_scope="unique_per_datapoint")
    got = _recon(all_sites_plan(DEC), pgd=pgd)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert want > kl_at(zeros)  # the ascent raised the loss
