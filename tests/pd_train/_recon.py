"""A decomposition of the tiny Llama for masked-forward and recon tests: 8 sites (q, gate, up,
down in each of 2 layers), random components and CI, and a batch of tokens (`_data()`)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pd_train._forward import ForwardSpec
from pd_train.config.pd import DecompositionTarget
from pd_train.decomposition import build_decomposition
from pd_train.models import llama

from ._tiny import TINY

MODEL = TINY
# 8 sites: q, gate, up, down in each of 2 layers -> 1, 4 and 8 chunks of 8, 2 and 1 sites.
DEC = build_decomposition(
    MODEL,
    [
        DecompositionTarget(module_pattern="layers.*.self_attn.q_proj", C=4),
        DecompositionTarget(module_pattern="layers.*.mlp.*", C=4),
    ],
)
SPEC = ForwardSpec(model=MODEL, decomposition=DEC)
B, T = 2, 6


def random_recon_data(model: Any, dec: Any, b: int, t: int) -> tuple:
    """(target weights of key 0, random V/U {kind: {V, U}}, CI [n_k, b, t, C] in [0, 1], tokens
    [b, t]) of the decomposition ``dec`` of ``model``, drawn from numpy's seed 0."""
    target = llama.init_params(model, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    comps, ci = {}, {}
    for layout in dec.kinds:
        n = len(layout.layers)
        comps[layout.kind] = {
            "V": jnp.asarray(
                rng.standard_normal((n, layout.d_in, layout.C)) / layout.d_in**0.5, jnp.float32
            ),
            "U": jnp.asarray(
                rng.standard_normal((n, layout.C, layout.d_out)) / layout.C**0.5, jnp.float32
            ),
        }
        ci[layout.kind] = jnp.asarray(rng.uniform(0, 1, (n, b, t, layout.C)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, model.vocab_size, (b, t)), jnp.int32)
    return target, comps, ci, tokens


@functools.cache
def _data() -> tuple:
    return random_recon_data(MODEL, DEC, B, T)


def _chi2(counts: np.ndarray) -> float:
    """Pearson's χ² of ``counts`` against a uniform expectation."""
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())
