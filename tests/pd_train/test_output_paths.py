"""Every output path is checked before any work (issue 30, item 4): a path that cannot be
written is one exit-2 line naming it and why, with nothing written, for every command that
writes. Real paths: ``/proc`` (no new entries, even for root) and a read-only mount of a real
run dir (a read-only bind mount as root, permission bits otherwise)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pd_train._output_paths import dated_dir, directory_problem, file_problem
from pd_train.cli import main

from ._analysis_runs import Runs, tiny_runs
from ._cli import _config, _refused, _snapshot

PROC = Path("/proc/pd-output-check")


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """``directory`` and its subdirectories read-only for this process, for the block."""
    if os.geteuid() != 0:  # permission bits bind an ordinary user
        dirs = [directory, *(p for p in directory.rglob("*") if p.is_dir())]
        modes = {d: d.stat().st_mode for d in dirs}
        for d in dirs:
            d.chmod(stat.S_IMODE(modes[d]) & ~0o222)
        try:
            yield
        finally:
            for d in dirs:
                d.chmod(stat.S_IMODE(modes[d]))
        return
    # Root writes whatever the bits say: a read-only bind mount of the directory over itself.
    bind = subprocess.run(["mount", "--bind", str(directory), str(directory)], check=False)
    if bind.returncode != 0:
        pytest.skip("root without mount permission: cannot make a directory read-only")
    try:
        remount = ["mount", "-o", "remount,bind,ro", str(directory), str(directory)]
        if subprocess.run(remount, check=False).returncode != 0:
            pytest.skip("cannot remount a bind mount read-only here")
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_directory_and_file_problems_come_from_the_filesystem(tmp_path: Path) -> None:
    """/proc's bits say root may write; only trying tells. Nothing is left behind."""
    assert directory_problem(tmp_path / "new" / "deeper") is None
    assert file_problem(tmp_path / "x" / "out.parquet") is None
    assert "cannot create '/proc/pd-output-check/runs': '/proc' is not writable (" in str(
        directory_problem(PROC / "runs")
    )
    assert "'/proc' is not writable" in str(file_problem(PROC))
    assert file_problem(tmp_path) == f"{str(tmp_path)!r} is a directory; expected a file"
    ro = tmp_path / "ro"
    ro.mkdir()
    with read_only(ro):
        assert directory_problem(ro) == f"{str(ro)!r} is not writable (Read-only file system)" or (
            os.geteuid() != 0
            and "is not writable (Permission denied)" in str(directory_problem(ro))
        )
        assert "cannot create" in str(directory_problem(ro / "sub"))
    assert list(tmp_path.rglob("*")) == [ro]  # the probes removed their temp files


def test_run_refuses_an_output_dir_or_run_dir_under_proc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, output_dir=str(PROC / "runs"))
    _refused(tmp_path, capsys, ["run", str(config)], "output_dir:", "'/proc' is not writable")
    config = _config(tmp_path)
    _refused(
        tmp_path,
        capsys,
        ["run", str(config), "--run-dir", str(PROC / "r")],
        f"--run-dir {PROC / 'r'}:",
        "'/proc' is not writable",
    )


def test_compile_record_and_pretrain_out_are_checked_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pretrain --out` was refused only after ~20 s of training, `compile --record` after
    every compile: now both before any."""
    config = _config(tmp_path)
    _refused(
        tmp_path,
        capsys,
        ["compile", str(config), "--record", str(PROC / "record.json")],
        "--record:",
        "'/proc' is not writable",
    )
    _refused(
        tmp_path,
        capsys,
        ["pretrain", "builtin:tms_5_2", "--out", str(PROC / "w.npz")],
        "--out:",
        "'/proc' is not writable",
    )
    _refused(
        tmp_path,
        capsys,
        ["pretrain", "builtin:tms_5_2", "--out", str(tmp_path)],
        f"--out: {str(tmp_path)!r} is a directory; expected a file",
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return tiny_runs(tmp_path_factory)


@pytest.fixture
def run_copy(runs: Runs, tmp_path: Path) -> Path:
    """A copy of a finished run dir (its own analysis/ and report.html absent)."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs.uninterrupted, run_dir, ignore=shutil.ignore_patterns("analysis"))
    (run_dir / "report.html").unlink(missing_ok=True)
    return run_dir


def _refused_here(
    directory: Path, capsys: pytest.CaptureFixture[str], argv: list[str], *words: str
) -> None:
    before = _snapshot(directory)
    assert main(argv) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err
    assert "Traceback" not in err and err.count("\n") == 1, err  # one line
    assert _snapshot(directory) == before


def test_analyze_and_report_check_their_outputs_before_any_work(
    run_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = str(run_copy)
    _refused_here(
        tmp_path,
        capsys,
        ["analyze", run, "--out", str(PROC / "c.parquet")],
        "--out:",
        "'/proc' is not writable",
    )
    _refused_here(
        tmp_path,
        capsys,
        ["report", run, "--out", str(PROC / "r.html")],
        "--out:",
        "'/proc' is not writable",
    )
    with read_only(run_copy):
        _refused_here(
            tmp_path,
            capsys,
            ["analyze", run],
            f"the table goes to {run_copy / 'analysis'} by default, but cannot create",
            "give --out FILE",
        )
        _refused_here(
            tmp_path,
            capsys,
            ["report", run],
            f"the page goes to {run_copy / 'report.html'} by default, but",
            "is not writable",
            "give --out FILE",
        )
        # What the message advises works: the run dir is only read.
        page = tmp_path / "elsewhere" / "report.html"
        assert main(["report", run, "--out", str(page)]) == 0
        assert page.read_text().startswith("<!DOCTYPE html>")


def test_probe_out_is_checked_before_any_arm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    raw = yaml.safe_load(config.read_text())
    assert raw["output_dir"] == str(tmp_path / "runs")
    _refused(
        tmp_path,
        capsys,
        ["probe", str(config), "--out", str(PROC / "probe")],
        "--out:",
        "'/proc' is not writable",
    )


def test_a_dated_dir_is_new_and_named_after_the_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dated_dir`` (the run, sweep and toy dirs' names): ``root/NAME-YYYYmmdd-HHMMSS``, then
    ``-2``, ``-3`` while that exists, nothing made; a relative root is under the cwd."""
    from datetime import datetime

    from pd_train import _output_paths

    class _At(datetime):
        @classmethod
        def now(cls, tz: object = None) -> _At:  # type: ignore[override]
            return cls(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(_output_paths, "datetime", _At)
    names = []
    for _ in range(3):
        path = dated_dir(tmp_path, "run")
        assert path.parent == tmp_path and not path.exists()
        names.append(path.name)
        path.mkdir()
    assert names == ["run-20260102-030405", "run-20260102-030405-2", "run-20260102-030405-3"]
    monkeypatch.chdir(tmp_path)
    assert dated_dir("outputs", "x-sweep") == tmp_path / "outputs" / "x-sweep-20260102-030405"
