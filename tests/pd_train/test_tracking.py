"""``pd-train track`` and ``pd-train run`` with ``tracking:``: a run's metrics.jsonl mirrored
into a W&B run, its eval figures as images and its decomposition as an artifact, offline (no
network, ``WANDB_MODE=offline`` and W&B's directories under the test's temp dir); ``pd-train
pull`` loads the decomposition back from the offline run's files, and ``analyze``/``report``
read what it pulled. The offline run files are read here with this module's own parser of the
``run-ID.wandb`` log, not with pd's."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pd_train.analysis.tracking import history, parse_tracking, sync_wandb
from pd_train.cli import main
from pd_train.config.io import ConfigError
from pd_train.outputs import read_metrics

from ._analysis_runs import tiny_runs


@pytest.fixture(autouse=True)
def _wandb_offline(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """W&B offline, silent, with its own dirs (staged artifact files, cache, settings) in a temp
    dir rather than the user's home; subprocesses inherit it."""
    root = tmp_path_factory.mktemp("wandb-home")
    for var, sub in (
        ("WANDB_DIR", "dir"),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_ARTIFACT_DIR", "artifacts"),
    ):
        (root / sub).mkdir()
        monkeypatch.setenv(var, str(root / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    return root


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
    with pytest.raises(ConfigError) as info:
        parse_tracking({"wandb": {"project": "p", "figures": "always", "checkpoint": "all"}})
    assert [p for p, _ in info.value.problems] == [
        "tracking.wandb.figures",
        "tracking.wandb.checkpoint",
    ]
    assert "got 'always'; must be one of every_eval, final, none" in str(info.value)
    assert "got 'all'; must be one of final, none" in str(info.value)
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
    # (the summary also holds the last image of each figure key; the scalars are compared)
    images = ("eval/figures/", "figures/")
    summary = {
        k: v for k, v in result.summary.items() if not k.startswith(("_", "warmup/", *images))
    }
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
    from pd_train.config.run import load_config

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
    # Each attempt's eval figures at its eval step (the last one's are the run's final plots),
    # and each attempt's decomposition as a new version of the run's artifact.
    images = _offline_images(run_dir, run_id)
    assert sorted(images) == [1, 2]
    for step in (1, 2):
        assert {"eval/figures/l0_per_site", "eval/figures/ci_hist_00"} <= set(images[step])
    for name in ("l0_per_site", "ci_hist_00", "density_per_kind"):
        data = _image_bytes(images[2][f"eval/figures/{name}"])
        assert data == (run_dir / "plots" / f"{name}.png").read_bytes(), name
    artifacts = _offline_artifacts(run_dir, run_id)
    assert [sorted(a.aliases) for a in artifacts] == [["latest", "step-2"], ["latest", "step-3"]]
    assert {e.path for e in artifacts[1].manifest.contents} == _expected_artifact_files(run_dir, 3)
    out = tmp_path / "pulled"
    assert main(["pull", str(_attempt_dirs(run_dir, run_id)[0]), "--out", str(out)]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["3"]


# --- figures, the artifact and loading back ------------------------------------------------


def _attempt_dirs(run_dir: Path, run_id: str) -> list[Path]:
    return sorted((run_dir / "tracking" / "wandb").glob(f"offline-run-*-{run_id}"))


def _offline_images(run_dir: Path, run_id: str) -> dict[int, dict[str, dict[str, Any]]]:
    """``{step: {key: {field: value}}}`` of every image logged to the offline run (over all
    its attempts), from the history records' ``image-file`` entries."""
    images: dict[int, dict[str, dict[str, Any]]] = {}
    for attempt in _attempt_dirs(run_dir, run_id):
        for record in _wandb_records(attempt / f"run-{run_id}.wandb"):
            if record.WhichOneof("record_type") != "history":
                continue
            fields: dict[str, dict[str, Any]] = {}
            for item in record.history.item:
                *key, field = item.nested_key
                fields.setdefault("/".join(key), {})[field] = json.loads(item.value_json)
            entries = {k: {**v, "attempt": attempt} for k, v in fields.items()}
            entries = {k: v for k, v in entries.items() if v.get("_type") == "image-file"}
            if entries:
                images.setdefault(record.history.step.num, {}).update(entries)
    return images


def _offline_artifacts(run_dir: Path, run_id: str) -> list[Any]:
    return [
        record.artifact
        for attempt in _attempt_dirs(run_dir, run_id)
        for record in _wandb_records(attempt / f"run-{run_id}.wandb")
        if record.WhichOneof("record_type") == "artifact"
    ]


def _image_bytes(entry: dict[str, Any]) -> bytes:
    path = entry["attempt"] / "files" / entry["path"]
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["size"]
    return data


def _md5_b64(path: Path) -> str:
    return base64.b64encode(hashlib.md5(path.read_bytes(), usedforsecurity=False).digest()).decode()


def _expected_artifact_files(run_dir: Path, step: int) -> set[str]:
    """What the artifact of ``run_dir`` must hold, listed from the directory itself: the config,
    the records and summaries, the plots, and checkpoint ``step`` without its training item."""
    names = {n for n in ("config.yaml", "metrics.jsonl", "summary.txt", "summary.json")}
    names = {n for n in names if (run_dir / n).is_file()}
    names |= {f"plots/{p.name}" for p in (run_dir / "plots").glob("*.png")}
    ckpt = run_dir / "checkpoints" / str(step)
    names |= {
        str(p.relative_to(run_dir))
        for p in ckpt.rglob("*")
        if p.is_file() and p.relative_to(ckpt).parts[0] != "training"
    }
    return names


def test_offline_sync_logs_eval_figures_plots_and_the_decomposition_and_pull_loads_it_back(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, _wandb_offline: Path
) -> None:
    pytest.importorskip("wandb")
    from pd_train.analysis import analyze_run

    runs = tiny_runs(tmp_path_factory)
    run_dir = tmp_path / "run"
    shutil.copytree(
        runs.uninterrupted,
        run_dir,
        ignore=shutil.ignore_patterns("tracking", "analysis", "report.html"),
    )
    assert main(["track", str(run_dir), "--project", "pd-test", "--mode", "offline"]) == 0
    run_id = json.loads((run_dir / "tracking" / "wandb.json").read_text())["run_id"]

    # Eval figures at each eval's step, rendered from the records up to it.
    images = _offline_images(run_dir, run_id)
    evals = sorted({r["step"] for r in read_metrics(run_dir) if r["phase"] == "eval"})
    assert evals == [1, 3]
    figures = ("l0_per_site", "l0_curves", "ci_hist_00", "density_per_kind")
    for step in evals:
        assert {f"eval/figures/{n}" for n in figures} <= set(images[step]), images[step].keys()
    # The recon plot needs a slow eval (cadence.slow_eval_every 4: the last eval only).
    assert "eval/figures/recon_per_site" in images[3]
    assert "eval/figures/recon_per_site" not in images[1]
    # The last eval's figures are the run's own end-of-run plots, byte for byte; the first
    # eval's L0 bars show other values.
    for name in (*figures, "recon_per_site"):
        data = _image_bytes(images[3][f"eval/figures/{name}"])
        assert data == (run_dir / "plots" / f"{name}.png").read_bytes(), name
    assert _image_bytes(images[1]["eval/figures/l0_per_site"]) != _image_bytes(
        images[3]["eval/figures/l0_per_site"]
    )
    # The plots no eval figure covers come from RUN_DIR/plots, with the last step.
    plots = {k: step for step, keys in images.items() for k in keys if k.startswith("figures/")}
    assert plots == {"figures/loss_curves": 3, "figures/eval_curves": 3}
    for key in plots:
        name = key.removeprefix("figures/")
        assert _image_bytes(images[3][key]) == (run_dir / "plots" / f"{name}.png").read_bytes()

    # The decomposition: one model artifact of the run dir with the latest checkpoint (4)
    # and not its optimizer state; every file as it is in the run dir.
    (artifact,) = _offline_artifacts(run_dir, run_id)
    assert (artifact.type, artifact.name) == ("model", f"pd-{run_id}")
    assert sorted(artifact.aliases) == ["latest", "step-4"]
    entries = {e.path: e for e in artifact.manifest.contents}
    expected = _expected_artifact_files(run_dir, 4)
    assert set(entries) == expected
    assert {"config.yaml", "metrics.jsonl", "checkpoints/4/decomposition/_METADATA"} <= expected
    assert (run_dir / "checkpoints" / "4" / "training").is_dir()
    for name, entry in entries.items():
        assert (entry.size, entry.digest) == (
            (run_dir / name).stat().st_size,
            _md5_b64(run_dir / name),
        ), name

    # Syncing again with nothing new logs no image and no new artifact version.
    config = parse_tracking({"wandb": {"project": "pd-test", "mode": "offline"}})
    again = sync_wandb(run_dir, config)
    assert (again.logged_steps, again.images, again.artifact) == (0, 0, None)
    assert len(_offline_artifacts(run_dir, run_id)) == 1

    # Loaded back from the offline run's files (the newest attempt names the run).
    out = tmp_path / "pulled"
    attempt = _attempt_dirs(run_dir, run_id)[-1]
    assert main(["pull", str(attempt), "--out", str(out)]) == 0
    for name in expected:
        assert (out / name).read_bytes() == (run_dir / name).read_bytes(), name
    assert not (out / "checkpoints" / "4" / "training").exists()
    assert json.loads((out / "pulled.json").read_text())["artifact"] == f"pd-{run_id} (offline)"
    # analyze and report read it: the same component table as the original run dir's.
    settings = {"n_batches": 1, "top_k": 2, "window": 2, "progress": False}
    pulled, original = analyze_run(out, **settings), analyze_run(run_dir, **settings)
    assert pulled.metadata["checkpoint_step"] == 4
    assert pulled.to_arrow().to_pydict() == original.to_arrow().to_pydict()
    assert main(["report", str(out)]) == 0
    assert (out / "report.html").is_file()


def test_pull_checks_every_file_and_writes_nothing_on_failure(
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    _wandb_offline: Path,
) -> None:
    pytest.importorskip("wandb")
    runs = tiny_runs(tmp_path_factory)
    run_dir = tmp_path / "run"
    shutil.copytree(
        runs.uninterrupted,
        run_dir,
        ignore=shutil.ignore_patterns("tracking", "analysis", "report.html", "plots"),
    )
    config = parse_tracking({"wandb": {"project": "pd-test", "mode": "offline", "figures": "none"}})
    result = sync_wandb(run_dir, config)
    assert result.images == 0 and result.artifact == (f"pd-{result.run_id}", 4)
    assert not _offline_images(run_dir, str(result.run_id))
    attempt = _attempt_dirs(run_dir, str(result.run_id))[-1]
    (artifact,) = _offline_artifacts(run_dir, str(result.run_id))
    staged = {e.path: Path(e.local_path) for e in artifact.manifest.contents}
    # W&B staged a copy under WANDB_DATA_DIR (the run dir's files may change before upload).
    assert all(p.is_relative_to(_wandb_offline / "data") for p in staged.values())

    # A non-empty directory that is not a pulled run is refused, left as it was.
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert main(["pull", str(attempt), "--out", str(taken)]) == 2
    assert "exists and is not a pulled run dir" in capsys.readouterr().err
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    # A staged file that no longer matches the manifest: refused, nothing written.
    out = tmp_path / "pulled"
    name = "checkpoints/4/decomposition/_METADATA"
    staged[name].write_bytes(staged[name].read_bytes() + b" ")
    assert main(["pull", str(attempt), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{name}: the staged copy does not match the artifact's manifest" in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["run", "taken"]
    # Not a W&B run or offline run directory: the accepted forms are named.
    assert main(["pull", "wandb:entity/project"]) == 2
    assert "a W&B run is named wandb:ENTITY/PROJECT/runs/RUN_ID" in capsys.readouterr().err
    assert main(["analyze", "wandb:nope"]) == 2
    assert "got 'wandb:nope'; a W&B run is named" in capsys.readouterr().err


def test_wandb_run_references_are_read_like_spd() -> None:
    from pd_train.analysis.wandb_io import PullError, WandbRef, is_wandb_ref, parse_wandb_ref

    ref = WandbRef("goodfire", "spd", "33n6xjjt")
    for text in (
        "wandb:goodfire/spd/runs/33n6xjjt",
        "wandb:goodfire/spd/33n6xjjt",
        "goodfire/spd/runs/33n6xjjt",
        "https://wandb.ai/goodfire/spd/runs/33n6xjjt",
        "https://wandb.ai/goodfire/spd/runs/33n6xjjt/overview?nw=x",
    ):
        assert parse_wandb_ref(text) == ref, text
    for text in ("wandb:goodfire/spd", "wandb:a/b/c/d", "wandb:", "wandb:a b/c/d"):
        with pytest.raises(PullError, match="a W&B run is named"):
            parse_wandb_ref(text)
    assert is_wandb_ref("wandb:x/y/z") and is_wandb_ref("https://wandb.ai/x/y/runs/z")
    assert not is_wandb_ref("outputs/wandb-x") and not is_wandb_ref("/tmp/run")


_NO_WANDB = """
import sys
sys.modules["wandb"] = None  # `import wandb` raises ImportError, as without the extra
from pd_train.cli import main
code = main(sys.argv[1:])
assert "wandb" not in sys.modules or sys.modules["wandb"] is None
sys.exit(code)
"""


def test_pd_train_runs_without_wandb(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Without the extra: the CLI imports and runs; what needs W&B says how to install it."""
    runs = tiny_runs(tmp_path_factory)

    def pd_train(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _NO_WANDB, *args],
            capture_output=True,
            text=True,
            # Without WANDB_MODE (W&B may leave its offline mode in this process's environment,
            # and a wandb: reference is then refused first, as reaching no server): the
            # missing extra is what this test is about.
            env={k: v for k, v in os.environ.items() if k != "WANDB_MODE"}
            | {"JAX_PLATFORMS": "cpu"},
            timeout=300,
            check=False,
        )

    assert pd_train("--help").returncode == 0
    for args in (
        ["pull", "wandb:team/project/runs/abc123"],
        ["track", str(runs.uninterrupted), "--project", "p", "--mode", "offline"],
    ):
        proc = pd_train(*args)
        assert proc.returncode == 2, proc.stderr
        assert "needs wandb: pip install 'pd-train[wandb]'" in proc.stderr, proc.stderr
    proc = pd_train("config", str(runs.config))
    assert proc.returncode == 0 and "run_name: analysis" in proc.stdout, proc.stderr
