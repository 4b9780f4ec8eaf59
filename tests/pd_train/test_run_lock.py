"""A run dir has one owner (issue 30, item 1): ``RUN_DIR/.pd-train.lock``, created with O_EXCL and
held with an fcntl lock. Every owner here is a real process; the refusals go through
``pd-train run`` itself."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pd_train.cli import main
from pd_train.run import LOCK_FILE, RunDirLock, RunDirLocked

HOLD = """
import sys, time
from pd_train.run._lock import RunDirLock, RunDirLocked
try:
    RunDirLock(sys.argv[1]).acquire()
except RunDirLocked as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(3)
print("LOCKED", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _holder(run_dir: Path, seconds: float = 600) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # a takeover's warning; the answer is on stdout
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("LOCKED"):
        proc.kill()
        pytest.fail(line + proc.communicate()[0])
    return proc


def _owner(run_dir: Path) -> dict:
    return json.loads((run_dir / LOCK_FILE).read_text())


def test_second_run_is_refused_naming_the_owner_and_nothing_is_written(
    tiny_run_config: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_run_config))
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        owner = _owner(run_dir)
        assert owner["pid"] == holder.pid and owner["host"] == socket.gethostname()
        for argv in (
            ["run", str(config), "--run-dir", str(run_dir)],
            ["run", str(config), "--run-dir", str(run_dir), "--max-steps", "1"],
        ):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert f"is in use by pid {holder.pid} on {socket.gethostname()}" in err, err
            assert "Traceback" not in err
            assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]
        assert _owner(run_dir) == owner  # the owner's lock untouched
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    holder.send_signal(signal.SIGKILL)  # dies without removing its lock file
    holder.wait()
    assert _owner(run_dir)["pid"] == holder.pid
    second = _holder(run_dir)  # another process takes it over
    try:
        assert _owner(run_dir)["pid"] == second.pid
        with pytest.raises(RunDirLocked, match=f"pid {second.pid}"):
            RunDirLock(run_dir).acquire()
    finally:
        second.terminate()
        second.wait()


def test_a_stale_lock_has_exactly_one_taker(tmp_path: Path) -> None:
    """Six processes race for one stale lock: one wins, five are refused naming the winner."""
    run_dir = tmp_path / "run"
    dead = _holder(run_dir)
    dead.kill()
    dead.wait()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HOLD, str(run_dir), "600"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(6)
    ]
    try:
        # Each answers with one line; the winner then holds the lock until it is killed.
        outs = [p.stdout.readline() for p in procs]  # type: ignore[union-attr]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    winners = [p.pid for p, out in zip(procs, outs, strict=True) if out.startswith("LOCKED")]
    assert len(winners) == 1, outs
    refused = [out for out in outs if out.startswith("REFUSED")]
    assert len(refused) == 5, outs
    # Each refusal names the winner, or (a racer that read the new lock file before the winner
    # wrote its owner into it) says the owner is still starting.
    assert all(
        f"pid {winners[0]}" in out or "a process that is starting" in out for out in refused
    ), outs


def test_lock_of_another_host_is_never_taken_over(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / LOCK_FILE
    lock.write_text(json.dumps({"host": "node-elsewhere", "pid": 1, "since": "then"}))
    with pytest.raises(RunDirLocked) as info:
        RunDirLock(run_dir).acquire()
    assert "pid 1 on node-elsewhere" in str(info.value)
    assert f"remove {lock}" in str(info.value)
    assert json.loads(lock.read_text())["host"] == "node-elsewhere"


def test_a_reused_pid_does_not_keep_a_lock_alive(tmp_path: Path) -> None:
    """The lock names a live pid (this test's) that started at another time: the owner is gone
    and its pid reused, so the lock is stale."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / LOCK_FILE
    me = {"host": socket.gethostname(), "pid": os.getpid(), "start": "1", "since": "then"}
    lock.write_text(json.dumps(me))
    os.utime(lock, (time.time() - 60, time.time() - 60))
    with RunDirLock(run_dir):
        assert _owner(run_dir)["start"] != "1"
    assert not lock.exists()


def test_release_removes_the_lock_and_a_run_dir_it_created_empty(tmp_path: Path) -> None:
    run_dir = tmp_path / "new" / "run"
    with RunDirLock(run_dir):
        assert (run_dir / LOCK_FILE).is_file()
    assert not run_dir.exists()
    with RunDirLock(run_dir):
        (run_dir / "config.yaml").write_text("")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]
