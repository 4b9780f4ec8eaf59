"""The useful-FLOP census (pd_train.flops): a hand count on a one-layer toy, every CI type."""

from __future__ import annotations

import math

import pytest

from pd_train.ci import make_ci_function
from pd_train.config.pd import (
    MLPCI,
    ChunkwiseSubsetRecon,
    ChunkwiseTransformerCI,
    DecompositionTarget,
    Faithfulness,
    GlobalTransformerCI,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    PersistentPGDRecon,
    PGDOptimizer,
    PGDRecon,
    SharedMLPCI,
    StochasticRecon,
    VectorMLPCI,
)
from pd_train.decomposition import build_decomposition
from pd_train.flops import (
    ADAM_FLOPS_PER_PARAM,
    ci_fn_flops,
    compiled_cost,
    efficiency_report,
    step_census,
)
from pd_train.models.llama_config import LlamaConfig

# One layer: d 8, two heads of 4 (q 8 wide), one KV head (k/v 4 wide), d_ff 16, vocab 32.
TOY = LlamaConfig(
    vocab_size=32,
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
)
B, T = 2, 3
N = B * T
OPT = OptimizerConfig(lr=1e-3)


def _pd(**kw: object) -> PDConfig:
    base: dict[str, object] = {
        "steps": 10,
        "batch_size": B,
        "decomposition_targets": (
            DecompositionTarget(module_pattern="layers.0.mlp.down_proj", C=3),
        ),
        "ci": SharedMLPCI(hidden_dims=(5,)),
        "loss_metrics": (
            Faithfulness(coeff=1.0),
            ImportanceMinimality(coeff=1.0),
            StochasticRecon(coeff=1.0),
        ),
        "components": OPT,
        "ci_fn": OPT,
    }
    base.update(kw)
    return PDConfig(**base)  # type: ignore[arg-type]


def test_census_equals_a_hand_count_on_a_one_layer_toy() -> None:
    """down_proj (16 -> 8, C 3) decomposed, shared_mlp CI 16 -> 5 -> 3, faithfulness +
    importance + stochastic recon; every number below counted by hand (2 FLOPs per MAC)."""
    census = step_census(TOY, _pd(), seq_len=T)
    # clean forward: site MACs per token q 64 + k 32 + v 32 + o 64 + gate 128 + up 128 +
    # down 128 = 576; attention 2 matmuls x B x heads x T x T x head_dim; LM head 8 x 32.
    clean = 2 * N * 576 + 2 * 2 * B * 2 * T * T * 4 + 2 * N * 8 * 32
    # CI function: 16 -> 5 (input carries no grad: dW only) and 5 -> 3 (dx and dW).
    ci = 2 * N * 16 * 5 * 2 + 2 * N * 5 * 3 * 3
    # faithfulness: V @ U (16 x 3 x 8), backward dV and dU.
    faith = 2 * 16 * 3 * 8 * 3
    # recon: starts at the live down_proj (q..up and down's x@W equal the clean forward):
    # x@V forward + dV, (xV*m)@U forward + d(xV*m) + dU, LM head forward + d(input).
    recon = 2 * N * 16 * 3 * 2 + 2 * N * 3 * 8 * 3 + 2 * N * 8 * 32 * 2
    # AdamW on V, U (3 x (16 + 8)) and the CI MLP (16*5 + 5 + 5*3 + 3).
    opt = ADAM_FLOPS_PER_PARAM * (3 * 24 + 103)
    by_term = census.by("term")
    assert by_term["clean"] == clean == 10560
    assert by_term["ci_fn"] == ci == 2460
    assert by_term["faithfulness"] == faith == 2304
    assert by_term["stochastic_recon"] == recon == 8160
    assert by_term["optimizer"] == opt
    assert "importance_minimality" not in by_term  # elementwise only
    assert census.total == clean + ci + faith + recon + opt
    assert census.tokens == N


def test_frozen_sites_behind_a_live_one_cost_their_input_gradient() -> None:
    """q_proj live: everything after it in the layer carries a gradient (dx = 1x forward),
    frozen sites never get a weight gradient; PGD ascents add n_steps masked passes."""
    pd = _pd(
        decomposition_targets=(
            DecompositionTarget(module_pattern="layers.0.self_attn.q_proj", C=2),
        ),
        loss_metrics=(PGDRecon(coeff=1.0, n_steps=3),),
    )
    census = step_census(TOY, pd, seq_len=T)
    frozen = [e for e in census.entries if e.term == "pgd_recon" and e.part == "frozen"]
    step = {e.kind: e for e in frozen if e.phase == "step"}
    # k and v read the same (clean) input as q: their x@W is the clean forward's, not redone;
    # o, gate, up, down are behind q.
    assert "k_proj" not in step and "v_proj" not in step
    for kind in ("o_proj", "gate_proj", "up_proj", "down_proj"):
        assert step[kind].backward == step[kind].forward
    ascent = sum(e.total for e in census.entries if e.phase == "pgd_ascent")
    # an ascent is the same pass without weight gradients (dV, dU): 3 of them.
    main = [e for e in census.entries if e.term == "pgd_recon" and e.phase == "step"]
    no_dw = sum(e.forward + (e.backward if e.part != "live" else 0) for e in main)
    live_dx = 2 * N * 2 * 8  # the live site's only input gradient: d(xV*m) of (xV*m)@U
    assert ascent == pytest.approx(3 * (no_dw + live_dx))


@pytest.mark.parametrize(
    "ci",
    [
        MLPCI(hidden_dims=(4, 3)),
        SharedMLPCI(hidden_dims=(6,)),
        VectorMLPCI(hidden_dims=(4,)),
        ChunkwiseTransformerCI(d_model=8, n_blocks=2, n_heads=2, mlp_hidden=12),
        GlobalTransformerCI(d_model=8, n_blocks=1, n_heads=2, n_kv_heads=1, mlp_hidden=12),
    ],
    ids=lambda c: c.type,
)
def test_ci_forward_is_two_flops_per_weight_per_position(ci: object) -> None:
    """Every weight matrix of every CI type is applied once per position (plus attention for
    the transformers, plus x@V for ``mlp``): its forward = 2·N·Σ weight numel (+ those)."""
    model = LlamaConfig(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    targets = (DecompositionTarget(module_pattern="layers.*.mlp.*", C=3),)
    pd = _pd(decomposition_targets=targets, ci=ci)
    dec = build_decomposition(model, targets)
    fn = make_ci_function(ci, decomposition=dec)  # type: ignore[arg-type]
    weights = sum(
        math.prod(a.shape)
        for a in fn.arrays(dec)
        if any(p in ("in_w", "out_w") or p.startswith("w") for p in a.path)
    )
    entries = ci_fn_flops(pd, dec, batch_size=B, seq_len=T)
    forward = sum(e.forward for e in entries)
    extra = 0
    if isinstance(ci, MLPCI):
        extra = sum(2 * N * k.d_in * k.C * len(k.layers) for k in dec.kinds)
    if isinstance(ci, ChunkwiseTransformerCI | GlobalTransformerCI):
        n_chunks = len(fn.chunks())  # type: ignore[attr-defined]
        extra = 2 * 2 * B * T * T * 8 * ci.n_blocks * n_chunks  # heads x head_dim = d_model
    assert forward == 2 * N * weights + extra
    assert sum(e.backward for e in entries) > forward  # dW everywhere, dx past the input


def test_every_term_and_the_production_recipe_are_counted() -> None:
    pd = _pd(
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*.mlp.*", C=3),),
        loss_metrics=(
            ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=2),
            PersistentPGDRecon(coeff=0.5, n_warmup_steps=2, optimizer=PGDOptimizer(lr=0.01)),
        ),
    )
    census = step_census(TOY, pd, seq_len=T)
    terms = census.by("term")
    assert terms["chunkwise_subset_recon"] > 0 and terms["persistent_pgd_recon"] > 0
    assert census.by("phase")["pgd_ascent"] > 0
    assert census.forward + census.backward == census.total


def test_hlo_flops_multiply_loop_bodies_by_their_trip_count() -> None:
    """XLA's cost_analysis counts a scan's body once; hlo_matmul_flops counts it 10 times."""
    import jax
    import jax.numpy as jnp

    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0]

    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    w = jax.ShapeDtypeStruct((10, 16, 16), jnp.float32)
    cost = compiled_cost(jax.jit(f).lower(x, w).compile())
    assert cost.matmul_flops == cost.matmul_flops_min == 10 * 2 * 8 * 16 * 16
    assert cost.unknown_loops == 0
    if cost.xla_flops is not None:
        assert cost.xla_flops < 2 * 2 * 8 * 16 * 16  # the body, once
    assert cost.temp_bytes is None or cost.temp_bytes >= 0

    # what `pd-train compile` prints for a train step whose census is half the compiled FLOPs
    from pd_train.run.compile import CompileRow

    row = CompileRow("train_step", 0.0, 0.0, None, cost=cost, useful=cost.matmul_flops / 2)
    report = efficiency_report([row])
    assert "train_step" in report and "matmul 0.000 GFLOP" in report
    assert "compiled/useful 2.00x" in report


def test_compiled_step_matches_the_census_without_remat() -> None:
    """A train step with no remat and no conditionals (one layer, route-all recon): XLA's
    compiled matmul FLOPs equal the census's within 5 % (measured: exactly equal), so every
    matmul the census counts is in the program and the program adds none beyond them."""
    from pd_train.train import Trainer

    model = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    b, t = 2, 16
    pd = _pd(
        batch_size=b,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*.*.*", C=8),),
        ci=SharedMLPCI(hidden_dims=(16,)),
    )
    trainer = Trainer(model, pd, compiler_options={"xla_backend_optimization_level": 0})
    cost = compiled_cost(trainer.compile_step(batch_size=b, seq_len=t))
    census = step_census(model, pd, seq_len=t)
    assert cost.matmul_flops == cost.matmul_flops_min  # no conditional in this program
    assert 1.0 <= cost.matmul_flops / census.matmul <= 1.05


def test_gpt2_census_equals_a_hand_count_on_a_one_layer_toy() -> None:
    """GPT-2 (no gate; q/k/v/o all 8 -> 8, up 8 -> 16, down 16 -> 8, tied LM head 8 x 32):
    up_proj (C 3) decomposed, shared_mlp CI 8 -> 5 -> 3; every number counted by hand."""
    from pd_train.models.gpt2 import GPT2Config

    toy = GPT2Config(vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2, n_inner=16)
    pd = _pd(
        decomposition_targets=(DecompositionTarget(module_pattern="layers.0.mlp.up_proj", C=3),)
    )
    census = step_census(toy, pd, seq_len=T)
    # clean: site MACs per token q, k, v, o 64 each + up 128 + down 128 = 512; attention 2
    # matmuls x B x 2 heads x T x T x head_dim 4; the tied LM head 8 x 32.
    clean = 2 * N * 512 + 2 * 2 * B * 2 * T * T * 4 + 2 * N * 8 * 32
    # CI: 8 -> 5 (dW only) and 5 -> 3 (dx and dW).
    ci = 2 * N * 8 * 5 * 2 + 2 * N * 5 * 3 * 3
    faith = 2 * 8 * 3 * 16 * 3
    # recon from the live up_proj (its x@W is the clean one): x@V fwd + dV, (xV*m)@U fwd +
    # d(xV*m) + dU, down_proj frozen behind it (fwd + dx), LM head fwd + dx.
    recon = 2 * N * 8 * 3 * 2 + 2 * N * 3 * 16 * 3 + 2 * N * 16 * 8 * 2 + 2 * N * 8 * 32 * 2
    opt = ADAM_FLOPS_PER_PARAM * (3 * 24 + 8 * 5 + 5 + 5 * 3 + 3)
    by_term = census.by("term")
    assert by_term["clean"] == clean == 9792
    assert by_term["ci_fn"] == ci == 1500
    assert by_term["faithfulness"] == faith == 2304
    assert by_term["stochastic_recon"] == recon == 11520
    assert by_term["optimizer"] == opt
    assert census.total == clean + ci + faith + recon + opt
    assert "gate_proj" not in census.by("kind")


def test_embedding_and_unembedding_sites_are_counted_by_hand() -> None:
    """embed_tokens (32 -> 8, C 3: a row lookup, no x@V matmul) and lm_head (8 -> 32, C 2) on the
    one-layer Llama toy, mlp CI: the recon forward starts at the embedding, so the whole layer
    is recomputed with gradients; every number counted by hand."""
    pd = _pd(
        decomposition_targets=(
            DecompositionTarget(module_pattern="embed_tokens", C=3),
            DecompositionTarget(module_pattern="lm_head", C=2),
        ),
        ci=MLPCI(hidden_dims=(5,)),
    )
    census = step_census(TOY, pd, seq_len=T)
    # (V[tok]*m) @ U: fwd + d(inner) + dU; the layer's sites (576 MACs) fwd + dx; attention fwd
    # + 2x bwd; the frozen head fwd + dx; the head's x@V (fwd, dx, dV) and (xV*m)@U (fwd, dx, dU).
    recon = (
        2 * N * 3 * 8 * 3
        + 2 * N * 576 * 2
        + 3 * 2 * 2 * B * 2 * T * T * 4
        + 2 * N * 8 * 32 * 2
        + 2 * N * 8 * 2 * 3
        + 2 * N * 2 * 32 * 3
    )
    faith = 2 * 32 * 3 * 8 * 3 + 2 * 8 * 2 * 32 * 3
    # mlp CI: x@V only at the head (dW), per component 1 -> 5 and 5 -> 1 (dx, dW) at both.
    ci = 2 * N * 8 * 2 * 2 + (2 * N * 3 * 5 * 3) * 2 + (2 * N * 2 * 5 * 3) * 2
    by_term = census.by("term")
    assert by_term["stochastic_recon"] == recon == 25440
    assert by_term["faithfulness"] == faith == 7680
    assert by_term["ci_fn"] == ci
