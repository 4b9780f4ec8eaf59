"""`pd-train run` end to end on a tiny random-weights Llama: resume, SIGTERM, cache, HLO dump.

Every run is a fresh `pd-train` process on one CPU device (the sharded step is tested in
test_step.py), and all share one persistent compile cache, so only the first compiles the step;
the HLO-dump run compiles on purpose (it bypasses the cache) and keeps its step small.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pd_train.outputs import read_metrics

TINY_ARCH = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rope_theta": 10000.0,
}


def tiny_config(tmp: Path, cache: Path, **pd_overrides: Any) -> dict[str, Any]:
    tokens = tmp / "tokens.npy"
    if not tokens.exists():
        rng = np.random.default_rng(0)
        np.save(tokens, rng.integers(0, 64, size=20_000, dtype=np.uint16))
    pd = {
        "steps": 8,
        "batch_size": 8,
        "decomposition_targets": [
            {"module_pattern": "layers.*.self_attn.*", "C": 8},
            {"module_pattern": "layers.*.mlp.*", "C": 16},
        ],
        "ci": {"type": "mlp", "hidden_dims": [4]},
        "loss_metrics": [
            {"type": "faithfulness", "coeff": 100.0},
            {"type": "importance_minimality", "coeff": 1e-3, "pnorm_start": 2.0, "pnorm_end": 1.0},
            {"type": "stochastic_recon", "coeff": 1.0},
        ],
        "components": {"lr": 1e-3, "warmup_steps": 2, "final_val_frac": 0.1, "clip": 1.0},
        "ci_fn": {"lr": 1e-3},
        "faithfulness_warmup": {"steps": 3, "lr": 1e-3},
        **pd_overrides,
    }
    return {
        "run_name": "tiny",
        "seed": 3,
        "output_dir": str(tmp / "runs"),
        "target": {"architecture": TINY_ARCH},
        "data": {"path": str(tokens), "seq_len": 16},
        "pd": pd,
        "cadence": {"train_log_every": 1, "save_every": 4, "keep_last_n_checkpoints": 3},
        "runtime": {"compile_cache": {"dir": str(cache)}},
    }


def write_config(tmp: Path, config: dict[str, Any], name: str = "config.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(config))
    return path


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss/total"] for r in read_metrics(run_dir) if r["phase"] == "train"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compile-cache")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Path:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    config = write_config(tmp, tiny_config(tmp, cache))
    run_dir = tmp / "run"
    _finish(_cli("run", str(config), "--run-dir", str(run_dir)))
    return run_dir


ONE_DEVICE = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pd_train.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **ONE_DEVICE},
    )


def _finish(proc: subprocess.Popen[str], timeout: float = 600) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"pd-train did not finish in {timeout} s: {out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    return out


def test_run_writes_every_output(uninterrupted: Path) -> None:
    run_dir = uninterrupted
    for name in ("config.yaml", "metrics.jsonl", "compile.json", "summary.txt"):
        assert (run_dir / name).is_file(), name
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == [
        "4",
        "8",
    ]
    assert list((run_dir / "plots").glob("*.png"))
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(8))
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if r["phase"] == "warmup"] == [-3, -2, -1]
    assert all(np.isfinite(v) for v in losses.values())


def test_second_launch_hits_the_compile_cache(
    uninterrupted: Path, tmp_path: Path, cache: Path
) -> None:
    config = write_config(tmp_path, tiny_config(tmp_path, cache))
    run_dir = tmp_path / "again"
    _finish(_cli("run", str(config), "--run-dir", str(run_dir), "--max-steps", "1"))
    record = json.loads((run_dir / "compile.json").read_text())
    step = record["jits"]["train_step"]["compiles"]
    assert step and all(c["cache"] == "hit" for c in step), step
    first = json.loads((uninterrupted / "compile.json").read_text())
    assert any(c["cache"] == "miss" for c in first["jits"]["train_step"]["compiles"])


def test_sigterm_saves_and_resume_continues_bit_exactly(
    uninterrupted: Path, tmp_path: Path, cache: Path
) -> None:
    # SIGTERM as soon as the run has started (its handler is installed before the run dir is
    # written): the run must finish its next step, save it, and exit 0.
    config = write_config(tmp_path, tiny_config(tmp_path, cache, steps=8))
    run_dir = tmp_path / "run"
    proc = _cli("run", str(config), "--run-dir", str(run_dir))
    deadline = time.time() + 240
    while not (run_dir / "config.yaml").exists():
        if proc.poll() is not None:
            pytest.fail(f"run ended before SIGTERM: {proc.communicate()[0][-3000:]}")
        assert time.time() < deadline, "run did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _finish(proc)
    saved = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and saved[-1] < 8, saved
    assert train_losses(run_dir) == {
        s: v for s, v in train_losses(uninterrupted).items() if s < saved[-1]
    }

    _finish(_cli("run", "--resume", str(run_dir)))
    assert train_losses(run_dir) == train_losses(uninterrupted)


def test_hlo_dump_writes_files_only_when_on(
    uninterrupted: Path, tmp_path: Path, cache: Path
) -> None:
    assert not (uninterrupted / "hlo").exists()
    config = tiny_config(
        tmp_path,
        cache,
        steps=1,
        faithfulness_warmup={"steps": 0},
        loss_metrics=[{"type": "faithfulness", "coeff": 1.0}],
    )
    config["runtime"]["launch_env"] = {"profile": {"hlo_dump": True}}
    config["cadence"]["save_every"] = 0
    path = write_config(tmp_path, config)
    run_dir = tmp_path / "dump"
    # XLA reads the dump flags once, when the backend starts: a fresh process.
    _finish(_cli("run", str(path), "--run-dir", str(run_dir)))
    dumped = [p.name for p in (run_dir / "hlo").iterdir()]
    assert any("train_step" in name for name in dumped), dumped[:10]
    record = json.loads((run_dir / "compile.json").read_text())
    assert record["cache_dir"] is None  # the dump run bypasses the persistent cache
