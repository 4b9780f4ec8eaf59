"""``pd-train track`` and ``pd-train run`` with ``tracking:``: a run's metrics.jsonl mirrored
into a W&B run, offline (no network)."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def test_another_tracker_gets_a_message_about_it_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tracking: {mlflow: {}}` used to get a line about a missing wandb section beside it."""
    with pytest.raises(ConfigError) as info:
        parse_tracking({"mlflow": {}})
    assert [p for p, _ in info.value.problems] == ["tracking.mlflow"]
    assert "unknown tracker; pd-train mirrors metrics.jsonl into Weights & Biases only" in str(
        info.value
    )
    from ._analysis_runs import CONFIG

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({**CONFIG, "tracking": {"mlflow": {"uri": "x"}}}))
    assert main(["config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "tracking.mlflow: unknown tracker" in err and "wandb:" not in err.split("(")[0], err
    assert "tracking.wandb" not in err, err


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


def test_run_config_tracking_errors_name_the_field() -> None:
    from pd_train.run_config import load_config

    from ._analysis_runs import CONFIG

    bad = {**CONFIG, "tracking": {"wandb": {"project": "", "mode": "loud"}}}
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert [p for p, _ in info.value.problems] == [
        "tracking.wandb.project",
        "tracking.wandb.mode",
    ]
    config, _ = load_config({**CONFIG, "tracking": {"wandb": {"project": "p", "mode": "offline"}}})
    assert config.tracking == {"wandb": {"project": "p", "mode": "offline"}}
    assert load_config(CONFIG)[0].tracking is None


def _wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of an offline ``run-ID.wandb`` file: a 7-byte header, then
    LevelDB-log framing (32 KiB blocks; chunks with a 7-byte header of crc, length, type:
    1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb  # type: ignore[import-not-found,unused-ignore]

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block  # block padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def _offline_summary(run_dir: Path, run_id: str) -> tuple[int, dict[str, Any]]:
    """(number of offline attempts, the summary of the W&B run ``run_id`` over all of them)."""
    attempts = sorted((run_dir / "tracking" / "wandb").glob(f"offline-run-*-{run_id}"))
    summary: dict[str, Any] = {}
    for attempt in attempts:
        for record in _wandb_records(attempt / f"run-{run_id}.wandb"):
            if record.WhichOneof("record_type") != "summary":
                continue
            for item in record.summary.update:
                key = item.key or "/".join(item.nested_key)
                summary[key] = json.loads(item.value_json)
    return len(attempts), summary


@pytest.mark.slow
def test_run_with_offline_tracking_logs_metrics_and_a_resume_continues_the_run(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3-step ``pd-train run`` with ``tracking: {wandb: {mode: offline}}``: stopped after 2
    steps, then resumed; the same W&B run continues and its summary is metrics.jsonl's last
    value of every tracked key."""
    pytest.importorskip("wandb")
    import yaml

    from ._analysis_runs import CONFIG, _pd_train

    monkeypatch.setenv("WANDB_SILENT", "true")
    config = {
        **CONFIG,
        "output_dir": str(tmp_path / "out"),
        "pd": {**CONFIG["pd"], "steps": 3},  # type: ignore[dict-item]
        "cadence": {"train_log_every": 1, "eval_every": 3, "save_every": 2},
        "runtime": {
            "compile_cache": {"dir": str(tmp_path_factory.getbasetemp() / "tracking-cache")},
            "compiler_options": {"xla_backend_optimization_level": 0},
        },
        "tracking": {"wandb": {"project": "pd-test", "mode": "offline", "tags": ["ci"]}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    run_dir = tmp_path / "run"
    _pd_train("run", str(tmp_path / "config.yaml"), "--run-dir", str(run_dir), "--max-steps", "2")
    state = json.loads((run_dir / "tracking" / "wandb.json").read_text())
    assert state["last_step"] == 1
    run_id = state["run_id"]
    n, first = _offline_summary(run_dir, run_id)
    assert n == 1
    assert first["train/loss/total"] == pytest.approx(
        [r for r in read_metrics(run_dir) if r["phase"] == "train"][-1]["loss/total"]
    )

    _pd_train("run", "--resume", str(run_dir))
    state = json.loads((run_dir / "tracking" / "wandb.json").read_text())
    assert (state["run_id"], state["last_step"]) == (run_id, 2)
    n, summary = _offline_summary(run_dir, run_id)
    assert n == 2
    expected = _last_values(run_dir)
    assert {"train/loss/total", "eval/ce_clean"} <= set(expected)
    tracked = {k: v for k, v in summary.items() if k in expected}
    assert tracked == pytest.approx(expected)
    assert summary["warmup/loss/faithfulness"] == pytest.approx(
        [r for r in read_metrics(run_dir) if r["phase"] == "warmup"][-1]["loss/faithfulness"]
    )
