"""``pd-train run``: run (or resume) a decomposition, or a toy; the program's huge-page relaunch
and its fast exit."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pd_train.cli._common import (
    add_config_args,
    add_device_args,
    add_distributed_args,
    config_source,
    fail,
    is_toy_config,
    positive_int,
    restart_hint,
)

__all__ = ["HUGEPAGE_TUNABLE", "add_parser", "exit_now", "hugepage_environment", "run"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run or resume a decomposition")
    add_config_args(p, optional=True)
    p.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its latest checkpoint, with its saved config.yaml",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        help=(
            "write the run here (default: output_dir/NAME-TIME). If RUN_DIR already holds a run "
            "with the same config, it resumes from the latest checkpoint (or starts from step 0 "
            "if none was saved); a run with another config is refused (exit 2) and left "
            "untouched: continue it with --resume RUN_DIR or pick another directory"
        ),
    )
    p.add_argument(
        "--allow-config-change",
        action="store_true",
        help=(
            "with --resume: accept a config.yaml that differs from the checkpoint's config in "
            "pd.steps, cadence.*, tracking, runtime.compile_cache.* or "
            "runtime.launch_env.profile.* (any other difference is refused)"
        ),
    )
    p.add_argument(
        "--max-steps",
        type=positive_int,
        help="stop after this many steps (>= 1; the schedule stays that of pd.steps)",
    )
    add_distributed_args(
        p, help="process layout: one process, a task of an srun step, or given explicitly"
    )
    add_device_args(p)


#: The glibc tunable (glibc >= 2.35) that has malloc back its large blocks with transparent
#: huge pages. XLA:CPU takes its per-execution buffers from malloc; with 4 KiB pages the default
#: config's train step faulted in ~96,000 fresh pages per step (~0.22 CPU s of kernel time in a
#: 0.73 CPU s step); with huge pages ~300 (0.46 CPU s per step).
HUGEPAGE_TUNABLE = "glibc.malloc.hugetlb=1"


def hugepage_environment(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to relaunch ``pd-train run`` in, with :data:`HUGEPAGE_TUNABLE` added to
    ``GLIBC_TUNABLES`` (glibc reads it only at process start); None when it is set already,
    when ``PD_TRAIN_HUGEPAGES=0`` opts out, or off Linux with glibc >= 2.35."""
    opt = environ.get("PD_TRAIN_HUGEPAGES", "1")
    if opt not in ("0", "1"):
        msg = f"PD_TRAIN_HUGEPAGES: got {opt!r}; must be 0 (off) or 1 (on, the default)"
        raise ValueError(msg)
    if opt == "0" or sys.platform != "linux":
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return None
    try:
        name, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").split()  # "glibc 2.36"
        major, minor = (int(part) for part in version.split(".")[:2])
    except (AttributeError, OSError, ValueError):
        return None
    if name != "glibc" or (major, minor) < (2, 35):
        return None
    return {**environ, "GLIBC_TUNABLES": ":".join(t for t in (tunables, HUGEPAGE_TUNABLE) if t)}


def relaunch_with_hugepages() -> None:
    """Replace this process (same pid, same arguments) by one with huge-page malloc; called
    first thing by the ``pd-train run`` program (not by ``main([...])`` in a test)."""
    env = hugepage_environment(os.environ)
    if env is None:
        return
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        return  # keep running as we are


def exit_now(code: int, *, force: bool = False) -> None:
    """End the ``pd-train run`` program with ``code`` now, without the interpreter's teardown:
    after a run, JAX's exit hooks (clearing its caches and backends), the garbage collection of
    the run's objects and the freeing of ~1.5 GB of modules and buffers took ~1 s, after every
    file was already written and closed. Logging and stdout/stderr are flushed first. Returns
    (the normal exit follows) when a non-daemon thread is still running, whose work the
    interpreter would wait for — unless ``force`` (a run that failed: the threads of its
    failed checkpoint would only add tracebacks)."""
    import contextlib
    import logging
    import threading

    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    if not force and any(not t.daemon and t.is_alive() for t in others):
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to write
            stream.flush()
    os._exit(code)


def run(args: argparse.Namespace) -> int:
    from pd_train import _gc_pause

    # The set-up's imports and objects are not scanned by the cyclic collector: paused until
    # the runtime has started (before any device array exists), then frozen (_gc_pause).
    with _gc_pause.paused():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    preload = _preload(args)
    try:
        return _run_with(args, preload)
    finally:
        if preload is not None:
            preload.close()


def _preload(args: argparse.Namespace) -> Any:
    """The launch's :class:`pd_train._preload.Preload` (the train step loading from the
    executable cache at once, when an earlier launch left a hint for this config's structure),
    before pd's imports and the config's validation; None for a launch that could be
    multi-process (the backend must start after ``jax.distributed``), a toy, or a config
    that does not read (:func:`pd_train.run.prepare` reports it)."""
    if args.distributed != "none":
        return None
    from pd_train import _preload

    try:
        if args.resume is not None:
            if args.overrides:
                return None
            source: str | Path = args.resume / "config.yaml"
        else:
            source = config_source(args.config)
        return _preload.begin(source, args.overrides)
    except Exception as exc:  # a bad config or hint: the launch goes on without
        import logging

        logging.getLogger("pd_train").debug("no preload (%s: %s)", type(exc).__name__, exc)
        return None


def _run_with(args: argparse.Namespace, preload: Any) -> int:
    from pd_train import _gc_pause
    from pd_train import run as runner
    from pd_train.config.io import ConfigError
    from pd_train.run.distributed import DistributedError, placement_from_flags

    resume = args.resume
    if args.allow_config_change and resume is None:
        return fail("--allow-config-change applies to --resume RUN_DIR only")
    if resume is not None:
        if args.overrides:
            return fail("--resume takes the run's saved config; --set is not allowed with it")
        if args.run_dir is not None and args.run_dir.absolute() != resume.absolute():
            return fail(
                f"--resume {resume} continues the run in its own dir; --run-dir {args.run_dir} "
                "names another (leave --run-dir out)"
            )
        source: str | Path = resume / runner.CONFIG_FILE
        if not Path(source).is_file():
            return fail(f"--resume {resume}: no {runner.CONFIG_FILE} there; not a run dir")
        if is_toy_config(str(source)):  # a toy run dir: the toy runner resumes it
            from pd_train.cli import toy as toy_cli

            _gc_pause.resume()

            if not (resume / "checkpoints").is_dir():
                return fail(f"--resume {resume}: no checkpoint there yet; {restart_hint(resume)}")
            _, summary = toy_cli.run_toy_cli(
                str(source), run_dir=resume, max_steps=args.max_steps, resume=True
            )
            print(summary, end="")
            return 0
        if not runner.checkpoint_steps(resume):
            return fail(f"--resume {resume}: no checkpoint there yet; {restart_hint(resume)}")
    else:
        if is_toy_config(args.config):  # builtin:tms_5_2: the toy runner, not run.py
            from pd_train.cli import toy as toy_cli

            if args.distributed != "none":
                return fail("a toy run is one process; leave --distributed out")
            _gc_pause.resume()
            _, summary = toy_cli.run_toy_cli(
                args.config, args.overrides, run_dir=args.run_dir, max_steps=args.max_steps
            )
            print(summary, end="")
            return 0
        source = config_source(args.config)
    try:
        placement = placement_from_flags(args)
    except DistributedError as exc:
        return fail(str(exc))
    prepared = runner.prepare(source, args.overrides, resume_dir=resume)
    run_dir = resume or args.run_dir or runner.new_run_dir(prepared.config, base=prepared.base)
    problem = runner.directory_problem(run_dir, base=Path.cwd())
    if problem is not None:
        return fail(f"--run-dir {run_dir}: {problem}")
    # The run dir's one owner, before anything is written there (process 0 writes its files).
    try:
        with runner.RunDirLock(run_dir, enabled=placement.is_primary):
            if resume is None and args.run_dir is not None:
                prepared = runner.resolve_run_dir(prepared, run_dir)
            rt = runner.start_runtime(
                prepared, placement, run_dir=run_dir, start_step=True, preload=preload
            )
            _gc_pause.resume()
            result = runner.execute(
                rt,
                run_dir=run_dir,
                max_steps=args.max_steps,
                allow_config_change=args.allow_config_change,
            )
    except runner.RunDirError as exc:
        return fail(str(exc))
    except ConfigError as exc:
        # E.g. a damaged checkpoint: orbax's coroutines of the failed read would add their
        # tracebacks at the interpreter's exit (exit_now).
        args.exit_now = args.exit_force = True
        return fail(str(exc))
    except runner.CheckpointWriteError as exc:
        # One line; orbax's threads of the failed save end with the process (exit_now).
        args.exit_now = args.exit_force = True
        return fail(str(exc), code=1)
    if placement.is_primary:
        print(result.summary)
    # Everything is written and closed: a one-process run without a tracker may skip the
    # interpreter's teardown (see exit_now).
    args.exit_now = placement.num_processes == 1 and prepared.config.tracking is None
    return runner.EXIT_INTERRUPTED if result.stop_signal == "SIGINT" else 0
