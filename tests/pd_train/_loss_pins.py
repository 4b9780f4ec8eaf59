"""The two-site toy the recon loss pins share (test_loss_pins.py, test_hidden_acts_recon.py):
TMS 5-3 (linear1 [5, 3] then linear2 [3, 5], out = relu(x@W1@W2 + b), read as logits), its fixed
weights, components, CI and sources; the numpy reference of its masked forward and KL; and the
same arrays as pd's inputs."""

from __future__ import annotations

from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from pd_train._forward import ForwardSpec
from pd_train.config.pd import DecompositionTarget
from pd_train.decomposition import build_decomposition
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
