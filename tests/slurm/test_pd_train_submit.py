"""``pd-train submit`` against the real test cluster, and pd-train's multi-process path.

The multi-process test runs two SLURM tasks of 2 simulated CPU devices each (4 global devices,
``--distributed slurm``, gloo collectives) with a mesh whose data axis of 4 spans both
processes, so the ZeRO-1 shards of masters and Adam moments live half in each process. Its
losses must match one process with 4 simulated devices. Without ``jax.distributed`` each task
would see only its own 2 devices and the 4-wide mesh could not be built: the job would fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_launch import cancel, job_status, wait

WAIT = 420  # seconds for a job: a tiny run compiles and runs in well under a minute
RUN = 300  # seconds for the single-process reference run

# The shipped tiny Llama (4 layers, d_model 64) with one decomposed kind, short sequences, a few
# steps, no eval: the step's compile dominates, and this keeps it small.
TINY: dict[str, Any] = {
    "run_name": "pdt-submit",
    "output_dir": "runs",
    "target": {"checkpoint": "builtin:tiny_llama"},
    "data": {"path": "builtin:tiny_corpus", "seq_len": 16},
    "pd": {
        "steps": 3,
        "batch_size": 4,
        "decomposition_targets": [{"module_pattern": "layers.*.mlp.down_proj", "C": 8}],
        "loss_metrics": [
            {"type": "faithfulness", "coeff": 1.0},
            {"type": "importance_minimality", "coeff": 1e-3},
            {"type": "stochastic_recon", "coeff": 1.0},
        ],
        "components": {"lr": 1e-3},
        "ci_fn": {"lr": 1e-3},
    },
    "cadence": {"train_log_every": 1, "eval_every": 0},
    "runtime": {"compile_cache": {"enabled": False}},
    "launch": {"time": "10", "signal": None, "requeue": False},
}


def _cpu_env(devices: int) -> dict[str, str]:
    return {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    }


def _write_config(path: Path, **sections: Any) -> Path:
    raw = {**TINY, **sections}
    raw["run_name"] = f"pdt-submit-{uuid.uuid4().hex[:8]}"
    path.write_text(yaml.safe_dump(raw))
    return path


def _pd_train(args: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-m", "pd_train.cli", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _train_losses(run_dir: Path) -> dict[int, dict[str, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        r["step"]: {k: v for k, v in r.items() if k.startswith("loss/")}
        for r in records
        if r["phase"] == "train"
    }


def _submitted_job(run_dir: Path) -> str | None:
    path = run_dir / "submission.json"
    return json.loads(path.read_text())["job_id"] if path.is_file() else None


def _cancel_quietly(job_id: str | None) -> None:
    if job_id is None:
        return
    try:
        if not job_status(job_id).final:
            cancel(job_id)
    except Exception:  # the test's own failure is the one to report
        pass


@pytest.mark.slow
def test_submit_runs_to_completion(tmp_path: Path) -> None:
    config = _write_config(tmp_path / "tiny.yaml", launch={**TINY["launch"], "env": _cpu_env(2)})
    run_dir = tmp_path / "run"
    try:
        result = _pd_train(
            ["submit", str(config), "--run-dir", str(run_dir), "--wait", "--timeout", str(WAIT)],
            cwd=tmp_path,
            timeout=WAIT + 60,
        )
    finally:
        _cancel_quietly(_submitted_job(run_dir))
    log = run_dir / "logs"
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n" + "\n".join(
        p.read_text() for p in log.glob("*.out")
    )
    job_id = _submitted_job(run_dir)
    assert f"job {job_id} ended COMPLETED" in result.stdout
    assert job_status(job_id).state == "COMPLETED"

    assert (run_dir / "logs" / f"slurm-{job_id}.out").is_file()
    steps = sorted(_train_losses(run_dir))
    assert steps == [0, 1, 2]
    assert (run_dir / "checkpoints" / "3").is_dir()
    assert (run_dir / "summary.txt").is_file()
    for name in ("config.yaml", "code.json", "job.sh", "submission.json"):
        assert (run_dir / name).is_file(), name


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_task_job_matches_one_process_with_the_same_devices(tmp_path: Path) -> None:
    mesh = {"runtime": {**TINY["runtime"], "mesh": {"data": 4}}}
    launch = {**TINY["launch"], "tasks_per_node": 2, "env": _cpu_env(2)}
    config = _write_config(tmp_path / "tiny.yaml", launch=launch, **mesh)
    multi, single = tmp_path / "two-processes", tmp_path / "one-process"

    submitted = _pd_train(
        ["submit", str(config), "--run-dir", str(multi)], cwd=tmp_path, timeout=60
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = _submitted_job(multi)
    try:
        # The reference runs here while the job runs on the cluster.
        reference = _pd_train(
            ["run", str(config), "--run-dir", str(single)],
            cwd=tmp_path,
            timeout=RUN,
            env=_cpu_env(4),
        )
        assert reference.returncode == 0, reference.stderr
        status = wait(job_id, timeout=WAIT, check=False)
    finally:
        _cancel_quietly(job_id)
    log = (multi / "logs" / f"slurm-{job_id}.out").read_text()
    assert status.state == "COMPLETED", log

    recorded = json.loads((multi / "compile.json").read_text())["jax"]
    assert (recorded["process_count"], recorded["device_count"]) == (2, 4)
    assert (multi / "checkpoints" / "3").is_dir()

    ours, theirs = _train_losses(multi), _train_losses(single)
    assert sorted(ours) == sorted(theirs) == [0, 1, 2]
    for step in ours:
        assert ours[step].keys() == theirs[step].keys()
        for name, value in ours[step].items():
            assert abs(value - theirs[step][name]) <= 1e-5, (step, name, value, theirs[step][name])
