"""Run inside an salloc allocation by test_leaks.py: submit one job twice and report as JSON.

Once through pd-launch (scrubbed environment), once with plain ``sbatch`` and this process's
environment, which carries the allocation's SLURM_* variables. Usage:
``python _in_allocation.py mem|ntasks|gpu|step OUTDIR TAG``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pd_launch import JobSpec, SlurmStepError, render_script, slurm_process, submit, wait

ALLOCATION_VARS = ("SLURM_JOB_ID", "SLURM_MEM_PER_CPU", "SLURM_NTASKS", "SLURM_NPROCS")
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "TMPDIR")


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _both_ways(job: JobSpec, out: Path) -> dict[str, object]:
    submission = submit(job, timeout=30)
    scrubbed = wait(submission.job_id, timeout=60, check=False)

    raw_script = out / f"{job.name}.caller.sh"
    raw_script.write_text(render_script(job))
    sbatch = shutil.which("sbatch")
    assert sbatch is not None
    raw = subprocess.run(
        [sbatch, "--parsable", str(raw_script)],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=30,
        check=True,
    )
    raw_id = raw.stdout.strip().split(";")[0]
    caller = wait(raw_id, timeout=60, check=False)
    return {
        "scrubbed": {
            "state": scrubbed.state,
            "output": _read(out / f"{job.name}-{submission.job_id}.out"),
            "removed": list(submission.removed),
        },
        "caller": {"state": caller.state, "output": _read(out / f"{job.name}-{raw_id}.out")},
    }


def main() -> None:
    mode, out, tag = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    report: dict[str, object] = {"allocation": {k: os.environ.get(k) for k in ALLOCATION_VARS}}
    echo = ["bash", "-c", 'echo "task $SLURM_PROCID of $SLURM_NTASKS"']
    if mode == "mem":
        # The job asks for memory per node; the allocation set SLURM_MEM_PER_CPU.
        job = JobSpec(
            name=f"pdt-mem-{tag}", command=echo, memory="200M", time="2",
            output=str(out / f"pdt-mem-{tag}-%j.out"),
        )  # fmt: skip
        report.update(_both_ways(job, out))
    elif mode == "ntasks":
        # One task by SLURM's default, on a node with room for two; the allocation has -n 2.
        job = JobSpec(
            name=f"pdt-nt-{tag}", command=echo, tasks_per_node=None, time="2",
            extra_directives=("--mincpus=2",), output=str(out / f"pdt-nt-{tag}-%j.out"),
        )  # fmt: skip
        report.update(_both_ways(job, out))
    elif mode == "gpu":
        # The caller's GPU-visibility variables and TMPDIR (set by test_leaks.py as an
        # allocation with GPUs would set them); the job has no GPUs of its own.
        show = " ".join(f"{name}=${{{name}-unset}}" for name in GPU_VARS)
        job = JobSpec(
            name=f"pdt-gpu-{tag}", command=["bash", "-c", f'echo "{show}"'], time="2",
            output=str(out / f"pdt-gpu-{tag}-%j.out"),
        )  # fmt: skip
        report["allocation"].update({k: os.environ.get(k) for k in GPU_VARS})  # type: ignore[attr-defined]
        report.update(_both_ways(job, out))
    elif mode == "step":
        # An salloc shell inherits SLURM_PROCID-like variables but is no step.
        try:
            slurm_process(os.environ)
            report["step_error"] = None
        except SlurmStepError as e:
            report["step_error"] = str(e)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
