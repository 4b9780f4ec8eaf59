"""Peak memory of an executed init: stacked, fan-out (consuming or keeping the stacks), reference.

Runs an 8-layer init at Llama-3-8B proportions (dimensions and C scaled down so it fits a shared
machine; flags change that) on 8 simulated CPU devices with the ZeRO-1-like layout of
``init_compile.py``. Each arm runs in its own process, twice: the first run compiles, the second
is measured. The peak is the process's resident-set high-water mark during the second run minus
its resident set just before it (on CPU, device buffers are host memory, so this includes every
buffer and XLA temporary); where the device reports ``peak_bytes_in_use`` that is shown too.

    python benchmarks/init_memory.py
    python benchmarks/init_memory.py --layers 8 --d-scale 0.25 --c-scale 0.25

Bound for fan-out: all stacks + the largest group's members (= the largest stack).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ARMS = {
    "stacked": "stacked init only (the stacks)",
    "fan-out": "stacked + fan-out, consume=True",
    "fan-out-keep": "stacked + fan-out, consume=False",
    "slicing-jit": "stacked + one slicing jit, stacks donated",
    "per-array": "per-array reference (one jit)",
}


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    assert match, field
    return int(match.group(1))


def run_arm(arm: str, args: argparse.Namespace) -> dict[str, float]:
    """Run one arm twice in this process; measure the second run. Returns bytes."""
    sys.path.insert(0, str(Path(__file__).parent))
    import init_compile as bench  # sets up 8 simulated devices before importing jax
    import jax
    import numpy as np
    from jax.sharding import Mesh

    import pd_init

    mesh = Mesh(np.array(jax.devices()), ("data",))
    c = {kind: bench.scaled(value, args.c_scale) for kind, value in bench.DEFAULT_C.items()}
    specs = bench.llama_specs(args.layers, c, mesh, d_scale=args.d_scale)
    plan = pd_init.InitPlan(specs)
    key = jax.random.key(0)

    slicer = None
    if arm == "slicing-jit":
        # The naive fan-out: one jit, one output per array, stacks donated. JAX cannot alias a
        # donated stack to differently shaped outputs, so this frees nothing until it returns.
        locations = [plan.index[s.name] for s in specs]
        shardings = [s.sharding for s in specs]

        def slice_all(stacks):
            return [stacks[g][i] for g, i in locations]

        slicer = jax.jit(slice_all, out_shardings=shardings, donate_argnums=0)

    def once() -> list[jax.Array]:
        if arm == "stacked":
            return list(plan.init_stacked(key=key).stacks.values())
        if arm == "fan-out":
            return list(plan.fan_out(plan.init_stacked(key=key), consume=True).values())
        if arm == "fan-out-keep":
            stacked = plan.init_stacked(key=key)
            return [*plan.fan_out(stacked).values(), *stacked.stacks.values()]
        if arm == "slicing-jit":
            return list(slicer(dict(plan.init_stacked(key=key).stacks)))
        return list(plan.init_reference(key=key).values())

    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        jax.block_until_ready(once())  # compile and warm up; its outputs are freed here
        device = jax.devices()[0]
        stats = device.memory_stats() or {}
        Path("/proc/self/clear_refs").write_text("5")  # reset the resident-set high-water mark
        base = _status_kib("VmRSS")
        outputs = jax.block_until_ready(once())
        peak = _status_kib("VmHWM")
    after = device.memory_stats() or {}
    result = {
        "peak_rss": (peak - base) * 1024.0,
        "outputs": float(sum(a.nbytes for a in outputs)),
        "stacks": float(sum(g.nbytes for g in plan.groups)),
        "largest_group": float(max(g.nbytes for g in plan.groups)),
        "arrays": float(len(specs)),
    }
    if "peak_bytes_in_use" in after:
        result["device_peak"] = float(after["peak_bytes_in_use"] - stats.get("bytes_in_use", 0))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-scale", type=float, default=0.125, help="scale d_model, kv, d_ff")
    parser.add_argument("--c-scale", type=float, default=0.125, help="scale every C")
    parser.add_argument("--arm", choices=list(ARMS), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.arm:
        print(json.dumps(run_arm(args.arm, args)))
        return

    # A fixed mmap threshold makes glibc return every large freed buffer to the OS at once, so
    # the resident set follows the live buffers.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    results = {}
    for arm in ARMS:
        cmd = [sys.executable, __file__, "--arm", arm, "--layers", str(args.layers)]
        cmd += ["--d-scale", str(args.d_scale), "--c-scale", str(args.c_scale)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"arm {arm} failed with exit code {done.returncode}")
        results[arm] = json.loads(done.stdout.strip().splitlines()[-1])

    first = next(iter(results.values()))
    mib = 1 << 20
    stacks, largest = first["stacks"], first["largest_group"]
    bound = stacks + largest
    print(
        f"{args.layers} layers, {int(first['arrays'])} arrays, d-scale {args.d_scale}, "
        f"c-scale {args.c_scale}: stacks S = {stacks / mib:.0f} MiB, largest group "
        f"{largest / mib:.0f} MiB, fan-out bound S + largest = {bound / mib:.0f} MiB"
    )
    print(f"{'arm':<44} {'peak MiB':>9} {'peak / S':>9} {'peak / bound':>12}")
    for arm, result in results.items():
        peak = result["peak_rss"]
        print(f"{ARMS[arm]:<44} {peak / mib:>9.0f} {peak / stacks:>9.2f} {peak / bound:>12.2f}")
        if "device_peak" in result:
            print(f"{'  (device peak_bytes_in_use)':<44} {result['device_peak'] / mib:>9.0f}")
    fan = results["fan-out"]["peak_rss"]
    verdict = "within" if fan <= bound * 1.05 else "OVER"
    print(
        f"fan-out peak {fan / mib:.0f} MiB is {verdict} the bound {bound / mib:.0f} MiB "
        f"(keeping the stacks: {results['fan-out-keep']['peak_rss'] / mib:.0f} MiB)"
    )


if __name__ == "__main__":
    main()
