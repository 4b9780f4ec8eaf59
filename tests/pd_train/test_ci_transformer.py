"""The chunkwise and global transformer CI functions: the scanned chunk stack against an
independent per-chunk loop (values and grads), bidirectional attention, RoPE, remat, pd-init
identity, and the config errors."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.ci import TransformerCIFunction, make_ci_function
from pd_train.config.pd import (
    ChunkwiseTransformerCI,
    ConfigError,
    DecompositionTarget,
    GlobalTransformerCI,
)
from pd_train.decomposition import build_decomposition
from pd_train.train import Trainer

from ._ci_transformer import ALL, CHUNKWISE, MODEL, B, T, _pd, _setup, _trainer, jit


def _rms(x: jax.Array) -> jax.Array:
    eps = float(np.finfo(np.float32).eps)
    return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def _rope(x: jax.Array, theta: float) -> jax.Array:
    """x [B, T, H, hd], rotate-half RoPE written out with angles per position and pair."""
    hd = x.shape[-1]
    pos = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None]
    ang = pos * (1.0 / theta ** (jnp.arange(hd // 2, dtype=jnp.float32) * 2 / hd))[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _reference(fn: TransformerCIFunction, params: dict, inputs: dict) -> dict:
    """A plain per-chunk Python loop over chunks and blocks, attention per head with the K/V
    heads repeated (GQA), written independently of the module."""
    n_chunks = params["in_w"].shape[0]
    H, KV, d = fn.n_heads, fn.kv_heads, fn.d_model
    hd = d // H
    outs: dict[str, list] = {k: [] for k in params["out_w"]}
    for c in range(n_chunks):
        parts = []
        for kind in fn.tap_kinds():
            per = inputs[kind].shape[0] // n_chunks
            for j in range(per):
                parts.append(_rms(inputs[kind][c * per + j]))
        h = jnp.concatenate(parts, axis=-1) @ params["in_w"][c] + params["in_b"][c]
        for blk in range(fn.n_blocks):
            w = {k: v[c * fn.n_blocks + blk] for k, v in params["blocks"].items()}
            a = _rms(h)
            q = _rope((a @ w["wq"]).reshape(B, T, H, hd), fn.rope_theta)
            k = _rope((a @ w["wk"]).reshape(B, T, KV, hd), fn.rope_theta)
            v = (a @ w["wv"]).reshape(B, T, KV, hd)
            k, v = jnp.repeat(k, H // KV, axis=2), jnp.repeat(v, H // KV, axis=2)
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
            att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v).reshape(B, T, d)
            h = h + att @ w["wo"]
            m = _rms(h)
            up = m @ w["w1"] + w["b1"]
            h = h + 0.5 * up * (1 + jax.scipy.special.erf(up / math.sqrt(2))) @ w["w2"] + w["b2"]
        for kind, ws in params["out_w"].items():
            per = ws.shape[0] // n_chunks
            for j in range(per):
                outs[kind].append(h @ ws[c * per + j] + params["out_b"][kind][c * per + j])
    return {k: jnp.stack(v) for k, v in outs.items()}


@pytest.mark.parametrize(
    "ci",
    [CHUNKWISE, GlobalTransformerCI(d_model=16, n_blocks=2, n_heads=2, mlp_hidden=24)],
    ids=["chunkwise", "global"],
)
def test_scanned_chunk_stack_equals_a_per_chunk_loop(ci: object) -> None:
    """Values (and for the chunkwise stack gradients w.r.t. every param) of the scan equal the
    Python loop."""
    fn, params, inputs = _setup(ci)

    def loss(f):
        return lambda p: sum(jnp.sum(jnp.sin(v)) for v in f(p).values())

    scan = functools.partial(fn.apply, inputs=inputs)
    ref = functools.partial(_reference, fn, inputs=inputs)
    got, want = jit(scan)(params), jit(ref)(params)
    assert set(got) == set(want) == set(_trainer(ci).decomposition.kind_names)
    for k in want:
        assert got[k].shape == (MODEL.num_hidden_layers, B, T, 4)
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=2e-5, atol=2e-5)
    if isinstance(ci, GlobalTransformerCI):
        return  # same code path as chunkwise with one chunk; keep the test cheap
    g_scan = jit(jax.grad(loss(scan)))(params)
    g_ref = jit(jax.grad(loss(ref)))(params)
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(g_scan), jax.tree_util.tree_leaves(g_ref), strict=True
    ):
        assert float(jnp.abs(b).max()) > 0, path
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5, err_msg=str(path)
        )


def test_attention_is_bidirectional_and_position_aware() -> None:
    fn, params, inputs = _setup()
    apply = jit(fn.apply)
    base = apply(params, inputs)
    # A later position changes an earlier position's CI (no causal mask).
    later = {k: v.at[:, :, T - 1].add(1.0) for k, v in inputs.items()}
    changed = apply(params, later)
    for k in base:
        assert float(jnp.abs(changed[k][:, :, 0] - base[k][:, :, 0]).max()) > 1e-4
    # RoPE: swapping two positions' inputs does not just swap their outputs (a network without
    # position information is permutation-equivariant over positions and would).
    perm = np.arange(T)
    perm[[0, 2]] = perm[[2, 0]]
    swapped = apply(params, {k: v[:, :, perm] for k, v in inputs.items()})
    gap = max(float(jnp.abs(swapped[k] - base[k][:, :, perm]).max()) for k in base)
    assert gap > 1e-4


def test_remat_keeps_values_and_grads_and_checkpoints_each_block() -> None:
    fn, params, inputs = _setup()
    remat = make_ci_function(CHUNKWISE, decomposition=fn.decomposition, remat=True)

    def grad(f):
        return jit(jax.grad(lambda p: sum(jnp.sum(v**2) for v in f.apply(p, inputs).values())))

    g0, g1 = grad(fn)(params), grad(remat)(params)
    for a, b in zip(jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1), strict=True):
        scale = float(jnp.abs(a).max())
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5 * scale)
    jaxpr = str(
        jax.make_jaxpr(jax.grad(lambda p: jnp.sum(remat.apply(p, inputs)["q_proj"])))(params)
    )
    assert "checkpoint" in jaxpr or "remat" in jaxpr


def test_params_are_stacked_per_chunk_with_names_from_layers() -> None:
    trainer = _trainer()
    ci = trainer.abstract_params()["ci_fn"]
    fn = trainer.ci_fn
    assert fn.tap_kinds() == ("q_proj", "o_proj", "gate_proj", "down_proj")  # one per input
    d_in = 2 * (16 + 16 + 16 + 24)  # two layers per chunk, taps of widths 16, 16, 16, 24
    assert ci["in_w"].shape == (2, d_in, 16)
    assert ci["blocks"]["wq"].shape == (2 * 2, 16, 16)
    assert ci["blocks"]["wk"].shape == (2 * 2, 16, 8)  # 2 K/V heads of dim 4
    assert ci["out_w"]["down_proj"].shape == (4, 16, 4)
    names = {s.name for s in trainer.param_specs()}
    assert {"layers.0-1.ci_fn.in_w", "layers.2-3.ci_fn.blocks.1.wq"} <= names
    assert "layers.3.mlp.down_proj.ci_fn.out_w" in names


def test_init_is_bit_identical_per_array_and_keys_come_from_names() -> None:
    ci = ChunkwiseTransformerCI(d_model=16, n_blocks=1, n_heads=2, mlp_hidden=24)
    down = (DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=4),)
    stacked = _trainer(ci, targets=down).init_params(key=jax.random.key(3))["ci_fn"]
    per_array = _trainer(ci, "per_array", down).init_params(key=jax.random.key(3))["ci_fn"]
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(stacked),
        jax.tree_util.tree_leaves(per_array),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))
    # Decomposing only layers 2-3 gives exactly chunks 2-3 of the full decomposition.
    part = _trainer(
        ci, targets=(DecompositionTarget(module_pattern="layers.[23].mlp.down_proj", C=4),)
    )
    half = part.init_params(key=jax.random.key(3))["ci_fn"]
    for (path, a), b in zip(
        jax.tree_util.tree_leaves_with_path(half), jax.tree_util.tree_leaves(stacked), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b[2:]), err_msg=str(path))
    w1 = np.asarray(stacked["blocks"]["w1"])
    assert w1.shape == (4, 16, 24) and 0.7 < w1.std() * math.sqrt(16 / 2) < 1.3  # N(0, 2/d)


@pytest.mark.parametrize(
    ("ci", "targets", "path", "words"),
    [
        (
            ChunkwiseTransformerCI(
                blocks_per_chunk=3, d_model=16, n_blocks=1, n_heads=2, mlp_hidden=8
            ),
            ALL,
            "pd.ci.blocks_per_chunk",
            "does not divide the 4 decomposed layers",
        ),
        (
            ChunkwiseTransformerCI(d_model=16, n_blocks=1, n_heads=2, mlp_hidden=8),
            (
                DecompositionTarget(module_pattern="layers.[01].*", C=4),
                DecompositionTarget(module_pattern="layers.[23].mlp.*", C=4),
            ),
            "pd.decomposition_targets",
            "must decompose the same kinds",
        ),
        (
            ChunkwiseTransformerCI(d_model=16, n_blocks=1, n_heads=3, mlp_hidden=8),
            ALL,
            "pd.ci.n_heads",
            "does not divide d_model 16",
        ),
        (
            GlobalTransformerCI(d_model=12, n_blocks=1, n_heads=4, mlp_hidden=8),
            ALL,
            "pd.ci.n_heads",
            "head dim 3, which is odd",
        ),
        (
            GlobalTransformerCI(d_model=16, n_blocks=1, n_heads=4, n_kv_heads=3, mlp_hidden=8),
            ALL,
            "pd.ci.n_kv_heads",
            "must divide n_heads 4",
        ),
    ],
    ids=["blocks_per_chunk", "non_uniform", "n_heads", "odd_head_dim", "n_kv_heads"],
)
def test_bad_transformer_configs_name_the_field(ci, targets, path, words) -> None:
    with pytest.raises(ConfigError) as info:
        Trainer(MODEL, _pd(ci, targets))
    assert f"{path}:" in str(info.value) and words in str(info.value), str(info.value)


def test_global_transformer_takes_any_decomposition() -> None:
    """Non-uniform layers are fine for one chunk; q/k/v share a tap only where they cover the
    same layers."""
    targets = (
        DecompositionTarget(module_pattern="layers.[01].self_attn.[qk]_proj", C=4),
        DecompositionTarget(module_pattern="layers.[23].self_attn.v_proj", C=4),
    )
    dec = build_decomposition(MODEL, targets)
    fn = make_ci_function(
        GlobalTransformerCI(d_model=16, n_blocks=1, n_heads=2, mlp_hidden=8), decomposition=dec
    )
    assert fn.tap_kinds() == ("q_proj", "v_proj")
    assert fn.input_dim() == 4 * 16


@pytest.mark.parametrize(
    ("ci", "message"),
    [
        (
            {
                "type": "chunkwise_transformer",
                "blocks_per_chunk": 3,
                "d_model": 16,
                "n_blocks": 1,
                "n_heads": 2,
                "mlp_hidden": 8,
            },
            "pd.ci.blocks_per_chunk: got 3, which does not divide the 2 decomposed layers",
        ),
        (
            {
                "type": "global_transformer",
                "d_model": 16,
                "n_blocks": 1,
                "n_heads": 5,
                "mlp_hidden": 8,
            },
            "pd.ci.n_heads: got 5, which does not divide d_model 16",
        ),
        ({"type": "chunk_transformer"}, "pd.ci.type: got 'chunk_transformer'; must be one of"),
    ],
    ids=["blocks_per_chunk", "n_heads", "type"],
)
def test_bad_ci_config_from_the_cli_writes_nothing(tmp_path, capsys, ci, message) -> None:
    from pd_train.cli import main

    from ._cli import tiny_config, write_config

    config = write_config(tmp_path, tiny_config(tmp_path, tmp_path / "cache", ci=ci))
    assert main(["run", str(config)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()


def test_production_configs_differ_only_in_the_ci_function() -> None:
    """configs/llama8b-full32L.yaml runs the production chunkwise transformer; its shared_mlp
    variant is the same config otherwise (so the two compare the CI function alone)."""
    from pathlib import Path

    from pd_train.run import prepare

    root = Path(__file__).resolve().parents[2] / "configs"
    prod = prepare(root / "llama8b-full32L.yaml", for_run=False)
    variant = prepare(root / "llama8b-full32L-shared-mlp.yaml", for_run=False)
    assert prod.config.pd.ci == ChunkwiseTransformerCI(
        blocks_per_chunk=1, d_model=4096, n_blocks=4, n_heads=64, mlp_hidden=16384
    )
    assert variant.config.pd.ci.type == "shared_mlp"
    a, b = dict(prod.raw), dict(variant.raw)
    for raw in (a, b):
        raw.pop("run_name")
        raw["pd"] = {k: v for k, v in raw["pd"].items() if k != "ci"}
    assert a == b
