"""`pd-train compile`: every jit of a run, lowered on abstract inputs and compiled, with memory."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pd_train.cli import main


def test_compile_reports_every_jit_without_weights_or_data(
    tiny_run_config: dict, tmp_path: Path, capsys
) -> None:
    config = tiny_run_config
    config["data"]["path"] = None  # compile needs no data, and no weights (random target)
    config["cadence"]["eval_every"] = 4
    config["cadence"]["slow_eval_every"] = 8  # the slow eval is a jit of its own
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    record = tmp_path / "compile.json"
    assert main(["compile", str(path), "--record", str(record)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    jits = (
        "init_params",
        "opt_init",
        "faithfulness_warmup",
        "train_step",
        "eval_metrics",
        "slow_eval_metrics",
    )
    for jit in jits:
        assert f"| {jit} |" in out, out
    recorded = json.loads(record.read_text())
    assert set(jits) <= set(recorded["jits"])
    assert recorded["jits"]["train_step"]["memory"]["temp_size_in_bytes"] > 0
    assert not (tmp_path / "runs").exists()

    # Progress while it runs: a line per jit, each compile with its cache outcome; a second
    # compile of the same config loads every jit from the persistent cache, and says so.
    assert main(["compile", str(path)]) == 0
    again = capsys.readouterr()
    assert "[1/" in again.err and "lowering train_step…" in again.err, again.err
    assert "compiling train_step (cache hit)… " in again.err, again.err
    rows = {
        line.split("|")[1].strip(): line.split("|")[4].strip()
        for line in again.out.splitlines()
        if line.startswith("| ") and "---" not in line
    }
    assert rows["train_step"] == "hit" and rows["eval_metrics"] == "hit", again.out
    assert f"{len(jits)} of {len(jits)} jits loaded from the compile cache" in again.out
    assert "compiling train_step (cache " in captured.err  # the first announced its jits too
