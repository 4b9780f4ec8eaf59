"""slurm_process() in the tasks of a real step, and refusing a batch script's environment."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from pd_launch import JobSpec, submit, wait

REPORT = (
    "import attrs, json, os\n"
    "from pd_launch import slurm_process\n"
    "print(json.dumps(attrs.asdict(slurm_process(os.environ))))\n"
)

CHECK_BATCH = (
    "import os\n"
    "from pd_launch import SlurmStepError, slurm_process\n"
    "assert os.environ['SLURM_PROCID'] == '0' and os.environ['SLURM_NTASKS'] == '2'\n"
    "try:\n"
    "    slurm_process(os.environ)\n"
    "    print('accepted')\n"
    "except SlurmStepError as e:\n"
    "    print('refused:', e)\n"
)


def test_each_task_of_a_two_task_step(tmp_path: Path) -> None:
    name = f"pdt-step-{uuid.uuid4().hex[:8]}"
    job = JobSpec(
        name=name, command=[sys.executable, "-c", REPORT], tasks_per_node=2, time="2",
        output=str(tmp_path / "%x-%j.out"),
    )  # fmt: skip
    job_id = submit(job).job_id
    wait(job_id, timeout=60)
    lines = (tmp_path / f"{name}-{job_id}.out").read_text().splitlines()
    processes = sorted((json.loads(line) for line in lines), key=lambda p: p["process_id"])
    assert [p["process_id"] for p in processes] == [0, 1]
    assert [p["local_process_id"] for p in processes] == [0, 1]
    assert {p["num_processes"] for p in processes} == {2}
    assert {p["local_process_count"] for p in processes} == {2}
    assert {p["job_id"] for p in processes} == {job_id}
    (address,) = {p["coordinator_address"] for p in processes}
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True)
    assert address.startswith(host.stdout.strip() + ":")


def test_batch_script_of_a_two_task_job_is_refused(tmp_path: Path) -> None:
    # Plain sbatch --wrap runs the command in the batch script itself, outside any step, where
    # SLURM_PROCID=0 and SLURM_NTASKS=2 are set.
    out = tmp_path / "batch.out"
    script = tmp_path / "check.py"
    script.write_text(CHECK_BATCH)
    result = subprocess.run(
        ["sbatch", "--parsable", "--ntasks=2", "--time=2", f"--output={out}",
         f"--wrap={sys.executable} {script}"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    wait(result.stdout.strip().split(";")[0], timeout=60)
    assert out.read_text().startswith("refused: SLURM_STEP_ID is not set")
