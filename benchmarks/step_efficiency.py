"""How much of the compiled train step is work the method needs (issue 17).

Per config, the train step is lowered and compiled on abstract inputs (no weights, no data) in
its own process with its own number of simulated CPU devices, and compared with the useful-FLOP
census of :mod:`pd_train.flops`:

- useful GFLOP: the census (matmuls and attention, forward and backward, PGD ascents; no
  optimizer, which is elementwise), for the whole step;
- compiled GFLOP: the compiled program's matmul FLOPs (loops multiplied out) per device × the
  devices; where the program has conditionals (the masked forward's copy / frozen / live layer
  branches) it is a range, cheapest to dearest branch, and the ratio uses the dearest (an upper
  bound on the waste);
- memory per device from XLA's memory_analysis: arguments + temporaries (and XLA's own peak).

The scanned chunk loop (``pd.recon.chunk_loop: scan``, what runs) picks each layer's copy /
frozen / live branch at run time, so its compiled count is only a range; the arms without
"(scan ...)" compile ``chunk_loop: unroll``, where liveness is static and the program has no
such branches, so compiled FLOPs are exactly what executes — those give the ratios.

Arms: default (1 device, as ``pd-train run`` runs it) as run, unrolled without remat and with
recon remat; cpu-example (1 device); production Llama-3-8B on 8 simulated devices as run (scan,
remat recon + CI) and unrolled without remat. ``--production-layers N`` cuts the production model to N layers (the FLOPs scale
linearly; say so when you use it). Last line:
``step flops: compiled/useful R.RRx at default, R.RRx at production`` (production without
remat).

    python benchmarks/step_efficiency.py [--production-layers 32] [--skip-production]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _arm(config: str, overrides: list[str], devices: int) -> dict:
    """Run in a child process: compile the train step, return the figures as JSON."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from pd_train import run as runner
    from pd_train.flops import compiled_cost, step_census
    from pd_train.run.distributed import Placement

    prepared = runner.prepare(config, overrides, for_run=False)
    rt = runner.start_runtime(prepared, Placement())
    runner.configure_cache(prepared.config, disable=True)
    cfg = prepared.config
    census = step_census(prepared.model, cfg.pd, seq_len=cfg.data.seq_len)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    compiled = rt.trainer.compile_step(
        batch_size=cfg.pd.batch_size,
        seq_len=cfg.data.seq_len,
        target_dtype=runner.target_dtype(cfg),
    )
    compile_s, compile_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    cost = compiled_cost(compiled)
    n = rt.trainer.mesh.devices.size if rt.trainer.mesh is not None else jax.device_count()
    return {
        "devices": n,
        "useful": census.matmul,
        "useful_parts": {k: v for k, v in census.by("term").items() if k != "optimizer"},
        "compiled_lo": cost.matmul_flops_min * n,
        "compiled_hi": cost.matmul_flops * n,
        "xla_flops": cost.xla_flops,
        "bytes_accessed": cost.bytes_accessed,
        "args": cost.argument_bytes,
        "temp": cost.temp_bytes,
        "peak": cost.peak_bytes,
        "compile_s": compile_s,
        "compile_cpu_s": compile_cpu,
        "unknown_loops": cost.unknown_loops,
    }


def _child(args: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    if proc.returncode:
        return {"error": (proc.stderr or proc.stdout)[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--production-layers", type=int, default=32)
    parser.add_argument("--skip-production", action="store_true")
    parser.add_argument("--only", nargs="*", help="run only arms whose label contains one of these")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.child:
        config, overrides, devices = json.loads(ns.child)
        print(json.dumps(_arm(config, overrides, devices)))
        return

    no_remat = [
        "runtime.remat.recon=false",
        "runtime.remat.recon_layers=false",
        "runtime.remat.ci_fn=false",
    ]
    unroll = ["pd.recon.chunk_loop=unroll"]
    arms: list[tuple[str, str, list[str], int]] = [
        ("default", "configs/default.yaml", [*no_remat, *unroll], 1),
    ]
    later = [
        ("default (scan, as run)", "configs/default.yaml", [], 1),
        ("default, recon remat", "configs/default.yaml", ["runtime.remat.recon=true", *unroll], 1),
        ("cpu-example", "configs/cpu-example.yaml", [*no_remat, *unroll], 1),
    ]
    if not ns.skip_production:
        prod = "configs/llama8b-full32L.yaml"
        cut = []
        label = "production"
        if ns.production_layers != 32:
            arch = (
                "{vocab_size: 128256, hidden_size: 4096, intermediate_size: 14336, "
                f"num_hidden_layers: {ns.production_layers}, num_attention_heads: 32, "
                "num_key_value_heads: 8, head_dim: 128, rope_theta: 500000.0}"
            )
            cut = [f"target.architecture={arch}"]
            label = f"production ({ns.production_layers} of 32 layers)"
        arms.append((f"{label}, no remat", prod, [*cut, *no_remat, *unroll], 8))
        later.append((f"{label} (scan, remat recon+ci, as run)", prod, cut, 8))
    arms += later  # the two arms of the last line first: production compiles take minutes
    print(
        "| config | devices | useful GFLOP | compiled GFLOP | compiled/useful | "
        "args GiB/dev | temp GiB/dev | XLA peak GiB/dev | compile s (CPU s) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios: dict[str, float] = {}
    for label, config, overrides, devices in arms:
        if ns.only and not any(o in label for o in ns.only):
            continue
        r = _child([config, overrides, devices])
        if "error" in r:
            print(f"| {label} | {devices} | error: {r['error'].splitlines()[-1][:120]} |")
            continue
        lo, hi, u = r["compiled_lo"], r["compiled_hi"], r["useful"]
        compiled = f"{hi / 1e9:.1f}" if lo == hi else f"{lo / 1e9:.1f}-{hi / 1e9:.1f}"
        ratio = f"{hi / u:.2f}x" if lo == hi else f"{lo / u:.2f}-{hi / u:.2f}x"
        ratios[label] = hi / u
        print(
            f"| {label} | {r['devices']} | {u / 1e9:.1f} | {compiled} | {ratio} | "
            f"{_gib(r['args'])} | {_gib(r['temp'])} | {_gib(r['peak'])} | "
            f"{r['compile_s']:.0f} ({r['compile_cpu_s']:.0f}) |",
            flush=True,
        )
    prod = [v for k, v in ratios.items() if k.startswith("production") and k.endswith("no remat")]
    default = ratios.get("default")
    print(
        f"step flops: compiled/useful {default or float('nan'):.2f}x at default, "
        f"{prod[0] if prod else float('nan'):.2f}x at production"
    )


if __name__ == "__main__":
    main()
