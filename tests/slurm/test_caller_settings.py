"""Issue 30, item 6, on the real test cluster: the caller's SQUEUE_*/SCANCEL_*/SACCT_* settings,
SBATCH_* variables in a job's env or in the caller's environment, strings at the kernel's exec
limit, GPU visibility outside an allocation, an unreadable SLURM_CONF.

Each case also runs the plain SLURM command the same way, to show the failure is real.
(GPU visibility and TMPDIR inside an allocation: tests/slurm/test_leaks.py.)
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pd_launch import (
    DroppedDefaultsWarning,
    JobSpec,
    JobSpecError,
    JobWaitTimeoutError,
    SlurmConfigError,
    SubmissionError,
    UnknownPartitionError,
    cancel,
    job_status,
    render_script,
    submit,
    wait,
)

WAIT = 60

# A user's squeue/scancel/sacct defaults that filter the job pd-launch asks about out.
QUERY_SETTINGS = {
    "SQUEUE_USERS": "nobody",
    "SQUEUE_PARTITION": "short",
    "SQUEUE_NAMES": "someone-else",
    "SCANCEL_PARTITION": "short",
    "SCANCEL_NAME": "someone-else",
    "SACCT_FEDERATION": "1",
}


def _name(kind: str) -> str:
    return f"pdt-{kind}-{uuid.uuid4().hex[:8]}"


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=120, check=False
    )  # fmt: skip


def _squeue(job_id: str, fmt: str, env: dict[str, str] | None = None) -> str:
    """squeue's line for the job (as plain squeue run with ``env`` answers)."""
    return _run(
        ["squeue", "--noheader", "--states=all", f"--jobs={job_id}", f"--format={fmt}"], env
    ).stdout.strip()


def _running(name: str, tmp_path: Path) -> str:
    """Submit a job that sleeps and wait until it runs; its id."""
    job = JobSpec(name=name, command=["sleep", "60"], time="2", output=str(tmp_path / "o"))
    job_id = submit(job).job_id
    deadline = time.monotonic() + WAIT
    while job_status(job_id).state != "RUNNING":
        assert time.monotonic() < deadline, job_status(job_id)
        time.sleep(0.5)
    return job_id


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "pd_launch", *args], env)


# ------------------------------------------------------------------ queries and cancels
def test_query_settings_neither_hide_a_running_job_nor_spare_it(tmp_path: Path) -> None:
    job_id = _running(_name("qry"), tmp_path)
    user = {**os.environ, **QUERY_SETTINGS}

    # Plain squeue with the user's settings does not list the running job ...
    assert _squeue(job_id, "%i|%T", user) == ""
    assert _squeue(job_id, "%i|%T") == f"{job_id}|RUNNING"
    # ... pd-launch's status and wait still see it.
    assert job_status(job_id, env=user).state == "RUNNING"
    with pytest.raises(JobWaitTimeoutError, match="still RUNNING after 1"):
        wait(job_id, timeout=1, poll=0.5, env=user)
    status = _cli("status", job_id, env=user)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"{job_id} RUNNING")

    # Plain scancel with them exits 0 and cancels nothing.
    plain = _run(["scancel", job_id], user)
    assert plain.returncode == 0 and plain.stderr == ""
    time.sleep(2)
    assert _squeue(job_id, "%T") == "RUNNING"
    # pd-launch's cancel really cancels.
    assert cancel(job_id, env=user).state == "RUNNING"
    assert wait(job_id, timeout=WAIT, check=False, env=user).state == "CANCELLED"


def test_cli_cancel_and_wait_with_query_settings(tmp_path: Path) -> None:
    user = {**os.environ, **QUERY_SETTINGS}
    held = _cli("submit", "--name", _name("qcli"), "--time", "2", "--directive=--hold",
                "--output", str(tmp_path / "o"), "--", "true", env=user)  # fmt: skip
    assert held.returncode == 0, held.stderr
    job_id = held.stdout.strip()
    cancelled = _cli("cancel", job_id, env=user)
    assert cancelled.stdout.strip() == f"{job_id}: cancel requested (was PENDING)"
    waited = _cli("wait", job_id, "--timeout", "60", env=user)
    assert waited.returncode == 1 and waited.stdout.startswith(f"{job_id} CANCELLED")

    done = _cli("submit", "--name", _name("qcli"), "--time", "2", "--wait", "60",
                "--output", str(tmp_path / "o2"), "--", "true", env=user)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].endswith("COMPLETED (exit code 0:0)")


def _wrapped_sbatch(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose `sbatch` runs the real one, then misbehaves as ``body`` says."""
    real = shutil.which("sbatch")
    assert real is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "sbatch"
    wrapper.write_text(f"#!/bin/sh\n{body.format(real=real)}\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_a_lost_submission_is_cancelled_despite_query_settings(tmp_path: Path) -> None:
    # sbatch submits, then hangs: pd-launch must find the job by its comment and cancel it.
    env = {**_wrapped_sbatch(tmp_path, '{real} "$@"\nexec sleep 60'), **QUERY_SETTINGS}
    name = _name("lostq")
    job = JobSpec(name=name, command=["sleep", "30"], time="2", output=str(tmp_path / "o"))
    with pytest.raises(SubmissionError, match=r"did not answer within 3 s.*; cancelled job [0-9]+"):
        submit(job, env=env, timeout=3)
    listed = _run(["squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i"])
    (job_id,) = listed.stdout.split()
    assert wait(job_id, timeout=WAIT, check=False).state == "CANCELLED"


# ------------------------------------------------------------------ SBATCH_* variables
def test_sbatch_variables_override_the_script_so_env_may_not_set_them(tmp_path: Path) -> None:
    name = _name("ovr")
    job = JobSpec(name=name, command=["true"], time="2", extra_directives=["--hold"])
    script = tmp_path / "job.sh"
    script.write_text(render_script(job))
    # What a job.env of {SBATCH_JOB_NAME, SBATCH_TIMELIMIT} used to hand sbatch.
    hijacked = {**os.environ, "SBATCH_JOB_NAME": "pdt-hijacked", "SBATCH_TIMELIMIT": "1"}
    result = _run(["sbatch", "--parsable", str(script)], hijacked)
    job_id = result.stdout.strip().split(";")[0]
    try:
        assert _squeue(job_id, "%j|%l") == "pdt-hijacked|1:00"
    finally:
        _run(["scancel", job_id])
    for variable in ("SBATCH_JOB_NAME", "SBATCH_TIMELIMIT", "SBATCH_PARTITION", "SBATCH_EXPORT"):
        with pytest.raises(JobSpecError, match=f"env key '{variable}' is sbatch's variable"):
            JobSpec(name=name, command=["true"], env={variable: "x"})


def test_dropped_sbatch_defaults_are_named_and_can_be_kept(tmp_path: Path) -> None:
    site = {"SBATCH_ACCOUNT": "pdtacct", "SBATCH_RESERVATION": "maint", "SBATCH_TIMELIMIT": "1"}
    user = {**os.environ, **site}
    job = JobSpec(name=_name("dflt"), command=["true"], time="2", output=str(tmp_path / "o"))

    # Plain sbatch uses the defaults: this cluster has no reservation 'maint'.
    script = tmp_path / "job.sh"
    script.write_text(render_script(job))
    plain = _run(["sbatch", "--parsable", str(script)], user)
    assert plain.returncode == 1 and "Requested reservation is invalid" in plain.stderr

    with pytest.warns(DroppedDefaultsWarning) as caught:
        submission = submit(job, env=user)
    assert [str(w.message) for w in caught] == [
        "the caller's sbatch defaults SBATCH_ACCOUNT='pdtacct', SBATCH_RESERVATION='maint' are "
        "not passed on (pd-launch submits without SBATCH_* variables, which would override the "
        "job's own #SBATCH lines); to keep them, set account='pdtacct' and add "
        "'--reservation=maint' to extra_directives in the job"
    ]
    assert submission.dropped_defaults == str(caught[0].message)
    assert wait(submission.job_id, timeout=WAIT).state == "COMPLETED"

    # Following the advice for the account keeps it (the reservation does not exist here).
    kept = JobSpec(name=_name("dflt"), command=["true"], time="2", account="pdtacct",
                   output=str(tmp_path / "o"), extra_directives=["--hold"])  # fmt: skip
    job_id = submit(kept, env={**os.environ, "SBATCH_ACCOUNT": "pdtacct"}).job_id
    assert _squeue(job_id, "%a") == "pdtacct"
    cancel(job_id)

    # The warning comes before sbatch runs: a rejected job still tells.
    rejected = JobSpec(name=_name("dflt"), command=["true"], partition="nosuch")
    with pytest.warns(DroppedDefaultsWarning), pytest.raises(UnknownPartitionError):
        submit(rejected, env=user)


def test_cli_prints_the_dropped_defaults_in_one_line(tmp_path: Path) -> None:
    user = {**os.environ, "SBATCH_QOS": "normal"}
    result = _cli("submit", "--name", _name("dcli"), "--time", "2", "--wait", "60",
                  "--output", str(tmp_path / "o"), "--", "true", env=user)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "pd-launch: warning: the caller's sbatch defaults SBATCH_QOS='normal' are not passed on "
        "(pd-launch submits without SBATCH_* variables, which would override the job's own "
        "#SBATCH lines); to keep them, add '--qos=normal' to extra_directives in the job"
    ]


# ------------------------------------------------------------------ the exec string limit
def _placeholder_job(name: str, tmp_path: Path, **fields: object) -> JobSpec:
    return JobSpec(name=name, time="2", output=str(tmp_path / f"{name}-%j.out"), **fields)  # type: ignore[arg-type]


def test_the_longest_argument_runs_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    name = _name("arg")
    longest = "x" * 131071
    job = _placeholder_job(name, tmp_path, command=["bash", "-c", 'echo "${#0}"', longest])
    job_id = submit(job).job_id
    assert wait(job_id, timeout=WAIT).state == "COMPLETED"
    assert (tmp_path / f"{name}-{job_id}.out").read_text() == "131071\n"

    with pytest.raises(JobSpecError, match=r"command\[3\]=.* is 131072 bytes"):
        _placeholder_job(name, tmp_path, command=["bash", "-c", 'echo "${#0}"', longest + "x"])
    # What such a job did before: sbatch accepts it and it fails at its srun.
    script = tmp_path / "job.sh"
    script.write_text(render_script(job).replace(longest, longest + "x"))
    raw_id = _run(["sbatch", "--parsable", str(script)]).stdout.strip()
    assert wait(raw_id, timeout=WAIT, check=False).state == "FAILED"
    assert "Argument list too long" in (tmp_path / f"{name}-{raw_id}.out").read_text()


def test_the_longest_env_string_runs_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    name = _name("envlen")
    longest = "y" * (131071 - len("AB="))
    job = _placeholder_job(name, tmp_path, command=["bash", "-c", 'echo "${#AB}"'],
                           env={"AB": longest})  # fmt: skip
    job_id = submit(job).job_id
    assert wait(job_id, timeout=WAIT).state == "COMPLETED"
    assert (tmp_path / f"{name}-{job_id}.out").read_text() == f"{len(longest)}\n"
    with pytest.raises(JobSpecError, match=r"env\['AB'\]=.*AB=VALUE is 131072 bytes"):
        _placeholder_job(name, tmp_path, command=["true"], env={"AB": longest + "y"})


# ------------------------------------------------------------------ GPU visibility outside a job
def test_gpu_visibility_of_a_login_shell_is_kept(tmp_path: Path) -> None:
    name = _name("gpuk")
    user = {**os.environ, "CUDA_VISIBLE_DEVICES": "3"}
    user.pop("SLURM_JOB_ID", None)
    job = _placeholder_job(name, tmp_path, command=["bash", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'])
    job_id = submit(job, env=user).job_id
    assert wait(job_id, timeout=WAIT).state == "COMPLETED"
    assert (tmp_path / f"{name}-{job_id}.out").read_text() == "3\n"


# ------------------------------------------------------------------ SLURM_CONF
def test_unreadable_slurm_conf_fails_at_once(tmp_path: Path) -> None:
    name = _name("conf")
    env = {**os.environ, "SLURM_CONF": "/nonexistent/slurm.conf"}
    job = JobSpec(name=name, command=["true"], time="2")
    script = tmp_path / "job.sh"
    start = time.monotonic()
    with pytest.raises(SlurmConfigError, match=r"SLURM_CONF='/nonexistent/slurm\.conf' does not"):
        submit(job, env=env, script_path=script)
    with pytest.raises(SlurmConfigError):
        job_status(1, env=env)
    result = _cli("submit", "--name", name, "--", "true", env=env)
    assert result.returncode == 2 and "does not exist" in result.stderr
    assert time.monotonic() - start < 10  # squeue alone retries for ~60 s before failing
    assert not script.exists()
