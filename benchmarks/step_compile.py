"""Train-step compile time: recon chunk loop as one ``lax.scan`` vs Python-unrolled.

AOT, compile only: every arm builds a :class:`pd_train.Trainer` on a mesh of 8 simulated CPU
devices (ZeRO-1 layout), lowers the step on abstract state/target/batch (nothing allocated) and
compiles it, with ``jax.clear_caches()`` before each arm. Width d_model 256; every site of every
layer decomposed; losses faithfulness + importance minimality + chunkwise subset recon (the
production recon term). ``sites_per_chunk = ceil(sites / chunks)``, so the plan has at most the
requested number of chunks (the table shows how many it has).

Arms: ``scan`` is the step as pd runs it (chunk loop and layer loop are scans; each layer picks
copy / frozen / live with ``lax.switch``). ``unroll`` is the original system's structure: chunk
and layer loops unrolled in Python, each chunk's forward specialized to its live sites. One extra
arm at 8Lx8c unrolls the chunks but keeps the layer scan. Unroll arms whose predicted time (the
previous unroll arm of that layer count scaled by the chunk ratio, or the previous layer count's
first arm scaled by the layer ratio) exceeds ``--unroll-budget`` seconds are skipped, and the
table says so. Then scan and unroll run real steps at 8 layers x 8 chunks and their step times
are compared.

    python benchmarks/step_compile.py
    python benchmarks/step_compile.py --layers 2 8 --chunks 1 4 --unroll-budget 60

The last line is
``step compile: scan 32Lx16c / 2Lx1c R1x; unroll/scan at 8Lx8c R2x; step time scan/unroll R3x``.
"""

from __future__ import annotations

import os

# Simulated devices must be configured before jax is imported.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import pd_sharding
from pd_train.config import (
    ChunkwiseSubsetRecon,
    DecompositionTarget,
    Faithfulness,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    ReconConfig,
    SharedMLPCI,
)
from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig
from pd_train.step import Trainer, step_key

D_MODEL, HEADS, KV_HEADS, D_FF, VOCAB = 256, 4, 2, 1024, 1024
C = 64
BATCH, SEQ = 8, 32


#: Arms: the scanned step, the original system's structure (chunk and layer loops unrolled in
#: Python, each chunk's forward specialized to its live sites), and chunk-unrolled with layers
#: still scanned.
RECON = {
    "scan": ReconConfig(chunk_loop="scan", layer_loop="scan"),
    "unroll": ReconConfig(chunk_loop="unroll", layer_loop="unroll"),
    "unroll-chunks": ReconConfig(chunk_loop="unroll", layer_loop="scan"),
}


def model(layers: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=D_MODEL,
        intermediate_size=D_FF,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
    )


def pd_config(layers: int, chunks: int, loop: str) -> PDConfig:
    sites = 7 * layers
    return PDConfig(
        steps=1000,
        batch_size=BATCH,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*", C=C),),
        ci=SharedMLPCI(hidden_dims=(64,)),
        loss_metrics=(
            Faithfulness(coeff=1e6),
            ImportanceMinimality(coeff=5e-6, pnorm_start=2.0, pnorm_end=0.4, eps=1e-6),
            ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=math.ceil(sites / chunks)),
        ),
        recon=RECON[loop],
        components=OptimizerConfig(lr=2e-5, final_val_frac=0.1, clip=0.01),
        ci_fn=OptimizerConfig(lr=2e-5, final_val_frac=0.1),
    )


def trainer(layers: int, chunks: int, loop: str, mesh: jax.sharding.Mesh) -> Trainer:
    return Trainer(model(layers), pd_config(layers, chunks, loop), mesh=mesh)


def compile_arm(
    layers: int, chunks: int, loop: str, mesh: jax.sharding.Mesh
) -> tuple[float, float, int]:
    """(lower seconds, compile seconds, chunks in the plan)."""
    jax.clear_caches()
    tr = trainer(layers, chunks, loop, mesh)
    n_chunks = next(iter(tr.plans.values())).n_chunks
    start = time.perf_counter()
    lowered = tr.lower_step(batch_size=BATCH, seq_len=SEQ, target_dtype=jnp.float32)
    lowered_at = time.perf_counter()
    lowered.compile()
    done = time.perf_counter()
    return lowered_at - start, done - lowered_at, n_chunks


def step_time(layers: int, chunks: int, loop: str, mesh: jax.sharding.Mesh, steps: int) -> float:
    """Median seconds per executed step (after one warm-up step)."""
    jax.clear_caches()
    tr = trainer(layers, chunks, loop, mesh)
    target = llama.init_params(tr.model, key=jax.random.key(0))
    target = jax.device_put(target, tr.target_shardings(target))
    tokens = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ)).astype(np.int32)
    tokens = jax.device_put(tokens, tr.batch_sharding((BATCH, SEQ)))
    state = tr.init_state(key=jax.random.key(1))
    run_key = jax.random.key(2)
    state, metrics = tr.train_step(state, target, tokens, step_key(run_key, 0))
    jax.block_until_ready(metrics)
    times = []
    for i in range(1, steps + 1):
        start = time.perf_counter()
        state, metrics = tr.train_step(state, target, tokens, step_key(run_key, i))
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _fmt(cells: tuple[float, float] | str) -> str:
    if isinstance(cells, str):
        return f"{cells:>8} {'':>8}"
    low, comp = cells
    return f"{low + comp:>8.1f} {comp:>8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument(
        "--unroll-budget", type=float, default=300.0, help="max predicted seconds per unroll arm"
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per loop at 8Lx8c")
    args = parser.parse_args()

    mesh = pd_sharding.make_mesh(data=8)
    print(
        f"devices: {len(jax.devices())} x {jax.devices()[0].platform}; d_model {D_MODEL}, "
        f"d_ff {D_FF}, C {C}, batch {BATCH}x{SEQ}, all 7 kinds decomposed; jax {jax.__version__}",
        flush=True,
    )
    totals: dict[tuple[str, int, int], float] = {}
    rows: list[str] = []
    skipped: list[str] = []
    last: dict[int, tuple[int, float]] = {}  # layers -> (plan chunks, seconds) of the last unroll
    first_unroll: dict[int, float] = {}  # layers -> seconds of its first unroll arm

    def predict(layers: int, plan: int) -> float | None:
        if layers in last:
            chunks, seconds = last[layers]
            return seconds * plan / chunks
        smaller = [n for n in last if n < layers]
        if smaller:  # the first arm of a layer count: scale the previous layer count's first arm
            n = max(smaller)
            return first_unroll[n] * layers / n
        return None

    for layers in args.layers:
        for chunks in args.chunks:
            scan = compile_arm(layers, chunks, "scan", mesh)
            plan = scan[2]
            totals[("scan", layers, chunks)] = scan[0] + scan[1]
            predicted = predict(layers, plan)
            unroll: tuple[float, float] | str
            if predicted is not None and predicted > args.unroll_budget:
                skipped.append(f"{layers}Lx{chunks}c (predicted {predicted:.0f} s)")
                unroll, ratio = "skipped", ""
            else:
                low, comp, _ = compile_arm(layers, chunks, "unroll", mesh)
                unroll = (low, comp)
                totals[("unroll", layers, chunks)] = low + comp
                last[layers] = (plan, low + comp)
                first_unroll.setdefault(layers, low + comp)
                ratio = f"{(low + comp) / (scan[0] + scan[1]):.1f}x"
            row = f"{layers:>6} {chunks:>6} {plan:>5} | {_fmt(scan[:2])} | {_fmt(unroll)} | {ratio:>11}"
            rows.append(row)
            print(row, flush=True)

    # Chunks unrolled but layers still scanned, at the arm of R2: how much the layer scan alone buys.
    low, comp, _ = compile_arm(8, 8, "unroll-chunks", mesh)
    totals[("unroll-chunks", 8, 8)] = low + comp

    header = (
        f"{'layers':>6} {'chunks':>6} {'plan':>5} | {'scan':>8} {'(xla)':>8} | "
        f"{'unroll':>8} {'(xla)':>8} | {'unroll/scan':>11}"
    )
    print()
    print("Step compile seconds (lower + compile; in brackets the XLA compile part). plan = chunks")
    print("in the recon plan (sites_per_chunk = ceil(7 * layers / chunks)).")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(row)
    if skipped:
        print(f"unroll arms skipped (budget {args.unroll_budget:.0f} s): " + "; ".join(skipped))
    print(
        f"8Lx8c with chunks unrolled and layers scanned: {low + comp:.1f} s "
        f"({(low + comp) / totals[('scan', 8, 8)]:.1f}x scan)"
        if ("scan", 8, 8) in totals
        else ""
    )

    t_scan = step_time(8, 8, "scan", mesh, args.steps)
    t_unroll = step_time(8, 8, "unroll", mesh, args.steps)
    print(
        f"step time at 8Lx8c (median of {args.steps}): scan {t_scan * 1e3:.0f} ms, "
        f"unroll {t_unroll * 1e3:.0f} ms"
    )

    def total(loop: str, layers: int, chunks: int) -> float:
        return totals.get((loop, layers, chunks), float("nan"))

    r1 = total("scan", 32, 16) / total("scan", 2, 1)
    r2 = total("unroll", 8, 8) / total("scan", 8, 8)
    r3 = t_scan / t_unroll
    print(
        f"step compile: scan 32Lx16c / 2Lx1c {r1:.2f}x; unroll/scan at 8Lx8c {r2:.1f}x; "
        f"step time scan/unroll {r3:.2f}x"
    )


if __name__ == "__main__":
    main()
