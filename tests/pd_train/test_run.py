"""`pd-train run` end to end on a tiny random-weights Llama: resume, SIGTERM, cache, HLO dump.

Every run is a fresh `pd-train` process on one CPU device (the sharded step is tested in
test_step.py), and all share one persistent compile cache, so only the first compiles the step;
the HLO-dump run compiles on purpose (it bypasses the cache) and keeps its step small.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pd_train.outputs import read_metrics

from ._cli import _cli, _finish, _snapshot, tiny_config, train_losses, write_config


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
    # The step's executable was stored by the first launch and loaded by this one: no trace,
    # no lowering, no backend compile (not even a persistent-cache lookup).
    assert record["notes"]["train_step_executable_cache"] == "hit", record["notes"]
    assert record["jits"]["train_step"]["compiles"] == []
    # Loaded from start_runtime on, before the run's recorder existed (a note, not a phase).
    assert record["notes"]["train_step_load_seconds"] > 0, record["notes"]
    assert all(c["cache"] == "hit" for jit in record["jits"].values() for c in jit["compiles"])
    first = json.loads((uninterrupted / "compile.json").read_text())
    assert first["notes"]["train_step_executable_cache"] == "miss"
    assert any(c["cache"] == "miss" for c in first["jits"]["train_step"]["compiles"])


def test_a_source_edit_that_keeps_the_programs_loads_them_by_their_lowered_key(
    uninterrupted: Path, tmp_path: Path, cache: Path
) -> None:
    """After an edit of pd's source that changes no program (its digest faked in the launch's
    process), each program misses its source key, is lowered, and loads by its lowered key
    (no compile, not served by JAX's persistent cache, so stored under the new source key):
    the next launch hits at once."""
    import os
    import sys

    from ._cli import ONE_DEVICE

    config = write_config(tmp_path, tiny_config(tmp_path, cache))
    code = (
        "import runpy, sys\n"
        "import pd_train.process_env as pe\n"
        "pe.source_digest = lambda: 'an edit that changes no program'\n"
        "sys.argv = ['pd-train', *sys.argv[1:]]\n"
        "runpy.run_module('pd_train.cli', run_name='__main__')\n"
    )
    records, outputs = [], []
    for name in ("edited", "again"):
        run_dir = tmp_path / name
        args = ["run", str(config), "--run-dir", str(run_dir), "--max-steps", "1"]
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **ONE_DEVICE},
        )
        outputs.append(_finish(proc))
        records.append(json.loads((run_dir / "compile.json").read_text()))
    edited, again = records
    assert "loading train_step (executable cache, by its lowered program" in outputs[0]
    assert edited["notes"]["train_step_executable_cache"] == "hit (lowered)", edited["notes"]
    assert edited["jits"]["train_step"]["compiles"] == [], edited["jits"]["train_step"]
    init = edited["notes"]["init_executable_cache"]
    assert init and set(init.values()) == {"hit (lowered)"}, init
    assert again["notes"]["train_step_executable_cache"] == "hit", again["notes"]
    assert set(again["notes"]["init_executable_cache"].values()) == {"hit"}


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

    out = _finish(_cli("run", "--resume", str(run_dir)))
    assert train_losses(run_dir) == train_losses(uninterrupted)
    assert "loading train_step (executable cache)… " in out, out[-3000:]

    # Same config, same programs: the resume (a fresh process, so no in-memory jit cache)
    # loads the step that fresh starts compiled (it is lowered on the trainer's abstract
    # layout, which restored and warmed-up states are put on) and finds every other program
    # in the persistent cache.
    resumed = json.loads((run_dir / "compile.json").read_text())
    assert resumed["notes"]["train_step_executable_cache"] == "hit", resumed["notes"]
    compiles = {
        (name, c["module"]): c["cache"]
        for name, jit in resumed["jits"].items()
        for c in jit["compiles"]
    }
    assert compiles and all(cache == "hit" for cache in compiles.values()), compiles
    # The fresh attempt's record is kept beside it, not overwritten.
    first = json.loads((run_dir / "compile-attempt-1.json").read_text())
    assert "faithfulness_warmup" in first["jits"]  # only a fresh start warms up
    assert "faithfulness_warmup" not in resumed["jits"]


def _started(proc: subprocess.Popen[str], run_dir: Path) -> None:
    """Wait until the run has written its run dir (its signal handlers are installed by then)."""
    deadline = time.time() + 240
    while not (run_dir / "config.yaml").exists():
        if proc.poll() is not None:
            pytest.fail(f"run ended before the signal: {proc.communicate()[0][-3000:]}")
        assert time.time() < deadline, "run did not start"
        time.sleep(0.05)


def test_ctrl_c_saves_writes_the_summary_and_exits_130(
    uninterrupted: Path, tmp_path: Path, cache: Path
) -> None:
    config = write_config(tmp_path, tiny_config(tmp_path, cache, steps=8))
    run_dir = tmp_path / "run"
    proc = _cli("run", str(config), "--run-dir", str(run_dir))
    _started(proc, run_dir)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "SIGINT: saving at the next step boundary" in out
    saved = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved and saved[-1] < 8, saved
    summary = (run_dir / "summary.txt").read_text()
    assert f"yes (SIGINT after step {saved[-1] - 1})" in summary
    assert f"last step run  {saved[-1] - 1} " in summary
    # The prompt comes back at once: the plots are skipped, with a message (resuming writes them).
    assert not list((run_dir / "plots").glob("*.png"))
    assert f"stopped by Ctrl-C: saved checkpoint step {saved[-1]} in " in out
    assert "plots skipped" in out


def test_second_ctrl_c_aborts_at_once_with_one_line(tmp_path: Path, cache: Path) -> None:
    config = write_config(tmp_path, tiny_config(tmp_path, cache, steps=8))
    run_dir = tmp_path / "run"
    proc = _cli("run", str(config), "--run-dir", str(run_dir))
    _started(proc, run_dir)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("pd-train: aborted by a second Ctrl-C"), out[-3000:]
    assert not (run_dir / "summary.txt").exists()


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


# ---------------------------------------------------------------------------------------------
# `pd-train run --run-dir D` into a directory that already holds a run


def _prepared(tmp: Path, cache: Path, **pd_overrides: Any) -> Any:
    from pd_train.run import prepare

    return prepare(tiny_config(tmp, cache, **pd_overrides))


def _run_dir_with(
    tmp: Path, config: Any, *, checkpoints: bool = False, metrics: bool = False
) -> Path:
    from pd_train.config.run import to_yaml

    run_dir = tmp / "existing"
    run_dir.mkdir(parents=True)
    if config is not None:
        (run_dir / "config.yaml").write_text(to_yaml(config))
    if checkpoints:
        (run_dir / "checkpoints" / "4").mkdir(parents=True)
    if metrics:
        (run_dir / "metrics.jsonl").write_text('{"step": 0, "phase": "train"}\n')
    return run_dir


def test_run_dir_decision_table(tmp_path: Path, cache: Path) -> None:
    from pd_train.run import RunDirError, resolve_run_dir

    prepared = _prepared(tmp_path, cache)
    config = prepared.config
    other = _prepared(tmp_path, cache, steps=16).config

    def decide(run_dir: Path) -> Path | None:
        return resolve_run_dir(prepared, run_dir).resume_dir

    assert decide(tmp_path / "absent") is None
    (tmp_path / "empty").mkdir()
    assert decide(tmp_path / "empty") is None
    # Same config: resume when there is a checkpoint, else a start from step 0.
    same = _run_dir_with(tmp_path / "a", config, checkpoints=True, metrics=True)
    assert decide(same) == same
    assert decide(_run_dir_with(tmp_path / "b", config)) is None  # pd-train submit's first start
    assert decide(_run_dir_with(tmp_path / "c", config, metrics=True)) is None
    # Another config, or a run without its config: refused, with the way out.
    for run_dir, expected in (
        (_run_dir_with(tmp_path / "d", other, checkpoints=True), "pd.steps: 16 there, 8 here"),
        (_run_dir_with(tmp_path / "e", other), "another config"),
        (_run_dir_with(tmp_path / "f", None, checkpoints=True), "checkpoints at steps [4]"),
        (_run_dir_with(tmp_path / "g", None, metrics=True), "no config.yaml"),
    ):
        before = _snapshot(run_dir)
        with pytest.raises(RunDirError, match="--resume") as info:
            decide(run_dir)
        assert expected in str(info.value)
        assert _snapshot(run_dir) == before
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError, match="is a file"):
        decide(tmp_path / "file")


def test_saved_config_keeps_relative_paths_working_from_the_run_dir(
    tmp_path: Path, cache: Path
) -> None:
    """A config with a config-relative data path: the copy saved in the run dir must still find
    the data, or ``--resume`` (which reads that copy, relative to the run dir) would fail."""
    from pd_train.config.run import to_yaml
    from pd_train.run import prepare

    raw = tiny_config(tmp_path, cache)
    raw["data"]["path"] = "tokens.npy"  # next to the config
    prepared = prepare(write_config(tmp_path, raw))
    assert Path(prepared.config.data.path) == tmp_path / "tokens.npy"
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(prepared.config))
    assert prepare(run_dir / "config.yaml").config == prepared.config


def test_resume_needs_a_checkpoint_and_its_own_run_dir(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pd_train.cli import main

    config = _prepared(tmp_path, cache).config
    fresh = _run_dir_with(tmp_path / "a", config)  # e.g. submitted, not started yet
    assert main(["run", "--resume", str(fresh)]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint there yet" in err and f"--run-dir {fresh}" in err
    started = _run_dir_with(tmp_path / "b", config, checkpoints=True)
    assert main(["run", "--resume", str(started), "--run-dir", str(tmp_path / "c")]) == 2
    assert "names another" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_run_dir_of_another_run_is_refused_and_left_untouched(
    uninterrupted: Path, tmp_path: Path, cache: Path
) -> None:
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    before = _snapshot(run_dir)
    config = write_config(tmp_path, tiny_config(tmp_path, cache))
    proc = _cli("run", str(config), "--set", "pd.steps=6", "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-3000:]
    assert f"pd-train run --resume {run_dir}" in out
    assert "pd.steps: 8 there, 6 here" in out
    assert _snapshot(run_dir) == before


@pytest.mark.slow
def test_run_dir_of_the_same_run_restarts_then_resumes_bit_exactly(
    uninterrupted: Path, tmp_path: Path, cache: Path
) -> None:
    """An attempt that died before its first checkpoint left config.yaml and metrics: the same
    command starts over (the old metrics kept aside), and once a checkpoint exists, the same
    command again resumes from it — every step logged once, losses equal to an uninterrupted
    run's."""
    config_dict = tiny_config(tmp_path, cache)
    config = write_config(tmp_path, config_dict)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(config.read_text())
    died = '{"step": -3, "phase": "warmup", "time": 0.0, "loss/faithfulness": 1.0}\n'
    (run_dir / "metrics.jsonl").write_text(died)

    _finish(_cli("run", str(config), "--run-dir", str(run_dir), "--max-steps", "4"))
    kept = list(run_dir.glob("metrics-attempt-*.jsonl"))
    assert len(kept) == 1 and kept[0].read_text() == died
    saved = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved == ["4"]

    out = _finish(_cli("run", str(config), "--run-dir", str(run_dir)))
    assert "resuming" in out
    records = read_metrics(run_dir)
    keys = [(r["phase"], r["step"]) for r in records if r["phase"] in ("warmup", "train")]
    assert len(keys) == len(set(keys)), keys  # nothing logged twice
    assert [s for p, s in keys if p == "warmup"] == [-3, -2, -1]
    assert train_losses(run_dir) == train_losses(uninterrupted)
