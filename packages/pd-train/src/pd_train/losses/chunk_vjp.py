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

:func:`late_vjp` does the same for a term with one (chunk, draw) (its backward in a
``lax.cond``); :func:`scan_map` for a stacked map (the transformer CI function's chunks), also
carrying bf16 stacks as bits through its loops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["late_vjp", "scan_map", "windowed_chunk_sum"]

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


def late_vjp(fn: Callable[..., jax.Array], *args: Tree) -> jax.Array:
    """``fn(*args)`` (a scalar) rematerialized whole, like ``jax.checkpoint(fn)(*args)``, with
    its backward inside a ``lax.cond`` whose predicate XLA cannot see.

    The backward's zero-initialized gradient stacks (the transposed layer scan's, a CI- and a
    sources-sized one for the persistent-PGD term) are then allocated in the branch, i.e. only
    while the backward runs. Without it, JAX's transposes start them as constant zeros, which
    XLA:CPU's scheduler allocated at the start of the step, next to the CI function's forward
    (the step's peak). The predicate is ``0 · fn(*args) == 0`` (false only for a NaN or
    infinite value, which XLA cannot fold); both branches compute the same VJP, so the
    gradients are exactly ``jax.checkpoint(fn)``'s either way. (A ``while`` loop of one such
    trip did the same, but its carry needs the gradients' initial values: a zero copy of every
    differentiated input, CI- and sources-sized, that XLA computed right after the forward and
    kept alive across the other terms' backward: 4.75 GiB per device at production.) ``fn``
    may close over arrays only if they carry no gradient.
    """

    @jax.custom_vjp
    def call(*a: Tree) -> jax.Array:
        return fn(*a)

    def fwd(*a: Tree) -> tuple[jax.Array, Tree]:
        out = fn(*a)
        return out, (a, out)

    def bwd(res: Tree, g: jax.Array) -> tuple[Tree, ...]:
        a, out = res
        late_zero = out * 0  # not folded: it exists only once the forward has run

        def backward(a: Tree, ct: jax.Array) -> tuple[Tree, ...]:
            _, vjp = jax.vjp(fn, *a)
            return tuple(vjp(ct))

        # Both branches the same VJP: the predicate only hides from XLA that one always runs.
        return jax.lax.cond(late_zero == 0, backward, backward, a, g + late_zero)

    call.defvjp(fwd, bwd)
    return call(*args)


def _to_bits(a: jax.Array) -> jax.Array:
    """A 2-byte float array as its uint16 bit pattern (exact; any other array unchanged)."""
    if jnp.issubdtype(a.dtype, jnp.floating) and a.dtype.itemsize == 2:
        return jax.lax.bitcast_convert_type(a, jnp.uint16)
    return a


def _from_bits(a: jax.Array, dtype: Any) -> jax.Array:
    return jax.lax.bitcast_convert_type(a, dtype) if a.dtype != dtype else a


def scan_map(fn: Callable[[Tree, Tree], Tree], diff: Tree, nondiff: Tree) -> Tree:
    """``ys[i] = fn(diff[i], nondiff[i])`` over the shared leading axis as one ``lax.scan``,
    differentiable in ``diff`` only (``nondiff`` is a constant to it: no gradient flows into it),
    with the same values, residuals and FLOPs as JAX's own scan, and two differences in memory:

    - the backward's gradient stacks (``diff``'s cotangent, one per leaf, [n, ...] fp32) are a
      reverse scan's carry started from ``0 · ct`` (the cotangent: data, not a constant), so
      they cannot exist before the backward. JAX's transposed scan starts them as constant
      zeros, which XLA:CPU allocated at the start of the step — for the production CI function
      that is every CI parameter's gradient (~2 GiB per device) live across the whole step;
    - every 2-byte float (bf16) array the loops slice — ``nondiff`` leaves and the residuals
      the forward saves for the backward — is carried as its uint16 bit pattern and bitcast
      back per slice. XLA:CPU cannot slice bf16 in a loop: its float normalization converts the
      whole operand to fp32 first and then hoists that convert out of the loop, so every bf16
      stack a loop reads gets an fp32 copy of twice its size, alive as long as the stack (the
      production CI function's taps and block inputs: ~5.8 GiB per device). Bit patterns are
      not floats, so nothing is converted; on a GPU this changes nothing.

    The residuals are those of ``jax.vjp(fn)`` per step (``fn``'s own ``jax.checkpoint``s
    decide them, as in JAX's scan); a residual that is one of the step's inputs is read from
    the input instead of being stacked again. The backward rebuilds each step's VJP from its
    residuals and applies it to that step's cotangent: the same operations as JAX's transpose.
    """
    n = jax.tree_util.tree_leaves(diff)[0].shape[0]
    nd_leaves, nd_def = jax.tree_util.tree_flatten(jax.lax.stop_gradient(nondiff))
    nd_dtypes = [a.dtype for a in nd_leaves]
    packed = [_to_bits(a) for a in nd_leaves]
    meta: dict[str, Any] = {}

    def views(bits: list[jax.Array]) -> list[jax.Array]:
        return [_from_bits(b, dt) for b, dt in zip(bits, nd_dtypes, strict=True)]

    def primal(d: Tree, bits: list[jax.Array]) -> Tree:
        def body(carry: None, x: Tree) -> tuple[None, Tree]:
            di, bi = x
            return carry, fn(di, jax.tree_util.tree_unflatten(nd_def, views(bi)))

        return jax.lax.scan(body, None, (d, bits))[1]

    @jax.custom_vjp
    def call(d: Tree, bits: list[jax.Array]) -> Tree:
        return primal(d, bits)

    def fwd(d: Tree, bits: list[jax.Array]) -> tuple[Tree, Tree]:
        def body(carry: None, x: Tree) -> tuple[None, Tree]:
            di, bi = x
            nd = views(bi)
            y, vjp = jax.vjp(lambda a: fn(a, jax.tree_util.tree_unflatten(nd_def, nd)), di)
            res, res_def = jax.tree_util.tree_flatten(vjp)
            inputs = jax.tree_util.tree_leaves(di) + nd
            plan: list[tuple[str, int, Any]] = []
            saved: list[jax.Array] = []
            for r in res:
                j = next((j for j, a in enumerate(inputs) if a is r), None)
                if j is None:
                    plan.append(("saved", len(saved), r.dtype))
                    saved.append(_to_bits(r))
                else:
                    plan.append(("input", j, r.dtype))
            meta["res_def"], meta["plan"] = res_def, plan
            return carry, (y, saved)

        _, (ys, saved) = jax.lax.scan(body, None, (d, bits))
        return ys, (d, bits, saved)

    def bwd(res: Tree, ct: Tree) -> tuple[Tree, None]:
        d, bits, saved = res
        first = jax.tree_util.tree_leaves(ct)[0]
        late_zero = first[(0,) * first.ndim] * 0  # exists only once the cotangent does

        def body(carry: Tree, x: Tree) -> tuple[Tree, None]:
            i, di, bi, si, cti = x
            inputs = jax.tree_util.tree_leaves(di) + views(bi)
            leaves = [
                inputs[j] if where == "input" else _from_bits(si[j], dt)
                for where, j, dt in meta["plan"]
            ]
            (g,) = jax.tree_util.tree_unflatten(meta["res_def"], leaves)(cti)
            carry = jax.tree_util.tree_map(
                lambda c, gi: jax.lax.dynamic_update_index_in_dim(c, gi.astype(c.dtype), i, 0),
                carry,
                g,
            )
            return carry, None

        init = jax.tree_util.tree_map(
            lambda a: jnp.broadcast_to(late_zero.astype(a.dtype), a.shape), d
        )
        steps = (jnp.arange(n), d, bits, saved, ct)
        grads, _ = jax.lax.scan(body, init, steps, reverse=True)
        return grads, None

    call.defvjp(fwd, bwd)
    return call(diff, packed)
