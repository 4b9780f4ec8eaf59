"""The pd-launch command line, without a cluster: dry runs and errors before any sbatch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pd_launch import JobSpec, SlurmNotFoundError, prepare_submission, submit

# What a shell inside `salloc --mem-per-cpu=100 -n 2` carries, among other things.
LEAKY = {
    "SLURM_JOB_ID": "41",
    "SLURM_NTASKS": "2",
    "SLURM_MEM_PER_CPU": "100",
    "SBATCH_TIMELIMIT": "5",
    "PMIX_RANK": "0",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    return subprocess.run(
        [sys.executable, "-m", "pd_launch", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=60,
        check=False,
    )


def test_dry_run_prints_script_and_removed_variables() -> None:
    result = _cli(
        "submit", "--dry-run", "--name", "demo", "--time", "10", "--mem", "1G",
        "--env", "PD_RUN=demo", "--", "python", "-c", "print('hi there')",
        env=LEAKY,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    expected_script = (
        "#!/bin/bash\n"
        "#SBATCH --job-name=demo\n"
        "#SBATCH --nodes=1\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --mem=1G\n"
        "#SBATCH --time=10\n"
        "#SBATCH --no-requeue\n"
        "#SBATCH --open-mode=append\n"
        "\n"
        "set -eu\n"
        "export PD_RUN=demo\n"
        "exec srun --kill-on-bad-exit=1 python -c 'print('\"'\"'hi there'\"'\"')'\n"
    )
    assert result.stdout.startswith(expected_script)
    report = result.stdout[len(expected_script) :]
    assert report == (
        "# --dry-run: nothing submitted.\n"
        "# sbatch would run without these 5 caller variables:\n"
        "#   PMIX_RANK\n"
        "#   SBATCH_TIMELIMIT\n"
        "#   SLURM_JOB_ID\n"
        "#   SLURM_MEM_PER_CPU\n"
        "#   SLURM_NTASKS\n"
        "# Kept: SLURM_CONF\n"
        "# Set by the job: PD_RUN\n"
    )


def test_dry_run_from_a_job_file_with_overrides(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "fromfile"\ncommand = ["true"]\ntime = "5"\npartition = "debug"\n')
    result = _cli("submit", "--dry-run", "--job", str(job), "--time", "2:00:00", "--requeue")
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --job-name=fromfile\n" in result.stdout
    assert "#SBATCH --time=2:00:00\n" in result.stdout
    assert "#SBATCH --partition=debug\n" in result.stdout
    assert "#SBATCH --requeue\n" in result.stdout
    assert "# No caller variables would be removed.\n" in result.stdout


def test_dry_run_needs_no_sbatch() -> None:
    result = _cli("submit", "--dry-run", "--name", "x", "--", "true", env={"PATH": "/nonexistent"})
    assert result.returncode == 0, result.stderr


def test_malformed_time_is_a_clear_error() -> None:
    result = _cli("submit", "--dry-run", "--name", "x", "--time", "2h", "--", "true")
    assert result.returncode == 2
    assert "time='2h' is not a SLURM time limit; use one of MM, MM:SS, HH:MM:SS" in result.stderr
    assert result.stdout == ""


def test_no_sbatch_on_path_cli(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    result = _cli(
        "submit", "--name", "x", "--script-path", str(script), "--", "true",
        env={"PATH": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2
    assert f"sbatch is not on PATH ({tmp_path})" in result.stderr
    assert not script.exists()


def test_no_sbatch_on_path_api(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    job = JobSpec(name="x", command=["true"])
    with pytest.raises(SlurmNotFoundError, match="install slurm-client"):
        submit(job, env={"PATH": str(tmp_path)}, script_path=script)
    assert list(tmp_path.iterdir()) == []


def test_prepare_submission_keeps_job_env_and_conf() -> None:
    job = JobSpec(name="x", command=["true"], env={"SLURM_CPU_BIND": "none"})
    prepared = prepare_submission(job, env={**LEAKY, "SLURM_CPU_BIND": "map_cpu:0"})
    assert prepared.env["SLURM_CPU_BIND"] == "none"
    assert prepared.env["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert "SLURM_CPU_BIND" not in prepared.removed
    assert "SLURM_NTASKS" in prepared.removed and "SLURM_NTASKS" not in prepared.env


def test_wait_needs_a_timeout() -> None:
    result = _cli("wait", "12")
    assert result.returncode == 2
    assert "--timeout" in result.stderr
