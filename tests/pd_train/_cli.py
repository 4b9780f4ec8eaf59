"""Running `pd-train` on a tiny YAML config: in a subprocess (`_cli`, `_finish`) or in-process
(`_refused`: a refused command writes nothing).

`tiny_config(tmp, cache)` is the tiny run every CLI test starts from: a two-layer random-weights
Llama (`TINY_ARCH`), 20 000 random tokens, 8 steps, a checkpoint every 4.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pd_train.cli import main
from pd_train.outputs import read_metrics

from ._tiny import FAST

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
        # Unoptimized XLA code (the same HLO) compiles about twice as fast on CPU.
        "runtime": {
            "compile_cache": {"dir": str(cache)},
            "compiler_options": dict(FAST),
        },
    }


def write_config(tmp: Path, config: dict[str, Any], name: str = "config.yaml") -> Path:
    path = tmp / name
    path.write_text(yaml.safe_dump(config))
    return path


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss/total"] for r in read_metrics(run_dir) if r["phase"] == "train"}


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


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def _config(tmp: Path, **top: Any) -> Path:
    raw = tiny_config(tmp, tmp / "cache")
    raw.update(top)
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _refused(tmp: Path, capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> str:
    before = _snapshot(tmp)
    assert main(argv) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err
    assert "Traceback" not in err
    assert _snapshot(tmp) == before  # nothing written
    assert not (tmp / "runs").exists()
    return err
