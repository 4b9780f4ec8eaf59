"""``pd-train compile``: lower and compile every jit of a run on abstract inputs.

No weights, no data, nothing allocated: each jit is lowered on ``jax.ShapeDtypeStruct`` inputs
that carry the run's shardings, compiled, and reported with its seconds and XLA's per-device
memory analysis. With ``--simulate-devices 8`` this works for the production Llama-3-8B config
on a laptop CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_train.distributed import Placement

MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
)


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


def _jits(rt: Any) -> list[tuple[str, Callable[[], Any]]]:
    """(name, lower) for every jit a run compiles, in the order a run compiles them."""
    import jax

    trainer = rt.trainer
    config = rt.prepared.config
    from pd_train.run import _target_dtype

    target_dtype = _target_dtype(config)
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


def _memory(compiled: Any) -> dict[str, int] | None:
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
                compiled = lowered.compile()
                t2 = time.perf_counter()
            recorder.memory(name, compiled)
            cache = _cache_outcome(recorder.cache_outcomes(name))
            rows.append(CompileRow(name, t1 - t0, t2 - t1, _memory(compiled), cache))
            flops.annotate(rows[-1], compiled, rt, prepared)
    return rows


def _cache_outcome(outcomes: Sequence[str]) -> str:
    if not outcomes or all(o == "off" for o in outcomes):
        return "off"
    return "miss" if "miss" in outcomes else "hit"


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.3f}"


def format_compile_table(rows: Sequence[CompileRow]) -> str:
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
    from pd_train.flops import efficiency_report

    return "\n".join(lines) + "\n\n" + efficiency_report(rows)
