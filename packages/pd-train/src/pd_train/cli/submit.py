"""``pd-train submit CONFIG``: a run dir that records exactly what was submitted, then sbatch.

Order (nothing is written or submitted before the config passed every check):

1. validate the config completely (:func:`pd_train.run.prepare`, ``for_run=True``) and the
   launch section against it; build the pd-launch :class:`~pd_launch.JobSpec`;
2. fill a hidden temporary directory next to the run dir: ``config.yaml`` (resolved, with
   config-relative paths made absolute), the code snapshot (``code.json``, ``code.diff``,
   ``code-untracked.tar.gz``) and ``logs/``, then rename it to the run dir;
3. submit through pd-launch (scrubbed environment; it writes ``job.sh`` and submits that file);
4. write ``submission.json``. If sbatch rejects the job or is missing, the run dir is removed:
   a run dir without ``submission.json`` never exists once ``pd-train submit`` has returned.

Each SLURM task runs ``python -m pd_train.cli run RUN_DIR/config.yaml --run-dir RUN_DIR
--distributed slurm --process-per node|device``, or ``run --resume RUN_DIR`` when the run dir
already holds a checkpoint (a requeued job continues where it stopped).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import importlib.metadata
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pd_train.config.io import add_override_argument

if TYPE_CHECKING:
    from pd_launch import JobSpec
    from pd_train.config.launch import LaunchConfig
    from pd_train.config.run import Config

__all__ = ["add_parser", "build_job", "job_command", "submit"]

SCRIPT_FILE = "job.sh"
SUBMISSION_FILE = "submission.json"
CODE_FILE = "code.json"
DIFF_FILE = "code.diff"
UNTRACKED_FILE = "code-untracked.tar.gz"
LOG_DIR = "logs"
DEFAULT_TIMEOUT = 3600.0
# Untracked files go into the snapshot only up to these sizes (a stray dataset must not be).
_UNTRACKED_FILE_LIMIT = 1 << 20
_UNTRACKED_TOTAL_LIMIT = 16 << 20
_VERSIONS_OF = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")


class SubmitError(Exception):
    """``pd-train submit`` cannot go on; ``code`` is the exit code (2: bad input, 1: failure)."""

    def __init__(self, message: str, *, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _seconds(text: str) -> float:
    """argparse type for --timeout: a finite number of seconds >= 0 (float() takes 'nan')."""
    import math

    try:
        value = float(text) if text.isascii() else math.nan  # float('٣') is 3.0
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        msg = f"{text!r} is not a finite number of seconds >= 0"
        raise argparse.ArgumentTypeError(msg)
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``submit`` on ``pd-train``'s subcommands (``handler``: :func:`submit`)."""
    p = subparsers.add_parser(
        "submit",
        help="submit a run to SLURM (config section `launch`)",
        description=(
            "Validate CONFIG, create an immutable run dir (resolved config, code snapshot, "
            "sbatch script, submission record) and submit it with sbatch through pd-launch. "
            "Set launch fields like any other: --set launch.nodes=2 --set launch.partition=gpu "
            "(a time limit: --set launch.time=4:00:00)."
        ),
    )
    p.add_argument("config", help="YAML config (builtin:NAME names a shipped one)")
    add_override_argument(p, example="launch.nodes=2")
    p.add_argument(
        "--run-dir", type=Path, help="create the run here (default: output_dir/RUN_NAME-TIME)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the sbatch script and the scrubbed variables; write and submit nothing",
    )
    p.add_argument(
        "--wait", action="store_true", help="wait for the job to end; exit 1 unless COMPLETED"
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long --wait waits (default {DEFAULT_TIMEOUT:.0f}); the job keeps running after",
    )
    p.set_defaults(handler=submit)
    return p


# ---------------------------------------------------------------------------------------------
# The job


def job_command(launch: LaunchConfig, run_dir: Path) -> list[str]:
    """What every task runs: ``pd-train run`` on the run dir, resuming if it has a checkpoint.

    The run dir travels as ``PD_RUN_DIR`` (exported by the script) so the command reads the same
    for every run.
    """
    python = launch.python or sys.executable
    flags = f"--distributed slurm --process-per {launch.process_per}"
    run = f"exec {shlex.quote(python)} -m pd_train.cli run"
    lines = ["set -e", *launch.setup]
    lines += [
        # A step directory (digits only) is a finished orbax checkpoint; temporary ones have
        # suffixes. Every task decides alike: nothing is saved before all of them have started.
        'if ls "$PD_RUN_DIR/checkpoints" 2>/dev/null | grep -qxE "[0-9]+"; then',
        f'  {run} --resume "$PD_RUN_DIR" {flags}',
        "fi",
        f'{run} "$PD_RUN_DIR/config.yaml" --run-dir "$PD_RUN_DIR" {flags}',
    ]
    return ["bash", "-c", "\n".join(lines)]


def build_job(config: Config, run_dir: Path, *, chdir: Path) -> JobSpec:
    """The pd-launch job description for ``config`` (its ``launch`` section) in ``run_dir``."""
    from pd_launch import JobSpec

    launch: LaunchConfig = config.launch
    log_dir = Path(launch.log_dir).expanduser() if launch.log_dir else run_dir / LOG_DIR
    if not log_dir.is_absolute():
        log_dir = chdir / log_dir
    return JobSpec(
        name=launch.job_name or config.run_name,
        command=job_command(launch, run_dir),
        nodes=launch.nodes,
        tasks_per_node=launch.processes_per_node,
        cpus_per_task=launch.cpus_per_task,
        gpus_per_node=launch.gpus_per_node,
        memory=launch.mem,
        mem_per_cpu=launch.mem_per_cpu,
        time=str(launch.time),
        partition=launch.partition,
        account=launch.account,
        signal=launch.signal,
        requeue=launch.requeue,
        output=str(log_dir / "slurm-%j.out"),
        chdir=str(chdir),
        env={**launch.env, "PD_RUN_DIR": str(run_dir)},
        extra_directives=launch.extra_directives,
    )


def _path_problems(run_dir: Path, cwd: Path, *, run_dir_from: str) -> list[str]:
    """The paths the job script's ``#SBATCH`` lines hold that sbatch could not read back, named
    by where the user set them (spaces are fine: pd-launch quotes them)."""
    from pd_launch import path_problem

    problems = []
    problem = path_problem(str(run_dir))
    if problem is not None:
        problems.append(
            f"{run_dir_from}: the run dir {str(run_dir)!r} {problem}; choose another run dir"
        )
    problem = path_problem(str(cwd))
    if problem is not None:
        problems.append(
            f"the working directory {str(cwd)!r} (the job's --chdir) {problem}; run pd-train "
            "submit from another directory"
        )
    return problems


def launch_problems(config: Config) -> list[tuple[str, str]]:
    """Checks of the launch section against the rest of the config."""
    launch: LaunchConfig = config.launch
    processes = launch.nodes * launch.processes_per_node
    problems = []
    mesh = config.runtime.mesh
    gpus = launch.nodes * launch.gpus_per_node
    if mesh.data is not None and gpus:
        size = mesh.replicate * mesh.data * mesh.tensor
        if size != gpus:
            msg = (
                f"asks for {gpus} GPUs ({launch.nodes} nodes × {launch.gpus_per_node}), but "
                f"runtime.mesh is {mesh.replicate} × {mesh.data} × {mesh.tensor} = {size} "
                "devices (replicate × data × tensor); make them equal, or set "
                "runtime.mesh.data to null to take every device"
            )
            problems.append(("launch.gpus_per_node", msg))
    if config.pd.batch_size % processes:
        msg = (
            f"gives {processes} processes ({launch.nodes} nodes × {launch.processes_per_node}), "
            f"which do not divide pd.batch_size={config.pd.batch_size}; every process loads "
            "an equal share of each batch"
        )
        problems.append(("launch.tasks_per_node", msg))
    return problems


# ---------------------------------------------------------------------------------------------
# The code snapshot


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        result = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None


def _packages() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name or not (name.startswith("pd-") or name in _VERSIONS_OF):
            continue
        entry: dict[str, Any] = {"version": dist.version}
        direct = dist.read_text("direct_url.json")
        if direct:
            with contextlib.suppress(ValueError):
                entry["installed_from"] = json.loads(direct)
        found[name] = entry
    return dict(sorted(found.items()))


def snapshot_code(dest: Path, *, search: Sequence[Path] | None = None) -> dict[str, Any]:
    """Record the code a run uses into ``dest`` and return what ``code.json`` holds.

    Always: Python, the installed pd-* packages (version, where they were installed from) and
    jax & co. In the first git checkout found in ``search`` (default: the one holding pd_train,
    else the working directory): the commit, ``code.diff`` (``git diff HEAD``, binary-safe) and
    ``code-untracked.tar.gz`` with untracked, not ignored files up to 1 MiB each (16 MiB in
    all; the rest are listed in ``untracked_skipped``).
    """
    import pd_train

    if search is None:
        search = (Path(pd_train.__file__).resolve().parent, Path.cwd())
    record: dict[str, Any] = {
        "python": sys.version,
        "executable": sys.executable,
        "packages": _packages(),
        "git": None,
    }
    for where in search:
        top = _git(["rev-parse", "--show-toplevel"], where) if where.is_dir() else None
        if top:
            break
    else:
        return record
    root = Path(top.strip())
    commit = (_git(["rev-parse", "HEAD"], root) or "").strip() or None
    diff = _git(["diff", "HEAD", "--binary"], root) or ""
    listed = _git(["ls-files", "-z", "--others", "--exclude-standard"], root) or ""
    untracked = [name for name in listed.split("\0") if name]
    git: dict[str, Any] = {
        "root": str(root),
        "commit": commit,
        "branch": (_git(["rev-parse", "--abbrev-ref", "HEAD"], root) or "").strip() or None,
        "dirty": bool(diff or untracked),
        "diff_file": None,
        "untracked_file": None,
        "untracked_skipped": [],
    }
    if diff:
        (dest / DIFF_FILE).write_text(diff)
        git["diff_file"] = DIFF_FILE
    if untracked:
        kept, skipped, total = [], [], 0
        for name in untracked:
            path = root / name
            size = path.stat().st_size if path.is_file() and not path.is_symlink() else -1
            if 0 <= size <= _UNTRACKED_FILE_LIMIT and total + size <= _UNTRACKED_TOTAL_LIMIT:
                kept.append(name)
                total += size
            else:
                skipped.append(name)
        if kept:
            with tarfile.open(dest / UNTRACKED_FILE, "w:gz") as tar:
                for name in kept:
                    tar.add(root / name, arcname=name, recursive=False)
            git["untracked_file"] = UNTRACKED_FILE
        git["untracked_files"] = kept
        git["untracked_skipped"] = skipped
    record["git"] = git
    return record


# ---------------------------------------------------------------------------------------------
# The command


def _fail(message: str) -> None:
    from pd_train.cli._common import fail

    fail(message, command="pd-train submit")


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _dry_run_report(run_dir: Path, removed: tuple[str, ...], env: dict[str, str], job: Any) -> str:
    from pd_launch import scrub_notes

    lines = [
        "# --dry-run: nothing written, nothing submitted.",
        f"# run dir: {run_dir}",
        *scrub_notes(removed, env),
    ]
    lines.append(f"# Set by the job: {', '.join(sorted(job.env))}")
    return "\n".join(lines)


def _unset_data_note(config: str) -> str:
    return (
        f"Not ready to submit: data.path is null in {config}, so the job would stop at its\n"
        "first check. Name pre-tokenized tokens of the target's tokenizer (.npy files, .bin\n"
        "files with data.dtype, or a directory of shards), e.g.\n"
        f"  pd-train submit {config} --set data.path=/path/to/tokens"
    )


RANDOM_WEIGHTS_NOTE = (
    "target.checkpoint is null: the job decomposes random weights of the architecture.\n"
    "For the real model: --set target.checkpoint=/path/to/hf-model-dir"
)


def submit(args: argparse.Namespace) -> int:
    """``pd-train submit``: 0 submitted (and, with ``--wait``, COMPLETED), 2 bad input, 1 failure."""
    try:
        return _submit(args)
    except SubmitError as exc:
        _fail(str(exc))
        return exc.code


def _submit(args: argparse.Namespace) -> int:
    import pd_launch

    # 1. Everything that can be checked, before anything is written.
    prepared, notes = _checked_config(args)
    config = prepared.config  # prepare() made its paths absolute
    cwd = Path.cwd()
    run_dir = _new_run_dir(args, prepared, cwd)
    try:
        job = build_job(config, run_dir, chdir=cwd)
    except pd_launch.JobSpecError as exc:
        raise SubmitError(f"the job description is invalid: {exc}", code=2) from None

    if args.dry_run:
        preview = pd_launch.prepare_submission(job)
        print(preview.script, end="")
        print(_dry_run_report(run_dir, preview.removed, dict(preview.env), job))
        for note in notes:
            print("\n".join(f"# {line}" for line in note.splitlines()))
        return 0
    for note in notes:  # only the random-weights note gets here: the job is still submitted
        print(f"pd-train submit: warning: {note}", file=sys.stderr)
    _check_sbatch(job)

    # 2. The run dir, complete before it appears under its name.
    _write_run_dir(run_dir, config, job)

    # 3. Submit; on any failure the run dir goes away again.
    submitted_at = datetime.now(UTC).isoformat(timespec="seconds")
    submission = _submit_or_remove(job, run_dir, config)
    log = Path(str(job.output).replace("%j", submission.job_id))
    record = {
        "job_id": submission.job_id,
        "cluster": submission.cluster,
        "submitted_at": submitted_at,
        "run_dir": str(run_dir),
        "script": SCRIPT_FILE,
        "log": str(log),
        "config_source": str(args.config),
        "overrides": list(args.overrides),
        "job_command": list(job.command),
        "cwd": str(cwd),
        "user": getpass.getuser(),
        "host": socket.gethostname(),
        "removed_env": list(submission.removed),
        "job_env": dict(job.env),
        "sbatch_warnings": submission.warnings,
    }
    _write_json(run_dir / SUBMISSION_FILE, record)
    if submission.warnings:
        print(submission.warnings, file=sys.stderr)
    print(f"submitted job {submission.job_id}")
    print(f"run dir: {run_dir}")
    print(f"log:     {log}")
    if not args.wait:
        return 0
    return _wait(submission.job_id, log, timeout=args.timeout)


def _checked_config(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The prepared config (validated as for a run, and its launch section) and the notes to
    show with the job; a bad config raises :class:`SubmitError` (exit 2)."""
    from pd_train import run as runner
    from pd_train.cli._common import config_source
    from pd_train.config.io import ConfigError

    notes: list[str] = []
    try:
        try:
            prepared = runner.prepare(config_source(args.config), args.overrides, for_run=True)
        except ConfigError as exc:
            # A dry run of a config that leaves data.path for the user to fill in (the
            # production config does) still shows the job, and says what is missing.
            if not (args.dry_run and {path for path, _ in exc.problems} == {"data.path"}):
                raise
            prepared = runner.prepare(config_source(args.config), args.overrides, for_run=False)
            if prepared.config.data.path is not None:
                raise
            notes.append(_unset_data_note(args.config))
        problems = launch_problems(prepared.config)
        if problems:
            raise ConfigError(problems, source=args.config)
    except ConfigError as exc:
        raise SubmitError(str(exc), code=2) from None
    if prepared.config.target.checkpoint is None:
        notes.append(RANDOM_WEIGHTS_NOTE)
    return prepared, notes


def _new_run_dir(args: argparse.Namespace, prepared: Any, cwd: Path) -> Path:
    """The run dir to create (absolute): ``--run-dir`` or a new name under ``output_dir``;
    refused (exit 2) when it exists or cannot be made."""
    from pd_train import run as runner

    if args.run_dir is not None:
        run_dir = args.run_dir.expanduser().absolute()
    else:
        run_dir = runner.new_run_dir(prepared.config, base=prepared.base).absolute()
    if run_dir.exists():
        msg = f"run dir {run_dir} already exists; pd-train submit always starts a new one"
        raise SubmitError(msg, code=2)
    run_dir_from = "--run-dir" if args.run_dir is not None else "output_dir / run_name"
    path_problems = _path_problems(run_dir, cwd, run_dir_from=run_dir_from)
    if path_problems:
        raise SubmitError("; ".join(path_problems), code=2)
    return run_dir


def _check_sbatch(job: Any) -> None:
    """Refuse (nothing written) when sbatch is not on the job environment's PATH."""
    import pd_launch

    scrubbed = pd_launch.scrub_environment(os.environ, overrides=job.env).env
    if shutil.which("sbatch", path=scrubbed.get("PATH", os.defpath)) is None:
        msg = (
            f"sbatch is not on PATH ({scrubbed.get('PATH', '')}); pd-train submit needs SLURM's "
            "client commands (run it on a login node, or install slurm-client and set "
            "SLURM_CONF). Nothing was written."
        )
        raise SubmitError(msg)


def _write_run_dir(run_dir: Path, config: Any, job: Any) -> None:
    """The run dir's config, code snapshot and log dir, written in a staging dir that is
    renamed into place (removed again on any failure)."""
    from pd_train import run as runner
    from pd_train.config.run import to_yaml

    run_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = run_dir.with_name(f".{run_dir.name}.submitting-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        (staging / runner.CONFIG_FILE).write_text(to_yaml(config))
        _write_json(staging / CODE_FILE, snapshot_code(staging))
        log_dir = Path(str(job.output)).parent
        if log_dir.is_relative_to(run_dir):
            (staging / log_dir.relative_to(run_dir)).mkdir(parents=True)
        else:
            log_dir.mkdir(parents=True, exist_ok=True)
        os.rename(staging, run_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _submit_or_remove(job: Any, run_dir: Path, config: Any) -> Any:
    """``pd_launch.submit`` of the job; on any failure the run dir is removed again."""
    import pd_launch

    try:
        return pd_launch.submit(job, script_path=run_dir / SCRIPT_FILE)
    except BaseException as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        if isinstance(exc, pd_launch.UnknownPartitionError):
            msg = f"launch.partition={config.launch.partition!r}: {exc}"
            raise SubmitError(f"{msg}\nThe run dir was removed.", code=2) from None
        if isinstance(exc, pd_launch.LaunchError):
            raise SubmitError(f"{exc}\nThe run dir {run_dir} was removed.") from None
        raise


def _wait(job_id: str, log: Path, *, timeout: float) -> int:
    import pd_launch

    try:
        status = pd_launch.wait(job_id, timeout=timeout, check=False)
    except pd_launch.JobWaitTimeoutError as exc:
        _fail(f"{exc}; it keeps running (pd-launch cancel {job_id} stops it)")
        return 1
    except pd_launch.LaunchError as exc:
        _fail(f"could not follow job {job_id}: {exc}")
        return 1
    detail = f" (exit code {status.exit_code})" if status.exit_code else ""
    print(f"job {job_id} ended {status.state}{detail}")
    if status.ok:
        return 0
    if log.is_file():
        tail = log.read_text(errors="replace").splitlines()[-20:]
        print(f"last lines of {log}:", *tail, sep="\n", file=sys.stderr)
    return 1
