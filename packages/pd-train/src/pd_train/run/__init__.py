"""``pd-train run``: one decomposition from a config to checkpoints, metrics, plots and a summary.

Order of a run (each step only after the previous one succeeded):

1. :func:`prepare` — load and validate the config completely (no jax device is touched, no file
   is written): the target's architecture, patterns against its sites, files, cadences.
2. :class:`RunDirLock` — the run dir's one owner, taken before anything is written there.
3. :func:`start_runtime` — the launch environment (``XLA_FLAGS``, an HLO dump dir on process 0)
   before the backend starts, ``jax.distributed``, the mesh, and the layout checks on abstract
   shapes (divisibility errors name the array).
4. :func:`execute` — a resume's checkpoint checked (config and arrays), the run dir's files,
   the compile cache and ``compile.json``, the target weights placed straight into their
   shardings, the state (fresh or restored), the faithfulness warmup, :func:`run_loop` over
   its hooks (log, eval, plots, tracker, save, stop signals), plots and a summary.

A resumed run continues bit-exactly: the state, the run key and the data stream (a pure
function of ``(seed, step)``) are all that a step depends on, and all three are restored.

Modules (private; their public names are re-exported here):

=====================  ======================================================================
``_prepare.py``        :func:`prepare`, :class:`Prepared`, :func:`load_target`, output checks
``_runtime.py``        :class:`Runtime`, :func:`start_runtime`, :func:`configure_cache`
``_run_dir.py``        run dir names and files, :func:`resolve_run_dir` (``--run-dir D``)
``_lock.py``           :class:`RunDirLock`: the run dir's owner (O_EXCL file + fcntl)
``_programs.py``       :class:`StepProgram`: the train step compiled or loaded ahead
``signals.py``        :class:`StopSignals`: SIGTERM / Ctrl-C at a step boundary
``_checkpointing.py``  :class:`Saver` (free space, stored config, partial saves removed),
                       :func:`restore_checked` (config drift, arrays against the state)
``hooks.py``          :class:`Hook`, :class:`Cadence`, :class:`StepInfo`, one hook per duty
``loop.py``           :func:`run_loop`: steps and hooks, nothing else
``_execute.py``        :func:`execute`: the pieces of a run assembled around the loop
=====================  ======================================================================
"""

from pd_train.run._checkpointing import (
    CONFIG_METADATA_KEY,
    RESUME_MAY_CHANGE,
    CheckpointWriteError,
    Restored,
    ResumePoint,
    Saver,
    abstract_key_data,
    canonical_state,
    check_resume,
    replicated,
    restore_checked,
    training_item,
)
from pd_train.run._execute import RunResult, execute
from pd_train.run._lock import LOCK_FILE, RunDirLock, RunDirLocked
from pd_train.run._prepare import Prepared, directory_problem, load_target, prepare, target_dtype
from pd_train.run._programs import StepProgram, compile_announcer, trainer_program_key
from pd_train.run._run_dir import (
    COMPILE_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    RUN_MARKERS,
    RunDirError,
    checkpoint_steps,
    config_differences,
    new_run_dir,
    resolve_run_dir,
    start_run_dir,
)
from pd_train.run._runtime import Runtime, configure_cache, start_runtime
from pd_train.run.hooks import (
    PLOT_WORKERS,
    PLOT_WORKERS_AHEAD_S,
    Cadence,
    EvalHook,
    Hook,
    LogHook,
    PlotWorkersHook,
    SaveHook,
    StepInfo,
    StopHook,
    TraceHook,
    TrackerHook,
)
from pd_train.run.loop import StepFn, run_loop
from pd_train.run.signals import EXIT_INTERRUPTED, StopSignals

# The names other modules imported before run.py became this package (kept working).
_training_item = training_item

__all__ = [
    "COMPILE_FILE",
    "CONFIG_FILE",
    "CONFIG_METADATA_KEY",
    "EXIT_INTERRUPTED",
    "LOCK_FILE",
    "METRICS_FILE",
    "PLOT_WORKERS",
    "PLOT_WORKERS_AHEAD_S",
    "RESUME_MAY_CHANGE",
    "RUN_MARKERS",
    "Cadence",
    "CheckpointWriteError",
    "EvalHook",
    "Hook",
    "LogHook",
    "PlotWorkersHook",
    "Prepared",
    "Restored",
    "ResumePoint",
    "RunDirError",
    "RunDirLock",
    "RunDirLocked",
    "RunResult",
    "Runtime",
    "SaveHook",
    "Saver",
    "StepFn",
    "StepInfo",
    "StepProgram",
    "StopHook",
    "StopSignals",
    "TraceHook",
    "TrackerHook",
    "abstract_key_data",
    "canonical_state",
    "check_resume",
    "checkpoint_steps",
    "compile_announcer",
    "config_differences",
    "configure_cache",
    "directory_problem",
    "execute",
    "load_target",
    "new_run_dir",
    "prepare",
    "replicated",
    "resolve_run_dir",
    "restore_checked",
    "run_loop",
    "start_run_dir",
    "start_runtime",
    "target_dtype",
    "trainer_program_key",
    "training_item",
]
