"""A resume on another device count says that it is not guaranteed to be bit-exact (issue 30,
item 5): real `pd-train run` processes on 1, then 2 simulated devices, with a real checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pd_train.outputs import earlier_device_count, resume_device_warning

from ._cli import tiny_config, train_losses, write_config


def _run(devices: int, *args: str) -> str:
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pd_train.cli", "run", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stderr


def test_resume_on_another_device_count_warns_that_it_is_not_bit_exact(tmp_path: Path) -> None:
    raw = tiny_config(tmp_path, tmp_path / "cache", steps=4)
    raw["cadence"] = {**raw["cadence"], "save_every": 2, "eval_every": 0}
    config = write_config(tmp_path, raw)
    run_dir = tmp_path / "run"
    err = _run(1, str(config), "--run-dir", str(run_dir), "--max-steps", "2")
    assert "device(s); its last attempt ran on" not in err  # a fresh start: nothing to compare
    assert earlier_device_count(run_dir) == (1, "compile.json")
    assert resume_device_warning(run_dir, 1) is None  # the same count: nothing to say

    err = _run(2, "--resume", str(run_dir))
    assert f"resuming {run_dir} on 2 device(s); its last attempt ran on 1 (compile.json)" in err
    assert "not guaranteed to be bit-exact with one that ran on 1 device(s) throughout" in err
    assert "resume on 1 device(s) for a bit-exact continuation" in err
    # The record of the first attempt was kept aside; the new one says 2.
    assert json.loads((run_dir / "compile-attempt-1.json").read_text())["jax"]["device_count"] == 1
    assert earlier_device_count(run_dir) == (2, "compile.json")
    assert sorted(train_losses(run_dir)) == [0, 1, 2, 3]
