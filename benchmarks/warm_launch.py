"""Where a warm launch's time to step 0 goes: phases timed inside the process, arms side by side.

Each arm (this checkout, or another worktree's packages first on ``PYTHONPATH``) gets its own
compile cache, filled by one cold launch; then the arms' warm launches of the shortened default
(benchmarks/time_to_first_step.py's overrides, ``--max-steps 1``) alternate, ``--repeats`` each.
A launch runs ``pd_train.cli.main`` in a fresh interpreter with the huge-page tunable already
set (as ``pd-train run`` relaunches itself) and marks, at the end of each phase, the wall
seconds since the parent started it, the process's CPU seconds (all threads) and the main
thread's (a checkout with ``pd-train run``'s preload marks it and pd_train.run's imports apart;
one without imports pd_train.run first, as its parser did). The background loads (the train
step's: ``StepProgram``'s thread, and the preload's, when it started and ended) report their
own thread's CPU seconds and when they ended; XLA deserializes in threads of its own, so these
CPU figures are the Python threads' only. Prints one table per arm: each phase's median over
the launches (wall, CPU, main-thread CPU), and last per arm:

    ARM: to step 0 W.WW s wall, C.CC CPU s (main thread M.MM), median of N

    nice -n 5 python benchmarks/warm_launch.py [--repeats 4] [--arm NAME=PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OVERRIDES = ["cadence.eval_every=0", "cadence.save_every=0", "pd.faithfulness_warmup.steps=3"]

#: (mark, phase it ends), in the order a launch reaches them.
PHASES = (
    ("cli", "interpreter start, pd_train.cli"),
    ("preload", "preload: config read, hint, jax, backend (the step's load starts)"),
    ("imports", "imports (jax, pd_train.run)"),
    ("prepare", "config: load and validate (prepare)"),
    ("runtime", "runtime: backend, mesh, trainer, layout checks"),
    ("recorder", "run dir, compile record, terminal"),
    ("target", "target weights"),
    ("init", "init programs and warm-up steps"),
    ("hooks", "hooks, data"),
    ("step0", "waiting for the step's load, then step 0"),
)

_CHILD = r"""
import json, os, sys, threading, time
T0 = float(os.environ["PD_WARM_T0"])
OUT = os.environ["PD_WARM_OUT"]
marks, threads = {}, {}
def mark(name):
    marks[name] = (time.time() - T0, time.process_time(), time.thread_time())
import pd_train.cli
from pd_train.cli import run as run_cli
mark("cli")
def after(module, attr, name):
    fn = getattr(module, attr)
    def wrapped(*a, **k):
        result = fn(*a, **k)
        mark(name)
        return result
    setattr(module, attr, wrapped)
def install():
    import pd_train.run
    from pd_train.run import _execute, _programs
    after(pd_train.run, "prepare", "prepare")
    after(pd_train.run, "start_runtime", "runtime")
    after(_execute, "_run_recorder", "recorder")
    after(_execute, "_load_target", "target")
    after(_execute, "_initial_state", "init")
    after(_execute, "_run_hooks", "hooks")
    build = _programs.StepProgram._build
    def timed_build(self):
        try:
            build(self)
        finally:
            threads["train_step load"] = (time.time() - T0, time.thread_time())
    _programs.StepProgram._build = timed_build
    step_fn = _execute._step_fn
    def timed_step_fn(*a, **k):
        fn = step_fn(*a, **k)
        def wrapped(state, step):
            result = fn(state, step)
            if "step0" not in marks:
                mark("step0")
                for p in preloads:
                    if p is not None and p.load_ended is not None:
                        threads["preload (step)"] = (p.load_ended - T0, p.load_cpu)
                        threads["preload (step) started"] = (p.load_started - T0, 0.0)
                with open(OUT, "w") as f:
                    json.dump({"marks": marks, "threads": threads}, f)
                if os.environ.get("PD_WARM_EXIT"):  # e.g. under -X importtime: only to step 0
                    sys.stderr.flush()
                    os._exit(0)
            return result
        return wrapped
    _execute._step_fn = timed_step_fn
preloads = []
if hasattr(run_cli, "_run_with"):  # the preload, then pd_train.run's imports (pd-train run)
    preload = run_cli._preload
    def timed_preload(args):
        result = preload(args)
        preloads.append(result)
        mark("preload")
        return result
    run_cli._preload = timed_preload
    run_with = run_cli._run_with
    def timed_run_with(args, preload):
        install()
        mark("imports")
        return run_with(args, preload)
    run_cli._run_with = timed_run_with
else:  # a checkout without the preload: pd_train.run imported by the CLI's parser
    mark("preload")
    install()
    mark("imports")
sys.exit(pd_train.cli.main(sys.argv[1:]))
"""


def launch(pythonpath: str | None, cache: Path, out: Path, extra: list[str]) -> dict:
    """One launch; its marks (``{"marks": {name: (wall, cpu, main cpu)}, "threads": ...}``)."""
    run_dir = out / f"run-{len(list(out.iterdir()))}"
    result = out.parent / f"{run_dir.name}.json"
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
    env["PD_WARM_OUT"] = str(result)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    args = [
        sys.executable, "-c", _CHILD, "run", "builtin:default", "--run-dir", str(run_dir),
        "--max-steps", "1", "--set", f"runtime.compile_cache.dir={cache}",
        *[a for o in [*OVERRIDES, *extra] for a in ("--set", o)],
    ]  # fmt: skip
    env["PD_WARM_T0"] = repr(time.time())
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"launch failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


def arm_pythonpath(path: str) -> str:
    """``PYTHONPATH`` for a worktree at ``path``: its packages' src folders."""
    root = Path(path)
    return os.pathsep.join(str(p) for p in sorted((root / "packages").glob("*/src")))


def table(name: str, runs: list[dict]) -> str:
    lines = [
        f"{name}: {len(runs)} warm launches (medians)",
        "| phase (to the end of step 0) | wall s | CPU s | main thread CPU s |",
        "|---|---:|---:|---:|",
    ]
    previous = [(0.0, 0.0, 0.0)] * len(runs)
    for mark, label in PHASES:
        now = [r["marks"][mark] for r in runs]
        deltas = [[n[i] - p[i] for i in range(3)] for n, p in zip(now, previous, strict=True)]
        wall, cpu, main = (statistics.median(d[i] for d in deltas) for i in range(3))
        lines.append(f"| {label} | {wall:.2f} | {cpu:.2f} | {main:.2f} |")
        previous = now
    total = [r["marks"]["step0"] for r in runs]
    wall, cpu, main = (statistics.median(t[i] for t in total) for i in range(3))
    lines.append(f"| **total to step 0** | **{wall:.2f}** | **{cpu:.2f}** | **{main:.2f}** |")
    for thread in sorted({t for r in runs for t in r["threads"]}):
        ended = [r["threads"][thread] for r in runs if thread in r["threads"]]
        lines.append(
            f"(thread {thread}: ended at {statistics.median(e[0] for e in ended):.2f} s, "
            f"{statistics.median(e[1] for e in ended):.2f} CPU s)"
        )
    lines.append(
        f"{name}: to step 0 {wall:.2f} s wall, {cpu:.2f} CPU s (main thread {main:.2f}), "
        f"median of {len(runs)}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another worktree's code (its packages/*/src first on PYTHONPATH); repeatable",
    )
    parser.add_argument("--set", action="append", default=[], help="one more override")
    parser.add_argument(
        "--arms-only", action="store_true", help="only the --arm worktrees, not this checkout"
    )
    args = parser.parse_args()
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    arms: list[tuple[str, str | None]] = [] if args.arms_only else [("this checkout", None)]
    arms += [(a.split("=", 1)[0], arm_pythonpath(a.split("=", 1)[1])) for a in args.arm]
    with tempfile.TemporaryDirectory() as tmp:
        runs: dict[str, list[dict]] = {name: [] for name, _ in arms}
        dirs = {}
        for name, pythonpath in arms:
            cache, out = Path(tmp) / name / "cache", Path(tmp) / name / "runs"
            out.mkdir(parents=True)
            dirs[name] = (cache, out)
            launch(pythonpath, cache, out, args.set)  # cold: fills the arm's cache
        for i in range(args.repeats):
            order = arms if i % 2 == 0 else arms[::-1]
            for name, pythonpath in order:
                result = launch(pythonpath, *dirs[name], args.set)
                runs[name].append(result)
                print(
                    f"{name}: step 0 at {result['marks']['step0'][0]:.2f} s, "
                    f"{result['marks']['step0'][1]:.2f} CPU s (load {os.getloadavg()[0]:.1f})",
                    file=sys.stderr,
                )
    for name, _ in arms:
        print(table(name, runs[name]))
        print()


if __name__ == "__main__":
    main()
