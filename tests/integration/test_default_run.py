"""The README's main job, shortened: the embedded default decomposition from the installed wheel."""

import os
import subprocess
import sys
from pathlib import Path


def test_default_run_end_to_end(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
        "JAX_PLATFORMS": "cpu",
    }
    args = [
        sys.executable, "-m", "pd_train.cli", "run",
        "--set", f"output_dir={tmp_path}",
        "--set", "pd.steps=12",
        "--set", "pd.faithfulness_warmup.steps=5",
        "--set", "cadence.train_log_every=4",
        "--set", "cadence.eval_every=12",
        "--set", "cadence.save_every=12",
        "--set", "data.eval_batches=1",
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name.startswith("tiny-default-")]
    summary = (run_dir / "summary.txt").read_text()
    assert summary in proc.stdout
    for words in ("faithfulness", "L0", "ce_clean", "kl_ci", "metrics.jsonl"):
        assert words in summary, words
    assert (run_dir / "checkpoints" / "12").is_dir()
