"""Time from launch to the end of step 0, cold (empty compile cache) and warm (same cache).

Launches `pd-train run` twice as fresh processes on the same config (the embedded default,
shortened: no eval, a short warmup, 1 step; a toy config, ``--config builtin:tms_5_2_fast``:
no eval, its first K-step call) and reads step 0's wall-clock time from the run's
metrics.jsonl, and the launch's CPU seconds by then (from /proc; on a shared machine the figure
that does not depend on the other load). Prints a table and, last:

    time to first step: cold C.Cs, warm W.Ws, warm/cold R.RR

Python's imports count too: without cached bytecode (``PYTHONDONTWRITEBYTECODE=1`` and an
install that compiled none, e.g. ``uv`` without ``--compile-bytecode``) every launch compiles
jax's, optax's and pd's modules from source again (``import jax``: ~1.8 s instead of ~0.7 on
this 2-core machine). The table says which case was measured; ``--pycache-prefix DIR`` runs the
launches with bytecode cached in DIR (``PYTHONPYCACHEPREFIX``; the cold launch writes it).

The same code's figures differ ~2.5x between the VMs this project has run on, so the table
starts with the machine's speed: the CPU seconds of a pure-Python loop of 30 M additions at a
module's top level (a launch is mostly interpreter and compiler work). On the VMs of
docs/findings.md section 10 (that section's commits) it took 1.3-1.4 s (cold 16-18 s, warm
1.9-2.2 s), ~2 s (cold 24.7 s, warm 3.2-4.7 s) and 3.5-4.2 s (cold 27-45 s, warm 3.5-5.4 s).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _cpu_seconds(pid: int) -> float | None:
    """user + system CPU seconds of a running process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _step0_time(metrics: Path) -> float | None:
    if not metrics.exists():
        return None
    for line in metrics.read_text().splitlines():
        if not line.endswith("}"):
            continue  # a record being written
        record = json.loads(line)
        if record["phase"] == "train" and record["step"] == 0:
            return float(record["time"])
    return None


def first_step_seconds(
    config: str, out: Path, overrides: list[str], steps: int
) -> tuple[float, float | None, float]:
    """(wall seconds from launch to the end of step 0, the process's CPU seconds by then,
    the process's CPU seconds in all) of a run of ``steps`` steps. The machine may be shared:
    CPU seconds are what the launch itself spent, an upper bound of its wall time on an idle
    machine with one thread."""
    run_dir = out / f"run-{len(list(out.iterdir()))}"
    args = [
        sys.executable, "-m", "pd_train.cli", "run", config,
        "--run-dir", str(run_dir), "--max-steps", str(steps),
        *[a for o in overrides for a in ("--set", o)],
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu_at_step0 = None
    while proc.poll() is None and cpu_at_step0 is None:
        if _step0_time(run_dir / "metrics.jsonl") is not None:
            cpu_at_step0 = _cpu_seconds(proc.pid)
        time.sleep(0.02)
    _, stderr = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"pd-train run failed ({proc.returncode}):\n{stderr[-3000:]}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    step0 = _step0_time(run_dir / "metrics.jsonl")
    assert step0 is not None, "no step 0 record"
    return step0 - started, cpu_at_step0, usage.ru_utime + usage.ru_stime


_LOOP = """
import time
started, total = time.process_time(), 0
for i in range(30_000_000):
    total += i
print(time.process_time() - started)
"""


def python_loop_seconds() -> float:
    """CPU seconds of a pure-Python loop of 30 M additions at a module's top level (global
    variables, as ``python -c`` runs it), best of two fresh interpreters."""
    runs = [
        subprocess.run([sys.executable, "-c", _LOOP], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    return min(float(r.stdout) for r in runs)


def bytecode_state(module: str = "jax") -> str:
    """Whether a launch imports ``module`` from cached bytecode (``.pyc``) or compiles it from
    source, as this process's environment says (the launches inherit it)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    if origin is None:
        return f"unknown ({module} not found)"
    pyc = Path(importlib.util.cache_from_source(origin))
    if pyc.exists():
        return f"cached bytecode ({pyc.parent})"
    if sys.dont_write_bytecode:
        return "compiled from source at every launch (no .pyc; PYTHONDONTWRITEBYTECODE is set)"
    return "compiled from source by the first launch, then cached"


def cache_bytecode_in(prefix: Path) -> None:
    """Launches from now on write and read Python's bytecode in ``prefix``
    (PYTHONPYCACHEPREFIX), even where PYTHONDONTWRITEBYTECODE is set (as in some sandboxes):
    a warm launch then imports cached bytecode, as on a researcher's machine."""
    os.environ["PYTHONPYCACHEPREFIX"] = str(prefix.absolute())
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix, sys.dont_write_bytecode = os.environ["PYTHONPYCACHEPREFIX"], False


def launch_overrides(config: str, cache: Path) -> tuple[list[str], int]:
    """The ``--set`` overrides that shorten ``config``'s run and put its compile cache in
    ``cache``, and the steps to run: a toy config (:func:`pd_train.cli.toy.is_toy_config`)
    runs its first call (K steps, the program a toy run compiles) without evals or
    checkpoints; a decomposition config one step after a 3-step warmup."""
    from pd_train.cli.toy import is_toy_config, load_toy_config

    if is_toy_config(config):
        steps = load_toy_config(config)["steps_per_call"]
        return ["eval_every=0", "save_every=0", f"compile_cache.dir={cache}"], steps
    overrides = ["cadence.eval_every=0", "cadence.save_every=0", "pd.faithfulness_warmup.steps=3"]
    return [*overrides, f"runtime.compile_cache.dir={cache}"], 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="builtin:default")
    parser.add_argument("--devices", type=int, default=1, help="simulated CPU devices")
    parser.add_argument(
        "--pycache-prefix",
        type=Path,
        help="launch with Python's bytecode cached in this directory (PYTHONPYCACHEPREFIX)",
    )
    args = parser.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.pycache_prefix is not None:
        cache_bytecode_in(args.pycache_prefix)
    imports = bytecode_state()
    loop_s = python_loop_seconds()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "runs"
        out.mkdir()
        overrides, steps = launch_overrides(args.config, cache)
        spent = 0.0
        for label in ("empty", "warm"):
            load = os.getloadavg()[0]
            wall, cpu, total = first_step_seconds(args.config, out, overrides, steps)
            rows.append((label, wall, cpu, total - spent, load))
            spent = total
    (_, cold, *_), (_, warm, *_) = rows
    print(f"cores: {os.cpu_count()}; load average (1 min) at each launch in the last column")
    print(f"machine speed: a pure-Python loop of 30 M additions takes {loop_s:.2f} CPU s")
    print(f"Python imports (jax): {imports}; now: {bytecode_state()}")
    print(
        "| launch | compile cache | time to end of step 0 | CPU s by then | CPU s in all | load |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for i, (label, wall, cpu, total, load) in enumerate(rows, 1):
        by_then = "?" if cpu is None else f"{cpu:.1f}"
        print(f"| {i} | {label} | {wall:.1f} s | {by_then} | {total:.1f} | {load:.1f} |")
    print(f"time to first step: cold {cold:.1f}s, warm {warm:.1f}s, warm/cold {warm / cold:.2f}")


if __name__ == "__main__":
    main()
