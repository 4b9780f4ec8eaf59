"""The transformer CI function's chunk scan with its own VJP (pd_train.losses.chunk_vjp.scan_map):
exactly JAX's values and gradients, but on XLA:CPU (docs/findings.md section 8, production
topology: 62.16 -> 58.39 GiB per device) the backward starts no CI-parameter gradient stack from
constant zeros at the top level of the program, and no bf16 stack a loop reads (the taps, the
blocks' saved inputs) gets an fp32 copy."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pd_train.ci.transformer as transformer_module
from pd_train.losses.chunk_vjp import scan_map

from ._ci_transformer import CHUNKWISE, B, T, _setup
from ._hlo import _entry_constant_shapes
from ._tiny import FAST


def _plain_scan_map(fn: Any, diff: Any, nondiff: Any) -> Any:
    """The scan the transformer ran before: JAX's own transpose."""
    return jax.lax.scan(lambda c, x: (c, fn(*x)), None, (diff, nondiff))[1]


def _remat_bf16() -> tuple[Any, Any, Any]:
    """The production recipe's CI function at a tiny shape: remat of each block, bf16 taps (so
    the compute dtype is bf16, as at production)."""
    fn, params, inputs = _setup()
    fn = transformer_module.TransformerCIFunction(
        decomposition=fn.decomposition,
        d_model=CHUNKWISE.d_model,
        n_blocks=CHUNKWISE.n_blocks,
        n_heads=CHUNKWISE.n_heads,
        n_kv_heads=CHUNKWISE.n_kv_heads,
        mlp_hidden=CHUNKWISE.mlp_hidden,
        blocks_per_chunk=CHUNKWISE.blocks_per_chunk,
        remat=True,
    )
    inputs = {k: v.astype(jnp.bfloat16) for k, v in inputs.items()}
    return fn, params, inputs


def _value_and_grad(fn: Any, inputs: Any) -> Any:
    rng = np.random.default_rng(5)
    weights = {
        k: jnp.asarray(rng.standard_normal(fn.decomposition.kind(k).C), jnp.float32)
        for k in fn.decomposition.kind_names
    }

    def loss(params: Any) -> jax.Array:
        pre = fn.apply(params, inputs)
        return sum(jnp.sum(jnp.tanh(v) * weights[k]) for k, v in pre.items())

    return jax.value_and_grad(loss)


def test_scan_map_equals_the_plain_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CI function's value and every parameter's gradient: bit for bit those of JAX's
    scan; no gradient leaks into the taps."""
    fn, params, inputs = _remat_bf16()
    got = jax.jit(_value_and_grad(fn, inputs), compiler_options=FAST)(params)
    monkeypatch.setattr(transformer_module, "scan_map", _plain_scan_map)
    want = jax.jit(_value_and_grad(fn, inputs), compiler_options=FAST)(params)
    assert float(got[0]) != 0.0
    for (path, g), w in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True
    ):
        assert float(jnp.abs(g).max()) > 0 or g.ndim == 0, path
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=str(path))


def test_scan_map_takes_no_gradient_into_nondiff_and_carries_bf16_as_bits() -> None:
    """``nondiff`` gets no cotangent (its values are constants to the map) and travels as
    bits, while ``diff``'s gradient is exactly JAX's."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((3, 4, 5)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((3, 2, 4)), jnp.bfloat16)

    def fn(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.sin(x @ w.astype(jnp.bfloat16)).astype(jnp.float32)

    def loss(m: Any) -> Any:
        return lambda w, x: jnp.sum(m(fn, w, x) ** 2)

    got = jax.grad(loss(scan_map), argnums=(0, 1))(w, x)
    want = jax.grad(loss(_plain_scan_map), argnums=0)(w, x)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want))
    assert not np.any(np.asarray(got[1], np.float32))  # a stop_gradient: zeros
    # x travels through the loops as its bit pattern.
    jaxpr = str(jax.make_jaxpr(jax.grad(loss(scan_map)))(w, x))
    assert "u16[3,2,4]" in jaxpr


def _grad_hlo(fn: Any, params: Any, inputs: Any) -> str:
    return jax.jit(_value_and_grad(fn, inputs)).lower(params).compile().as_text()


def test_no_fp32_copy_of_the_bf16_taps_and_no_constant_zero_gradient_stacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In the compiled gradient: no fp32 array of the stacked taps' shape (XLA:CPU's float
    normalization made one for the backward's slices of the bf16 taps, and hoisted it out of
    the loop), and no CI-parameter gradient stack computed from constants only at the top
    level (JAX's transposed scan starts them as zeros that XLA:CPU allocated at the start of
    the step). The plain scan has both: checked."""
    fn, params, inputs = _remat_bf16()
    n_chunks = params["in_w"].shape[0]
    taps = f"f32[{n_chunks},{B},{T},{fn.input_dim()}]"
    stacks = {
        f"f32[{','.join(map(str, a.shape))}]"
        for a in jax.tree.leaves(fn.chunk_inputs(params, inputs))
        if a.shape[0] == n_chunks and a.ndim >= 3 and a.dtype == jnp.float32
    } - {taps}
    assert stacks  # e.g. the blocks' w1 stacked per chunk

    def shapes() -> tuple[bool, set[str]]:
        hlo = _grad_hlo(fn, params, inputs)
        has_taps = bool(re.search(re.escape(taps) + r"\{", hlo))
        return has_taps, _entry_constant_shapes(hlo) & stacks

    assert shapes() == (False, set())
    monkeypatch.setattr(transformer_module, "scan_map", _plain_scan_map)
    has_taps, zeros = shapes()
    assert has_taps and zeros  # what this test guards against
