"""``pd-train probe`` init arms end to end: ``init_stacked`` (the baseline) and
``init_per_array`` train for real, each in its own process and caches, and log bit-identical
losses and gradient norms."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from pd_probe import arm_paths
from pd_train.cli import probe as probe_cli

from ._probe import SMALL


@pytest.mark.slow
def test_steps_probe_init_arms_log_identical_losses(tmp_path, monkeypatch, capsys):
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(SMALL))
    flags = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip())
    out = tmp_path / "probe"
    argv = [str(config), "--mode", "steps", "--max-steps", "2", "--out", str(out)]
    code = probe_cli.main(
        [*argv, "--arms", "init_stacked,init_per_array", "--simulate-devices", "2"]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "- init (init_stacked, init_per_array): identical: 6 loss values" in printed, printed

    def arm_config(name: str) -> dict:
        return json.loads(arm_paths(out, name).config.read_text())

    assert arm_config("init_per_array")["runtime"]["init"] == "per_array"
    assert arm_config("baseline")["runtime"]["init"] == "stacked"
    metrics = arm_paths(out, "init_per_array").run(1).metrics.read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [0, 1]
