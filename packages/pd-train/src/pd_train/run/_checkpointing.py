"""What a run saves and restores: the state's two checkpoint items, the config each checkpoint was
written with, the free-space check before a save, and the checks of a checkpoint to resume from
(its config against the run dir's config.yaml, its arrays against the state's) that run before
anything is written.

A failed save (a full disk, any write error) leaves the last good checkpoint as it was, removes
the partial one (orbax's temporary directory) and raises :class:`CheckpointWriteError`:
``pd-train run`` ends with one line and exit 1, and ``--resume`` continues from the last good
checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_train.config.io import ConfigError
from pd_train.run._run_dir import config_differences
from pd_train.run.checkpoints import CheckpointError, Checkpoints, tree_path_name

log = logging.getLogger("pd_train")

#: The key of the config (its YAML text) in each checkpoint's orbax custom metadata.
CONFIG_METADATA_KEY = "pd_config_yaml"

#: The fields that ``pd-train run --resume D --allow-config-change`` accepts when they differ
#: between D/config.yaml and the checkpoint's config: none of them changes what the saved state
#: means. ``pd.steps`` extends or shortens the run (the schedules follow the new length from
#: the resumed step on); cadences, tracking, the compile cache and the profiler decide only
#: what is written and when. Every other field (shapes, sites, terms, learning rates, seeds,
#: data, mesh, dtypes) is refused with or without the flag: start a new run instead.
RESUME_MAY_CHANGE = (
    "pd.steps",
    "cadence.",
    "tracking",
    "runtime.compile_cache.",
    "runtime.launch_env.profile.",
)

#: Below this many checkpoints' worth of free space, a save warns that the next one may not fit.
FREE_SPACE_WARN_CHECKPOINTS = 2.0


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the last good one is kept, the partial one removed."""


def training_item(state: Any, run_key_data: Any) -> dict[str, Any]:
    """What only resuming needs. The data position is the step: batches are a pure function of
    ``(seed, step)``. Persistent PGD's sources and their optimizer state ride along."""
    item = {"step": state.step, "opt_state": state.opt_state, "run_key": run_key_data}
    if state.adversary:
        item["adversary"] = state.adversary
    if getattr(state, "term_state", None):
        item["term_state"] = state.term_state
    return item


def abstract_key_data(trainer: Any) -> Any:
    import jax

    data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    sharding = trainer.layout.replicated() if trainer.layout is not None else None
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=sharding)


def abstract_items(trainer: Any) -> tuple[Any, Any]:
    """The (decomposition, training) items of the trainer's abstract state, as saved."""
    abstract = trainer.abstract_state()
    return {"params": abstract.params}, training_item(abstract, abstract_key_data(trainer))


def replicated(trainer: Any, key: Any) -> Any:
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


def canonical_state(trainer: Any, state: Any, abstract: Any = None) -> Any:
    """``state`` on the shardings of :meth:`Trainer.abstract_state`, the layout a checkpoint
    restores onto. The warmup jit, for one, leaves the components on shardings XLA chose; a
    state laid out otherwise lowers the step to another program (another persistent-cache key),
    so a resumed run would miss the cache that its fresh start filled. A no-op where the
    layouts already agree. ``abstract``: the trainer's :meth:`Trainer.abstract_state`, when the
    caller has it already."""
    import jax

    if trainer.layout is None:
        return state
    if abstract is None:
        abstract = trainer.abstract_state()
    shardings = jax.tree.map(lambda a: a.sharding, abstract)
    return jax.device_put(state, shardings)


def tree_nbytes(tree: Any) -> int:
    """Bytes of a tree's arrays (global shapes): what a checkpoint of it writes, about."""
    import jax
    import numpy as np

    return sum(
        int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
        for a in jax.tree.leaves(tree)
        if hasattr(a, "shape")
    )


def disk_bytes(path: Path) -> int:
    """Bytes allocated to a directory's files and subdirectories (0 if it is absent)."""
    if not path.is_dir():
        return 0
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*"))


def partial_saves(directory: Path) -> list[Path]:
    """Orbax's temporary directories of unfinished saves in a checkpoint directory."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if ".orbax-checkpoint-tmp" in p.name)


#: :func:`remove_partial_saves_until_quiet`: how long no partial save must reappear, and the
#: longest it waits for that (seconds). Only a run whose save failed waits, at its exit. 0.5 s
#: was too short on a loaded CI machine: a queued write recreated ``2.orbax-checkpoint-tmp``
#: after it (once in a CI run with both cores busy, 7 Dec 2026; docs/testing.md).
PARTIAL_SAVES_QUIET_S = 2.0
PARTIAL_SAVES_LIMIT_S = 15.0


def remove_partial_saves_until_quiet(
    directory: Path, *, quiet: float = PARTIAL_SAVES_QUIET_S, limit: float = PARTIAL_SAVES_LIMIT_S
) -> None:
    """Remove the partial saves in ``directory`` again and again until none has reappeared for
    ``quiet`` seconds (at most ``limit`` seconds in all). A failed save's pending tensorstore
    writes can run after the save was given up and recreate its directory: removing the
    partial frees the inodes a full disk lacked, so a write still queued then succeeds."""
    import time

    start = last_seen = time.monotonic()
    while True:
        found = partial_saves(directory)
        for partial in found:
            shutil.rmtree(partial, ignore_errors=True)
        now = time.monotonic()
        if found:
            last_seen = now
        if now - last_seen >= quiet or now - start >= limit:
            return
        time.sleep(0.02)


class Saver:
    """Saves the run's state into ``RUN_DIR/checkpoints`` with the config it was written with;
    every process calls :meth:`save`. ``last_saved``: the step of the last good checkpoint."""

    def __init__(
        self,
        checkpoints: Checkpoints,
        *,
        trainer: Any,
        run_key: Any,
        config_yaml: str,
        last_saved: int | None = None,
        on_saved: Callable[[int], None] | None = None,
        agree: Callable[[bool], bool] = bool,
    ) -> None:
        self.checkpoints = checkpoints
        self.trainer = trainer
        self.run_key = run_key
        self.config_yaml = config_yaml
        self.last_saved = last_saved
        self.on_saved = on_saved
        #: True on every process when any process's flag is (:func:`agreed`): a save that one
        #: process refuses is refused by all, or the others would wait in orbax's collectives.
        self.agree = agree

    def save(self, step: int, state: Any) -> None:
        import jax

        key_data = jax.random.key_data(self.run_key)
        if self.trainer.layout is not None:
            # orbax saves only global arrays in multi-process runs, not one device's copy.
            key_data = jax.device_put(key_data, self.trainer.layout.replicated())
        decomposition = {"params": state.params}
        training = training_item(state, key_data)
        if step in self.checkpoints.steps():
            return
        self._check_free_space(step, tree_nbytes((decomposition, training)))
        try:
            # A write error surfaces here, once: orbax's and tensorstore's threads would also
            # print it, each with its traceback (what they print is kept back until the save
            # ends, and passed on when it succeeded).
            with _stderr_held() as held, _absl_quiet():
                self.checkpoints.save(
                    step,
                    decomposition=decomposition,
                    training=training,
                    custom_metadata={CONFIG_METADATA_KEY: self.config_yaml},
                )
                held.succeeded = True
        except Exception as exc:
            with _stderr_held():
                self._failed(step, exc)
        self.last_saved = step
        if self.on_saved is not None:
            self.on_saved(step)

    def _check_free_space(self, step: int, array_bytes: int) -> None:
        """Refuse a save that cannot fit, warn when the next one may not. A checkpoint's size:
        the last one's on disk (its files' allocated blocks: metadata and small-file overhead
        included), or before the first, its arrays' bytes."""
        directory = self.checkpoints.directory
        last = directory / str(self.last_saved)
        size = max(array_bytes, disk_bytes(last) if self.last_saved is not None else 0)
        existing = directory if directory.exists() else directory.parent
        free = shutil.disk_usage(existing).free
        gib = 2.0**30
        if self.agree(free < size):
            reason = (
                f"{free / gib:.3g} GiB free on {existing}, the checkpoint needs about "
                f"{size / gib:.3g} GiB"
            )
            self._failed(step, OSError(reason))
        if free < FREE_SPACE_WARN_CHECKPOINTS * size:
            log.warning(
                "checkpoint at step %d: %.3g GiB free on %s, each checkpoint takes about %.3g GiB;"
                " the next one may not fit",
                step,
                free / gib,
                existing,
                size / gib,
            )

    def _failed(self, step: int, exc: BaseException) -> None:
        # Quiet first: the save's pending tensorstore callbacks can end while close() shuts
        # orbax's event loop, and each would print "Event loop is closed" before our line.
        _after_a_failed_save(self.checkpoints.directory)
        # orbax's threads of the failed save end now (their errors repeat this one).
        with _absl_quiet(), contextlib.suppress(Exception):
            self.checkpoints.close()
        for partial in partial_saves(self.checkpoints.directory):
            shutil.rmtree(partial, ignore_errors=True)
        kept = (
            f"the last good checkpoint is step {self.last_saved}"
            if self.last_saved is not None
            else "no checkpoint of this attempt was written"
        )
        run_dir = self.checkpoints.directory.parent
        resume = f"; continue with `pd-train run --resume {run_dir}`" if self.last_saved else ""
        msg = (
            f"checkpoint at step {step} could not be written to {self.checkpoints.directory} "
            f"({type(exc).__name__}: {str(exc)[:400]}); the partial one was removed, "
            f"{kept}{resume}"
        )
        raise CheckpointWriteError(msg) from exc


def _after_a_failed_save(directory: Path) -> None:
    """The run ends with the save's error; orbax's threads of that save may outlive
    ``close()`` (on a busy machine): they neither print their traceback later (orbax's log
    stays silenced for the process's life, and so do the closed event loops' callbacks:
    :func:`_drop_closed_loop_callbacks`) nor leave a partial save they recreated (removed
    again at exit, after Python has joined those threads, until none has reappeared for a
    while: :func:`remove_partial_saves_until_quiet`; a partial save left all the same is
    removed when the next attempt opens the checkpoints, orbax's ``cleanup_tmp_directories``)."""
    import atexit

    logging.getLogger("absl").setLevel(logging.CRITICAL)
    _drop_closed_loop_callbacks()
    atexit.register(remove_partial_saves_until_quiet, directory)


def _drop_closed_loop_callbacks() -> None:
    """From now on, drop what the failed save's pending tensorstore reads and writes report
    when they end after orbax closed their event loop: each one's done-callback calls
    ``loop.call_soon_threadsafe``, whose ``RuntimeError('Event loop is closed')`` tensorstore
    hands to :data:`sys.unraisablehook` (by default, a traceback on stderr, after the run's
    one-line error); asyncio's "Task was destroyed but it is pending" for their tasks, too.
    Every other unraisable exception still reaches the previous hook."""
    import sys

    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_loop_callbacks", False):
        return

    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        closed_loop = isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
        if not (closed_loop and unraisable.object is None):
            previous(unraisable)

    hook.drops_closed_loop_callbacks = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


class _Held:
    succeeded = False


@contextlib.contextmanager
def _stderr_held() -> Iterator[_Held]:
    """File descriptor 2 (what C++ threads print, too) goes to a temporary file meanwhile; it
    is written to the real stderr afterwards if ``succeeded`` was set, else dropped."""
    import sys
    import tempfile

    held = _Held()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
        spool = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    except OSError:
        yield held
        return
    os.dup2(spool.fileno(), 2)
    try:
        yield held
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if held.succeeded:
            spool.seek(0)
            with contextlib.suppress(OSError):
                os.write(2, spool.read())
        spool.close()


@contextlib.contextmanager
def _absl_quiet() -> Iterator[None]:
    """orbax's log (the ``absl`` logger) silenced below CRITICAL meanwhile."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        absl.setLevel(level)


# ---------------------------------------------------------------------------------------------
# Resuming


@dataclass
class ResumePoint:
    """The checkpoint a run resumes from, checked: its step and the config it was written with
    (None for a checkpoint written before configs were stored)."""

    step: int
    config_yaml: str | None


def check_resume(
    checkpoints: Checkpoints,
    *,
    config: Any,
    trainer: Any,
    allow_config_change: bool = False,
) -> ResumePoint:
    """Check the latest checkpoint before anything is written: readable, written with this
    config (or one differing only in :data:`RESUME_MAY_CHANGE` fields, with
    ``allow_config_change``), holding arrays of the state's shapes and dtypes. Problems raise
    ConfigError naming the file, the array, what was found and what was expected."""
    step = checkpoints.latest_step()
    where = f"--resume {checkpoints.directory.parent}"
    if step is None:
        raise ConfigError([(where, f"no checkpoint in {checkpoints.directory}")])
    try:
        stored = checkpoints.custom_metadata(step).get(CONFIG_METADATA_KEY)
    except CheckpointError as exc:
        raise ConfigError([(where, str(exc))]) from None
    if stored is None:
        log.warning(
            "checkpoint %d in %s stores no config (written by an earlier pd-train): its config "
            "is not compared with config.yaml",
            step,
            checkpoints.directory,
        )
    else:
        _check_config(stored, config, where=where, step=step, allow=allow_config_change)
    decomposition, training = abstract_items(trainer)
    for item, expected in (("decomposition", decomposition), ("training", training)):
        try:
            found = checkpoints.item_arrays(step, item)
        except CheckpointError as exc:
            raise ConfigError([(where, str(exc))]) from None
        problems = _array_problems(found, expected)
        if problems:
            shown = "; ".join(problems[:5])
            more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
            path = checkpoints.directory / str(step) / item
            msg = (
                f"checkpoint {path} does not match the run's config: {shown}{more}; resume it "
                "with the config it was written with, or start a new run"
            )
            raise ConfigError([(where, msg)])
    return ResumePoint(step=step, config_yaml=stored)


@dataclass
class Restored:
    """A checked checkpoint, restored: its step, the state and the run key."""

    step: int
    state: Any
    run_key: Any
    config_yaml: str | None


def restore_checked(
    checkpoints: Checkpoints, *, config: Any, trainer: Any, allow_config_change: bool = False
) -> Restored:
    """:func:`check_resume`, then the checkpoint restored onto the trainer's abstract state; an
    array that cannot be read (a truncated file) is a ConfigError naming the checkpoint."""
    import jax

    from pd_train.train import TrainState

    point = check_resume(
        checkpoints, config=config, trainer=trainer, allow_config_change=allow_config_change
    )
    decomposition, training = abstract_items(trainer)
    error = None
    # A damaged array is reported once, here: orbax's threads and coroutines would also print
    # it, with tracebacks (held back, and passed on only after a successful restore).
    with _stderr_held() as held, _absl_quiet():
        try:
            params, training, step = checkpoints.restore(
                decomposition=decomposition, training=training, step=point.step
            )
            held.succeeded = True
        except CheckpointError as exc:
            error = str(exc)
        import gc

        gc.collect()  # the failed read's coroutines, while their complaints are held
    if error is not None:
        raise ConfigError([(f"--resume {checkpoints.directory.parent}", error)])
    state = TrainState(
        step=training["step"],
        params=params["params"],
        opt_state=training["opt_state"],
        adversary=training.get("adversary", {}),
        term_state=training.get("term_state", {}),
    )
    run_key = jax.random.wrap_key_data(training["run_key"])
    return Restored(step=step, state=state, run_key=run_key, config_yaml=point.config_yaml)


def _check_config(stored: str, config: Any, *, where: str, step: int, allow: bool) -> None:
    from pd_train.config.io import unstructure
    from pd_train.config.run import load_config

    try:
        saved, _ = load_config(_yaml_dict(stored))
    except ConfigError as exc:
        msg = f"the config stored with checkpoint {step} cannot be read: {exc}"
        raise ConfigError([(where, msg)]) from None
    diffs = config_differences(unstructure(saved), unstructure(config))
    # Paths are made absolute on load: a config.yaml moved with its run dir is the same run.
    if not diffs:
        return
    fixed = [d for d in diffs if not d[0].startswith(RESUME_MAY_CHANGE)]
    shown = "; ".join(
        f"{path}: {old!r} in the checkpoint, {new!r} in config.yaml"
        for path, old, new in (fixed or diffs)[:5]
    )
    count = len(fixed or diffs)
    more = f" (and {count - 5} more)" if count > 5 else ""
    if fixed:
        msg = (
            f"config.yaml differs from the config checkpoint {step} was written with, in fields "
            f"that cannot change on resume: {shown}{more}. Restore those fields, or start a new "
            "run with the new config (only "
            f"{', '.join(f.rstrip('.') for f in RESUME_MAY_CHANGE)} may change on resume, "
            "with --allow-config-change)"
        )
        raise ConfigError([(where, msg)])
    if not allow:
        msg = (
            f"config.yaml differs from the config checkpoint {step} was written with: "
            f"{shown}{more}. Pass --allow-config-change to resume with the new values, or "
            "restore config.yaml"
        )
        raise ConfigError([(where, msg)])
    log.warning("resuming with a changed config (--allow-config-change): %s%s", shown, more)


def _yaml_dict(text: str) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(text)
    return data if isinstance(data, dict) else {}


def _array_problems(found: dict[str, tuple[tuple[int, ...], str]], expected: Any) -> list[str]:
    """Differences between a checkpoint item's arrays (path → (shape, dtype)) and the abstract
    tree the run restores into."""
    import jax
    import numpy as np

    want = {
        tree_path_name(path): (tuple(leaf.shape), str(np.dtype(leaf.dtype)))
        for path, leaf in jax.tree_util.tree_flatten_with_path(expected)[0]
    }
    problems = [f"{name}: missing from the checkpoint" for name in want if name not in found]
    problems += [f"{name}: not in the run's state" for name in found if name not in want]
    for name, (shape, dtype) in want.items():
        if name in found and found[name] != (shape, dtype):
            got_shape, got_dtype = found[name]
            problems.append(
                f"{name}: got {got_dtype}{list(got_shape)}, expected {dtype}{list(shape)}"
            )
    return problems
