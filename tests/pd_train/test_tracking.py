"""``pd-train track``: a run's metrics.jsonl mirrored into a W&B run, offline (no network)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pd_train._config_io import ConfigError
from pd_train.analysis.tracking import history, parse_tracking, sync_wandb
from pd_train.cli import main
from pd_train.outputs import read_metrics

from ._analysis_runs import tiny_runs


def test_tracking_config_errors_name_every_field() -> None:
    with pytest.raises(ConfigError) as info:
        parse_tracking(
            {"wandb": {"mode": "sometimes", "tags": ["a", 3], "colour": "red"}, "mlflow": {}}
        )
    paths = [p for p, _ in info.value.problems]
    assert paths == [
        "tracking.mlflow",
        "tracking.wandb.colour",
        "tracking.wandb.project",
        "tracking.wandb.mode",
        "tracking.wandb.tags",
    ]
    assert "must be one of online, offline, disabled" in str(info.value)
    config = parse_tracking({"wandb": {"project": "pd", "mode": "offline", "tags": ["t"]}})
    assert (config.project, config.mode, config.tags, config.entity) == (
        "pd",
        "offline",
        ("t",),
        None,
    )


def _last_values(run_dir: Path) -> dict[str, float]:
    steps, _ = history(read_metrics(run_dir))
    last: dict[str, float] = {}
    for step in sorted(steps):
        last.update(steps[step])
    return last


def test_offline_summary_equals_metrics_and_a_resumed_sync_reuses_the_run(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    runs = tiny_runs(tmp_path_factory)
    run_dir = tmp_path / "run"
    shutil.copytree(runs.uninterrupted, run_dir, ignore=shutil.ignore_patterns("checkpoints"))
    full = (run_dir / "metrics.jsonl").read_text()
    # The run as it was after its first two steps (as if stopped there and resumed later).
    early = [line for line in full.splitlines() if json.loads(line)["step"] < 2]
    (run_dir / "metrics.jsonl").write_text("\n".join(early) + "\n")
    assert (
        main(["track", str(run_dir), "--project", "pd-test", "--mode", "offline", "--tags", "ci"])
        == 0
    )
    state = json.loads((run_dir / "tracking" / "wandb.json").read_text())
    assert state["last_step"] == 1
    first_id = state["run_id"]
    # The run went on: the same W&B run continues from step 2, and its summary is the file's
    # last value of every tracked key.
    (run_dir / "metrics.jsonl").write_text(full)
    config = parse_tracking({"wandb": {"project": "pd-test", "mode": "offline"}})
    result = sync_wandb(run_dir, config)
    assert result.run_id == first_id
    assert result.logged_steps == 2 and result.last_step == 3
    expected = _last_values(run_dir)
    assert {"train/loss/total", "eval/ce_clean", "eval/l0/layers.1.mlp.down_proj"} <= set(expected)
    assert "eval/density/layers.1.mlp.down_proj" not in expected  # vectors stay in the file
    summary = {k: v for k, v in result.summary.items() if not k.startswith(("_", "warmup/"))}
    assert summary == pytest.approx(expected)
    assert result.summary["warmup/loss/faithfulness"] == pytest.approx(
        [r for r in read_metrics(run_dir) if r["phase"] == "warmup"][-1]["loss/faithfulness"]
    )
    assert list((run_dir / "tracking" / "wandb").glob(f"offline-run-*-{first_id}"))
    # Nothing new: nothing logged, same run.
    again = sync_wandb(run_dir, config)
    assert (again.run_id, again.logged_steps) == (first_id, 0)


def test_track_without_settings_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.yaml").write_text("run_name: x\n")
    assert main(["track", str(tmp_path)]) == 2
    assert "give --project" in capsys.readouterr().err
    assert main(["track", str(tmp_path), "--project", "p", "--mode", "loud"]) == 2
    assert "tracking.wandb.mode: got 'loud'" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
