"""Two tiny real runs shared by the analysis and report tests (made once per pytest session).

The built-in tiny Llama (it has a vocabulary) with three of its sites decomposed, 4 steps,
checkpoints at 2 and 4: ``uninterrupted`` runs straight through; ``resumed`` stops after step 2
(``--max-steps 2``) and is continued with ``--resume``. Each run is a ``pd-train`` process on one
CPU device sharing one compile cache; the runs are kept under pytest's base temp dir, so a
second test module reuses them.
"""

from __future__ import annotations

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
    root = tmp_path_factory.getbasetemp() / "analysis-runs"
    runs = Runs(root / "uninterrupted", root / "resumed", root / "config.yaml")
    if (root / "done").exists():
        return runs
    root.mkdir(exist_ok=True)
    config = {**CONFIG, "output_dir": str(root / "out")}
    # Unoptimized XLA code compiles about twice as fast; both runs and the analysis share it.
    config["runtime"] = {
        "compile_cache": {"dir": str(root / "cache")},
        "compiler_options": {"xla_backend_optimization_level": 0},
    }
    runs.config.write_text(yaml.safe_dump(config))
    _pd_train("run", str(runs.config), "--run-dir", str(runs.uninterrupted))
    _pd_train("run", str(runs.config), "--run-dir", str(runs.resumed), "--max-steps", "2")
    _pd_train("run", "--resume", str(runs.resumed))
    (root / "done").touch()
    return runs
