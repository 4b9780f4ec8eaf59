"""The pd-launch command line against the real test cluster."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pd_launch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _name() -> str:
    return f"pdt-cli-{uuid.uuid4().hex[:8]}"


def test_submit_wait_status(tmp_path: Path) -> None:
    out = str(tmp_path / "%j.out")
    ok = _cli("submit", "--name", _name(), "--time", "2", "--output", out, "--wait", "60",
              "--", "echo", "hi")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    job_id, final = ok.stdout.splitlines()
    assert final == f"{job_id} COMPLETED (exit code 0:0)"
    assert (tmp_path / f"{job_id}.out").read_text() == "hi\n"
    status = _cli("status", job_id)
    assert status.returncode == 0 and status.stdout.startswith(f"{job_id} COMPLETED")

    failed = _cli("submit", "--name", _name(), "--time", "2", "--output", out, "--wait", "60",
                  "--", "false")  # fmt: skip
    assert failed.returncode == 1
    assert failed.stdout.splitlines()[-1].endswith("FAILED (exit code 1:0, NonZeroExitCode)")


def test_cancel_then_wait_reports_cancelled(tmp_path: Path) -> None:
    held = _cli("submit", "--name", _name(), "--time", "2", "--directive=--hold",
                "--output", str(tmp_path / "o"), "--", "true")  # fmt: skip
    assert held.returncode == 0, held.stderr
    job_id = held.stdout.strip()
    cancelled = _cli("cancel", job_id)
    assert cancelled.returncode == 0
    assert cancelled.stdout.strip() == f"{job_id}: cancel requested (was PENDING)"
    waited = _cli("wait", job_id, "--timeout", "60")
    assert waited.returncode == 1
    assert waited.stdout.startswith(f"{job_id} CANCELLED")


def test_rejection_exit_code_and_message() -> None:
    # A rejection by sbatch exits 3; bad input that pd-launch refuses itself exits 2.
    rejected = _cli("submit", "--name", _name(), "--partition", "nosuch", "--", "true")
    assert rejected.returncode == 3
    assert "invalid partition specified: nosuch" in rejected.stderr
    assert rejected.stdout == ""
    too_long = _cli("submit", "--name", _name(), "--partition", "short", "--time", "5",
                    "--", "true")  # fmt: skip
    assert too_long.returncode == 3
    assert "Requested time limit is invalid" in too_long.stderr
    bad = _cli("submit", "--name", _name(), "--time", "5h", "--", "true")
    assert bad.returncode == 2
    assert "time='5h' is not a SLURM time limit" in bad.stderr
