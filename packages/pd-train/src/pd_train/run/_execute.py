"""Step 3 of a run: :func:`execute` — the run dir's files, the compile record, the target, the
state (fresh and warmed up, or restored), the data, the hooks, :func:`run_loop`, then plots and
a summary. Each piece is a function named for what it sets up."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_train.config.run import Config, to_yaml
from pd_train.run._checkpointing import (
    CheckpointWriteError,
    Restored,
    Saver,
    canonical_state,
    replicated,
    restore_checked,
)
from pd_train.run._prepare import load_target, target_dtype
from pd_train.run._programs import StepProgram, compile_announcer
from pd_train.run._run_dir import COMPILE_FILE, start_run_dir
from pd_train.run._runtime import Runtime, configure_cache
from pd_train.run.hooks import (
    EvalHook,
    Hook,
    LogHook,
    PlotWorkersHook,
    SaveHook,
    StopHook,
    TraceHook,
    TrackerHook,
)
from pd_train.run.loop import run_loop
from pd_train.run.signals import StopSignals, agreed

log = logging.getLogger("pd_train")


@dataclass
class RunResult:
    """``final_step``: steps finished (the name of the last checkpoint; the last step run is
    ``final_step - 1`` in metrics.jsonl's 0-based numbering). ``stop_signal``: ``"SIGTERM"`` or
    ``"SIGINT"`` when a signal stopped the run early, else None."""

    run_dir: Path
    final_step: int
    stopped_early: bool
    summary: str
    stop_signal: str | None = None


def execute(
    rt: Runtime,
    *,
    run_dir: Path,
    max_steps: int | None = None,
    allow_config_change: bool = False,
) -> RunResult:
    """Run (or resume) the decomposition in ``run_dir``; every process calls this.

    A resume first checks and restores its checkpoint (:func:`restore_checked`: its config
    against config.yaml, its arrays against the state) before anything is written. SIGTERM or Ctrl-C at
    any point (also during setup or the warmup) stops the run after its next step, with a
    checkpoint, plots and a summary, and returns normally (``stop_signal`` says which); a
    second Ctrl-C aborts at once (exit 130).
    """
    from pd_train.run.checkpoints import Checkpoints

    config = rt.prepared.config
    checkpoints = Checkpoints(
        run_dir / "checkpoints", keep_last_n=config.cadence.keep_last_n_checkpoints, writer=True
    )
    plots = PlotWorkersHook(None)
    terminal = _terminal(rt)
    try:
        with (
            terminal.capture_stderr(),
            terminal.logging_to_terminal(),
            _closing(plots),
            StopSignals() as stop,
        ):
            stop.terminal = terminal
            resume = None
            if rt.prepared.resume_dir is not None:
                # Checked and read before anything is written: a drifted config or a damaged
                # checkpoint is an error (exit 2) that leaves the run dir as it was.
                resume = restore_checked(
                    checkpoints,
                    config=config,
                    trainer=rt.trainer,
                    allow_config_change=allow_config_change,
                )
            return _execute(rt, run_dir, checkpoints, resume, max_steps, stop, plots, terminal)
    finally:
        terminal.close()
        if rt.step_program is not None:  # the run did not start: end the step's thread
            rt.step_program.cancel(wait=True)


@contextlib.contextmanager
def _closing(plots: PlotWorkersHook) -> Iterator[None]:
    """The plot workers ended on the way out (a no-op once they rendered the plots; after
    Ctrl-C they never got their job), before the terminal stops capturing their stderr."""
    try:
        yield
    finally:
        if plots.workers is not None:
            plots.workers.close()


def _execute(
    rt: Runtime,
    run_dir: Path,
    checkpoints: Any,
    resume: Restored | None,
    max_steps: int | None,
    stop: StopSignals,
    plots: PlotWorkersHook,
    terminal: Any,
) -> RunResult:
    config, primary = rt.prepared.config, rt.placement.is_primary
    started = time.time()
    if primary:
        start_run_dir(run_dir, config, resuming=resume is not None)
    early, rt.step_program = rt.step_program, None
    cache_dir = (
        early.cache_dir
        if early is not None  # configured by start_runtime
        else configure_cache(config, disable=rt.hlo_dump_dir is not None)
    )
    recorder = _run_recorder(rt, run_dir, cache_dir, terminal)
    with _recorded(recorder):
        recorder.note(cache_dir=str(cache_dir) if cache_dir else None)
        step_program = _step_program(rt, early, recorder, cache_dir)
        # What the rest of the run needs is imported while the step loads in its thread.
        import jax.numpy as jnp

        from pd_train.outputs import MetricsLog

        target = _load_target(rt, recorder)
        metrics_log = MetricsLog(run_dir, is_primary=primary)
        state, run_key, start = _initial_state(
            rt, checkpoints, resume, metrics_log, recorder, target, step_program
        )
        end = config.pd.steps if max_steps is None else min(config.pd.steps, max_steps)
        hooks, tracker, stop_hook = _run_hooks(
            rt,
            run_dir,
            checkpoints,
            stop=stop,
            plots=plots,
            terminal=terminal,
            metrics_log=metrics_log,
            target=target,
            run_key=run_key,
            recorder=recorder,
            step_program=step_program,
            last_saved=start if resume is not None else None,
            start=start,
            end=end,
        )
        step_fn = _step_fn(rt, step_program, recorder, target, run_key, start)
        final = run_loop(step_fn, hooks, state=state, start=start, end=end)
        jnp.zeros(()).block_until_ready()

    summary = ""
    if primary:
        metrics_log.close()
        if tracker is not None:
            tracker.close()
        summary = _plots_and_summary(
            run_dir,
            plots.workers,
            started=started,
            start=start,
            final_step=final.step,
            stopped=stop if stop_hook.stopped else None,
            terminal=terminal,
        )
    return RunResult(
        run_dir=run_dir,
        final_step=final.step,
        stopped_early=stop_hook.stopped,
        summary=summary,
        stop_signal=stop.stop_signal if stop_hook.stopped else None,
    )


def _run_recorder(rt: Runtime, run_dir: Path, cache_dir: Any, terminal: Any) -> Any:
    """The run's compile recorder: process 0 writes ``compile.json`` and announces each
    compile on the terminal, with why a jit missed the cache (:mod:`pd_train.program_records`)."""
    from pd_probe import Recorder
    from pd_train.outputs import labelled
    from pd_train.program_records import ProgramRecords, explaining

    if not rt.placement.is_primary:
        return Recorder(None, mode="run", on_compile=None)
    programs = ProgramRecords.for_config(cache_dir, rt.prepared.config, rt.prepared.model)
    announce = explaining(compile_announcer(terminal), programs, stream=terminal.writer())
    return Recorder(run_dir / COMPILE_FILE, mode="run", on_compile=labelled(announce))


def _run_hooks(
    rt: Runtime,
    run_dir: Path,
    checkpoints: Any,
    *,
    stop: StopSignals,
    plots: PlotWorkersHook,
    terminal: Any,
    metrics_log: Any,
    target: Any,
    run_key: Any,
    recorder: Any,
    step_program: Any,
    last_saved: int | None,
    start: int,
    end: int,
) -> tuple[list[Hook], Any, StopHook]:
    """The loop's hooks in their order (profiler trace, log + progress, plots, eval, tracker,
    save, stop signals), the tracker (process 0, or None) and the stop hook."""
    from pd_train.outputs import Progress

    config, trainer, primary = rt.prepared.config, rt.trainer, rt.placement.is_primary
    saver = Saver(
        checkpoints,
        trainer=trainer,
        run_key=run_key,
        config_yaml=to_yaml(config),
        last_saved=last_saved,
        on_saved=stop.saved,
        agree=lambda flag: agreed(flag, rt.placement),
    )
    tracker = _tracker(config, run_dir) if primary else None
    progress = Progress(
        end,
        start_step=start,
        is_primary=primary,
        log_every=config.cadence.train_log_every,
        terminal=terminal if primary else None,
    )
    eval_hook = _eval_hook(rt, target, run_key, recorder, step_program, metrics_log)
    if eval_hook is not None and primary:
        eval_hook.terminal = terminal
    trace = _trace_window(config, run_dir) if primary else None
    plots.eval_hook = eval_hook
    stop_hook = StopHook(stop, rt.placement)
    hooks: list[Hook] = [
        *([TraceHook(trace)] if trace is not None else []),
        LogHook(
            trainer=trainer,
            metrics_log=metrics_log,
            progress=progress,
            every=config.cadence.train_log_every,
            seq_len=config.data.seq_len,
        ),
        *([plots] if primary else []),
        *([eval_hook] if eval_hook is not None else []),
        *([TrackerHook(tracker)] if tracker is not None else []),
        SaveHook(saver, every=config.cadence.save_every),
        stop_hook,
    ]
    return hooks, tracker, stop_hook


@contextlib.contextmanager
def _recorded(recorder: Any) -> Iterator[None]:
    """``recorder`` entered; when a failed checkpoint (a full disk) leaves compile.json
    unwritable too, the checkpoint's error is the one raised."""
    try:
        with recorder:
            yield
    except OSError as exc:
        if isinstance(exc.__context__, CheckpointWriteError):
            raise exc.__context__ from None
        raise


def _step_program(rt: Runtime, early: StepProgram | None, recorder: Any, cache_dir: Any) -> Any:
    """The train step compiling (or loading) in a thread while the target loads, the state
    initializes and the faithfulness warmup runs (started by start_runtime, or here); the init
    and warm-up jits load from the same executable cache (a warm launch skips their trace and
    lowering)."""
    if early is None:
        step_program = StepProgram(
            rt.trainer,
            target_dtype=target_dtype(rt.prepared.config),
            recorder=recorder,
            cache_dir=cache_dir,
            announce=rt.placement.is_primary,
        )
        step_program.start()
    else:
        step_program = early
        step_program.attach(recorder)
    rt.trainer.programs = step_program.init_programs()
    return step_program


def _load_target(rt: Runtime, recorder: Any) -> Any:
    """The target's weights, straight into their shardings."""
    import jax

    dtype = target_dtype(rt.prepared.config)
    abstract_target = rt.abstract_target
    if abstract_target is None:
        abstract_target = rt.trainer.abstract_target(dtype)
    shardings = jax.tree.map(lambda a: a.sharding, abstract_target)
    with recorder.phase("load_target"):
        return load_target(rt.prepared, shardings=shardings, dtype=dtype)


def _initial_state(
    rt: Runtime,
    checkpoints: Any,
    resume: Restored | None,
    metrics_log: Any,
    recorder: Any,
    target: Any,
    step_program: StepProgram,
) -> tuple[Any, Any, int]:
    """``(state, run key, first step)``: the restored checkpoint's (its records from that step
    on dropped from metrics.jsonl), or fresh and warmed up; laid out as the step expects
    (DESIGN decision 8)."""
    import jax

    config, trainer = rt.prepared.config, rt.trainer
    run_key = replicated(trainer, jax.random.key(config.seed))
    start = 0
    with recorder.phase("init"):
        if resume is not None:
            state, run_key, start = resume.state, resume.run_key, resume.step
            metrics_log.truncate_from(start)
        else:
            # Init and eval keys are folded with numbers no step reaches (steps fold 0, 1, ...).
            state = trainer.init_state(key=jax.random.fold_in(run_key, 2**31 - 1))
    if resume is None and config.pd.faithfulness_warmup.steps:
        with recorder.phase("faithfulness_warmup"):
            n_warm = config.pd.faithfulness_warmup.steps
            # Each warmup record is written as its step finishes, with its own time.
            state, _ = trainer.faithfulness_warmup(
                state,
                target,
                on_step=lambda i, value: metrics_log.log(
                    i - n_warm, "warmup", {"loss/faithfulness": value}
                ),
            )
    trainer.programs = None
    step_program.remember_init_programs()
    if step_program.init_outcomes:
        recorder.note(init_executable_cache=dict(step_program.init_outcomes))
    if step_program.init_prefetched:
        recorder.note(init_programs_prefetched=list(step_program.init_prefetched))
    canonical = canonical_state(trainer, state, rt.abstract_state)
    return canonical, replicated(trainer, run_key), start


def _batches(rt: Runtime, path: Any, seed: int) -> Any:
    from pd_train.run.data import Batches, TokenDataset

    config = rt.prepared.config
    dataset = TokenDataset(
        path,
        seq_len=config.data.seq_len,
        dtype=config.data.dtype,
        vocab_size=rt.prepared.model.vocab_size,
    )
    return Batches(
        dataset,
        batch_size=config.pd.batch_size,
        seed=seed,
        process_index=rt.placement.process_id,
        process_count=rt.placement.num_processes,
    )


def _step_fn(
    rt: Runtime, step_program: StepProgram, recorder: Any, target: Any, run_key: Any, start: int
) -> Any:
    """The loop's step: the batch of ``(seed, step)``, the step's key, the train step (the
    attempt's first step is the ``train_step`` compile phase)."""
    import jax
    import numpy as np

    import pd_sharding
    from pd_train.train import step_key

    batches = _batches(rt, rt.prepared.data_path, rt.prepared.config.seed)

    def step_fn(state: Any, step: int) -> tuple[Any, Any]:
        rows = batches.batch(step)
        tokens = pd_sharding.global_batch(rows.astype(np.int32), rt.mesh)
        key = step_key(run_key, step)
        if step != start:
            return step_program(state, target, tokens, key)  # type: ignore[no-any-return]
        with recorder.phase("train_step"):
            state, metrics = step_program(state, target, tokens, key)
            jax.block_until_ready(metrics)
        return state, metrics

    return step_fn


def _eval_hook(
    rt: Runtime,
    target: Any,
    run_key: Any,
    recorder: Any,
    step_program: StepProgram,
    metrics_log: Any,
) -> EvalHook | None:
    """The eval hook (None when ``cadence.eval_every`` is 0)."""
    import jax

    from pd_train import evaluate as evaluation

    config = rt.prepared.config
    if not config.cadence.eval_every:
        return None
    evaluator = evaluation.Evaluator(
        rt.trainer,
        _batches(rt, rt.prepared.eval_path, config.seed + 1),
        n_batches=config.data.eval_batches,
        mesh=rt.mesh,
    )
    return EvalHook(
        evaluator,
        every=config.cadence.eval_every,
        slow_every=config.cadence.slow_eval_every,
        total_steps=config.pd.steps,
        eval_key=jax.random.fold_in(run_key, 2**31 - 2),
        target=target,
        metrics_log=metrics_log,
        recorder=recorder,
        step_program=step_program,
    )


def _plots_and_summary(
    run_dir: Path,
    workers: Any,
    *,
    started: float,
    start: int,
    final_step: int,
    stopped: StopSignals | None,
    terminal: Any,
) -> str:
    """Plots (by the plot workers when they were started; skipped after Ctrl-C: the prompt
    comes back at once) and summary.txt; returns the summary."""
    from pd_train.outputs import read_metrics, render_summary, write_plots

    records = read_metrics(run_dir)
    if stopped is not None and stopped.stop_signal == "SIGINT":
        saved = stopped.last_saved
        where = (
            f"saved checkpoint step {saved} in {run_dir / 'checkpoints' / str(saved)}"
            if saved is not None
            else "no checkpoint saved"
        )
        terminal.line(
            f"stopped by Ctrl-C: {where}; plots skipped (`pd-train run --resume {run_dir}` "
            "continues the run and writes them at its end)"
        )
    elif workers is not None:
        t0 = time.perf_counter()
        workers.write(run_dir, run_dir / "plots")
        log.info(
            "plots: rendered by %d worker processes (started %.0f s before) in %.1f s "
            "(each worker's wall / CPU s: %s)",
            len(workers.answered),
            t0 - workers.started,
            time.perf_counter() - t0,
            ", ".join(f"{wall:.1f} / {cpu:.1f}" for wall, cpu in workers.timings),
        )
    else:
        write_plots(records, run_dir / "plots")
    summary: str = render_summary(
        records,
        run_dir,
        extra={
            "wall time": f"{time.time() - started:.1f} s",
            "stopped early": f"yes ({stopped.stop_signal or 'signal'} after step {final_step - 1})"
            if stopped is not None
            else "no",
        },
        last_step=final_step - 1 if final_step > 0 else None,
        attempt_first_step=start,
    )
    (run_dir / "summary.txt").write_text(summary)
    return summary


def _terminal(rt: Runtime) -> Any:
    """The run's one writer of terminal lines (process 0); other processes get one that
    writes plain lines to their stderr as before and captures nothing."""
    import sys

    from pd_train.outputs import Terminal

    if rt.placement.is_primary:
        return Terminal()
    return Terminal(sys.stderr, bar=False)


def _tracker(config: Config, run_dir: Path) -> Any:
    """The run's W&B tracker (``tracking:`` in the config; process 0 only), or None."""
    if config.tracking is None:
        return None
    import attrs

    from pd_train.analysis.tracking import WandbTracker, parse_tracking

    return WandbTracker(run_dir, parse_tracking(config.tracking), run_config=attrs.asdict(config))


def _trace_window(config: Config, run_dir: Path) -> Any:
    from pd_train.process_env import TraceWindow

    profile = config.runtime.launch_env.profile
    if profile.trace_start_step is None:
        return None
    return TraceWindow(
        run_dir / "trace", start=profile.trace_start_step, num_steps=profile.trace_num_steps
    )
