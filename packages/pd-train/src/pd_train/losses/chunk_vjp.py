"""The chunk loop of a recon term whose chunks are windows of whole layers, with its own VJP.

A layer-aligned plan (chunk i makes exactly layers [i·n, (i + 1)·n) live, every kind decomposed
at every layer) needs, per chunk, only its own window of the CI. :func:`windowed_chunk_sum`
scans the chunks with each window as scan input, and its backward is written here instead of
being JAX's transpose of the scan:

- per chunk (last to first, as the transposed scan) it recomputes that chunk's forward and
  takes its VJP (the chunk is rematerialized whole, as ``remat.recon`` does), writing the
  window's CI gradient into its rows of one all-window buffer and adding the components'
  gradient into one carry;
- both buffers start as zeros broadcast from ``0 · total`` (the term's forward value), so they
  cannot exist before the term's forward has run. JAX's transposed scan starts them as constant
  zeros (the cotangent g is a constant too: the term's coefficient), which XLA:CPU's scheduler
  was free to allocate at the start of the step: at the production shape that put a CI-sized
  (4.75 GiB per device) cotangent carry next to the CI function's forward, the step's peak.

Values: the same chunk forwards and the same order of accumulation as the transposed scan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["windowed_chunk_sum"]

Tree = Any


def windowed_chunk_sum(
    chunk_kl: Callable[[Tree, Tree, Mapping[str, jax.Array]], jax.Array],
    xs: Tree,
    components: Tree,
    ci_windows: Mapping[str, jax.Array],
) -> jax.Array:
    """Σ_i chunk_kl(xs[i], components, {k: ci_windows[k][i]}); fp32 scalar.

    xs: per-chunk data, leading axis n_chunks (no gradient); components: any tree of arrays
    (differentiated); ci_windows[kind]: [n_chunks, window, B, T, C] (differentiated).
    ``chunk_kl`` may close over other arrays only if they carry no gradient.
    """

    def forward(comps: Tree, windows: Mapping[str, jax.Array]) -> jax.Array:
        def body(acc: jax.Array, x: Tree) -> tuple[jax.Array, None]:
            data, window = x
            return acc + chunk_kl(data, comps, window), None

        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (xs, windows))
        return total

    @jax.custom_vjp
    def total(comps: Tree, windows: Mapping[str, jax.Array]) -> jax.Array:
        return forward(comps, windows)

    def fwd(comps: Tree, windows: Mapping[str, jax.Array]) -> tuple[jax.Array, Tree]:
        out = forward(comps, windows)
        return out, (comps, windows, out)

    def bwd(res: Tree, g: jax.Array) -> tuple[Tree, Mapping[str, jax.Array]]:
        comps, windows, out = res
        late_zero = out * 0  # a zero that exists only once the forward has run (not folded)

        def zeros(a: jax.Array) -> jax.Array:
            return jnp.broadcast_to(late_zero.astype(a.dtype), a.shape)

        n_chunks = jax.tree_util.tree_leaves(windows)[0].shape[0]

        def body(carry: Tree, x: Tree) -> tuple[Tree, None]:
            d_comps, d_windows = carry
            i, data, window = x
            _, vjp = jax.vjp(lambda c, w: chunk_kl(data, c, w), comps, window)
            dc, dw = vjp(g)
            d_comps = jax.tree_util.tree_map(jnp.add, d_comps, dc)
            d_windows = {
                k: jax.lax.dynamic_update_index_in_dim(d_windows[k], dw[k], i, 0) for k in d_windows
            }
            return (d_comps, d_windows), None

        init = (jax.tree_util.tree_map(zeros, comps), {k: zeros(v) for k, v in windows.items()})
        steps = (jnp.arange(n_chunks), xs, windows)
        (d_comps, d_windows), _ = jax.lax.scan(body, init, steps, reverse=True)
        return d_comps, d_windows

    total.defvjp(fwd, bwd)
    return total(components, ci_windows)
