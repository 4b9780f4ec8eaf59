"""Submission, state, wait and cancel against the real test cluster."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import uuid
from pathlib import Path

import pytest

from pd_launch import (
    JobFailedError,
    JobSpec,
    JobStatus,
    JobWaitTimeoutError,
    SlurmQueryError,
    SubmissionError,
    UnknownPartitionError,
    cancel,
    job_status,
    render_script,
    submit,
    wait,
)
from pd_launch._slurm import _from_sacct

WAIT = 60  # seconds; every job here takes one or two


def _name(kind: str) -> str:
    return f"pdt-{kind}-{uuid.uuid4().hex[:8]}"


def _jobs_named(name: str) -> list[str]:
    """'id|STATE' of every job the controller holds with this name."""
    result = subprocess.run(
        ["squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i|%T"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.split()


def test_trivial_job_completes(tmp_path: Path) -> None:
    name = _name("ok")
    job = JobSpec(
        name=name,
        command=["bash", "-c", 'echo "hello $GREETING from task $SLURM_PROCID of $SLURM_NTASKS"'],
        time="2",
        memory="100M",
        output=str(tmp_path / "%x-%j.out"),
        env={"GREETING": "pd launch"},
    )
    script = tmp_path / "job.sh"
    submission = submit(job, script_path=script)
    assert script.read_text() == render_script(job)
    assert submission.job_id.isdigit()

    status = wait(submission.job_id, timeout=WAIT)
    assert status.state == "COMPLETED" and status.ok and status.final
    assert status.exit_code == "0:0"
    log = (tmp_path / f"{name}-{submission.job_id}.out").read_text()
    assert log == "hello pd launch from task 0 of 1\n"

    # The same answer from the job completion log that sacct reads without slurmdbd.
    from_sacct = _from_sacct(submission.job_id, dict(os.environ), 30)
    assert from_sacct is not None
    assert (from_sacct.state, from_sacct.exit_code, from_sacct.source) == (
        "COMPLETED",
        "0:0",
        "sacct",
    )


def test_output_is_appended(tmp_path: Path) -> None:
    log = tmp_path / "shared.out"
    log.write_text("earlier attempt\n")
    job = JobSpec(name=_name("app"), command=["echo", "later"], time="2", output=str(log))
    wait(submit(job).job_id, timeout=WAIT)
    assert log.read_text() == "earlier attempt\nlater\n"


def test_failed_job_is_not_success(tmp_path: Path) -> None:
    job = JobSpec(name=_name("fail"), command=["false"], time="2", output=str(tmp_path / "o"))
    job_id = submit(job).job_id
    with pytest.raises(JobFailedError, match=f"job {job_id} ended FAILED, not COMPLETED") as info:
        wait(job_id, timeout=WAIT)
    assert info.value.status.state == "FAILED"
    assert info.value.status.exit_code == "1:0"
    status = wait(job_id, timeout=WAIT, check=False)
    assert not status.ok and status.final


def test_cancelled_pending_job_is_not_success(tmp_path: Path) -> None:
    # Held, so it stays PENDING until cancelled and never runs.
    job = JobSpec(
        name=_name("cxl"), command=["true"], time="2",
        output=str(tmp_path / "o"), extra_directives=("--hold",),
    )  # fmt: skip
    job_id = submit(job).job_id
    assert job_status(job_id).state == "PENDING"
    with pytest.raises(JobWaitTimeoutError, match="still PENDING after 1"):
        wait(job_id, timeout=1, poll=0.5)

    before = cancel(job_id)
    assert before.state == "PENDING"
    with pytest.raises(JobFailedError, match="ended CANCELLED, not COMPLETED") as info:
        wait(job_id, timeout=WAIT)
    final: JobStatus = info.value.status
    assert final.state == "CANCELLED" and not final.ok
    # Its exit code alone looks like success: only the state tells.
    assert final.exit_code in (None, "0:0")
    from_sacct = _from_sacct(job_id, dict(os.environ), 30)
    assert from_sacct is not None
    assert (from_sacct.state, from_sacct.exit_code) == ("CANCELLED", "0:0")
    assert not (tmp_path / "o").exists()

    # Cancelling a job that has ended changes nothing and says how it ended.
    assert cancel(job_id).state == "CANCELLED"


def test_unknown_job() -> None:
    with pytest.raises(SlurmQueryError, match="job 999999 is unknown to squeue and sacct"):
        job_status(999999)
    with pytest.raises(SlurmQueryError, match="unknown"):
        cancel(999999)


def test_unknown_partition_carries_sbatchs_message(tmp_path: Path) -> None:
    name = _name("part")
    job = JobSpec(name=name, command=["true"], partition="nosuch", time="2")
    script = tmp_path / "job.sh"
    with pytest.raises(UnknownPartitionError) as info:
        submit(job, script_path=script)
    assert "invalid partition specified: nosuch" in info.value.stderr
    assert "Invalid partition name specified" in str(info.value)
    assert f"sbatch rejected job {name!r}" in str(info.value)
    assert info.value.returncode == 1
    assert not script.exists()
    assert list(tmp_path.iterdir()) == []
    assert _jobs_named(name) == []


@pytest.mark.parametrize(
    ("fields", "sbatch_says"),
    [
        ({"partition": "short", "time": "5"}, "Requested time limit is invalid"),
        ({"nodes": 2}, "Node count specification invalid"),
    ],
)
def test_rejected_submission_carries_sbatchs_message(
    tmp_path: Path, fields: dict[str, object], sbatch_says: str
) -> None:
    name = _name("rej")
    job = JobSpec(name=name, command=["true"], **fields)  # type: ignore[arg-type]
    script = tmp_path / "job.sh"
    with pytest.raises(SubmissionError, match=sbatch_says) as info:
        submit(job, script_path=script)
    assert not isinstance(info.value, UnknownPartitionError)
    assert sbatch_says in info.value.stderr
    assert not script.exists()
    assert _jobs_named(name) == []


def test_rejection_that_leaves_a_record_is_reported(tmp_path: Path) -> None:
    # SLURM 22.05 rejects a request no node can satisfy but keeps a FAILED record of it.
    name = _name("rejrec")
    job = JobSpec(name=name, command=["true"], memory="999999G")
    script = tmp_path / "job.sh"
    with pytest.raises(SubmissionError, match="Memory specification can not be satisfied") as info:
        submit(job, script_path=script)
    assert not script.exists()
    records = _jobs_named(name)
    if not records:
        assert "recorded" not in str(info.value)
    for record in records:
        job_id, state = record.split("|")
        assert state == "FAILED"
        assert f"SLURM recorded job {job_id} as FAILED; it will not run" in str(info.value)


def test_existing_script_is_never_overwritten(tmp_path: Path) -> None:
    name = _name("exist")
    script = tmp_path / "job.sh"
    script.write_text("precious\n")
    with pytest.raises(FileExistsError, match="never overwrites"):
        submit(JobSpec(name=name, command=["true"]), script_path=script)
    assert script.read_text() == "precious\n"
    assert _jobs_named(name) == []


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


def test_lost_answer_cancels_the_job_it_created(tmp_path: Path) -> None:
    # sbatch submits, then hangs: the job exists but its id never arrives.
    env = _wrapped_sbatch(tmp_path, '{real} "$@"\nexec sleep 60')
    name = _name("lost")
    job = JobSpec(name=name, command=["sleep", "30"], time="2", output=str(tmp_path / "o"))
    with pytest.raises(
        SubmissionError, match=r"did not answer within 3 s for job .*; cancelled job [0-9]+"
    ):
        submit(job, env=env, timeout=3)
    (entry,) = _jobs_named(name)
    job_id = entry.split("|")[0]
    assert wait(job_id, timeout=WAIT, check=False).state == "CANCELLED"


def test_unreadable_answer_cancels_the_job_it_created(tmp_path: Path) -> None:
    env = _wrapped_sbatch(tmp_path, '{real} "$@" >/dev/null\necho "Submitted, probably"')
    name = _name("garble")
    job = JobSpec(name=name, command=["sleep", "30"], time="2", output=str(tmp_path / "o"))
    with pytest.raises(SubmissionError, match=r"without a job id.*; cancelled job [0-9]+"):
        submit(job, env=env)
    (entry,) = _jobs_named(name)
    assert wait(entry.split("|")[0], timeout=WAIT, check=False).state == "CANCELLED"
