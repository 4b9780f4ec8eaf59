"""Two tiny real runs shared by the analysis and report tests (made once per pytest session).

The built-in tiny Llama (it has a vocabulary) with three of its sites decomposed, 4 steps,
checkpoints at 2 and 4: ``uninterrupted`` runs straight through; ``resumed`` stops after step 2
(``--max-steps 2``) and is continued with ``--resume``. Each run is a ``pd-train`` process on one
CPU device sharing one compile cache. They are made once per pytest session: under
pytest-xdist the first worker that needs them makes them in the workers' common base temp dir
(the parent of each worker's own) under a file lock, and every worker copies them into its own
base temp dir, where each test module finds them.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ._cli import _cli, _finish

CONFIG = {
    "run_name": "analysis",
    "seed": 5,
    "target": {"checkpoint": "builtin:tiny_llama"},
    "data": {
        "path": "builtin:tiny_corpus",
        "eval_path": "builtin:tiny_corpus_val",
        "seq_len": 16,
        "eval_batches": 1,
    },
    "pd": {
        "steps": 4,
        "batch_size": 8,
        "decomposition_targets": [
            {"module_pattern": "layers.1.self_attn.q_proj", "C": 8},
            {"module_pattern": "layers.[01].mlp.down_proj", "C": 16},
        ],
        "ci": {"type": "mlp", "hidden_dims": [4]},
        "loss_metrics": [
            {"type": "faithfulness", "coeff": 1000.0},
            {"type": "importance_minimality", "coeff": 3e-4, "pnorm_start": 2.0, "pnorm_end": 1.0},
            {"type": "stochastic_recon", "coeff": 1.0},
        ],
        "components": {"lr": 2e-3, "warmup_steps": 1, "final_val_frac": 0.1, "clip": 1.0},
        "ci_fn": {"lr": 2e-3},
        "faithfulness_warmup": {"steps": 2, "lr": 3e-3},
        "l0_threshold": 0.1,
    },
    "cadence": {
        "train_log_every": 1,
        "eval_every": 2,
        "slow_eval_every": 4,  # the recon metrics at step 4 only (test_analysis_run)
        "save_every": 2,
        "keep_last_n_checkpoints": 3,
    },
}


@dataclass(frozen=True)
class Runs:
    uninterrupted: Path
    resumed: Path
    config: Path


def _pd_train(*args: str) -> None:
    _finish(_cli(*args))


def tiny_runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The runs in this process's base temp dir (a copy of the session's, under xdist)."""
    root = tmp_path_factory.getbasetemp() / "analysis-runs"
    runs = Runs(root / "uninterrupted", root / "resumed", root / "config.yaml")
    if (root / "done").exists():
        return runs
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        _make(root)
        return runs
    shared = tmp_path_factory.getbasetemp().parent / "analysis-runs"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (shared / "done").exists():
            _make(shared)
    # The run dirs only (their configs name the shared compile cache, which no test reads).
    shutil.copytree(shared, root, ignore=shutil.ignore_patterns("cache"))
    return runs


def _make(root: Path) -> None:
    root.mkdir(exist_ok=True)
    config = {**CONFIG, "output_dir": str(root / "out")}
    # Unoptimized XLA code compiles about twice as fast; both runs and the analysis share it.
    config["runtime"] = {
        "compile_cache": {"dir": str(root / "cache")},
        "compiler_options": {"xla_backend_optimization_level": 0},
    }
    config_path = root / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    uninterrupted, resumed = root / "uninterrupted", root / "resumed"
    _pd_train("run", str(config_path), "--run-dir", str(uninterrupted))
    _pd_train("run", str(config_path), "--run-dir", str(resumed), "--max-steps", "2")
    _pd_train("run", "--resume", str(resumed))
    (root / "done").touch()
