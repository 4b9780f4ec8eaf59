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
first arm scaled by the layer ratio) exceeds ``--unroll-budget`` CPU seconds are skipped, and the
table says so. Then scan and unroll run real steps at 8 layers x 8 chunks and their step times
are compared.

    python benchmarks/step_compile.py
    python benchmarks/step_compile.py --layers 2 8 --chunks 1 4 --unroll-budget 60
    python benchmarks/step_compile.py --target builtin:smollm2-all --layers 2 8 30 --chunks 1 5

The last line is
``step compile: scan 32Lx16c / 2Lx1c R1x; unroll/scan at 8Lx8c R2x; step time scan/unroll R3x``.

Then the transformer CI function (``--ci-chunks``, empty skips it; ``--ci-only`` runs only it):
the scanned step at 32 layers with a chunkwise-transformer CI function cut into each given
number of chunks (``blocks_per_chunk = 32 / chunks``), at reduced width (CI d_model 64, 2
blocks, 4 heads, MLP 128; target width as above), remat of the CI blocks on. Prints
``ci step compile: 32 chunks / 2 chunks R.RRx`` (CPU time).

Then the shipped configs' recon plan (``--all-sites-layers``, empty skips it;
``--all-sites-only`` runs only it): the scanned step with one ``subset_recon`` term (all sites
in one masked forward, per-position uniform-k routing) at each layer count. Prints
``all-sites step compile: 32L / 2L R.RRx`` (CPU time; goal ≤ 1.5), then the same with the
production recipe's recon remat (``all-sites step compile (remat recon, sources redrawn): …``).

``--step-time-vs WORKTREE`` runs only the step time at 8Lx8c, this checkout against the code
of another worktree (each arm in its own processes, alternating), and prints last
``step time, hyperparameters as data / as constants: R.RRx (CPU R.RRx)``.

Then persistent PGD (``--ppgd-warmups``, empty skips it; ``--ppgd-only`` runs only it): the
scanned step at 8 layers (width as above, 4 recon chunks) plus a ``persistent_pgd_recon`` term
(bsc, Adam) with each given ``n_warmup_steps``. The warmup ascents are a ``lax.fori_loop``, so
the compile should not grow with their number. Prints
``ppgd step compile: warmup 8 / warmup 0 R.RRx`` (CPU time).
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
import re
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import pd_sharding
from pd_train.config.pd import (
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
from pd_train.train import Trainer, step_key

D_MODEL, HEADS, KV_HEADS, D_FF, VOCAB = 256, 4, 2, 1024, 1024
C = 64
BATCH, SEQ = 8, 32
#: ``--target CONFIG``: a real model's architecture and decomposition targets replace the above.
TARGET: dict = {}


#: Arms: the scanned step, the original system's structure (chunk and layer loops unrolled in
#: Python, each chunk's forward specialized to its live sites), and chunk-unrolled with layers
#: still scanned.
RECON = {
    "scan": ReconConfig(chunk_loop="scan", layer_loop="scan"),
    "unroll": ReconConfig(chunk_loop="unroll", layer_loop="unroll"),
    "unroll-chunks": ReconConfig(chunk_loop="unroll", layer_loop="scan"),
}


def model(layers: int) -> LlamaConfig:
    if TARGET:
        import attrs

        return attrs.evolve(TARGET["arch"], num_hidden_layers=layers)
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
        decomposition_targets=TARGET.get("targets")
        or (DecompositionTarget(module_pattern="layers.*", C=C),),
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


class Arm(NamedTuple):
    """One compile: CPU and wall seconds of lower + compile, the plan's chunk count, and the
    number of fused kernels in the compiled module (XLA's ``fused_computation``s)."""

    cpu: float
    wall: float
    plan: int
    kernels: int


def count_kernels(compiled: jax.stages.Compiled) -> int:
    """Fused computations in the optimized HLO: roughly the kernels the backend generated."""
    return len(re.findall(r"^%?fused_computation[\w.]* ", compiled.as_text(), re.MULTILINE))


def compile_arm(layers: int, chunks: int, loop: str, mesh: jax.sharding.Mesh) -> Arm:
    jax.clear_caches()
    tr = trainer(layers, chunks, loop, mesh)
    n_chunks = next(iter(tr.plans.values())).n_chunks
    wall, cpu = time.perf_counter(), time.process_time()
    compiled = tr.lower_step(batch_size=BATCH, seq_len=SEQ, target_dtype=jnp.float32).compile()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return Arm(cpu, wall, n_chunks, count_kernels(compiled))


def step_time(layers: int, chunks: int, loop: str, mesh: jax.sharding.Mesh, steps: int) -> float:
    """Fastest wall seconds of ``steps`` executed steps (after one warm-up step): the minimum
    is the figure least disturbed by other work on a shared machine."""
    return step_time_cpu(layers, chunks, loop, mesh, steps)[0]


def step_time_cpu(
    layers: int, chunks: int, loop: str, mesh: jax.sharding.Mesh, steps: int
) -> tuple[float, float]:
    """(:func:`step_time`, this process's CPU seconds per timed step: all its threads, the
    compile and the warm-up step excluded)."""
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
    cpu = time.process_time()
    for i in range(1, steps + 1):
        start = time.perf_counter()
        state, metrics = tr.train_step(state, target, tokens, step_key(run_key, i))
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    return min(times), (time.process_time() - cpu) / steps


def compare_step_time(old: str, steps: int, rounds: int) -> None:
    """The step time at 8Lx8c (scan) of this checkout (the hyperparameters an argument of the
    step) against the code in the worktree ``old`` (e.g. the commit before the
    hyperparameters-as-data merge, whose step has them as constants): each arm in its own
    process (``old``'s packages first on ``PYTHONPATH``), ``rounds`` rounds in ABBA order, the
    fastest step of each arm kept. Prints a table and, last,
    ``step time, hyperparameters as data / as constants: R.RRx``."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    packages = Path(old).resolve() / "packages"
    old_path = os.pathsep.join(str(p / "src") for p in sorted(packages.iterdir()))
    arms = {"data (this checkout)": None, f"constants ({old})": old_path}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    for round_ in range(rounds):
        order = list(arms.items())
        for name, path in order if round_ % 2 == 0 else order[::-1]:  # ABBA: no arm always first
            env = dict(os.environ)
            if path is not None:
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
            out = subprocess.run(
                [sys.executable, __file__, "--step-time-arm", "--steps", str(steps)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            wall, cpu, source = json.loads(out.stdout.strip().splitlines()[-1])
            results[name].append((wall, cpu))
            print(f"{name}: {wall * 1e3:.0f} ms, {cpu:.2f} CPU s/step ({source})", flush=True)
    print(f"\nStep time at 8Lx8c (scan), fastest of {steps} steps per process, {rounds} processes")
    print("per arm; CPU s: the process's CPU seconds per timed step (all threads), min over its")
    print("processes.")
    print("| arm | fastest step ms | CPU s per step |")
    print("|---|---:|---:|")
    best = {name: (min(w for w, _ in r), min(c for _, c in r)) for name, r in results.items()}
    for name, (wall, cpu) in best.items():
        print(f"| {name} | {wall * 1e3:.0f} | {cpu:.2f} |")
    (data_wall, data_cpu), (const_wall, const_cpu) = best.values()
    print(
        f"step time, hyperparameters as data / as constants: {data_wall / const_wall:.2f}x "
        f"(CPU {data_cpu / const_cpu:.2f}x)"
    )


def ci_compile_arm(chunks: int, mesh: jax.sharding.Mesh, layers: int = 32) -> Arm:
    """The scanned step at ``layers`` layers with the transformer CI function in ``chunks``."""
    import attrs

    from pd_train.config.pd import ChunkwiseTransformerCI, RematConfig, RuntimeConfig

    jax.clear_caches()
    ci = ChunkwiseTransformerCI(
        blocks_per_chunk=layers // chunks, d_model=64, n_blocks=2, n_heads=4, mlp_hidden=128
    )
    pd = attrs.evolve(pd_config(layers, 4, "scan"), ci=ci)
    runtime = RuntimeConfig(remat=RematConfig(ci_fn=True))
    tr = Trainer(model(layers), pd, runtime, mesh=mesh)
    wall, cpu = time.perf_counter(), time.process_time()
    compiled = tr.lower_step(batch_size=BATCH, seq_len=SEQ, target_dtype=jnp.float32).compile()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return Arm(cpu, wall, chunks, count_kernels(compiled))


def ci_step_compile(chunk_counts: list[int], mesh: jax.sharding.Mesh) -> None:
    arms = {}
    for chunks in chunk_counts:
        arms[chunks] = arm = ci_compile_arm(chunks, mesh)
        print(
            f"CI transformer, 32 layers, {chunks:>2} CI chunks: compile {arm.cpu:.1f} CPU s, "
            f"{arm.wall:.1f} s wall, {arm.kernels} kernels",
            flush=True,
        )
    lo, hi = min(arms), max(arms)
    print(f"ci step compile: {hi} chunks / {lo} chunks {arms[hi].cpu / arms[lo].cpu:.2f}x")


def ppgd_compile_arm(n_warmup: int, mesh: jax.sharding.Mesh, layers: int = 8) -> Arm:
    """The scanned step at ``layers`` layers with a persistent PGD term of ``n_warmup`` warmup
    ascents per step."""
    import attrs

    from pd_train.config.pd import PersistentPGDRecon, PGDOptimizer

    jax.clear_caches()
    base = pd_config(layers, 4, "scan")
    term = PersistentPGDRecon(
        coeff=0.5,
        scope="bsc",
        n_warmup_steps=n_warmup,
        optimizer=PGDOptimizer(type="adam", lr=0.01, warmup_frac=0.025, b1=0.5, b2=0.99),
    )
    pd = attrs.evolve(base, loss_metrics=(*base.loss_metrics, term))
    tr = Trainer(model(layers), pd, mesh=mesh, seq_len=SEQ)
    wall, cpu = time.perf_counter(), time.process_time()
    compiled = tr.lower_step(batch_size=BATCH, seq_len=SEQ, target_dtype=jnp.float32).compile()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return Arm(cpu, wall, 4, count_kernels(compiled))


def ppgd_step_compile(warmups: list[int], mesh: jax.sharding.Mesh) -> None:
    arms = {}
    for n in warmups:
        arms[n] = arm = ppgd_compile_arm(n, mesh)
        print(
            f"persistent PGD, 8 layers x 4 chunks, n_warmup_steps {n}: compile {arm.cpu:.1f} "
            f"CPU s, {arm.wall:.1f} s wall, {arm.kernels} kernels",
            flush=True,
        )
    lo, hi = min(arms), max(arms)
    print(f"ppgd step compile: warmup {hi} / warmup {lo} {arms[hi].cpu / arms[lo].cpu:.2f}x")


def all_sites_compile_arm(layers: int, mesh: jax.sharding.Mesh, *, remat: bool = False) -> Arm:
    """The scanned step at ``layers`` layers with the shipped configs' recon plan: one
    ``subset_recon`` term (every site in one forward, per-position uniform-k routing).
    ``remat``: the production recipe's recon remat (``runtime.remat.recon``, sources redrawn
    in the backward: ``save_sources: false``)."""
    import attrs

    from pd_train.config.pd import SubsetRecon
    from pd_train.config.runtime import RematConfig, RuntimeConfig

    jax.clear_caches()
    base = pd_config(layers, 1, "scan")
    terms = tuple(t for t in base.loss_metrics if not isinstance(t, ChunkwiseSubsetRecon))
    pd = attrs.evolve(base, loss_metrics=(*terms, SubsetRecon(coeff=1.0)))
    runtime = RuntimeConfig(remat=RematConfig(recon=True, save_sources=False)) if remat else None
    tr = Trainer(model(layers), pd, runtime, mesh=mesh)
    wall, cpu = time.perf_counter(), time.process_time()
    compiled = tr.lower_step(batch_size=BATCH, seq_len=SEQ, target_dtype=jnp.float32).compile()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return Arm(cpu, wall, 1, count_kernels(compiled))


def all_sites_step_compile(layer_counts: list[int], mesh: jax.sharding.Mesh) -> None:
    """The all-sites arms as the default config runs them, then with the production recipe's
    recon remat; one flatness line each."""
    for remat, label in ((False, ""), (True, " (remat recon, sources redrawn)")):
        arms = {}
        for layers in layer_counts:
            arms[layers] = arm = all_sites_compile_arm(layers, mesh, remat=remat)
            print(
                f"all-sites subset recon{label}, {layers:>2} layers ({7 * layers} sites, "
                f"1 forward): compile {arm.cpu:.1f} CPU s, {arm.wall:.1f} s wall, "
                f"{arm.kernels} kernels",
                flush=True,
            )
        lo, hi = min(arms), max(arms)
        ratio = arms[hi].cpu / arms[lo].cpu
        print(f"all-sites step compile{label}: {hi}L / {lo}L {ratio:.2f}x", flush=True)


def _cells(arm: Arm | None) -> str:
    if arm is None:
        return f"{'skipped':>8} {'':>8} {'':>7}"
    return f"{arm.cpu:>8.1f} {arm.wall:>8.1f} {arm.kernels:>7}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument(
        "--unroll-budget",
        type=float,
        default=300.0,
        help="max predicted CPU seconds per unroll arm",
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per loop at 8Lx8c")
    parser.add_argument(
        "--ci-chunks", type=int, nargs="*", default=[2, 32], help="CI transformer chunk counts"
    )
    parser.add_argument("--ci-only", action="store_true", help="run only the CI arms")
    parser.add_argument(
        "--ppgd-warmups",
        type=int,
        nargs="*",
        default=[0, 2, 8],
        help="persistent-PGD n_warmup_steps arms",
    )
    parser.add_argument("--ppgd-only", action="store_true", help="run only the persistent-PGD arms")
    parser.add_argument(
        "--all-sites-layers",
        type=int,
        nargs="*",
        default=[2, 32],
        help="layer counts of the all-sites subset recon arms (the shipped configs' plan)",
    )
    parser.add_argument(
        "--all-sites-only", action="store_true", help="run only the all-sites subset recon arms"
    )
    parser.add_argument(
        "--target",
        metavar="CONFIG",
        help="a real model's architecture and decomposition targets (C per kind) from a pd-train "
        "config, e.g. builtin:smollm2-all (SmolLM2-135M, 210 sites); --layers cap at its depth; "
        "skips the CI and persistent-PGD arms",
    )
    parser.add_argument(
        "--step-time-vs",
        metavar="WORKTREE",
        help="only the step time at 8Lx8c, this checkout against the code of WORKTREE (each in "
        "its own process, alternating; e.g. the commit before hyperparameters became data)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="processes per arm (--step-time-vs)")
    parser.add_argument("--step-time-arm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step_time_arm:  # one arm of --step-time-vs: JSON [wall s, CPU s, pd_train's path]
        import json

        import pd_train

        wall, cpu = step_time_cpu(8, 8, "scan", pd_sharding.make_mesh(data=8), args.steps)
        print(json.dumps([wall, cpu, str(pd_train.__file__)]))
        return
    if args.step_time_vs:
        compare_step_time(args.step_time_vs, args.steps, args.rounds)
        return
    if args.target:
        from _target import load_target

        arch, _, _, target_pd = load_target(args.target)
        TARGET.update(arch=arch, targets=target_pd.decomposition_targets)
        args.layers = sorted({min(n, arch.num_hidden_layers) for n in args.layers})
        args.ci_chunks, args.ppgd_warmups = [], []
        args.all_sites_layers = sorted(
            {min(n, arch.num_hidden_layers) for n in args.all_sites_layers}
        )
        print(f"--target {args.target}: {arch}; C {target_pd.decomposition_targets}")
    if args.all_sites_only:
        all_sites_step_compile(args.all_sites_layers, pd_sharding.make_mesh(data=8))
        return
    if args.ppgd_only:
        ppgd_step_compile(args.ppgd_warmups, pd_sharding.make_mesh(data=len(jax.devices())))
        return
    if args.ci_only:
        ci_step_compile(args.ci_chunks, pd_sharding.make_mesh(data=len(jax.devices())))
        return

    mesh = pd_sharding.make_mesh(data=8)
    print(
        f"devices: {len(jax.devices())} x {jax.devices()[0].platform}; d_model {D_MODEL}, "
        f"d_ff {D_FF}, C {C}, batch {BATCH}x{SEQ}, all 7 kinds decomposed; jax {jax.__version__}",
        flush=True,
    )
    arms: dict[tuple[str, int, int], Arm] = {}
    rows: list[str] = []
    skipped: list[str] = []
    last: dict[int, Arm] = {}  # layers -> its last unroll arm
    first: dict[int, Arm] = {}  # layers -> its first unroll arm

    def predict(layers: int, plan: int) -> float | None:
        if layers in last:
            return last[layers].cpu * plan / last[layers].plan
        smaller = [n for n in first if n < layers]
        if smaller:  # the first arm of a layer count: the previous count's first arm, scaled
            n = max(smaller)
            return first[n].cpu * layers / n
        return None

    for layers in args.layers:
        for chunks in args.chunks:
            scan = arms["scan", layers, chunks] = compile_arm(layers, chunks, "scan", mesh)
            predicted = predict(layers, scan.plan)
            unroll: Arm | None = None
            if predicted is not None and predicted > args.unroll_budget:
                skipped.append(f"{layers}Lx{chunks}c (predicted {predicted:.0f} s)")
            else:
                unroll = arms["unroll", layers, chunks] = compile_arm(
                    layers, chunks, "unroll", mesh
                )
                last[layers] = unroll
                first.setdefault(layers, unroll)
            ratio = f"{unroll.cpu / scan.cpu:.1f}x" if unroll else ""
            row = f"{layers:>6} {chunks:>6} {scan.plan:>5} | {_cells(scan)} | {_cells(unroll)} | {ratio:>11}"
            rows.append(row)
            print(row, flush=True)
    # Chunks unrolled but layers scanned, at the arm of R2: what the layer scan alone buys.
    mixed = compile_arm(8, 8, "unroll-chunks", mesh)

    header = (
        f"{'layers':>6} {'chunks':>6} {'plan':>5} | {'scan cpu':>8} {'wall':>8} {'kernels':>7} | "
        f"{'unroll':>8} {'wall':>8} {'kernels':>7} | {'unroll/scan':>11}"
    )
    print()
    print("Step compile (lower + compile), seconds: CPU time of this process, and wall. Ratios use")
    print("CPU time, which other work on a shared machine disturbs least. plan = chunks in the")
    print("recon plan (sites_per_chunk = ceil(7 * layers / chunks)); kernels = fused computations")
    print("in the compiled module.")
    print(header)
    print("-" * len(header))
    for row in rows:
        print(row)
    if skipped:
        print(f"unroll arms skipped (budget {args.unroll_budget:.0f} CPU s): " + "; ".join(skipped))
    if ("scan", 8, 8) in arms:
        print(
            f"8Lx8c, chunks unrolled but layers scanned: {mixed.cpu:.1f} CPU s, "
            f"{mixed.kernels} kernels ({mixed.cpu / arms['scan', 8, 8].cpu:.1f}x scan)"
        )

    t_scan = step_time(8, 8, "scan", mesh, args.steps)
    t_unroll = step_time(8, 8, "unroll", mesh, args.steps)
    print(
        f"step time at 8Lx8c (fastest of {args.steps}): scan {t_scan * 1e3:.0f} ms, "
        f"unroll {t_unroll * 1e3:.0f} ms"
    )

    def cpu(loop: str, layers: int, chunks: int) -> float:
        arm = arms.get((loop, layers, chunks))
        return arm.cpu if arm else float("nan")

    hi, lo = (max(args.layers), max(args.chunks)), (min(args.layers), min(args.chunks))
    r1 = cpu("scan", *hi) / cpu("scan", *lo)
    r2 = cpu("unroll", 8, 8) / cpu("scan", 8, 8)
    r3 = t_scan / t_unroll
    print(
        f"step compile: scan {hi[0]}Lx{hi[1]}c / {lo[0]}Lx{lo[1]}c {r1:.2f}x; "
        f"unroll/scan at 8Lx8c {r2:.1f}x; "
        f"step time scan/unroll {r3:.2f}x"
    )
    if args.all_sites_layers:
        all_sites_step_compile(args.all_sites_layers, mesh)
    if args.ci_chunks:
        ci_step_compile(args.ci_chunks, pd_sharding.make_mesh(data=len(jax.devices())))
    if args.ppgd_warmups:
        ppgd_step_compile(args.ppgd_warmups, pd_sharding.make_mesh(data=len(jax.devices())))


if __name__ == "__main__":
    main()
