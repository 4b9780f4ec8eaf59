"""``pd-launch`` / ``python -m pd_launch``: submit, inspect, wait for and cancel SLURM jobs."""

from __future__ import annotations

import argparse
import re
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pd_launch import __version__
from pd_launch._env import scrub_notes
from pd_launch._errors import (
    DroppedDefaultsWarning,
    JobFailedError,
    JobSpecError,
    JobWaitTimeoutError,
    LaunchError,
    SlurmQueryError,
    SubmissionError,
    SubmissionRejectedError,
    UnknownJobError,
)
from pd_launch._io import job_from_dict, job_to_dict, load_job
from pd_launch._slurm import (
    cancel,
    check_seconds,
    job_status,
    prepare_submission,
    submit,
    wait,
)
from pd_launch._status import JobStatus

# Exit codes (also in the README and --help).
EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_REJECTED = 3
EXIT_SLURM_ERROR = 4

_EXIT_CODES_HELP = """exit codes:
  0  done (submit --wait, wait: the job ended COMPLETED)
  1  the job ended in another state (FAILED, CANCELLED, TIMEOUT, ...), or --wait/--timeout ran
     out while it still runs
  2  bad input, nothing submitted: arguments, job description, an existing --script-path, an
     unreadable SLURM_CONF, SLURM commands not on PATH, a job id SLURM does not know
  3  sbatch rejected the submission (its message is printed; no job is left to run)
  4  SLURM did not answer or a query failed (sbatch's answer lost, squeue/sacct/scancel errors)"""


def _integer(text: str) -> int:
    """argparse type: ASCII digits only (int() also takes '٣', ' 3', '+3' and '3_0')."""
    if re.fullmatch(r"-?[0-9]+", text) is None:
        msg = f"{text!r} is not an integer (ASCII digits)"
        raise argparse.ArgumentTypeError(msg)
    return int(text)


# Command-line flag -> JobSpec field, for flags that take a value.
_VALUE_FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "name": ("--name", str),
    "nodes": ("--nodes", _integer),
    "tasks_per_node": ("--tasks-per-node", _integer),
    "cpus_per_task": ("--cpus-per-task", _integer),
    "gpus_per_node": ("--gpus-per-node", _integer),
    "memory": ("--mem", str),
    "mem_per_cpu": ("--mem-per-cpu", str),
    "time": ("--time", str),
    "partition": ("--partition", str),
    "account": ("--account", str),
    "signal": ("--signal", str),
    "output": ("--output", str),
    "error": ("--error", str),
    "chdir": ("--chdir", str),
}


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds >= 0 ('nan' and 'inf' parse as floats)."""
    try:
        if not text.isascii():  # float('٣') is 3.0
            raise ValueError(text)
        return check_seconds("SECONDS", float(text))
    except ValueError:
        msg = f"{text!r} is not a finite number of seconds >= 0"
        raise argparse.ArgumentTypeError(msg) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pd-launch",
        description=(
            "Submit SLURM jobs with an environment scrubbed of the caller's SLURM_*, SBATCH_*, "
            "SRUN_*, SALLOC_*, PMI_*, PMIX_* and other launchers' rank variables (SLURM_CONF "
            "kept)."
        ),
        epilog=_EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pd-launch {__version__}")
    commands = parser.add_subparsers(dest="action", required=True)

    sub = commands.add_parser(
        "submit",
        help="render and submit a job",
        description="Render a job description to an sbatch script and submit it.",
        epilog=_EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.add_argument("--job", metavar="FILE", help="job description (.json or .toml)")
    for field, (flag, kind) in _VALUE_FLAGS.items():
        sub.add_argument(flag, dest=field, type=kind, default=None, help=f"job field {field}")
    sub.add_argument(
        "--requeue", dest="requeue", action=argparse.BooleanOptionalAction, default=None
    )
    sub.add_argument(
        "--env", dest="env", action="append", default=None, metavar="NAME=VALUE",
        help="variable exported in the job (repeatable)",
    )  # fmt: skip
    sub.add_argument(
        "--directive", dest="extra_directives", action="append", default=None, metavar="OPTION",
        help="extra sbatch option, e.g. --directive=--constraint=a100 (repeatable)",
    )  # fmt: skip
    sub.add_argument("--script-path", help="write the script here (a new file) and submit it")
    sub.add_argument(
        "--dry-run", action="store_true",
        help="print the script and the variables that would be removed; submit nothing",
    )  # fmt: skip
    sub.add_argument(
        "--wait", type=_seconds, metavar="SECONDS",
        help="wait this long for the job to end; exit 1 unless it ends COMPLETED",
    )  # fmt: skip
    sub.add_argument("command", nargs="*", help="the command each task runs (after --)")

    for name, text in (
        ("status", "print a job's state"),
        ("cancel", "cancel a job"),
        ("wait", "wait for a job to end; exit 1 unless it ends COMPLETED"),
    ):
        p = commands.add_parser(
            name, help=text, description=text, epilog=_EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        p.add_argument("job_id")
        if name == "wait":
            p.add_argument("--timeout", type=_seconds, required=True, metavar="SECONDS")
    return parser


def _job_from_args(args: argparse.Namespace) -> Any:
    data: dict[str, Any] = job_to_dict(load_job(args.job)) if args.job else {}
    for field in (*_VALUE_FLAGS, "requeue", "extra_directives"):
        value = getattr(args, field)
        if value is not None:
            data[field] = value
    if args.env:
        env = dict(data.get("env", {}))
        for item in args.env:
            name, sep, value = item.partition("=")
            if not sep:
                msg = f"--env {item!r}: expected NAME=VALUE"
                raise JobSpecError(msg)
            env[name] = value
        data["env"] = env
    if args.command:
        data["command"] = list(args.command)
    return job_from_dict(data, where=args.job or "job")


def _show(status: JobStatus) -> str:
    extra = [f"exit code {status.exit_code}" if status.exit_code else "", status.reason or ""]
    detail = ", ".join(e for e in extra if e)
    return f"{status.job_id} {status.state}" + (f" ({detail})" if detail else "")


def _dry_run_report(
    removed: tuple[str, ...],
    env: Mapping[str, str],
    job_env: Sequence[str],
    dropped_defaults: str | None = None,
) -> str:
    lines = ["# --dry-run: nothing submitted.", *scrub_notes(removed, env)]
    if job_env:
        lines.append(f"# Set by the job: {', '.join(sorted(job_env))}")
    if dropped_defaults is not None:
        lines.append(f"# warning: {dropped_defaults}")
    return "\n".join(lines)


def _exit_code(error: Exception) -> int:
    """The exit code for an error pd-launch raised (see _EXIT_CODES_HELP)."""
    if isinstance(error, JobWaitTimeoutError | JobFailedError):
        return EXIT_JOB_FAILED
    if isinstance(error, SubmissionRejectedError):
        return EXIT_REJECTED
    if isinstance(error, UnknownJobError):
        return EXIT_BAD_INPUT
    if isinstance(error, SubmissionError | SlurmQueryError):
        return EXIT_SLURM_ERROR
    return EXIT_BAD_INPUT


def _submit(job: Any, script_path: str | None) -> Any:
    """submit(), with its DroppedDefaultsWarning printed as one line at once."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DroppedDefaultsWarning)
        try:
            return submit(job, script_path=script_path)
        finally:
            for warning in caught:
                if issubclass(warning.category, DroppedDefaultsWarning):
                    print(f"pd-launch: warning: {warning.message}", file=sys.stderr)
                else:
                    warnings.showwarning(
                        warning.message, warning.category, warning.filename, warning.lineno
                    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0-4, see ``pd-launch --help``)."""
    args = _parser().parse_args(argv)
    try:
        if args.action == "submit":
            job = _job_from_args(args)
            if args.dry_run:
                prepared = prepare_submission(job)
                print(prepared.script, end="")
                print(
                    _dry_run_report(
                        prepared.removed, prepared.env, list(job.env), prepared.dropped_defaults
                    )
                )
                return 0
            submission = _submit(job, args.script_path)
            if submission.warnings:
                print(submission.warnings, file=sys.stderr)
            print(submission.job_id)
            if args.wait is not None:
                status = wait(submission.job_id, timeout=args.wait, check=False)
                print(_show(status))
                return 0 if status.ok else 1
            return 0
        if args.action == "status":
            print(_show(job_status(args.job_id)))
            return 0
        if args.action == "cancel":
            before = cancel(args.job_id)
            print(f"{args.job_id}: cancel requested (was {before.state})")
            return 0
        if args.action == "wait":
            status = wait(args.job_id, timeout=args.timeout, check=False)
            print(_show(status))
            return 0 if status.ok else 1
    except (JobWaitTimeoutError, JobFailedError) as e:
        print(f"pd-launch: {e}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except LaunchError as e:
        print(f"pd-launch: error: {e}", file=sys.stderr)
        return _exit_code(e)
    except OSError as e:  # the script path: exists, or its folder cannot be written
        print(f"pd-launch: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    msg = f"unknown action {args.action!r}"
    raise AssertionError(msg)
