"""Memory per device of one jit of a config, and what sits at its peak (issue 17 item 7).

Compiles only the train step (or the eval) of a config on N simulated CPU devices, on abstract
inputs (no weights, no data), and prints XLA's ``memory_analysis()`` per device: arguments,
outputs, temporaries, arguments + temporaries (the figure item 7 bounds), with the compile's
wall and CPU seconds. ``pd-train compile`` prints the same figures for every jit of a run; this
is the fast loop for one jit while changing the step.

With ``--dump DIR`` it also dumps XLA's buffer assignment and explains the temporaries: XLA:CPU
packs every temporary of the program (loop bodies included) into one preallocated block, and
``memory_analysis()``'s temp is that block's size. The script joins the block's buffers
(``*-buffer-assignment.txt``) with their live ranges over the whole program
(``*-live-range.txt``), finds the moment the most distinct buffers are live (the occupancy
peak: normally within a few MiB of the block) and lists the largest buffers live then, with the
instruction and shape that defines each. (The dump's own "peak" listing covers only the entry
computation, not the loop bodies, and can point elsewhere.)

    python benchmarks/step_memory.py [CONFIG] [--devices 64] [--jit train_step|eval_metrics]
        [--set PATH=VALUE ...] [--dump DIR] [--min-mib 256]

CONFIG defaults to ``configs/llama8b-full32L.yaml`` (the production topology is 64 devices;
~1-2 min and ~10 GB of host memory to compile at 32 layers on 2 cores).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
MIB = 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?", default=str(ROOT / "configs/llama8b-full32L.yaml"))
    parser.add_argument("--devices", type=int, default=64, help="simulated CPU devices")
    parser.add_argument("--jit", choices=("train_step", "eval_metrics"), default="train_step")
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE")
    parser.add_argument("--dump", type=Path, help="dump XLA's buffer assignment here, explain it")
    parser.add_argument("--min-mib", type=float, default=256.0, help="list buffers from this size")
    args = parser.parse_args(argv)
    if args.devices < 1:
        parser.error(f"--devices: got {args.devices}; must be >= 1")

    flags = [f"--xla_force_host_platform_device_count={args.devices}"]
    if args.dump is not None:
        if args.dump.exists() and any(args.dump.iterdir()):
            parser.error(f"--dump: {args.dump} is not empty; give a new or empty folder")
        flags += [f"--xla_dump_to={args.dump}", "--xla_dump_hlo_as_text"]
        flags += ["--xla_dump_hlo_pass_re=NONE"]
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from pd_train import run as runner
    from pd_train.config.pd import ConfigError
    from pd_train.run.distributed import Placement

    try:
        prepared = runner.prepare(
            args.config, [*args.set, "runtime.compile_cache.enabled=false"], for_run=False
        )
        rt = runner.start_runtime(prepared, Placement())
    except ConfigError as exc:
        print(f"step_memory: {exc}", file=sys.stderr)
        return 2
    runner.configure_cache(prepared.config, disable=True)
    config, trainer = prepared.config, rt.trainer
    dtype = runner.target_dtype(config)
    shape = {"batch_size": config.pd.batch_size, "seq_len": config.data.seq_len}

    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if args.jit == "train_step":
        lowered = trainer.lower_step(**shape, target_dtype=dtype)
    else:
        from pd_train import evaluate

        lowered = evaluate.lower_eval(trainer, **shape, target_dtype=dtype)
    compiled = lowered.compile()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    m = compiled.memory_analysis()
    print(
        f"{args.jit} on {args.devices} devices ({Path(args.config).name}"
        f"{', ' + ', '.join(args.set) if args.set else ''}), GiB per device: "
        f"args {m.argument_size_in_bytes / GIB:.2f}, out {m.output_size_in_bytes / GIB:.2f}, "
        f"temp {m.temp_size_in_bytes / GIB:.2f}, "
        f"args + temp {(m.argument_size_in_bytes + m.temp_size_in_bytes) / GIB:.2f}; "
        f"lower + compile {t1 - t0:.0f} s wall ({cpu:.0f} CPU s)"
    )
    if args.dump is not None:
        prefix = _module_prefix(args.dump, args.jit)
        print(explain_temp_block(prefix, min_bytes=int(args.min_mib * MIB)))
    return 0


def _module_prefix(dump: Path, jit: str) -> Path:
    """The dump's file prefix of ``jit``'s optimized module (the last one compiled)."""
    found = sorted(dump.glob(f"module_*.jit_{jit}*.cpu_after_optimizations-buffer-assignment.txt"))
    if not found:
        found = sorted(dump.glob(f"module_*{jit}*-buffer-assignment.txt"))
    if not found:
        msg = f"no buffer assignment of {jit} in {dump}"
        raise FileNotFoundError(msg)
    return Path(str(found[-1]).removesuffix("-buffer-assignment.txt"))


_VALUE = re.compile(r" value: <\d+ (\S+)(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)")
_RANGE = re.compile(r"\s+(\S+):(\d+)-(\d+)$")


def explain_temp_block(prefix: Path, *, min_bytes: int) -> str:
    """The preallocated temp block of ``prefix``'s buffer assignment, its occupancy peak over
    the program's schedule, and the buffers of at least ``min_bytes`` live at that peak."""
    assignment = Path(f"{prefix}-buffer-assignment.txt").read_text().splitlines()
    live = Path(f"{prefix}-live-range.txt").read_text().splitlines()
    head = next(
        i for i, line in enumerate(assignment)
        if line.startswith("allocation") and "preallocated-temp" in line
    )  # fmt: skip
    block = int(re.search(r"size (\d+)", assignment[head]).group(1))  # type: ignore[union-attr]
    values = []  # (name, size, offset, shape)
    for line in assignment[head + 1 :]:
        match = _VALUE.match(line)
        if match is None:
            break
        name, size, offset, shape = match.groups()
        values.append((name, int(size), int(offset), shape))
    split = live.index("  BufferLiveRange:")
    order = {}  # schedule position -> instruction
    for line in live[:split]:
        match = re.match(r"\s+(\d+):(\S+)", line)
        if match:
            order[int(match.group(1))] = match.group(2)
    ranges = {}
    for line in live[split + 1 :]:
        match = _RANGE.match(line)
        if match is None:
            break
        ranges[match.group(1)] = (int(match.group(2)), int(match.group(3)))

    def span(name: str) -> tuple[int, int] | None:
        return ranges.get(name if "{" in name else name + "{}")

    # Occupancy: the bytes of distinct (offset, size) slots in use at each position (values
    # sharing a slot, e.g. a loop's carried buffer, count once).
    events: dict[int, list[tuple[int, int, int]]] = collections.defaultdict(list)
    for name, size, offset, _ in values:
        s = span(name)
        if s is not None:
            events[s[0]].append((+1, offset, size))
            events[s[1] + 1].append((-1, offset, size))
    end = max(events) + 1 if events else 1
    users: collections.Counter[tuple[int, int]] = collections.Counter()
    current, best, at = 0, 0, 0
    for t in range(end):
        for sign, offset, size in sorted(events.get(t, []), key=lambda e: e[0]):
            if sign < 0:
                users[(offset, size)] -= 1
                current -= size if users[(offset, size)] == 0 else 0
            else:
                current += size if users[(offset, size)] == 0 else 0
                users[(offset, size)] += 1
        if current > best:
            best, at = current, t
    lines = [
        f"temp block {block / GIB:.2f} GiB; occupancy peak {best / GIB:.2f} GiB at schedule "
        f"position {at} of {end} ({order.get(at, '?')})",
        f"buffers of >= {min_bytes / MIB:.0f} MiB live there (size, instruction, shape):",
    ]
    seen = set()
    for name, size, offset, shape in sorted(values, key=lambda v: -v[1]):
        s = span(name)
        if size < min_bytes or s is None or not s[0] <= at <= s[1] or (offset, size) in seen:
            continue
        seen.add((offset, size))
        lines.append(f"  {size / MIB:9.1f} MiB  {name}  {shape[:90]}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
