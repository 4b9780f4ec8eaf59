"""Harvest throughput and memory of ``pd-train analyze`` (:class:`pd_train.analysis.Harvester`).

At the default config (the tiny Llama that ships with pd-train, its 28 sites, batch 8 × 64) on a
mesh of simulated CPU devices (8 by default): a Trainer with freshly initialized params (a
harvest's cost does not depend on trained values), the eval stream's batches, and the harvest
loop run for N = ``--batches`` (e.g. 4, 16, 64) batches after one warm-up call that compiles.

Per N it prints the wall seconds, tokens/s, CPU seconds of this process, the peak resident set
size sampled every 5 ms during the loop minus the RSS just before it (host + simulated-device
memory: on CPU both are this process's RSS), and the bytes of live jax arrays after the loop.
Flat memory means the last two columns do not grow with N.

``--llama8b``: also lowers and compiles the harvest jit for ``configs/llama8b-full32L.yaml`` on
abstract inputs (nothing allocated) and prints XLA's per-device memory; compile only.

    python benchmarks/analyze.py
    python benchmarks/analyze.py --batches 4 16 64 256 --llama8b
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
import threading
import time
from typing import Any

import jax
import numpy as np

from pd_train.analysis import Harvester
from pd_train.configs import builtin_config
from pd_train.run import prepare, start_runtime
from pd_train.run.data import Batches, TokenDataset
from pd_train.run.distributed import Placement

GiB = 1024**3


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRSS:
    """Samples this process's RSS every 5 ms while active."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.005)

    def __enter__(self) -> _PeakRSS:
        self.peak = _rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _live_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays())


def _default_setup() -> tuple[Any, Any, Any, Batches, Any]:
    from pd_train.analysis.components import _load_target

    prepared = prepare(builtin_config("default"))
    config = prepared.config
    rt = start_runtime(prepared, Placement())
    trainer = rt.trainer
    target = _load_target(prepared, trainer)
    params = trainer.init_params(key=jax.random.key(0))
    data = TokenDataset(
        prepared.eval_path,  # type: ignore[arg-type]
        seq_len=config.data.seq_len,
        dtype=config.data.dtype,
        vocab_size=prepared.model.vocab_size,
    )
    batches = Batches(
        data,
        batch_size=config.pd.batch_size,
        seed=config.seed + 1,
        process_index=0,
        process_count=1,
    )
    return rt, trainer, target, batches, params


def throughput(batch_counts: list[int], *, top_k: int, window: int) -> None:
    rt, trainer, target, batches, params = _default_setup()
    harvester = Harvester(trainer, threshold=0.0, top_k=top_k, window=window)
    t0 = time.process_time()
    w0 = time.perf_counter()
    harvester.run(params, target, batches.batch, n_batches=1, mesh=rt.mesh, progress=False)
    compile_wall, compile_cpu = time.perf_counter() - w0, time.process_time() - t0
    # One untimed pass at the smallest N: the allocator's first growth is not the harvest's.
    harvester.run(
        params, target, batches.batch, n_batches=batch_counts[0], mesh=rt.mesh, progress=False
    )
    print(
        f"default config, {len(jax.devices())} simulated devices, batch "
        f"{trainer.pd.batch_size}×{batches.dataset.seq_len}, top_k {top_k}, window {window}; "
        f"compile + first batch {compile_wall:.1f} s wall, {compile_cpu:.1f} CPU s"
    )
    print(
        f"{'batches':>8} {'tokens':>8} {'wall s':>8} {'tokens/s':>10} {'CPU s':>7} "
        f"{'peak RSS +MiB':>14} {'live arrays MiB':>16}"
    )
    rows = []
    for n in batch_counts:
        base = _rss()
        c0, w0 = time.process_time(), time.perf_counter()
        with _PeakRSS() as peak:
            result = harvester.run(
                params, target, batches.batch, n_batches=n, mesh=rt.mesh, progress=False
            )
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        grow = (peak.peak - base) / 2**20
        live = _live_bytes() / 2**20
        rows.append((n, result.n_tokens / wall, grow))
        print(
            f"{n:>8} {result.n_tokens:>8} {wall:>8.2f} {result.n_tokens / wall:>10,.0f} "
            f"{cpu:>7.2f} {grow:>14.1f} {live:>16.1f}"
        )
        del result
    first, last = rows[0], rows[-1]
    print(
        f"harvest: {last[1]:,.0f} tokens/s at {last[0]} batches; peak RSS growth "
        f"{first[2]:.1f} MiB at {first[0]} batches vs {last[2]:.1f} MiB at {last[0]} batches"
    )


def llama8b(*, top_k: int, window: int) -> None:
    prepared = prepare(builtin_config("llama8b-full32L"), for_run=False)
    rt = start_runtime(prepared, Placement())
    trainer = rt.trainer
    harvester = Harvester(trainer, threshold=0.0, top_k=top_k, window=window)
    config = prepared.config
    c0, w0 = time.process_time(), time.perf_counter()
    lowered = harvester.lower(batch_size=config.pd.batch_size, seq_len=config.data.seq_len)
    compiled = lowered.compile()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    mem = compiled.memory_analysis()
    state = sum(
        int(np.prod(a.shape)) * a.dtype.itemsize
        for a in jax.tree.leaves(jax.eval_shape(harvester.init_state))
    )
    print(
        f"llama8b-full32L harvest jit on {len(jax.devices())} simulated devices "
        f"(batch {config.pd.batch_size}×{config.data.seq_len}, top_k {top_k}, window {window}): "
        f"lower+compile {wall:.1f} s wall, {cpu:.1f} CPU s; harvest state {state / GiB:.2f} GiB "
        "(replicated); per device: "
        f"args {mem.argument_size_in_bytes / GiB:.2f} GiB, temp {mem.temp_size_in_bytes / GiB:.2f} GiB, "
        f"out {mem.output_size_in_bytes / GiB:.2f} GiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16, 64, 256])
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--window", type=int, default=8)
    parser.add_argument("--llama8b", action="store_true", help="also compile at Llama-8B shapes")
    parser.add_argument("--skip-default", action="store_true", help="no default-config arms")
    args = parser.parse_args()
    if not args.skip_default:
        throughput(sorted(args.batches), top_k=args.top_k, window=args.window)
    if args.llama8b:
        llama8b(top_k=args.top_k, window=args.window)


if __name__ == "__main__":
    main()
