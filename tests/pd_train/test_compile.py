"""`pd-train compile`: every jit of a run, lowered on abstract inputs and compiled, with memory."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pd_train.cli import main

from .test_run import tiny_config


def test_compile_reports_every_jit_without_weights_or_data(tmp_path: Path, capsys) -> None:
    config = tiny_config(tmp_path, tmp_path / "cache")
    config["data"]["path"] = None  # compile needs no data, and no weights (random target)
    config["cadence"]["eval_every"] = 4
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    record = tmp_path / "compile.json"
    assert main(["compile", str(path), "--record", str(record)]) == 0
    out = capsys.readouterr().out
    jits = ("init_params", "opt_init", "faithfulness_warmup", "train_step", "eval_metrics")
    for jit in jits:
        assert f"| {jit} |" in out, out
    recorded = json.loads(record.read_text())
    assert set(jits) <= set(recorded["jits"])
    assert recorded["jits"]["train_step"]["memory"]["temp_size_in_bytes"] > 0
    assert not (tmp_path / "runs").exists()
