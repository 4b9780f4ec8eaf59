"""Submitting from inside an allocation: pd-launch's job runs as asked, the caller's does not.

Each test runs _in_allocation.py inside a real `salloc`, which submits the same job twice: once
through pd-launch and once with plain sbatch and the allocation's environment (to show that
path really fails, so the pd-launch result means something).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from pd_launch import scrub_environment

HELPER = Path(__file__).with_name("_in_allocation.py")


def _in_salloc(
    salloc_args: list[str], mode: str, out: Path, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    result = subprocess.run(
        ["salloc", "--immediate=30", "--time=3", "--job-name=pdt-salloc", *salloc_args,
         sys.executable, str(HELPER), mode, str(out), uuid.uuid4().hex[:8]],
        capture_output=True,
        text=True,
        # salloc itself starts from a clean environment, whatever runs this test.
        env={**scrub_environment(dict(os.environ)).env, **(extra_env or {})},
        timeout=180,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_mem_job_inside_mem_per_cpu_allocation(tmp_path: Path) -> None:
    report = _in_salloc(["--ntasks=1", "--mem-per-cpu=100"], "mem", tmp_path)
    assert report["allocation"]["SLURM_MEM_PER_CPU"] == "100"

    assert report["scrubbed"]["state"] == "COMPLETED"
    assert report["scrubbed"]["output"] == "task 0 of 1\n"
    assert "SLURM_MEM_PER_CPU" in report["scrubbed"]["removed"]
    assert "SLURM_JOB_ID" in report["scrubbed"]["removed"]

    assert report["caller"]["state"] == "FAILED"
    assert "are mutually exclusive" in report["caller"]["output"]


def test_one_task_job_inside_two_task_allocation(tmp_path: Path) -> None:
    report = _in_salloc(["--ntasks=2"], "ntasks", tmp_path)
    assert report["allocation"]["SLURM_NTASKS"] == "2"

    assert report["scrubbed"]["state"] == "COMPLETED"
    assert report["scrubbed"]["output"] == "task 0 of 1\n"
    assert "SLURM_NTASKS" in report["scrubbed"]["removed"]

    # The caller's -n 2 leaks in: srun silently starts two tasks of a one-task job.
    assert report["caller"]["state"] == "COMPLETED"
    assert sorted(report["caller"]["output"].splitlines()) == ["task 0 of 2", "task 1 of 2"]


def test_salloc_shell_is_not_a_step(tmp_path: Path) -> None:
    report = _in_salloc(["--ntasks=2"], "step", tmp_path)
    assert report["allocation"]["SLURM_NTASKS"] == "2"
    assert report["step_error"] is not None
    assert "SLURM_STEP_ID is not set" in report["step_error"]


def test_gpu_visibility_and_tmpdir_of_the_allocation_stay_behind(tmp_path: Path) -> None:
    # What an allocation with GPUs and a per-job scratch directory hands its processes.
    caller_tmp = tmp_path / "slurm-caller-tmp"
    caller_tmp.mkdir()
    given = {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "ROCR_VISIBLE_DEVICES": "0,1",
        "HIP_VISIBLE_DEVICES": "0,1",
        "TMPDIR": str(caller_tmp),
    }
    report = _in_salloc(["--ntasks=1"], "gpu", tmp_path, extra_env=given)
    assert report["allocation"]["SLURM_JOB_ID"] and report["allocation"]["TMPDIR"] == str(
        caller_tmp
    )

    # pd-launch: the new job has no GPU of its own, so none is visible; slurmstepd gives it
    # its own TMPDIR (/tmp, the default when none is set).
    assert report["scrubbed"]["state"] == "COMPLETED"
    assert report["scrubbed"]["output"] == (
        "CUDA_VISIBLE_DEVICES=unset ROCR_VISIBLE_DEVICES=unset HIP_VISIBLE_DEVICES=unset "
        "TMPDIR=/tmp\n"
    )
    assert set(given) <= set(report["scrubbed"]["removed"])

    # Plain sbatch from the same shell: the caller's devices and scratch dir reach the job.
    assert report["caller"]["output"] == (
        "CUDA_VISIBLE_DEVICES=0,1 ROCR_VISIBLE_DEVICES=0,1 HIP_VISIBLE_DEVICES=0,1 "
        f"TMPDIR={caller_tmp}\n"
    )
