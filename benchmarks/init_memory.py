"""Peak memory of an init and its fan-out, against the fan-out bound (stacks + largest group).

Executes an 8-layer init at Llama-3-8B proportions (dimensions and C scaled down so it fits a
shared machine; flags change that) on 8 simulated CPU devices with the ZeRO-1-like layout of
``init_compile.py``, then fans it out, consuming the stacks and keeping them.

Two measures, because CPU device memory comes from an allocator that keeps freed pages (the
resident set never shrinks, so it cannot show a phase's peak):

- fan-out: the bytes of live JAX buffers (``jax.live_arrays()``), sampled by a thread every
  ~0.1 ms and on the main thread between phases. The fan-out's take functions write each member
  straight into its output, so live buffers are all the memory it holds.
- a jit (the stacked init, the per-array reference, one slicing jit with donated stacks): XLA's
  own accounting of the compiled executable, arguments + outputs + temporaries − aliased, per
  device, times the number of devices.

On a GPU, ``peak_bytes_in_use`` of device 0 is printed too.

    python benchmarks/init_memory.py
    python benchmarks/init_memory.py --layers 8 --d-scale 0.25 --c-scale 0.25
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import init_compile as bench  # sets up 8 simulated devices before jax is imported
import jax
import numpy as np
from jax.sharding import Mesh

import pd_init

MIB = 1 << 20


def live_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())


class PeakSampler:
    """Samples live JAX buffer bytes on a thread until stopped; ``peak`` is the largest seen."""

    def __init__(self) -> None:
        self.peak = live_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(1e-4)

    def sample(self) -> None:
        self.peak = max(self.peak, live_bytes())

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def jit_peak(compiled: jax.stages.Compiled, n_devices: int) -> float:
    """XLA's peak estimate of an executable: arguments + outputs + temporaries - aliased."""
    m = compiled.memory_analysis()
    per_device = (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )
    return float(per_device * n_devices)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-scale", type=float, default=0.125, help="scale d_model, kv, d_ff")
    parser.add_argument("--c-scale", type=float, default=0.125, help="scale every C")
    parser.add_argument("--draw", choices=["map", "vmap"], default="map", help="InitPlan(draw=)")
    args = parser.parse_args()

    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
    c = {kind: bench.scaled(value, args.c_scale) for kind, value in bench.DEFAULT_C.items()}
    specs = bench.llama_specs(args.layers, c, mesh, d_scale=args.d_scale)
    plan = pd_init.InitPlan(specs, draw=args.draw)
    key = jax.random.key(0)
    abstract_key = jax.eval_shape(lambda: key)

    stacks = float(sum(g.nbytes for g in plan.groups))
    largest = float(max(g.nbytes for g in plan.groups))
    bound = stacks + largest

    # The naive fan-out, for comparison: one jit slicing every member out, stacks donated.
    locations = [plan.index[s.name] for s in specs]

    def slice_all(stacks: dict[str, jax.Array]) -> list[jax.Array]:
        return [stacks[g][i] for g, i in locations]

    slicer = jax.jit(slice_all, out_shardings=[s.sharding for s in specs], donate_argnums=0)
    n = len(devices)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        jits = {
            "stacked init (one jit)": jit_peak(
                plan.stacked_fn.lower(key=abstract_key).compile(), n
            ),
            "per-array reference init (one jit)": jit_peak(
                plan.reference_fn.lower(key=abstract_key).compile(), n
            ),
            "fan-out by one slicing jit, stacks donated": jit_peak(
                slicer.lower(plan.abstract_stacks()).compile(), n
            ),
        }

    measured = {}
    for consume in (True, False):
        base = live_bytes()
        stacked = jax.block_until_ready(plan.init_stacked(key=key))
        with PeakSampler() as sampler:
            fanned = jax.block_until_ready(plan.fan_out(stacked, consume=consume))
        label = f"fan-out, consume={consume} (live buffers)"
        measured[label] = sampler.peak - base
        del stacked, fanned

    device_peak = (devices[0].memory_stats() or {}).get("peak_bytes_in_use")

    print(
        f"{args.layers} layers, {len(specs)} arrays, {len(plan.groups)} groups, draw={args.draw}, d-scale "
        f"{args.d_scale}, c-scale {args.c_scale}, {n} {devices[0].platform} devices: stacks S = "
        f"{stacks / MIB:.0f} MiB, largest group {largest / MIB:.0f} MiB, fan-out bound "
        f"S + largest = {bound / MIB:.0f} MiB"
    )
    print(f"{'':<46} {'peak MiB':>9} {'/ S':>6} {'/ bound':>8}")
    for label, peak in {**jits, **measured}.items():
        print(f"{label:<46} {peak / MIB:>9.0f} {peak / stacks:>6.2f} {peak / bound:>8.2f}")
    if device_peak is not None:
        print(f"device 0 peak_bytes_in_use over the whole run: {device_peak / MIB:.0f} MiB")
    fan = measured["fan-out, consume=True (live buffers)"]
    verdict = "within" if fan <= bound else "OVER"
    print(
        f"fan-out peak (consume=True) {fan / MIB:.0f} MiB is {verdict} the bound "
        f"{bound / MIB:.0f} MiB; keeping the stacks "
        f"{measured['fan-out, consume=False (live buffers)'] / MIB:.0f} MiB"
    )


if __name__ == "__main__":
    main()
