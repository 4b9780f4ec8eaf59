"""Every recon loss pinned to numbers computed outside pd: a two-site toy (TMS 5-3: linear1
[5, 3] then linear2 [3, 5], out = relu(x@W1@W2 + b), its output read as logits), fixed weights,
components, CI and sources, and the expected value written out with numpy from the method's
formulas (DESIGN.md "The method, precisely"): a live site gives ((x@V)·m)@U + δ·(x@(W − V@U))
with m = ci + (1 − ci)·r[:C], δ = r[C]; a frozen one x@W; the loss is KL(softmax(clean) ‖
softmax(masked)) summed over the vocabulary, mean over positions. Faithfulness and importance
minimality are pinned in test_losses.py and test_importance_frequency.py."""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from pd_train._forward import ForwardSpec
from pd_train.config.pd import DecompositionTarget, PersistentPGDRecon, PGDOptimizer
from pd_train.decomposition import build_decomposition
from pd_train.losses import LOSS_TERMS, TermInputs, all_sites_plan, chunkwise_plan, recon_loss
from pd_train.losses.pgd import FreshPGD
from pd_train.targets.tms import TMSConfig, TMSTarget

F, H, C, B = 5, 3, 4, 3
KINDS = ("linear1", "linear2")


@attrs.frozen(kw_only=True)
class _LogitTMS(TMSTarget):
    """TMS whose output is compared as logits (KL), so the recon losses are the LM's."""

    @property
    def output_loss(self) -> str:  # type: ignore[override]
        return "kl"


TARGET = _LogitTMS(config=TMSConfig(n_features=F, n_hidden=H, tied_weights=False))
DEC = build_decomposition(TARGET, [DecompositionTarget(module_pattern="*", C=C)])
SPEC = ForwardSpec(model=TARGET, decomposition=DEC)
RNG = np.random.default_rng(11)
W = {"linear1": RNG.standard_normal((F, H)), "linear2": RNG.standard_normal((H, F))}
BIAS = RNG.standard_normal(F) * 0.1
V = {k: RNG.standard_normal((w.shape[0], C)) * 0.7 for k, w in W.items()}
U = {k: RNG.standard_normal((C, w.shape[1])) * 0.7 for k, w in W.items()}
CI = {k: RNG.uniform(0, 1, (B, 1, C)) for k in KINDS}  # [B, T = 1, C]
R = {k: RNG.uniform(0, 1, (B, 1, C + 1)) for k in KINDS}  # sources [B, T, C + 1]
X = RNG.uniform(0, 1, (B, 1, F))


# ---------------------------------------------------------------- the reference, in numpy
def _site(kind: str, x: np.ndarray, live: bool, r: np.ndarray) -> np.ndarray:
    if not live:
        return x @ W[kind]
    m = CI[kind] + (1 - CI[kind]) * r[..., :C]
    delta = r[..., C:]
    return ((x @ V[kind]) * m) @ U[kind] + delta * (x @ (W[kind] - V[kind] @ U[kind]))


def _out(live: dict[str, bool], r: dict[str, np.ndarray]) -> np.ndarray:
    h = _site("linear1", X, live["linear1"], r["linear1"])
    return np.maximum(_site("linear2", h, live["linear2"], r["linear2"]) + BIAS, 0.0)


def _kl(masked: np.ndarray) -> float:
    clean = _out(dict.fromkeys(KINDS, False), R)
    lp = clean - np.log(np.exp(clean).sum(-1, keepdims=True))
    lq = masked - np.log(np.exp(masked).sum(-1, keepdims=True))
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), -1)))


# ---------------------------------------------------------------- pd's side
def _f32(a: np.ndarray) -> jax.Array:
    return jnp.asarray(a, jnp.float32)


def _pd_inputs() -> dict[str, Any]:
    target = {
        "layers": {k: _f32(w)[None] for k, w in W.items()},
        "b_final": _f32(BIAS),
    }
    comps = {k: {"V": _f32(V[k])[None], "U": _f32(U[k])[None]} for k in KINDS}
    ci = {k: _f32(CI[k])[None] for k in KINDS}  # [n_k = 1, B, T, C]
    sources = {k: _f32(R[k])[None] for k in KINDS}
    x = _f32(X)
    clean = TARGET.forward(target, x)
    return dict(target=target, comps=comps, ci=ci, sources=sources, x=x, clean=clean)


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
