"""Tests against a real SLURM cluster (scripts/slurm-test-cluster.sh); all marked ``slurm``.

They skip, with the reason, where no cluster is reachable (SLURM_CONF unset, no sbatch, sinfo
failing), so `pytest tests` passes on a machine without SLURM. Where the cluster must be there
(the nox ``slurm`` session), set PD_SLURM_REQUIRED=1: the run then fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _cluster_problem() -> str | None:
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        return (
            "SLURM_CONF is not set (run `bash scripts/slurm-test-cluster.sh start` and export it)"
        )
    if not Path(conf).is_file():
        return f"SLURM_CONF={conf} does not exist"
    for program in ("sbatch", "squeue", "sacct", "scancel", "salloc", "sinfo"):
        if shutil.which(program) is None:
            return f"{program} is not on PATH"
    try:
        result = subprocess.run(
            ["sinfo", "--noheader", "--format=%T"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 30 s"
    states = result.stdout.split()
    if result.returncode != 0 or not states:
        return f"sinfo failed (exit {result.returncode}): {result.stderr.strip()}"
    if not any(s.startswith(("idle", "mixed", "allocated")) for s in states):
        return f"no usable node (sinfo states: {', '.join(states)})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    if not mine:
        return
    for item in mine:
        item.add_marker(pytest.mark.slurm)
    problem = _cluster_problem()
    if problem is None:
        return
    if os.environ.get("PD_SLURM_REQUIRED") == "1":
        msg = f"PD_SLURM_REQUIRED=1 but the SLURM test cluster is not usable: {problem}"
        raise pytest.UsageError(msg)
    skip = pytest.mark.skip(reason=f"no SLURM test cluster: {problem}")
    for item in mine:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _cancel_leftover_test_jobs() -> Iterator[None]:
    """After each test, cancel its jobs (named pdt-*) that a failure left queued or running."""
    yield
    if shutil.which("squeue") is None or shutil.which("scancel") is None:
        return
    listed = subprocess.run(
        ["squeue", "--noheader", "--format=%i|%j"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    leftovers = [
        line.split("|", 1)[0]
        for line in listed.stdout.splitlines()
        if line.split("|", 1)[-1].startswith("pdt-")
    ]
    if leftovers:
        subprocess.run(["scancel", *leftovers], capture_output=True, timeout=30, check=False)
