"""``pd-train probe --launcher slurm`` against a real SLURM cluster
(``bash scripts/slurm-test-cluster.sh start``, then export SLURM_CONF). Skips without one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pd_probe import arm_paths
from pd_train.cli import probe as probe_cli

from ._probe import SMALL


def _cluster_problem() -> str | None:
    conf = os.environ.get("SLURM_CONF")
    if not conf or not Path(conf).is_file():
        return "no SLURM test cluster (SLURM_CONF unset or missing)"
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "sbatch/sinfo not on PATH"
    result = subprocess.run(
        ["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, timeout=30
    )
    if result.returncode != 0 or not any(
        s.startswith(("idle", "mixed", "allocated")) for s in result.stdout.split()
    ):
        return f"no usable SLURM node: {result.stdout.strip()} {result.stderr.strip()}"
    return None


@pytest.mark.slurm
@pytest.mark.slow
def test_compile_probe_through_slurm(tmp_path, capsys):
    problem = _cluster_problem()
    if problem is not None:
        if os.environ.get("PD_SLURM_REQUIRED") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(SMALL))
    job = tmp_path / "job.toml"
    job.write_text('name = "probe"\ncommand = ["true"]\ntime = "15:00"\n')
    out = tmp_path / "probe"
    argv = [str(config), "--arms", "baseline", "--out", str(out), "--simulate-devices", "2"]
    code = probe_cli.main([*argv, "--launcher", "slurm", "--slurm-job", str(job)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "| baseline | ok |" in printed
    paths = arm_paths(out, "baseline")
    run = paths.run(1)
    script = (run.dir / "job.sh").read_text()
    assert f"export JAX_COMPILATION_CACHE_DIR={paths.cache_dir}" in script
    record = json.loads(run.record.read_text())
    assert record["cache_dir"] == str(paths.cache_dir)
    assert record["jits"]["train_step"]["first_compile_cache"] == "miss"
    assert record["env"]["PD_PROBE_ARM"] == "baseline"
