"""``pd-train run``: one decomposition from a config to checkpoints, metrics, plots and a summary.

Order of a run (each step only after the previous one succeeded):

1. :func:`prepare` — load and validate the config completely (no jax device is touched, no file
   is written): the target's architecture, patterns against its sites, files, cadences.
2. :func:`start_runtime` — the launch environment (``XLA_FLAGS``, an HLO dump dir on process 0)
   before the backend starts, ``jax.distributed``, the mesh, and the layout checks on abstract
   shapes (divisibility errors name the array).
3. :func:`execute` — the run dir, the compile cache and ``compile.json``, the target weights
   placed straight into their shardings, the state (fresh or restored), the faithfulness warmup,
   the step loop (metrics, evals, checkpoints, SIGTERM), plots and a summary.

A resumed run continues bit-exactly: the state, the run key and the data stream (a pure
function of ``(seed, step)``) are all that a step depends on, and all three are restored.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pd_train._config_io import ConfigError
from pd_train.distributed import Placement
from pd_train.run_config import (
    Config,
    absolute_paths,
    load_config,
    resolve_path,
    target_architecture,
    to_yaml,
)

log = logging.getLogger("pd_train")

CONFIG_FILE = "config.yaml"
COMPILE_FILE = "compile.json"
METRICS_FILE = "metrics.jsonl"  # pd_train.outputs.METRICS_FILE (not imported: it pulls plots)

#: The run's plots are rendered by worker processes (pd_train.outputs.PlotWorkers) started
#: during the loop once the steps still to run are expected to take at least this many seconds
#: (time for their imports on the core the step leaves idle); otherwise in the run's process.
PLOT_WORKERS_AHEAD_S = 10.0
#: How many plot workers (the plots are rendered in parallel after the last step).
PLOT_WORKERS = 2


@dataclass
class Prepared:
    """A validated config and what was resolved from it; nothing allocated yet."""

    config: Config
    raw: dict[str, Any]
    base: Path | None
    model: Any
    checkpoint: Path | None
    data_path: Path | None
    eval_path: Path | None
    resume_dir: Path | None = None


def prepare(
    source: str | Path | dict[str, Any],
    overrides: Sequence[str] = (),
    *,
    for_run: bool = True,
    resume_dir: Path | None = None,
) -> Prepared:
    """Load and validate a config without touching a device or writing a file.

    ``for_run=False`` (``pd-train compile``, probes) skips the checks that need weights and
    data on disk.
    """
    from pd_train.analysis.statistics import resolve_l0_groups
    from pd_train.config import check_pd_config
    from pd_train.data import DataError, TokenDataset
    from pd_train.decomposition import build_decomposition

    config, raw = load_config(source, overrides)
    base = None if isinstance(source, dict) else Path(source).absolute().parent
    config = absolute_paths(config, base)
    problems: list[tuple[str, str]] = []

    def attempt(fn: Any) -> Any:
        try:
            return fn()
        except ConfigError as exc:
            problems.extend(exc.problems)
        return None

    model = attempt(lambda: target_architecture(config.target, base=base))
    checkpoint = data_path = eval_path = None
    if config.target.checkpoint is not None:
        checkpoint = attempt(lambda: _existing(config.target.checkpoint, "target.checkpoint", base))
    if for_run:
        if config.data.path is None:
            problems.append(("data.path", "is null; a run needs token files"))
        else:
            data_path = attempt(lambda: _existing(config.data.path, "data.path", base))
            eval_source = config.data.eval_path or config.data.path
            eval_path = attempt(lambda: _existing(eval_source, "data.eval_path", base))
    attempt(lambda: check_pd_config(config.pd))
    if model is not None:
        decomposition = attempt(lambda: build_decomposition(model, config.pd.decomposition_targets))
        if decomposition is not None:
            # CI checks that need the decomposition (transformer chunks) before any compile.
            attempt(lambda: _check_ci_function(config, decomposition))
            attempt(lambda: resolve_l0_groups(config.pd.l0_groups, decomposition.sites))
    if model is not None and checkpoint is not None and config.target.architecture is not None:
        attempt(lambda: _check_architecture_matches(model, checkpoint))
    problems.extend(_cadence_problems(config))
    if model is not None and config.data.seq_len > model.max_position_embeddings:
        msg = (
            f"got {config.data.seq_len}, more than the target's max_position_embeddings "
            f"({model.max_position_embeddings}); must be <= {model.max_position_embeddings}"
        )
        problems.append(("data.seq_len", msg))
    if for_run:
        problem = directory_problem(Path(config.output_dir).expanduser(), base=Path.cwd())
        if problem is not None:
            problems.append(("output_dir", problem))
    if for_run and model is not None:
        for path, where in ((data_path, "data.path"), (eval_path, "data.eval_path")):
            if path is None:
                continue
            try:
                TokenDataset(
                    path,
                    seq_len=config.data.seq_len,
                    dtype=config.data.dtype,
                    vocab_size=model.vocab_size,
                )
            except DataError as exc:
                problems.append((where, str(exc).removeprefix("data: ")))
    if problems:
        raise ConfigError(problems, source=None if isinstance(source, dict) else str(source))
    return Prepared(
        config=config,
        raw=raw,
        base=base,
        model=model,
        checkpoint=checkpoint,
        data_path=data_path,
        eval_path=eval_path,
        resume_dir=resume_dir,
    )


def directory_problem(path: Path, *, base: Path) -> str | None:
    """Why the directory ``path`` (relative to ``base``) cannot be used or created, or None.
    Nothing is created: an existing path must be a writable directory; otherwise its nearest
    existing ancestor must be."""
    path = path if path.is_absolute() else base / path
    if path.exists():
        if not path.is_dir():
            return f"{str(path)!r} is a file, not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{str(path)!r} is not writable"
        return None
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot create {str(path)!r}: {str(ancestor)!r} is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot create {str(path)!r}: {str(ancestor)!r} is not writable"
    return None


def _check_ci_function(config: Config, decomposition: Any) -> None:
    """The CI function's own checks against the decomposition (``pd.ci.*`` field paths)."""
    from pd_train.ci import make_ci_function

    make_ci_function(config.pd.ci, decomposition=decomposition).check(decomposition)


def load_target(prepared: Prepared, *, shardings: Any, dtype: Any) -> Any:
    """The frozen target's params, straight into ``shardings``: the checkpoint's weights
    (safetensors, or GGUF by its magic bytes; ``target.strict`` applies to safetensors), or the
    random weights of ``seed + 1`` for an architecture-only target."""
    import jax

    from pd_train.models import llama

    config = prepared.config
    if prepared.checkpoint is not None:
        from pd_train.models.gguf import is_gguf, load_gguf_checkpoint
        from pd_train.models.hf import load_llama_checkpoint

        if is_gguf(prepared.checkpoint):
            _, target = load_gguf_checkpoint(prepared.checkpoint, shardings=shardings, dtype=dtype)
        else:
            _, target = load_llama_checkpoint(
                prepared.checkpoint, shardings=shardings, dtype=dtype, strict=config.target.strict
            )
        return target
    init = functools.partial(llama.init_params, prepared.model, dtype=dtype)
    return jax.jit(init, out_shardings=shardings)(key=jax.random.key(config.seed + 1))


def _existing(value: str, where: str, base: Path | None) -> Path:
    from pd_train._config_io import FieldValueError

    try:
        path = resolve_path(value, base=base)
    except (FieldValueError, FileNotFoundError) as exc:
        raise ConfigError([(where, str(exc))]) from None
    if not path.exists():
        raise ConfigError([(where, f"{str(path)!r} does not exist")])
    return path


def _check_architecture_matches(model: Any, checkpoint: Path) -> None:
    from pd_train.models.gguf import gguf_llama_config, is_gguf
    from pd_train.models.hf import llama_config_from_hf, read_hf_config

    if is_gguf(checkpoint):
        on_disk = gguf_llama_config(checkpoint)
    else:
        on_disk = llama_config_from_hf(read_hf_config(checkpoint))
    if on_disk != model:
        msg = (
            f"target.architecture differs from {checkpoint}/config.json; drop target.architecture "
            "to use the checkpoint's, or point target.checkpoint at a matching checkpoint"
        )
        raise ConfigError([("target.architecture", msg)])


def _cadence_problems(config: Config) -> list[tuple[str, str]]:
    steps = config.pd.steps
    out = []
    for name in ("train_log_every", "eval_every", "save_every"):
        every = getattr(config.cadence, name)
        if every > steps:
            msg = f"got {every}, more than pd.steps ({steps}); must be <= pd.steps (0 turns it off)"
            if name != "train_log_every":
                out.append((f"cadence.{name}", msg))
            else:
                out.append((f"cadence.{name}", msg.replace(" (0 turns it off)", "")))
    from pd_train.analysis.recon_eval import slow_eval_problems

    return out + slow_eval_problems(config.cadence)


# ---------------------------------------------------------------------------------------------


@dataclass
class Runtime:
    """The started runtime: placement, mesh and the trainer, with its layout checked."""

    prepared: Prepared
    placement: Placement
    mesh: Any
    trainer: Any
    hlo_dump_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def start_runtime(
    prepared: Prepared,
    placement: Placement,
    *,
    run_dir: Path | None = None,
    start_step: bool = False,
) -> Runtime:
    """Launch environment, ``jax.distributed``, mesh, trainer; layout errors raise ConfigError.

    ``start_step`` (``pd-train run``): the train step starts loading from the executable cache
    (or waits to compile, see :class:`StepProgram`) in a thread as soon as the trainer exists,
    before the layout checks and the run dir's setup; :func:`execute` takes it over
    (``Runtime.extra["step_program"]``)."""
    from pd_train import distributed
    from pd_train.runtime_env import apply_launch_env

    config = prepared.config
    launch = config.runtime.launch_env
    dump_dir = None
    if launch.profile.hlo_dump and placement.is_primary and run_dir is not None:
        dump_dir = run_dir / "hlo"
    apply_launch_env(launch.env, hlo_dump_dir=dump_dir)
    distributed.initialize(placement)

    import jax

    import pd_sharding
    from pd_train.step import Trainer

    problems: list[tuple[str, str]] = []
    mesh_config = config.runtime.mesh
    try:
        mesh = pd_sharding.make_mesh(
            replicate=mesh_config.replicate, data=mesh_config.data, tensor=mesh_config.tensor
        )
    except pd_sharding.MeshError as exc:
        raise ConfigError([("runtime.mesh", str(exc))]) from None
    batch = config.pd.batch_size
    data_size = mesh.shape["replicate"] * mesh.shape["data"]
    if batch % data_size:
        msg = (
            f"got {batch}; must be a multiple of the data axes' size {data_size} "
            f"(runtime.mesh replicate × data), e.g. {max(data_size, batch // data_size * data_size)}"
        )
        problems.append(("pd.batch_size", msg))
    if batch % jax.process_count():
        msg = f"got {batch}; must be a multiple of the process count {jax.process_count()}"
        problems.append(("pd.batch_size", msg))
    if problems:
        raise ConfigError(problems)
    try:
        trainer = Trainer(
            prepared.model,
            config.pd,
            config.runtime,
            mesh=mesh,
            compiler_options=config.runtime.compiler_options,
            seq_len=config.data.seq_len,
        )
    except pd_sharding.ShardingError as exc:
        raise ConfigError([("runtime.mesh", str(exc))]) from None
    extra: dict[str, Any] = {}
    if start_step:
        # A warm launch's critical path is this load (~2 s for the default step): it starts
        # here, overlapping the layout checks, the run dir, the target, init and warm-up.
        step_program = StepProgram(
            trainer,
            target_dtype=_target_dtype(config),
            recorder=None,
            cache_dir=configure_cache(config, disable=dump_dir is not None),
            announce=placement.is_primary,
        )
        step_program.start()
        extra["step_program"] = step_program
    try:
        # Every sharding rule runs on abstract shapes now, before anything is allocated.
        trainer.abstract_state()
        trainer.abstract_target(_target_dtype(config))
    except pd_sharding.ShardingError as exc:
        if start_step:
            extra["step_program"].cancel()
        raise ConfigError([("runtime.mesh", str(exc))]) from None
    return Runtime(
        prepared=prepared,
        placement=placement,
        mesh=mesh,
        trainer=trainer,
        hlo_dump_dir=dump_dir,
        extra=extra,
    )


def _target_dtype(config: Config) -> Any:
    import jax.numpy as jnp

    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[config.target.dtype]


def new_run_dir(config: Config, *, base: Path | None) -> Path:
    root = Path(config.output_dir).expanduser()
    if not root.is_absolute():
        root = Path.cwd() / root
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = root / f"{config.run_name}-{stamp}"
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = root / f"{config.run_name}-{stamp}-{n}"
    return run_dir


class RunDirError(ValueError):
    """``--run-dir`` names a directory that holds another run (nothing was touched)."""


#: What a run writes into its run dir that a new run must not write over.
RUN_MARKERS = (CONFIG_FILE, METRICS_FILE, "checkpoints")


def resolve_run_dir(prepared: Prepared, run_dir: Path) -> Prepared:
    """Decide what ``pd-train run CONFIG --run-dir RUN_DIR`` does with an existing directory.

    * RUN_DIR holds no run (absent, empty, or none of config.yaml, metrics.jsonl,
      checkpoints/): a new run there.
    * RUN_DIR/config.yaml equals the resolved config (CONFIG with its ``--set`` overrides):
      the same run again — resume from its latest checkpoint (returns ``prepared`` with
      ``resume_dir`` set, as ``--resume RUN_DIR`` would), or, with no checkpoint yet, start it
      from step 0 (a ``pd-train submit`` job's first start, or a restart of one that died before
      its first save; :func:`execute` keeps an earlier attempt's metrics file aside).
    * Anything else — another config, an unreadable config.yaml, checkpoints or metrics without
      a config.yaml — raises :class:`RunDirError` saying what is there and to use ``--resume``
      or another run dir. Nothing is written or removed.

    Every process decides alike: nothing is written into the run dir before all processes have
    joined ``jax.distributed`` (:func:`start_runtime` runs after this).
    """
    from pd_train._config_io import unstructure

    if run_dir.exists() and not run_dir.is_dir():
        msg = f"--run-dir {run_dir} is a file, not a directory"
        raise RunDirError(msg)
    present = [name for name in RUN_MARKERS if (run_dir / name).exists()]
    if not present:
        return prepared
    steps = checkpoint_steps(run_dir)
    holds = ", ".join(
        f"checkpoints at steps {steps}" if name == "checkpoints" and steps else name
        for name in present
    )
    advice = (
        f"to continue that run use `pd-train run --resume {run_dir}` (it reads the run's own "
        "config.yaml); to start a new run choose another --run-dir, or leave it out"
    )
    saved_path = run_dir / CONFIG_FILE
    if not saved_path.is_file():
        msg = f"--run-dir {run_dir} already holds {holds} but no {CONFIG_FILE}; {advice}"
        raise RunDirError(msg)
    try:
        saved, _ = load_config(saved_path)
    except ConfigError as exc:
        msg = (
            f"--run-dir {run_dir} holds a run whose {CONFIG_FILE} cannot be read ({exc}); {advice}"
        )
        raise RunDirError(msg) from None
    if saved != prepared.config:
        diffs = _differences(unstructure(saved), unstructure(prepared.config))
        shown = "; ".join(f"{path}: {old!r} there, {new!r} here" for path, old, new in diffs[:5])
        more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
        msg = (
            f"--run-dir {run_dir} already holds a run ({holds}) with another config "
            f"({shown}{more}); nothing was changed. {advice[0].upper()}{advice[1:]}"
        )
        raise RunDirError(msg)
    if steps:
        log.info("run dir %s holds this run at step %d: resuming", run_dir, steps[-1])
        return replace(prepared, resume_dir=run_dir)
    return prepared


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Finished checkpoint steps: orbax names a finished step's directory by its number (an
    unfinished save has a temporary suffix)."""
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def _differences(old: Any, new: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(field path, old, new) for every leaf where two unstructured configs differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in [*old, *(k for k in new if k not in old)]:
            sub = f"{path}.{key}" if path else str(key)
            out += _differences(old.get(key), new.get(key), sub)
        return out
    sequences = (list, tuple)
    if isinstance(old, sequences) and isinstance(new, sequences) and len(old) == len(new):
        return [
            d
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for d in _differences(a, b, f"{path}[{i}]")
        ]
    return [] if old == new else [(path, old, new)]


def configure_cache(config: Config, *, disable: bool = False) -> Path | None:
    from pd_train.runtime_env import configure_compile_cache

    cache = config.runtime.compile_cache
    if disable or not cache.enabled:
        configure_compile_cache(None)
        return None
    directory = (
        Path(cache.dir).expanduser()
        if cache.dir
        else Path(config.output_dir).expanduser() / ".compile_cache"
    )
    if not directory.is_absolute():
        directory = Path.cwd() / directory
    configure_compile_cache(
        directory, min_compile_time_s=cache.min_compile_time_s, xla_caches=cache.xla_caches
    )
    return directory


# ---------------------------------------------------------------------------------------------


#: Exit code of ``pd-train run`` stopped by Ctrl-C (SIGINT), after its checkpoint, plots and
#: summary were written (128 + SIGINT, the shell's convention). A SIGTERM stop exits 0: SLURM
#: requeues the job and the next attempt resumes.
EXIT_INTERRUPTED = 130


class _Stop:
    """SIGTERM or Ctrl-C (SIGINT): finish the current step, save, write plots and the summary,
    and return (``stop_signal`` names the signal). A second Ctrl-C aborts at once: one line on
    stderr and exit 130, nothing more saved (the last checkpoint stays).

    The second Ctrl-C is seen by a watcher thread through ``signal.set_wakeup_fd`` (written by
    the C-level handler), so it acts even while the main thread is inside a long XLA compile,
    where Python signal handlers cannot run.
    """

    def __init__(self) -> None:
        self.stop_signal: str | None = None
        self.last_saved: int | None = None
        self._previous: dict[int, Any] = {}
        self._sockets: tuple[Any, Any] | None = None
        self._previous_wakeup = -1

    @property
    def requested(self) -> bool:
        return self.stop_signal is not None

    def _handler(self, signum: int, _frame: Any) -> None:
        if self.stop_signal is None:
            self.stop_signal = signal.Signals(signum).name
            again = (
                " (Ctrl-C again aborts at once, without saving)" if signum == signal.SIGINT else ""
            )
            log.warning(
                "%s: saving at the next step boundary, then exiting%s", self.stop_signal, again
            )

    def _abort(self) -> None:
        saved = (
            f"the last checkpoint is step {self.last_saved}"
            if self.last_saved is not None
            else "no checkpoint was saved by this attempt"
        )
        os.write(2, f"pd-train: aborted by a second Ctrl-C; {saved}\n".encode())
        os._exit(EXIT_INTERRUPTED)

    def _watch(self, reader: Any) -> None:
        interrupts = 0
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                data = b""
            if not data:
                reader.close()
                return
            interrupts += data.count(int(signal.SIGINT))
            if interrupts >= 2:
                self._abort()

    def __enter__(self) -> _Stop:
        import socket
        import threading

        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be installed in the main thread
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._sockets = (reader, writer)
        self._previous_wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handler)
        threading.Thread(target=self._watch, args=(reader,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sockets is None:
            return
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(self._previous_wakeup)
        self._sockets[1].close()  # the watcher reads end-of-file, closes its end and ends
        self._sockets = None


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


def execute(rt: Runtime, *, run_dir: Path, max_steps: int | None = None) -> RunResult:
    """Run (or resume) the decomposition in ``run_dir``; every process calls this.

    SIGTERM or Ctrl-C at any point (also during setup or the warmup) stops the run after its
    next step, with a checkpoint, plots and a summary, and returns normally (``stop_signal``
    says which); a second Ctrl-C aborts at once (exit 130).
    """
    early = rt.extra.get("step_program")
    try:
        with _Stop() as stop:
            return _execute(rt, run_dir=run_dir, max_steps=max_steps, stop=stop)
    finally:
        if early is not None:
            early.cancel()  # a no-op once the run attached its recorder
        workers = rt.extra.pop("plot_workers", None)
        if workers is not None:
            workers.close()  # a no-op once they rendered the plots


def _execute(rt: Runtime, *, run_dir: Path, max_steps: int | None, stop: _Stop) -> RunResult:
    import jax

    from pd_probe import Recorder

    prepared, trainer, placement = rt.prepared, rt.trainer, rt.placement
    config = prepared.config
    primary = placement.is_primary
    resuming = prepared.resume_dir is not None
    started = time.time()

    if primary:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resuming and not (run_dir / CONFIG_FILE).exists():
            (run_dir / CONFIG_FILE).write_text(to_yaml(config))
        metrics_file = run_dir / METRICS_FILE
        if not resuming and metrics_file.exists():
            # A start from step 0 in a run dir with metrics: an earlier attempt of this run
            # (see resolve_run_dir) that saved no checkpoint. Keep its records, out of the way.
            stamp = f"{datetime.now():%Y%m%d-%H%M%S}"
            kept = run_dir / f"metrics-attempt-{stamp}.jsonl"
            n = 1
            while kept.exists():
                n += 1
                kept = run_dir / f"metrics-attempt-{stamp}-{n}.jsonl"
            os.replace(metrics_file, kept)
            log.warning("run dir %s: an earlier attempt's metrics moved to %s", run_dir, kept.name)
        _keep_compile_record(run_dir)
    early: StepProgram | None = rt.extra.pop("step_program", None)
    if early is None:
        cache_dir = configure_cache(config, disable=rt.hlo_dump_dir is not None)
    else:
        cache_dir = early.cache_dir  # configured by start_runtime

    recorder = Recorder(
        run_dir / COMPILE_FILE if primary else None,
        mode="run",
        on_compile=compile_announcer() if primary else None,
    )
    with recorder:
        recorder.note(cache_dir=str(cache_dir) if cache_dir else None)
        dtype = _target_dtype(config)
        # The train step compiles (or loads) in a thread while the target loads, the state
        # initializes and the faithfulness warmup runs (started by start_runtime, or here).
        if early is None:
            step_program = StepProgram(
                trainer,
                target_dtype=dtype,
                recorder=recorder,
                cache_dir=cache_dir,
                announce=primary,
            )
            step_program.start()
        else:
            step_program = early
            step_program.attach(recorder)
        # The init and warm-up jits load from the same executable cache (a warm launch skips
        # their trace and lowering).
        trainer.programs = step_program.init_programs()
        # What the rest of the run needs is imported while the step loads in its thread.
        import jax.numpy as jnp
        import numpy as np

        import pd_sharding
        from pd_train import evaluate as evaluation
        from pd_train import flops
        from pd_train.analysis.recon_eval import slow_eval_due
        from pd_train.checkpoints import Checkpoints
        from pd_train.data import Batches, TokenDataset
        from pd_train.outputs import (
            MetricsLog,
            PlotWorkers,
            Progress,
            read_metrics,
            render_summary,
            write_plots,
        )
        from pd_train.step import TrainState, step_key

        # ---- target weights, straight into their shardings
        abstract_target = trainer.abstract_target(dtype)
        shardings = jax.tree.map(lambda a: a.sharding, abstract_target)
        with recorder.phase("load_target"):
            target = load_target(prepared, shardings=shardings, dtype=dtype)

        run_key = _replicated(trainer, jax.random.key(config.seed))
        # Init and eval keys are folded with numbers no step reaches (steps fold 0, 1, ...).
        init_key = jax.random.fold_in(run_key, 2**31 - 1)
        eval_key = jax.random.fold_in(run_key, 2**31 - 2)
        ckpts = Checkpoints(
            run_dir / "checkpoints", keep_last_n=config.cadence.keep_last_n_checkpoints
        )
        metrics_log = MetricsLog(run_dir, is_primary=primary)
        start_step = 0
        with recorder.phase("init"):
            if resuming:
                abstract = trainer.abstract_state()
                params, training, start_step = ckpts.restore(
                    decomposition={"params": abstract.params},
                    training=_training_item(abstract, _abstract_key_data(trainer)),
                )
                state = TrainState(
                    step=training["step"],
                    params=params["params"],
                    opt_state=training["opt_state"],
                    adversary=training.get("adversary", {}),
                )
                run_key = jax.random.wrap_key_data(training["run_key"])
                metrics_log.truncate_from(start_step)
            else:
                state = trainer.init_state(key=init_key)
        tracker = _tracker(config, run_dir) if primary else None
        if not resuming and config.pd.faithfulness_warmup.steps:
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
        if step_program.init_outcomes:
            recorder.note(init_executable_cache=dict(step_program.init_outcomes))
        # Fresh, warmed-up and restored states enter the step laid out alike (DESIGN decision 8).
        state = _canonical_state(trainer, state)
        run_key = _replicated(trainer, run_key)

        dataset = TokenDataset(
            prepared.data_path,  # type: ignore[arg-type]
            seq_len=config.data.seq_len,
            dtype=config.data.dtype,
            vocab_size=prepared.model.vocab_size,
        )
        batches = Batches(
            dataset,
            batch_size=config.pd.batch_size,
            seed=config.seed,
            process_index=placement.process_id,
            process_count=placement.num_processes,
        )
        evaluator = None
        if config.cadence.eval_every:
            eval_data = TokenDataset(
                prepared.eval_path,  # type: ignore[arg-type]
                seq_len=config.data.seq_len,
                dtype=config.data.dtype,
                vocab_size=prepared.model.vocab_size,
            )
            evaluator = evaluation.Evaluator(
                trainer,
                Batches(
                    eval_data,
                    batch_size=config.pd.batch_size,
                    seed=config.seed + 1,
                    process_index=placement.process_id,
                    process_count=placement.num_processes,
                ),
                n_batches=config.data.eval_batches,
                mesh=rt.mesh,
            )

        def save(step: int) -> None:
            key_data = jax.random.key_data(run_key)
            if trainer.layout is not None:
                # orbax saves only global arrays in multi-process runs, not one device's copy.
                key_data = jax.device_put(key_data, trainer.layout.replicated())
            training = _training_item(state, key_data)
            ckpts.save(step, decomposition={"params": state.params}, training=training)
            stop.last_saved = step

        steps = config.pd.steps if max_steps is None else min(config.pd.steps, max_steps)
        trace = _trace_window(config, run_dir) if primary else None
        progress = Progress(
            steps,
            start_step=start_step,
            is_primary=primary,
            log_every=config.cadence.train_log_every,
        )
        # Built after the attempt's first step is logged: its one-time work (the census, and on
        # a CPU the measured matmul peak, about a second) must not delay the first step.
        mfu: Any = None
        stopped_early = False
        evaluated = False
        step = start_step
        loop_started: tuple[int, float] | None = None
        while step < steps:
            rows = batches.batch(step)
            tokens = pd_sharding.global_batch(rows.astype(np.int32), rt.mesh)
            key = step_key(run_key, step)
            if trace is not None:
                trace.before_step(step)
            if step == start_step:
                with recorder.phase("train_step"):
                    state, metrics = step_program(state, target, tokens, key)
                    jax.block_until_ready(metrics)
            else:
                state, metrics = step_program(state, target, tokens, key)
            if trace is not None:
                trace.after_step(step)
            # Records carry the 0-based index of the finished step; a checkpoint at step
            # k holds k finished steps, so a resume from k truncates records >= k.
            done = step
            step += 1
            if step % config.cadence.train_log_every == 0 or step in (start_step + 1, steps):
                host = trainer.metrics_to_host(metrics)
                if mfu is not None:
                    host.update(mfu.measure(done))  # useful TFLOP/s per device and MFU
                metrics_log.log(done, "train", host)
                progress.update(done, host)
                if mfu is None:
                    mfu = flops.MFUMeter.for_trainer(trainer, seq_len=config.data.seq_len)
                    mfu.measure(done)  # the baseline: the first step's compile is not counted
                    if evaluator is not None:
                        # The eval compiles (or loads) in a thread while the next steps run.
                        step_program.start_eval(evaluator)
            else:
                progress.update(done)
            if loop_started is None:
                loop_started = (step, time.perf_counter())  # after the first (compiling) step
            elif primary and "plot_workers" not in rt.extra and (evaluator is None or evaluated):
                # Once the eval's ahead compile is done, and with enough steps left to hide
                # their start on the idle core: the plot workers' imports happen now.
                first, t0 = loop_started
                per_step = (time.perf_counter() - t0) / (step - first)
                if (steps - step) * per_step >= PLOT_WORKERS_AHEAD_S:
                    rt.extra["plot_workers"] = PlotWorkers(PLOT_WORKERS)
            if evaluator is not None and (step % config.cadence.eval_every == 0 or step == steps):
                # The attempt's first eval compiles (also on a resume, at a later step).
                with recorder.phase("eval") if not evaluated else _null():
                    record = evaluator(
                        state,
                        target,
                        key=jax.random.fold_in(eval_key, step),
                        slow=slow_eval_due(config.cadence.slow_eval_every, step, config.pd.steps),
                    )
                evaluated = True
                metrics_log.log(done, "eval", record)
            if tracker is not None:
                tracker.sync()  # the records just written to metrics.jsonl
            if config.cadence.save_every and step % config.cadence.save_every == 0:
                save(step)
            if _agreed(stop.requested, placement) and step < steps:
                stopped_early = True
                log.warning("stopped by %s after step %d", stop.stop_signal or "a signal", done)
                break
        progress.close()
        if trace is not None:
            trace.close()
        if evaluator is not None:
            evaluator.close()
            recorder.note(eval_executable_cache=evaluator.ahead_outcome)
        save(step)
        ckpts.close()
        jnp.zeros(()).block_until_ready()

    summary = ""
    if primary:
        metrics_log.close()
        if tracker is not None:
            tracker.close()
        records = read_metrics(run_dir)
        plot_workers = rt.extra.pop("plot_workers", None)
        if plot_workers is not None:
            t0 = time.perf_counter()
            plot_workers.write(run_dir, run_dir / "plots")
            log.info(
                "plots: rendered by %d worker processes (started %.0f s before) in %.1f s "
                "(each worker's wall / CPU s: %s)",
                len(plot_workers.answered),
                t0 - plot_workers.started,
                time.perf_counter() - t0,
                ", ".join(f"{wall:.1f} / {cpu:.1f}" for wall, cpu in plot_workers.timings),
            )
        else:
            write_plots(records, run_dir / "plots")
        summary = render_summary(
            records,
            run_dir,
            extra={
                "wall time": f"{time.time() - started:.1f} s",
                "stopped early": f"yes ({stop.stop_signal or 'signal'} after step {step - 1})"
                if stopped_early
                else "no",
            },
            last_step=step - 1 if step > 0 else None,
            attempt_first_step=start_step,
        )
        (run_dir / "summary.txt").write_text(summary)
    return RunResult(
        run_dir=run_dir,
        final_step=step,
        stopped_early=stopped_early,
        summary=summary,
        stop_signal=stop.stop_signal if stopped_early else None,
    )


class StepProgram:
    """The train step, compiled ahead of time in a background thread; call it like the step.

    :meth:`start` lowers and compiles the step on the run's abstract state, target, batch and
    key (:meth:`Trainer.lower_step`: the shardings the loop passes) while the main thread loads
    the target, initializes the state and runs the faithfulness warmup; JAX's persistent cache
    applies as before. With the compile cache on (in a single-process run) the compiled
    program is also kept in an :class:`pd_train.runtime_env.ExecutableCache` beside it, keyed
    by the step's configs, pd's source and the environment, so that a later launch loads it
    without tracing or lowering. If building fails, or the program refuses the first step's
    arguments, the step falls back to the trainer's jit (compiled at its first call) with a
    warning.

    Started without a recorder (``recorder=None``: :func:`start_runtime`, before the run dir
    exists), the thread loads from the executable cache at once; a program that must be
    compiled waits for :meth:`attach` so that its trace, lower and compile are recorded in
    compile.json as before (:meth:`cancel` ends a thread whose run never started).
    """

    def __init__(
        self,
        trainer: Any,
        *,
        target_dtype: Any,
        recorder: Any,
        cache_dir: Path | None,
        announce: bool = False,
    ) -> None:
        import threading

        from pd_train.runtime_env import EXECUTABLES_DIR, ExecutableCache, source_digest

        self.trainer = trainer
        self.target_dtype = target_dtype
        self.recorder = recorder
        self.announce = announce
        self.cache_dir = cache_dir
        self._attached = threading.Event()
        if recorder is not None:
            self._attached.set()
        self._cancelled = False
        #: Seconds the executable-cache load took (a hit), else None.
        self.load_seconds: float | None = None
        self.cache = (
            ExecutableCache(cache_dir / EXECUTABLES_DIR)
            if cache_dir is not None and ExecutableCache.usable()
            else None
        )
        #: ``hit`` (loaded from the executable cache), ``miss`` (compiled and stored), ``miss,
        #: not stored`` (served by JAX's persistent cache, or the source changed meanwhile),
        #: ``off``.
        self.outcome = "off" if self.cache is None else "miss"
        self.compiled: Any = None
        self.error: BaseException | None = None
        self._thread: Any = None
        self._joined = False
        # The source as imported (read right after the imports): a file edited while this run
        # starts changes the digest read after the compile, and nothing is stored.
        self._source = source_digest() if self.cache is not None else ""
        #: ``{init or warm-up jit name: executable-cache outcome}`` (see :meth:`init_programs`).
        self.init_outcomes: dict[str, str] = {}

    def key(self) -> str:
        return trainer_program_key("train_step", self.trainer, self.target_dtype, self._source)

    def start(self) -> None:
        import threading

        self._thread = threading.Thread(target=self._build, name="pd-train-step", daemon=True)
        self._thread.start()

    def attach(self, recorder: Any) -> None:
        """Give a program started without a recorder the run's (entered) recorder: a compile
        waiting for it proceeds inside its ``train_step`` phase."""
        self.recorder = recorder
        self._attached.set()

    def cancel(self) -> None:
        """End a thread still waiting for :meth:`attach` (the run did not start)."""
        if not self._attached.is_set():
            self._cancelled = True
            self._attached.set()

    def _build(self) -> None:
        import sys

        try:
            key = self.key() if self.cache is not None else ""
            if self.cache is not None:
                # A load needs no recorder: it starts at once, also before the run's.
                t0 = time.perf_counter()
                self.compiled = self.trainer.bind_step_program(self.cache.load(key))
                if self.compiled is not None:
                    self.outcome = "hit"
                    self.load_seconds = time.perf_counter() - t0
                    if self.announce:
                        print(
                            f"loading train_step (executable cache)… {self.load_seconds:.1f} s",
                            file=sys.stderr,
                            flush=True,
                        )
                    return
            self._attached.wait()
            if self._cancelled:
                return
            with self.recorder.phase("train_step"):
                self._compile(key)
        except Exception as exc:  # reported at the first step, which falls back to the jit
            self.error = exc

    def _compile(self, key: str) -> None:
        from pd_train.runtime_env import source_digest

        lowered = self.trainer.lower_step(
            batch_size=self.trainer.pd.batch_size,
            seq_len=self.trainer.seq_len,
            target_dtype=self.target_dtype,
        )
        if self.cache is None:
            self.compiled = lowered.compile()
        else:
            self.compiled, stored = self.cache.compile_and_store(
                key, lowered, unchanged=lambda: source_digest() == self._source
            )
            if not stored:
                self.outcome = "miss, not stored"

    def init_programs(self) -> Any:
        """A :attr:`Trainer.programs` serving the init and warm-up jits from this program's
        executable cache (None without one): each is loaded, or lowered, compiled and stored
        (when compiled here, as the step), keyed by its name, the trainer's configs, the source
        and its arguments' shapes, dtypes and shardings. Outcomes go to :attr:`init_outcomes`."""
        if self.cache is None:
            return None
        from pd_train.runtime_env import ProgramOrJit, source_digest

        cache = self.cache

        def programs(name: str, jit: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            import jax

            signature = jax.tree.map(
                lambda a: (tuple(a.shape), str(a.dtype), repr(getattr(a, "sharding", None))),
                (args, kwargs),
            )
            key = trainer_program_key(
                f"{name} {jax.tree.structure((args, kwargs))} {signature}",
                self.trainer,
                self.target_dtype,
                self._source,
            )
            compiled = cache.load(key)
            outcome = "hit"
            if compiled is None:
                compiled, stored = cache.compile_and_store(
                    key,
                    jit.lower(*args, **kwargs),
                    unchanged=lambda: source_digest() == self._source,
                )
                outcome = "miss" if stored else "miss, not stored"
            self.init_outcomes[name] = outcome
            return ProgramOrJit(name, compiled, jit)

        return programs

    def start_eval(self, evaluator: Any) -> None:
        """Start ``evaluator``'s ahead-of-time compile (:meth:`Evaluator.compile_ahead`), with
        this program's executable cache, source digest and recorder."""
        from pd_train.runtime_env import source_digest

        cache, key = self.cache, None
        if cache is not None:
            key = trainer_program_key("eval_metrics", self.trainer, self.target_dtype, self._source)
        evaluator.compile_ahead(
            target_dtype=self.target_dtype,
            cache=cache,
            key=key,
            unchanged=lambda: source_digest() == self._source,
            recorder=self.recorder,
        )

    def _join(self) -> None:
        self._thread.join()
        self._joined = True
        self.recorder.note(train_step_executable_cache=self.outcome)
        if self.load_seconds is not None:
            # The hit's jit entry (no compiles); the load ran before the recorder was attached,
            # so its seconds are a note.
            with self.recorder.phase("train_step"):
                pass
            self.recorder.note(train_step_load_seconds=round(self.load_seconds, 3))
        if self.compiled is None:
            log.warning(
                "train step: the ahead-of-time compile failed (%s: %s); compiling at the first "
                "call instead",
                type(self.error).__name__,
                self.error,
            )

    def __call__(self, state: Any, target: Any, tokens: Any, key: Any) -> Any:
        if not self._joined:
            self._join()
            if self.compiled is not None:
                try:
                    return self.compiled(state, target, tokens, key)
                except (TypeError, ValueError) as exc:
                    # The loop's arguments drifted from the trainer's abstract layout (a bug);
                    # the jit still runs the step.
                    log.warning("train step: the compiled program refused the arguments: %s", exc)
                    self.compiled = None
        if self.compiled is None:
            return self.trainer.train_step(state, target, tokens, key)
        return self.compiled(state, target, tokens, key)


def trainer_program_key(name: str, trainer: Any, target_dtype: Any, source: str) -> str:
    """The executable-cache key of the trainer's program ``name`` (``train_step``,
    ``eval_metrics``): its static inputs (the trainer's configs, T, compiler options, mesh,
    target dtype; its abstract arguments follow from them) and ``source``, a
    :func:`pd_train.runtime_env.source_digest`."""
    from pd_train.runtime_env import program_key

    t = trainer
    mesh = None if t.mesh is None else (dict(t.mesh.shape), t.mesh.devices.tolist())
    return program_key(
        name, t.model, t.pd, t.runtime, t.seq_len, t.compiler_options, mesh, str(target_dtype),
        source=source,
    )  # fmt: skip


def _tracker(config: Config, run_dir: Path) -> Any:
    """The run's W&B tracker (``tracking:`` in the config; process 0 only), or None."""
    if config.tracking is None:
        return None
    import attrs

    from pd_train.analysis.tracking import WandbTracker, parse_tracking

    return WandbTracker(run_dir, parse_tracking(config.tracking), run_config=attrs.asdict(config))


def _replicated(trainer: Any, key: Any) -> Any:
    """``key`` committed to the mesh, replicated: a fresh key and one restored from a checkpoint
    then give the step (and the ``fold_in`` before it) the same argument sharding."""
    import jax
    import numpy as np

    if trainer.layout is None:
        return key
    # device_put refuses a typed key onto devices of other processes; its data (the same on
    # every process, or already a global array) goes anywhere.
    data = jax.random.key_data(key)
    source: Any = np.asarray(data) if data.is_fully_addressable else data
    return jax.random.wrap_key_data(jax.device_put(source, trainer.layout.replicated()))


def _canonical_state(trainer: Any, state: Any) -> Any:
    """``state`` on the shardings of :meth:`Trainer.abstract_state`, the layout a checkpoint
    restores onto. The warmup jit, for one, leaves the components on shardings XLA chose; a
    state laid out otherwise lowers the step to another program (another persistent-cache key),
    so a resumed run would miss the cache that its fresh start filled. A no-op where the
    layouts already agree."""
    import jax

    if trainer.layout is None:
        return state
    shardings = jax.tree.map(lambda a: a.sharding, trainer.abstract_state())
    return jax.device_put(state, shardings)


def _keep_compile_record(run_dir: Path) -> None:
    """Move an earlier attempt's compile.json to ``compile-attempt-N.json`` (N = 1, 2, ... in
    the order the attempts ran), so every attempt's compiles stay visible; compile.json is
    always the latest attempt's."""
    record = run_dir / COMPILE_FILE
    if not record.exists():
        return
    n = 1
    while (run_dir / f"compile-attempt-{n}.json").exists():
        n += 1
    os.replace(record, run_dir / f"compile-attempt-{n}.json")


def compile_announcer(stream: Any = None) -> Any:
    """A pd-probe ``on_compile`` callback that writes one line per compile to ``stream``
    (default stderr): ``compiling train_step (cache miss)… 12.3 s``."""
    from pd_probe import CompileAnnouncer

    return CompileAnnouncer(stream)


def _agreed(flag: bool, placement: Placement) -> bool:
    """True when any process has the flag: every process must leave the loop at the same step,
    or the others would wait in the next step's collectives forever."""
    if placement.num_processes == 1:
        return flag
    import numpy as np
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.asarray(flag))))


def _training_item(state: Any, run_key_data: Any) -> dict[str, Any]:
    """What only resuming needs. The data position is the step: batches are a pure function of
    ``(seed, step)``. Persistent PGD's sources and their optimizer state ride along."""
    item = {"step": state.step, "opt_state": state.opt_state, "run_key": run_key_data}
    if state.adversary:
        item["adversary"] = state.adversary
    return item


def _abstract_key_data(trainer: Any) -> Any:
    import jax

    data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    sharding = trainer.layout.replicated() if trainer.layout is not None else None
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)


def _trace_window(config: Config, run_dir: Path) -> Any:
    from pd_train.runtime_env import TraceWindow

    profile = config.runtime.launch_env.profile
    if profile.trace_start_step is None:
        return None
    return TraceWindow(
        run_dir / "trace", start=profile.trace_start_step, num_steps=profile.trace_num_steps
    )


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
