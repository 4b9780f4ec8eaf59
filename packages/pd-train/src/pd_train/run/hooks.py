"""What the run loop does around its steps, one hook each: the profiler trace, the train log (with
MFU), the plot workers' start, the eval (and slow eval), the tracker, checkpoints, stop signals.

A hook is called after every step for which its :class:`Cadence` is due, in the order the hooks
were added (:func:`pd_train.run.run_loop`); :meth:`Hook.before` runs before every step and
:meth:`Hook.close` once after the last, in the same order. Hooks share nothing but the
:class:`StepInfo` they are given; a hook that needs another's progress holds it (the plot
workers wait for the eval hook's first eval).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from pd_train.run._checkpointing import Saver
from pd_train.run.distributed import Placement
from pd_train.run.signals import StopSignals, agreed

log = logging.getLogger("pd_train")

#: The run's plots are rendered by worker processes (pd_train.outputs.PlotWorkers) started
#: during the loop once the steps still to run are expected to take at least this many seconds
#: (time for their imports on the core the step leaves idle); otherwise in the run's process.
PLOT_WORKERS_AHEAD_S = 10.0
#: How many plot workers (the plots are rendered in parallel after the last step).
PLOT_WORKERS = 2


@dataclass
class StepInfo:
    """The loop's position after a step. ``step``: steps finished (the name a checkpoint of this
    state gets); records carry ``index`` = ``step - 1``, the 0-based index of the step just run.
    ``start``/``end``: the attempt's first step and the step it runs to. ``stop``: set by a hook
    to end the loop after this step. ``ran``: steps the call just made ran (K of a K-step
    program; ``metrics`` then stacks them on a leading axis)."""

    step: int
    start: int
    end: int
    state: Any
    metrics: Any = None
    stop: bool = False
    ran: int = 1

    @property
    def index(self) -> int:
        return self.step - 1


@dataclass(frozen=True)
class Cadence:
    """Due after every ``every``-th step (0: never), and after the attempt's first step
    (``first``) or its last (``last``)."""

    every: int = 1
    first: bool = False
    last: bool = False

    def due(self, info: StepInfo) -> bool:
        return (
            (self.every > 0 and info.step % self.every == 0)
            or (self.first and info.step - info.ran == info.start)
            or (self.last and info.step == info.end)
        )


class Hook:
    """One thing the loop does at a cadence; override what applies."""

    cadence = Cadence()

    def before(self, step: int) -> None:
        """Before step ``step`` runs (every step)."""

    def __call__(self, info: StepInfo) -> None:
        """After a step for which :attr:`cadence` is due."""

    def close(self, info: StepInfo) -> None:
        """Once, after the loop (``info.step``: steps finished)."""


class TraceHook(Hook):
    """The profiler trace window (``runtime.launch_env.profile.trace_start_step``)."""

    def __init__(self, trace: Any) -> None:
        self.trace = trace

    def before(self, step: int) -> None:
        self.trace.before_step(step)

    def __call__(self, info: StepInfo) -> None:
        self.trace.after_step(info.index)

    def close(self, info: StepInfo) -> None:
        self.trace.close()


class LogHook(Hook):
    """Every step advances the progress line; at ``cadence.train_log_every``, on the attempt's
    first step and on its last, the step's metrics (with useful TFLOP/s and MFU from the second
    record on) go to metrics.jsonl and the progress line."""

    def __init__(
        self, *, trainer: Any, metrics_log: Any, progress: Any, every: int, seq_len: int
    ) -> None:
        self.trainer = trainer
        self.metrics_log = metrics_log
        self.progress = progress
        self.every = Cadence(every, first=True, last=True)
        self.seq_len = seq_len
        # Built after the attempt's first step is logged: its one-time work (the census, and
        # on a CPU the measured matmul peak, about a second) must not delay the first step.
        self.mfu: Any = None

    def __call__(self, info: StepInfo) -> None:
        if not self.every.due(info):
            self.progress.update(info.index)
            return
        from pd_train import flops

        host = self.trainer.metrics_to_host(info.metrics)
        if self.mfu is not None:
            host.update(self.mfu.measure(info.index))  # useful TFLOP/s per device and MFU
        self.metrics_log.log(info.index, "train", host)
        self.progress.update(info.index, host)
        if self.mfu is None:
            self.mfu = flops.MFUMeter.for_trainer(self.trainer, seq_len=self.seq_len)
            self.mfu.measure(info.index)  # the baseline: the first step's compile not counted

    def close(self, info: StepInfo) -> None:
        self.progress.close()


class EvalHook(Hook):
    """The eval at ``cadence.eval_every`` and after the last step, a slow eval among them at
    ``cadence.slow_eval_every``. Its program compiles (or loads) ahead in a thread, started
    after the attempt's first step, while the next steps run; the attempt's first eval is a
    compile phase of its own in compile.json (also on a resume)."""

    def __init__(
        self,
        evaluator: Any,
        *,
        every: int,
        slow_every: int,
        total_steps: int,
        eval_key: Any,
        target: Any,
        metrics_log: Any,
        recorder: Any,
        step_program: Any,
    ) -> None:
        self.evaluator = evaluator
        self.every = Cadence(every, last=True)
        self.slow_every = slow_every
        self.total_steps = total_steps
        self.eval_key = eval_key
        self.target = target
        self.metrics_log = metrics_log
        self.recorder = recorder
        self.step_program = step_program
        self.ahead_started = False
        self.evaluated = False
        #: The run's :class:`pd_train.outputs.Terminal` (process 0), which shows each eval's
        #: results as a short table; None: not shown.
        self.terminal: Any = None

    def __call__(self, info: StepInfo) -> None:
        import contextlib

        import jax

        from pd_train.analysis.recon_eval import slow_eval_due

        if not self.ahead_started:
            self.ahead_started = True
            self.step_program.start_eval(self.evaluator)
        if not self.every.due(info):
            return
        phase = self.recorder.phase("eval") if not self.evaluated else contextlib.nullcontext()
        with phase:
            record = self.evaluator(
                info.state,
                self.target,
                key=jax.random.fold_in(self.eval_key, info.step),
                slow=slow_eval_due(self.slow_every, info.step, self.total_steps),
            )
        self.evaluated = True
        self.metrics_log.log(info.index, "eval", record)
        if self.terminal is not None:
            from pd_train.outputs import format_eval_table

            self.terminal.line(format_eval_table(info.index, record))

    def close(self, info: StepInfo) -> None:
        self.evaluator.close()
        self.recorder.note(eval_executable_cache=self.evaluator.ahead_outcome)


class PlotWorkersHook(Hook):
    """Starts the plot workers (process 0) once the eval's ahead compile is done and the steps
    left are expected to take at least :data:`PLOT_WORKERS_AHEAD_S`: their imports then happen
    on the core the step leaves idle. :attr:`workers` stays None otherwise (the plots are then
    rendered in the run's process)."""

    def __init__(self, eval_hook: EvalHook | None) -> None:
        self.eval_hook = eval_hook
        self.workers: Any = None
        self._loop_started: tuple[int, float] | None = None

    def __call__(self, info: StepInfo) -> None:
        if self._loop_started is None:
            self._loop_started = (info.step, time.perf_counter())  # after the compiling step
            return
        if self.workers is not None or (
            self.eval_hook is not None and not self.eval_hook.evaluated
        ):
            return
        first, t0 = self._loop_started
        per_step = (time.perf_counter() - t0) / (info.step - first)
        if (info.end - info.step) * per_step >= PLOT_WORKERS_AHEAD_S:
            from pd_train.outputs import PlotWorkers

            self.workers = PlotWorkers(PLOT_WORKERS)


class TrackerHook(Hook):
    """Mirrors the records just written to metrics.jsonl into the tracker (W&B)."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker

    def __call__(self, info: StepInfo) -> None:
        self.tracker.sync()


class SaveHook(Hook):
    """A checkpoint at ``cadence.save_every`` and always after the last step run (also a
    stopped one)."""

    def __init__(self, saver: Saver, *, every: int) -> None:
        self.saver = saver
        self.cadence = Cadence(every)

    def __call__(self, info: StepInfo) -> None:
        self.saver.save(info.step, info.state)

    def close(self, info: StepInfo) -> None:
        self.saver.save(info.step, info.state)
        self.saver.checkpoints.close()


class StopHook(Hook):
    """Ends the loop after the step in which any process saw SIGTERM or Ctrl-C (every process
    leaves at the same step; the checkpoint follows from :class:`SaveHook`)."""

    def __init__(self, signals: StopSignals, placement: Placement) -> None:
        self.signals = signals
        self.placement = placement
        self.stopped = False

    def __call__(self, info: StepInfo) -> None:
        if agreed(self.signals.requested, self.placement) and info.step < info.end:
            self.stopped = info.stop = True
            log.warning(
                "stopped by %s after step %d", self.signals.stop_signal or "a signal", info.index
            )
