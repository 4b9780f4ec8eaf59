"""Talking to SLURM: submit with a scrubbed environment, query state, wait, cancel."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import time
import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from pd_launch._defaults import dropped_defaults_warning
from pd_launch._env import ScrubbedEnvironment, query_environment, scrub_environment
from pd_launch._errors import (
    DroppedDefaultsWarning,
    JobFailedError,
    JobWaitTimeoutError,
    SlurmConfigError,
    SlurmNotFoundError,
    SlurmQueryError,
    SubmissionError,
    SubmissionRejectedError,
    UnknownJobError,
    UnknownPartitionError,
)
from pd_launch._job import JobSpec, render_script
from pd_launch._status import FINAL_STATES, JobStatus


@attrs.frozen(kw_only=True)
class PreparedSubmission:
    """Everything a submission would use, computed without talking to SLURM (``--dry-run``).

    Attributes:
        script: the sbatch script text.
        env: the environment sbatch would run with.
        removed: names scrubbed from the caller's environment, sorted.
        dropped_defaults: one line naming the caller's ``SBATCH_*`` defaults that the scrub
            drops and how to keep them through the job's fields; None if there are none.
    """

    script: str
    env: Mapping[str, str] = attrs.field(hash=False)
    removed: tuple[str, ...]
    dropped_defaults: str | None = None


@attrs.frozen(kw_only=True)
class Submission:
    """A job SLURM accepted.

    Attributes:
        job_id: the id sbatch returned.
        cluster: the cluster name when sbatch reported one (federations), else None.
        script_path: where the script was written, if a path was given.
        removed: names scrubbed from the caller's environment, sorted.
        warnings: whatever sbatch wrote to stderr while accepting the job.
        dropped_defaults: as in :class:`PreparedSubmission` (also issued as a
            :class:`DroppedDefaultsWarning`).
    """

    job_id: str
    cluster: str | None
    script_path: Path | None
    removed: tuple[str, ...]
    warnings: str = ""
    dropped_defaults: str | None = None


def prepare_submission(job: JobSpec, *, env: Mapping[str, str] | None = None) -> PreparedSubmission:
    """The script and scrubbed environment :func:`submit` would use, touching nothing."""
    caller = os.environ if env is None else env
    scrubbed: ScrubbedEnvironment = scrub_environment(caller, overrides=job.env)
    return PreparedSubmission(
        script=render_script(job),
        env=scrubbed.env,
        removed=scrubbed.removed,
        dropped_defaults=dropped_defaults_warning(job, scrubbed.removed, caller),
    )


def check_slurm_conf(env: Mapping[str, str]) -> None:
    """Raise :class:`SlurmConfigError` if ``env`` sets SLURM_CONF to a file that cannot be read.

    SLURM's clients retry an unreadable SLURM_CONF for about a minute (squeue) or more before
    they fail; this says so at once. An unset SLURM_CONF is left to SLURM (its default path, or
    a configless cluster).
    """
    conf = env.get("SLURM_CONF")
    if conf is None:
        return
    problem = None
    if not conf:
        problem = "is empty"
    elif not os.path.exists(conf):
        problem = "does not exist"
    elif not os.path.isfile(conf):
        problem = "is not a file"
    elif not os.access(conf, os.R_OK):
        problem = "is not readable"
    if problem is not None:
        msg = (
            f"SLURM_CONF={conf!r} {problem}; SLURM's commands would retry it for a minute or "
            "more and then fail: point SLURM_CONF at the cluster's slurm.conf, or unset it to "
            "use SLURM's default"
        )
        raise SlurmConfigError(msg)


def _which(program: str, env: Mapping[str, str]) -> str:
    path = env.get("PATH", os.defpath)
    found = shutil.which(program, path=path)
    if found is None:
        msg = (
            f"{program} is not on PATH ({path}); pd-launch drives SLURM through its client "
            "commands: run it on a login node, or install slurm-client and set SLURM_CONF"
        )
        raise SlurmNotFoundError(msg)
    return found


def _run(
    argv: Sequence[str], env: Mapping[str, str], *, timeout: float, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a SLURM client command (already resolved on PATH); raises TimeoutExpired."""
    # Never the caller's terminal: a SLURM command that asks (scancel -i) gets no answer.
    return subprocess.run(
        list(argv),
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=timeout,
        check=False,
    )


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a new file ``path``: complete or not at all; never over a file."""
    if path.exists():
        msg = f"script_path={str(path)!r} already exists; pd-launch never overwrites a script"
        raise FileExistsError(msg)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o755)
        # link() fails if ``path`` appeared meanwhile, where replace() would overwrite it.
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # a file system without hard links
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def submit(
    job: JobSpec,
    *,
    env: Mapping[str, str] | None = None,
    script_path: str | os.PathLike[str] | None = None,
    timeout: float = 60.0,
) -> Submission:
    """Submit ``job`` with ``sbatch --parsable`` from a scrubbed copy of ``env``.

    The caller's SLURM_*, SBATCH_*, SRUN_*, SALLOC_*, PMI_*, PMIX_* and other launchers' rank
    variables are removed, and inside a SLURM job also its GPU-visibility variables and TMPDIR
    (see :func:`scrub_environment`; SLURM_CONF and the job's own ``env`` stay), so a submission
    from inside an allocation behaves like one from a login shell.

    Warns:
        DroppedDefaultsWarning: before sbatch runs, when the caller's SBATCH_* defaults
            (SBATCH_ACCOUNT, SBATCH_QOS, ...) that the job does not set itself were dropped;
            one line, saying how to keep each through the job's fields.

    Args:
        job: the job description.
        env: the caller's environment; defaults to ``os.environ``. Not modified.
        script_path: write the script here (a new file, written atomically) and submit that
            file; None pipes the script to sbatch. The file is removed if sbatch rejects the job.
        timeout: seconds to wait for sbatch.

    Raises:
        SlurmNotFoundError: no sbatch on PATH.
        SlurmConfigError: SLURM_CONF names a file that cannot be read.
        UnknownPartitionError: the partition does not exist (carries sbatch's message).
        SubmissionRejectedError: sbatch refused the job (carries its message).
        SubmissionError: sbatch rejected the job or did not answer (carries its message). No job
            is left that could run: after a rejection or a lost answer, any job carrying this
            submission's comment is cancelled unless SLURM already ended it (the message says
            which).
        FileExistsError: ``script_path`` already exists.
    """
    prepared = prepare_submission(job, env=env)
    sbatch = _which("sbatch", prepared.env)
    check_slurm_conf(prepared.env)
    if prepared.dropped_defaults is not None:
        # Before sbatch runs: a site that needs the dropped account or QOS rejects the job.
        warnings.warn(prepared.dropped_defaults, DroppedDefaultsWarning, stacklevel=2)
    # A token to find the job by if sbatch's answer is lost (timeout, unreadable output).
    token = f"pd-launch-{uuid.uuid4().hex}"
    argv = [sbatch, "--parsable", f"--comment={token}"]
    path = None if script_path is None else Path(script_path)
    if path is not None:
        _write_atomically(path, prepared.script)
        argv.append(str(path))
    accepted = False
    try:
        try:
            result = _run(
                argv,
                prepared.env,
                timeout=timeout,
                stdin=None if path is not None else prepared.script,
            )
        except subprocess.TimeoutExpired as e:
            cleanup = _settle_by_token(token, job.name, prepared.env) or "no job was created"
            msg = f"sbatch did not answer within {timeout} s for job {job.name!r}; {cleanup}"
            raise SubmissionError(msg) from e
        stderr = result.stderr.strip()
        if result.returncode != 0:
            msg = f"sbatch rejected job {job.name!r} (exit {result.returncode}): {stderr}"
            # Some rejections still leave a record (22.05: FAILED, reason BadConstraints).
            cleanup = _settle_by_token(token, job.name, prepared.env)
            if cleanup:
                msg = f"{msg}\n({cleanup})"
            error = (
                UnknownPartitionError
                if "invalid partition" in stderr.lower()
                else SubmissionRejectedError
            )
            raise error(msg, stderr=stderr, returncode=result.returncode)
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        job_id, _, cluster = (lines[-1].strip() if lines else "").partition(";")
        if not job_id.isdigit():
            cleanup = _settle_by_token(token, job.name, prepared.env) or "no job was created"
            msg = (
                f"sbatch exited 0 for job {job.name!r} without a job id "
                f"(stdout {result.stdout!r}, stderr {stderr!r}); {cleanup}"
            )
            raise SubmissionError(msg, stderr=stderr, returncode=0)
        accepted = True
    finally:
        if path is not None and not accepted:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return Submission(
        job_id=job_id,
        cluster=cluster or None,
        script_path=path,
        removed=prepared.removed,
        warnings=stderr,
        dropped_defaults=prepared.dropped_defaults,
    )


def _settle_by_token(token: str, name: str, env: Mapping[str, str]) -> str:
    """Cancel any job carrying ``token`` as its comment that could still run; say what it found.

    Returns "" when SLURM holds no such job.
    """
    env = query_environment(env)
    try:
        squeue = _which("squeue", env)
        scancel = _which("scancel", env)
        listed = _run([squeue, "--noheader", "--states=all", "--format=%i|%T|%k"], env, timeout=30)
        if listed.returncode != 0:
            return f"could not check for a created job ({listed.stderr.strip()}); comment {token}"
        jobs = [
            (fields[0].strip(), fields[1].strip())
            for fields in (line.split("|", 2) for line in listed.stdout.splitlines())
            if len(fields) == 3 and fields[2].strip() == token
        ]
        live = [job_id for job_id, state in jobs if state not in FINAL_STATES]
        if live:
            _run([scancel, *live], env, timeout=30)
        notes = [
            f"cancelled job {job_id}"
            if job_id in live
            else f"SLURM recorded job {job_id} as {state}; it will not run"
            for job_id, state in jobs
        ]
        return "; ".join(notes)
    except (SlurmNotFoundError, OSError, subprocess.TimeoutExpired) as e:
        return f"could not check for a created job ({e}); look for comment {token}"


def _query_env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    query_env = query_environment(os.environ if env is None else env)
    check_slurm_conf(query_env)
    return query_env


def _wait_status(raw: str) -> str | None:
    """squeue's exit code is a raw wait status (256 = exit 1); say it as sacct does, "1:0"."""
    if not raw.isdigit():
        return raw or None
    status = int(raw)
    return f"{status >> 8}:{status & 0x7F}"


def _from_squeue(job_id: str, env: Mapping[str, str], timeout: float) -> JobStatus | None:
    squeue = _which("squeue", env)
    result = _run(
        [
            squeue,
            "--noheader",
            "--states=all",
            f"--jobs={job_id}",
            "--Format=JobID:|,State:|,exit_code:|,Reason:",
        ],
        env,
        timeout=timeout,
    )
    if result.returncode != 0:
        # A job the controller no longer holds (older than MinJobAge) is an error here.
        if "invalid job id" in result.stderr.lower():
            return None
        msg = f"squeue failed for job {job_id} (exit {result.returncode}): {result.stderr.strip()}"
        raise SlurmQueryError(msg)
    for line in result.stdout.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) >= 4 and fields[0] == job_id:
            return JobStatus(
                job_id=job_id,
                state=fields[1],
                exit_code=_wait_status(fields[2]),
                reason=None if fields[3] in ("", "None") else fields[3],
                source="squeue",
            )
    return None


def _from_sacct(job_id: str, env: Mapping[str, str], timeout: float) -> JobStatus | None:
    sacct = _which("sacct", env)
    fields = ["--noheader", "--parsable2", "--allocations", f"--jobs={job_id}"]
    fields.append("--format=JobID,State,ExitCode,Reason")
    result = _run([sacct, *fields], env, timeout=timeout)
    if result.returncode != 0 and "accounting storage is disabled" in result.stderr.lower():
        # No slurmdbd: read the job completion log instead (JobCompType=jobcomp/filetxt).
        result = _run([sacct, "--completion", *fields], env, timeout=timeout)
    if result.returncode != 0:
        msg = f"sacct failed for job {job_id} (exit {result.returncode}): {result.stderr.strip()}"
        raise SlurmQueryError(msg)
    found = None
    # A requeued job has one record per run; the last one is current.
    for line in result.stdout.splitlines():
        parts = line.split("|")
        if len(parts) >= 3 and parts[0].strip() == job_id:
            found = parts
    if found is None:
        return None
    reason = found[3].strip() if len(found) > 3 else ""
    return JobStatus(
        job_id=job_id,
        # sacct says "CANCELLED by 0".
        state=found[1].strip().split(" ", 1)[0],
        exit_code=found[2].strip() or None,
        reason=None if reason in ("", "None") else reason,
        source="sacct",
    )


def job_status(
    job_id: str | int, *, env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> JobStatus:
    """The job's current state: from squeue while the controller holds it, then from sacct.

    The queries run without the caller's SQUEUE_*/SACCT_* settings (see
    :data:`QUERY_PREFIXES`), which would otherwise filter the job out.

    Raises:
        UnknownJobError: neither squeue nor sacct knows the job.
        SlurmQueryError: a query failed.
        SlurmNotFoundError: squeue or sacct is not on PATH.
        SlurmConfigError: SLURM_CONF names a file that cannot be read.
    """
    job_id = str(job_id)
    query_env = _query_env(env)
    try:
        status = _from_squeue(job_id, query_env, timeout)
        if status is None:
            status = _from_sacct(job_id, query_env, timeout)
    except subprocess.TimeoutExpired as e:
        msg = f"SLURM did not answer about job {job_id} within {timeout} s: {e.cmd}"
        raise SlurmQueryError(msg) from e
    if status is None:
        msg = f"job {job_id} is unknown to squeue and sacct"
        raise UnknownJobError(msg)
    return status


def wait(
    job_id: str | int,
    *,
    timeout: float,
    check: bool = True,
    poll: float = 5.0,
    env: Mapping[str, str] | None = None,
) -> JobStatus:
    """Wait until the job has ended for good and return its final status.

    Polls quickly at first (0.25 s) and then every ``poll`` seconds.

    Args:
        job_id: the job to wait for.
        timeout: seconds to wait at most (required: a wait must end).
        check: raise :class:`JobFailedError` unless the job ended COMPLETED.
        poll: the longest pause between two queries.
        env: the caller's environment for the queries; defaults to ``os.environ``.

    Raises:
        JobWaitTimeoutError: the job had not ended after ``timeout`` seconds (it keeps running;
            cancel it if you do not want it).
        JobFailedError: ``check`` and the job ended CANCELLED, FAILED, TIMEOUT, NODE_FAIL,
            OUT_OF_MEMORY or any other state but COMPLETED.
    """
    check_seconds("timeout", timeout)
    check_seconds("poll", poll)
    deadline = time.monotonic() + timeout
    pause = 0.25
    status: JobStatus | None = None
    while True:
        status = job_status(job_id, env=env)
        if status.final:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            msg = f"job {job_id} still {status.state} after {timeout} s"
            raise JobWaitTimeoutError(msg, status=status)
        time.sleep(min(pause, left))
        pause = min(pause * 2, poll)
    if check and not status.ok:
        detail = ", ".join(
            f"{k} {v}" for k, v in (("exit code", status.exit_code), ("reason", status.reason)) if v
        )
        msg = f"job {job_id} ended {status.state}, not COMPLETED" + (
            f" ({detail})" if detail else ""
        )
        raise JobFailedError(msg, status=status)
    return status


def check_seconds(name: str, value: object) -> float:
    """``value`` if it is a finite number of seconds >= 0; else a ValueError naming ``name``.

    A NaN timeout would make :func:`wait` poll forever (no comparison with NaN is true).
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        msg = f"{name}={value!r} must be a finite number of seconds >= 0"
        raise ValueError(msg)
    return float(value)


def cancel(
    job_id: str | int, *, env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> JobStatus:
    """Ask SLURM to cancel the job; returns its status as seen just before.

    A job that has already ended is left alone. Use :func:`wait` to see its final state. scancel
    runs without the caller's SCANCEL_* settings (a SCANCEL_NAME or SCANCEL_PARTITION the job
    does not match would make it cancel nothing and still exit 0).

    Raises:
        UnknownJobError: the job is unknown.
        SlurmQueryError: scancel reported an error.
    """
    job_id = str(job_id)
    status = job_status(job_id, env=env, timeout=timeout)
    if status.final:
        return status
    query_env = _query_env(env)
    scancel = _which("scancel", query_env)
    try:
        result = _run([scancel, job_id], query_env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        msg = f"scancel did not answer within {timeout} s for job {job_id}"
        raise SlurmQueryError(msg) from e
    # scancel exits 0 on some errors, so its stderr is checked too.
    if result.returncode != 0 or "error" in result.stderr.lower():
        msg = f"scancel failed for job {job_id} (exit {result.returncode}): {result.stderr.strip()}"
        raise SlurmQueryError(msg)
    return status
