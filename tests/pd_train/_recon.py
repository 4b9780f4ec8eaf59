"""A decomposition of the tiny Llama for masked-forward and recon tests: 8 sites (q, gate, up,
down in each of 2 layers), random components and CI, and a batch of tokens (`_data()`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pd_train._forward import ForwardSpec
from pd_train.config import DecompositionTarget
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


@functools.cache
def _data() -> tuple:
    target = llama.init_params(MODEL, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    comps, ci = {}, {}
    for layout in DEC.kinds:
        n = len(layout.layers)
        comps[layout.kind] = {
            "V": jnp.asarray(
                rng.standard_normal((n, layout.d_in, layout.C)) / layout.d_in**0.5, jnp.float32
            ),
            "U": jnp.asarray(
                rng.standard_normal((n, layout.C, layout.d_out)) / layout.C**0.5, jnp.float32
            ),
        }
        ci[layout.kind] = jnp.asarray(rng.uniform(0, 1, (n, B, T, layout.C)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, MODEL.vocab_size, (B, T)), jnp.int32)
    return target, comps, ci, tokens


def _chi2(counts: np.ndarray) -> float:
    """Pearson's χ² of ``counts`` against a uniform expectation."""
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())
