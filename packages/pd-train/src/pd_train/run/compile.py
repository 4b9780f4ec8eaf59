"""``pd-train compile``: lower and compile every jit of a run on abstract inputs.

No weights, no data, nothing allocated: each jit is lowered on ``jax.ShapeDtypeStruct`` inputs
that carry the run's shardings, compiled, and reported with its seconds and XLA's per-device
memory analysis. With ``--simulate-devices 8`` this works for the production Llama-3-8B config
on a laptop CPU.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_train.outputs import xla_slow_compile_alarm_replaced
from pd_train.run.distributed import Placement

MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)


@dataclass(frozen=True)
class Device:
    """A device's memory to hold each jit's per-device memory against."""

    name: str
    memory_bytes: int


#: The device ``pd-train compile`` compares memory with when it compiles for no GPU (CPU,
#: simulated devices): an 80 GB part (A100 80GB, H100 SXM 80GB; NVIDIA's "80 GB" is 80 GiB).
REFERENCE_GPU = Device("80 GB GPU", 80 * 2**30)
#: JAX preallocates this share of a GPU's memory unless XLA_PYTHON_CLIENT_MEM_FRACTION says
#: otherwise (JAX's GPU memory allocation docs).
JAX_DEFAULT_MEM_FRACTION = 0.75


@dataclass
class CompileRow:
    """``cache``: the persistent compile cache's outcome for the jit's compiles: ``hit`` (all
    loaded from the cache), ``miss`` (at least one compiled), ``off`` (no cache consulted)."""

    jit: str
    lower_s: float
    compile_s: float
    memory: dict[str, int] | None
    cache: str = "off"
    #: pd_train.flops: the compiled cost per device; the census's useful FLOPs (train_step).
    cost: Any = None
    useful: float | None = None
    devices: int = 1

    @property
    def bytes_per_device(self) -> int | None:
        """What one device holds while the jit runs: arguments + outputs + temporaries, less
        the outputs that reuse donated arguments, or XLA's peak where it reports more (on CPU
        its peak leaves the temporaries out: the production step's 23.7 GiB beside 34.7 GiB of
        temporaries)."""
        peak = int(getattr(self.cost, "peak_bytes", None) or 0)
        m = self.memory
        if not m or "argument_size_in_bytes" not in m:
            return peak or None
        total = (
            m["argument_size_in_bytes"]
            + m.get("output_size_in_bytes", 0)
            + m.get("temp_size_in_bytes", 0)
            - m.get("alias_size_in_bytes", 0)
        )
        return max(total, peak)


def _jits(rt: Any) -> list[tuple[str, Callable[[], Any]]]:
    """(name, lower) for every jit a run compiles, in the order a run compiles them."""
    import jax

    trainer = rt.trainer
    config = rt.prepared.config
    from pd_train.run import target_dtype as dtype_of

    target_dtype = dtype_of(config)
    key = jax.eval_shape(lambda: jax.random.key(0))
    if trainer.layout is not None:
        key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=trainer.layout.replicated())
    jits: list[tuple[str, Callable[[], Any]]] = [
        *trainer.init_lowerings(key=key),
        ("opt_init", lambda: trainer.lower_opt_init()),
    ]
    if config.pd.faithfulness_warmup.steps:
        jits.append(("faithfulness_warmup", lambda: trainer.lower_warmup(target_dtype)))
    jits.append(
        (
            "train_step",
            lambda: trainer.lower_step(
                batch_size=config.pd.batch_size,
                seq_len=config.data.seq_len,
                target_dtype=target_dtype,
            ),
        )
    )
    if config.cadence.eval_every:
        from pd_train import evaluate

        jits.append(
            (
                "eval_metrics",
                lambda: evaluate.lower_eval(
                    trainer,
                    batch_size=config.pd.batch_size,
                    seq_len=config.data.seq_len,
                    target_dtype=target_dtype,
                ),
            )
        )
        if config.cadence.slow_eval_every:
            jits.append(
                (
                    "slow_eval_metrics",
                    lambda: evaluate.lower_eval(
                        trainer,
                        batch_size=config.pd.batch_size,
                        seq_len=config.data.seq_len,
                        target_dtype=target_dtype,
                        slow=True,
                    ),
                )
            )
    return jits


def compiled_memory(compiled: Any) -> dict[str, int] | None:
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # not every backend implements it
        return None
    if analysis is None:
        return None
    return {name: int(getattr(analysis, name)) for name in MEMORY_FIELDS if hasattr(analysis, name)}


def compile_all(
    source: str | Path | dict[str, Any],
    overrides: Sequence[str] = (),
    *,
    record: Path | None = None,
    placement: Placement | None = None,
    progress: Any = None,
) -> list[CompileRow]:
    """Validate the config (no weight or data files needed), start the runtime, compile.

    ``progress``: a text stream (e.g. ``sys.stderr``) that gets a line per jit as it lowers
    and compiles, with the compile cache's outcome; None for silence."""
    from pd_probe import CompileAnnouncer, Recorder
    from pd_train import flops
    from pd_train import run as runner

    prepared = runner.prepare(source, overrides, for_run=False)
    rt = runner.start_runtime(prepared, placement or Placement())
    cache_dir = runner.configure_cache(prepared.config)
    rows = []
    announce = CompileAnnouncer(progress) if progress is not None else None
    mesh = rt.trainer.mesh
    devices = int(mesh.devices.size) if mesh is not None else 1
    from pd_train.program_records import ProgramRecords, explaining  # why a jit missed

    programs = ProgramRecords.for_config(cache_dir, prepared.config, prepared.model)
    on_compile = explaining(announce, programs, stream=progress)
    with Recorder(record, mode="compile", on_compile=on_compile) as recorder:
        jits = _jits(rt)
        for i, (name, lower) in enumerate(jits, 1):
            if progress is not None:
                progress.write(f"[{i}/{len(jits)}] lowering {name}…\n")
                progress.flush()
            with recorder.phase(name):
                t0 = time.perf_counter()
                lowered = lower()
                t1 = time.perf_counter()
                with xla_slow_compile_alarm_replaced(name):
                    compiled = lowered.compile()
                t2 = time.perf_counter()
            recorder.memory(name, compiled)
            cache = _cache_outcome(recorder.cache_outcomes(name))
            row = CompileRow(
                name, t1 - t0, t2 - t1, compiled_memory(compiled), cache, devices=devices
            )
            rows.append(row)
            flops.annotate(row, compiled, rt, prepared)
    return rows


def target_device() -> Device:
    """The device the jits were compiled for when it is a GPU (its kind and the memory XLA may
    use), else :data:`REFERENCE_GPU`."""
    import jax

    device = jax.devices()[0]
    if device.platform == "gpu":
        stats: dict[str, Any] = {}
        with contextlib.suppress(Exception):
            stats = device.memory_stats() or {}
        if stats.get("bytes_limit"):
            return Device(device.device_kind, int(stats["bytes_limit"]))
    return REFERENCE_GPU


def _cache_outcome(outcomes: Sequence[str]) -> str:
    if not outcomes or all(o == "off" for o in outcomes):
        return "off"
    return "miss" if "miss" in outcomes else "hit"


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.3f}"


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


_UNITS = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_flops(lo: float, hi: float | None = None) -> str:
    """FLOPs in the unit that fits the larger value, three significant figures:
    ``6.69-14.4 PFLOP``, ``312 TFLOP``."""
    hi = lo if hi is None else hi
    rounded = float(f"{hi:.3g}")  # 999.6e12 is 1 PFLOP, not 1e+03 TFLOP
    scale, unit = next(((s, u) for s, u in _UNITS if rounded >= s), (1.0, ""))

    def fmt(x: float) -> str:
        return f"{x / scale:.3g}"

    body = fmt(hi) if fmt(lo) == fmt(hi) else f"{fmt(lo)}-{fmt(hi)}"
    return f"{body} {unit}FLOP"


def memory_report(rows: Sequence[CompileRow], device: Device) -> list[str]:
    """Per jit: what one device holds against ``device``'s memory, and whether it fits."""
    n = max((r.devices for r in rows), default=1)
    devices = f"{n} device{'s' if n != 1 else ''}"
    gib = device.memory_bytes / 2**30
    lines = [f"Memory per device against an {device.name} ({gib:.0f} GiB) at {devices}:"]
    fits_all = True
    for r in rows:
        need = r.bytes_per_device
        if need is None:
            lines.append(f"  {r.jit:<20} -")
            continue
        fits = need <= device.memory_bytes
        fits_all &= fits
        share = 100 * need / device.memory_bytes
        lines.append(
            f"  {r.jit:<20} {_size(need):>10}  {share:5.1f} %  fits: {'yes' if fits else 'no'}"
        )
    verdict = "yes" if fits_all else "no"
    lines.append(f"Fits an {device.name} at {devices}: {verdict}")
    if device is REFERENCE_GPU:
        budget = JAX_DEFAULT_MEM_FRACTION * gib
        lines.append(
            f"(JAX takes {JAX_DEFAULT_MEM_FRACTION:.0%} of a GPU, {budget:.0f} GiB here, unless "
            "XLA_PYTHON_CLIENT_MEM_FRACTION sets more; more devices shard the state thinner)"
        )
    return lines


def flops_report(rows: Sequence[CompileRow]) -> list[str]:
    """Per jit the compiled matmul FLOPs (loops multiplied out, a range where conditionals
    differ), per device and on all devices; the train step's useful FLOPs beside them."""
    lines = ["Matmul FLOPs per call (loops multiplied out; a range where conditionals differ):"]
    for r in rows:
        c = r.cost
        if c is None or not c.matmul_flops:
            continue
        n = r.devices
        total = format_flops(c.matmul_flops_min * n, c.matmul_flops * n)
        line = f"  {r.jit:<20} {format_flops(c.matmul_flops_min, c.matmul_flops)} per device"
        line += f", {total} on {n}" if n > 1 else ""
        if r.useful:
            lo, hi = c.matmul_flops_min * n / r.useful, c.matmul_flops * n / r.useful
            ratio = f"{hi:.2f}x" if abs(hi - lo) < 0.005 * hi else f"{lo:.2f}-{hi:.2f}x"
            line += f"; useful {format_flops(r.useful)} (compiled/useful {ratio})"
            if c.unknown_loops:
                s = "" if c.unknown_loops == 1 else "s"
                line += f" ({c.unknown_loops} loop{s} of unknown trip count)"
        lines.append(line)
    return lines if len(lines) > 1 else []


def format_compile_table(rows: Sequence[CompileRow], device: Device | None = None) -> str:
    """The table ``pd-train compile`` prints, then memory per device against ``device``
    (default: :func:`target_device`) and the FLOPs of each jit."""
    header = (
        "| jit | lower s | compile s | cache | args GiB | out GiB | temp GiB |\n"
        "|---|---:|---:|---|---:|---:|---:|"
    )
    lines = [header]
    for r in rows:
        m = r.memory or {}
        lines.append(
            f"| {r.jit} | {r.lower_s:.2f} | {r.compile_s:.2f} | {r.cache} | "
            f"{_gib(m.get('argument_size_in_bytes'))} | {_gib(m.get('output_size_in_bytes'))} | "
            f"{_gib(m.get('temp_size_in_bytes'))} |"
        )
    total = sum(r.lower_s + r.compile_s for r in rows)
    hits = sum(r.cache == "hit" for r in rows)
    lines.append(
        f"\ntotal lower + compile: {total:.1f} s (per-device memory from XLA); "
        f"{hits} of {len(rows)} jits loaded from the compile cache"
    )
    lines += ["", *memory_report(rows, device or target_device())]
    flops = flops_report(rows)
    if flops:
        lines += ["", *flops]
    return "\n".join(lines)
