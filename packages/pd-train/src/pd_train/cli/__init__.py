"""The ``pd-train`` command: a thin layer that composes pd-train with its sibling packages.

Subcommands:
  config   print a config resolved with its defaults and overrides
  run      run (or resume) a decomposition
  compile  lower and compile every jit of a run on abstract inputs; print seconds and memory
  pretrain train a built-in toy target (builtin:tms_5_2) deterministically; write its weights
  submit   submit a run to SLURM through pd-launch
  sweep    one run per point of a grid of overrides, one after another or as a SLURM array
  probe    compile probes of a config through pd-probe
  analyze  per-component density, mean CI and top contexts of a run's checkpoint (Parquet)
  report   one static HTML page of a run
  track    mirror a run's metrics.jsonl into a Weights & Biases run (pd-train[wandb])
  pull     load a decomposition back from a W&B run into a run dir (pd-train[wandb])
  tokenize text files → a token .npy, with a GGUF checkpoint's tokenizer

Exit codes: 0 success (also a run stopped by SIGTERM after saving: SLURM requeues it), 1 failure
while running, 2 bad input (config, arguments; nothing was written), 130 stopped by Ctrl-C (after
saving a checkpoint and the summary at the next step boundary, the plots skipped; a second Ctrl-C aborts at
once).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pd_train import __version__

DEFAULT_CONFIG = "builtin:default"
EXIT_INTERRUPTED = 130  # pd_train.run.EXIT_INTERRUPTED (not imported: it pulls the run module)


def _add_config_args(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    parser.add_argument(
        "config",
        nargs="?" if optional else None,
        default=DEFAULT_CONFIG if optional else None,
        help="YAML config (builtin:default names the embedded tiny decomposition)",
    )
    from pd_train.config.io import add_override_argument  # cattrs, yaml: after a relaunch

    add_override_argument(parser)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (``--max-steps``, ``--simulate-devices``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a whole number >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {value}; must be >= 1")
    return value


def _add_device_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--simulate-devices",
        type=positive_int,
        metavar="N",
        help="run on N >= 1 simulated CPU devices (sets XLA_FLAGS before JAX starts)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pd-train",
        description="Stochastic parameter decomposition of transformer language models with JAX.",
    )
    parser.add_argument("--version", action="version", version=f"pd-train {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("config", help="print the resolved config, with defaults")
    _add_config_args(p, optional=True)

    p = sub.add_parser("run", help="run or resume a decomposition")
    _add_config_args(p, optional=True)
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
    p.add_argument(
        "--distributed",
        choices=("none", "slurm", "explicit"),
        default="none",
        help="process layout: one process, a task of an srun step, or given explicitly",
    )
    p.add_argument("--coordinator", help="HOST:PORT of process 0 (--distributed explicit)")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    p.add_argument("--process-per", choices=("node", "device"), default="node")
    _add_device_args(p)

    p = sub.add_parser(
        "pretrain", help="train a built-in toy target (builtin:tms_5_2); writes its weights"
    )
    p.add_argument("config", help="builtin:<toy> (e.g. builtin:tms_5_2)")
    p.add_argument("--out", type=Path, help="default: overwrite the shipped weights' file")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 unless the result matches the shipped weights (within "
        "1e-5 of each array's scale: another CPU rounds differently)",
    )

    p = sub.add_parser("compile", help="AOT-compile every jit of a run on abstract inputs")
    _add_config_args(p, optional=True)
    p.add_argument("--record", type=Path, help="write per-jit compile records (JSON) here")
    _add_device_args(p)

    from pd_train.cli import probe as probe_cli
    from pd_train.cli import submit as launch_cli

    launch_cli.add_parser(sub)
    from pd_train.cli import sweep

    sweep.add_parser(sub)
    probe_cli.add_parser(sub)
    from pd_train.cli import analyze as analyze_cli

    analyze_cli.add_parsers(sub)
    from pd_train.cli import tokenize as tokenize_cli

    tokenize_cli.add_parser(sub)
    return parser


def _fail(message: str, code: int = 2) -> int:
    print(f"pd-train: error: {message}", file=sys.stderr)
    return code


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


def _relaunch_with_hugepages() -> None:
    """Replace this process (same pid, same arguments) by one with huge-page malloc; called
    first thing by the ``pd-train run`` program (not by ``main([...])`` in a test)."""
    env = hugepage_environment(os.environ)
    if env is None:
        return
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        return  # keep running as we are


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["run"]:
        try:
            _relaunch_with_hugepages()
        except ValueError as err:
            return _fail(str(err))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if getattr(args, "simulate_devices", None) is not None:
        flag = f"--xla_force_host_platform_device_count={args.simulate_devices}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from pd_train.config.io import ConfigError
    from pd_train.process_env import setup_logging

    setup_logging()
    handlers = {
        "config": _config,
        "run": _run,
        "compile": _compile,
        "pretrain": _pretrain,
        "submit": _submit,
        "sweep": _sweep,
        "probe": _probe,
        "analyze": _analyze,
        "report": _report,
        "track": _track,
        "pull": _pull,
        "tokenize": _tokenize,
    }
    try:
        code = handlers[args.command](args)
    except ConfigError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        # Ctrl-C outside the step loop (which saves first; see pd_train.run): one line, no
        # traceback.
        print("pd-train: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if argv is None and getattr(args, "exit_now", False):
        exit_now(code, force=getattr(args, "exit_force", False))
    return code


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


def is_toy_config(value: str) -> bool:
    """Whether ``value`` names a toy (:func:`pd_train.cli.toy.is_toy_config`). A shipped
    config (``builtin:default``) is answered without importing the toy module, which imports
    scipy (~1.5 s before the first step); no toy shares a shipped config's name."""
    from pd_train.configs import builtin_configs

    if value.startswith("builtin:") and value.removeprefix("builtin:") in builtin_configs():
        return False
    from pd_train.cli import toy as toy_cli

    return toy_cli.is_toy_config(value)


def restart_hint(run_dir: Path) -> str:
    """How to (re)start the run in ``run_dir`` that has no checkpoint, as a command that is
    then accepted: the same dir for a decomposition run (``--run-dir`` with the same config
    starts at step 0); a new dir for a toy run without a checkpoint."""
    config = run_dir / "config.yaml"
    if is_toy_config(str(config)):
        return (
            f"{run_dir} is a toy run without a checkpoint: run it again into a new dir with "
            f"`pd-train run {config} --run-dir NEW_DIR`"
        )
    return f"start the run with `pd-train run {config} --run-dir {run_dir}`"


def config_source(value: str) -> str | Path:
    from pd_train.configs import builtin_config

    if value.startswith("builtin:"):
        return builtin_config(value.removeprefix("builtin:"))
    return Path(value)


def _config(args: argparse.Namespace) -> int:
    from pd_train.config.run import to_yaml
    from pd_train.run import prepare

    if is_toy_config(args.config):  # the toy's resolved config, checked as `run` checks it
        import yaml

        from pd_train.cli import toy as toy_cli

        raw = toy_cli.load_toy_config(args.config, args.overrides)
        print(yaml.safe_dump(raw, sort_keys=False), end="")
        return 0
    # Validated as `pd-train compile` validates (the target, patterns, cadences), then printed
    # as written (paths not made absolute); weight and data files are not opened.
    source = config_source(args.config)
    prepared = prepare(source, args.overrides, for_run=False)
    config = prepared.config
    if not isinstance(source, dict):
        from pd_train.config.run import load_config

        config, _ = load_config(source, args.overrides)
    print(to_yaml(config), end="")
    return 0


def _run(args: argparse.Namespace) -> int:
    from pd_train import run as runner
    from pd_train.config.io import ConfigError
    from pd_train.run.distributed import DistributedError, placement_from_flags

    resume = args.resume
    if args.allow_config_change and resume is None:
        return _fail("--allow-config-change applies to --resume RUN_DIR only")
    if resume is not None:
        if args.overrides:
            return _fail("--resume takes the run's saved config; --set is not allowed with it")
        if args.run_dir is not None and args.run_dir.absolute() != resume.absolute():
            return _fail(
                f"--resume {resume} continues the run in its own dir; --run-dir {args.run_dir} "
                "names another (leave --run-dir out)"
            )
        source: str | Path = resume / runner.CONFIG_FILE
        if not Path(source).is_file():
            return _fail(f"--resume {resume}: no {runner.CONFIG_FILE} there; not a run dir")
        if is_toy_config(str(source)):  # a toy run dir: the toy runner resumes it
            from pd_train.cli import toy as toy_cli

            if not (resume / "checkpoints").is_dir():
                return _fail(f"--resume {resume}: no checkpoint there yet; {restart_hint(resume)}")
            _, summary = toy_cli.run_toy_cli(
                str(source), run_dir=resume, max_steps=args.max_steps, resume=True
            )
            print(summary, end="")
            return 0
        if not runner.checkpoint_steps(resume):
            return _fail(f"--resume {resume}: no checkpoint there yet; {restart_hint(resume)}")
    else:
        if is_toy_config(args.config):  # builtin:tms_5_2: the toy runner, not run.py
            from pd_train.cli import toy as toy_cli

            if args.distributed != "none":
                return _fail("a toy run is one process; leave --distributed out")
            _, summary = toy_cli.run_toy_cli(
                args.config, args.overrides, run_dir=args.run_dir, max_steps=args.max_steps
            )
            print(summary, end="")
            return 0
        source = config_source(args.config)
    try:
        placement = placement_from_flags(args)
    except DistributedError as exc:
        return _fail(str(exc))
    prepared = runner.prepare(source, args.overrides, resume_dir=resume)
    run_dir = resume or args.run_dir or runner.new_run_dir(prepared.config, base=prepared.base)
    problem = runner.directory_problem(run_dir, base=Path.cwd())
    if problem is not None:
        return _fail(f"--run-dir {run_dir}: {problem}")
    # The run dir's one owner, before anything is written there (process 0 writes its files).
    try:
        with runner.RunDirLock(run_dir, enabled=placement.is_primary):
            if resume is None and args.run_dir is not None:
                prepared = runner.resolve_run_dir(prepared, run_dir)
            rt = runner.start_runtime(prepared, placement, run_dir=run_dir, start_step=True)
            result = runner.execute(
                rt,
                run_dir=run_dir,
                max_steps=args.max_steps,
                allow_config_change=args.allow_config_change,
            )
    except runner.RunDirError as exc:
        return _fail(str(exc))
    except ConfigError as exc:
        # E.g. a damaged checkpoint: orbax's coroutines of the failed read would add their
        # tracebacks at the interpreter's exit (exit_now).
        args.exit_now = args.exit_force = True
        return _fail(str(exc))
    except runner.CheckpointWriteError as exc:
        # One line; orbax's threads of the failed save end with the process (exit_now).
        args.exit_now = args.exit_force = True
        return _fail(str(exc), code=1)
    if placement.is_primary:
        print(result.summary)
    # Everything is written and closed: a one-process run without a tracker may skip the
    # interpreter's teardown (see exit_now).
    args.exit_now = placement.num_processes == 1 and prepared.config.tracking is None
    return runner.EXIT_INTERRUPTED if result.stop_signal == "SIGINT" else 0


def _compile(args: argparse.Namespace) -> int:
    from pd_train._output_paths import file_problem
    from pd_train.run.compile import compile_all, format_compile_table

    if args.config is not None and is_toy_config(args.config):  # builtin:tms_5_2
        from pd_train.cli import toy as toy_cli

        if args.record is not None:
            return _fail("--record is not supported for a toy config")
        print(format_compile_table(toy_cli.compile_toy(args.config, args.overrides)))
        return 0
    if args.record is not None and (problem := file_problem(args.record)) is not None:
        return _fail(f"--record: {problem}")
    rows = compile_all(
        config_source(args.config), args.overrides, record=args.record, progress=sys.stderr
    )
    print(format_compile_table(rows))
    return 0


def _pretrain(args: argparse.Namespace) -> int:
    from pd_train.cli import toy as toy_cli

    if args.check and args.out is not None:
        return _fail("--check writes nothing; leave --out out")
    if args.out is not None:
        from pd_train._output_paths import file_problem

        problem = file_problem(args.out)
        if problem is not None:  # refused before the pretraining, not after it
            return _fail(f"--out: {problem}")
    text, same = toy_cli.pretrain_toy_cli(args.config, out=args.out, check=args.check)
    print(text)
    return 1 if args.check and not same else 0


def _submit(args: argparse.Namespace) -> int:
    from pd_train.cli import submit as launch_cli

    return launch_cli.submit(args)


def _sweep(args: argparse.Namespace) -> int:
    from pd_train.cli import sweep

    return sweep.sweep(args)


def _probe(args: argparse.Namespace) -> int:
    from pd_train.cli import probe as probe_cli

    return probe_cli.probe(args)


def _tokenize(args: argparse.Namespace) -> int:
    from pd_train.cli import tokenize as tokenize_cli

    return tokenize_cli.tokenize(args)


def _analyze(args: argparse.Namespace) -> int:
    from pd_train.cli import analyze as analyze_cli

    return analyze_cli.analyze(args)


def _report(args: argparse.Namespace) -> int:
    from pd_train.cli import analyze as analyze_cli

    return analyze_cli.report(args)


def _track(args: argparse.Namespace) -> int:
    from pd_train.cli import analyze as analyze_cli

    return analyze_cli.track(args)


def _pull(args: argparse.Namespace) -> int:
    from pd_train.cli import analyze as analyze_cli

    return analyze_cli.pull(args)


if __name__ == "__main__":
    sys.exit(main())
