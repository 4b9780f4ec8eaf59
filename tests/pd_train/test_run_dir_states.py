"""The run dir as a state machine (issue 30, item 7): hypothesis drives random sequences of real
``pd-train run`` processes on one run dir — start, ``--resume``, ``kill -9`` at a random point,
SIGTERM, a second start while the first lives, and a full disk (a real tmpfs) — and after every
step checks what may never happen: a step logged twice, a logged value that differs from an
uninterrupted run's, a finished checkpoint lost (other than superseded per
``keep_last_n_checkpoints``), an orbax temporary directory left by a run that ended, a lock left
by a run that ended, or a refused command that changed the run dir. Each sequence ends by
running the run to completion: its whole trajectory equals the uninterrupted run's, bit for bit.

Cost (bounded for CI): the tiny config, 6 steps, a checkpoint every 2 (keep 2); the compile
cache is shared, so only the reference run compiles. ``max_examples=4`` sequences of at most
``stateful_step_count=4`` rules, from a fixed seed (:data:`SEED`: the same sequences on every
machine), ``deadline=None``, no shrinking (a failure prints its rules and outcomes, and keeps
its log and run dir). About 30 ``pd-train`` processes (most of 3-6 s) in all.

The test can fail: with ``MetricsLog.truncate_from`` left out of a resume, the second sequence
(kill -9 after step 4, then a resume killed during a save) fails with steps logged twice.

The run dir lives on a tmpfs mounted for each sequence where the test runs as root; elsewhere
it lives in tmp_path and only the disk-full rule is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ._cli import ONE_DEVICE, tiny_config, write_config

STEPS = 6
SAVE_EVERY = 2
KEEP = 2
LOCK = ".pd-train.lock"
TMP_MARK = ".orbax-checkpoint-tmp"
TIMEOUT = 300.0
#: The sequences' seed: fixed, so CI runs the same sequences everywhere. This one's four (with
#: the tmpfs) cover every rule: kill -9 at a step, during a save and at startup, then resumed;
#: SIGTERM; both disk-full kinds; a second command while the first lives.
SEED = 35
#: The run dir's tmpfs: room for a few runs; few inodes, so that filling them is quick.
TMPFS_OPTIONS = "size=64m,nr_inodes=2000"

#: A point of a run at which a signal is sent: its lock taken, its n-th train record of this
#: attempt written, or a checkpoint being written (an orbax temporary directory present).
POINTS = st.one_of(
    st.just(("lock", 0)),
    st.tuples(st.just("record"), st.integers(0, STEPS - 1)),
    st.just(("saving", 0)),
)


def _compared(record: dict[str, Any]) -> dict[str, Any]:
    """A record without what depends on the clock (its time, the perf/* figures)."""
    return {k: v for k, v in record.items() if k != "time" and not k.startswith("perf/")}


def _records(run_dir: Path) -> tuple[list[dict[str, Any]], bool]:
    """metrics.jsonl's records and whether its last line is partial (a killed run's)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return [], False
    lines = path.read_bytes().split(b"\n")
    partial = lines[-1] != b""
    complete = lines[:-1]
    return [json.loads(line) for line in complete], partial


def _checkpoints(run_dir: Path) -> list[int]:
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def _partial_saves(run_dir: Path) -> list[str]:
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if TMP_MARK in p.name)


def _snapshot(run_dir: Path) -> dict[str, bytes | None] | None:
    """Every file's bytes and every directory (None) under ``run_dir``; None if it is absent."""
    if not run_dir.exists():
        return None
    return {
        str(p.relative_to(run_dir)): (None if p.is_dir() else p.read_bytes())
        for p in sorted(run_dir.rglob("*"))
    }


def _lock_pid(run_dir: Path) -> int | None:
    try:
        return int(json.loads((run_dir / LOCK).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The config, and its uninterrupted run's records (computed once: the reference)."""
    tmp = tmp_path_factory.mktemp("states")
    raw = tiny_config(tmp, tmp / "cache", steps=STEPS)
    raw["cadence"].update(save_every=SAVE_EVERY, keep_last_n_checkpoints=KEEP)
    # XLA's default optimization, as test_run_faults.py keeps it: its disk-full rule meets the
    # same orbax partial-save race, at either level under load (docs/testing.md, Measurements).
    del raw["runtime"]["compiler_options"]
    config = write_config(tmp, raw)
    reference = tmp / "reference"
    proc = _launch(["run", str(config), "--run-dir", str(reference)], tmp / "reference.log")
    assert proc.wait(timeout=900) == 0, (tmp / "reference.log").read_text()[-3000:]
    records, partial = _records(reference)
    assert not partial
    by_key = {(r["phase"], r["step"]): _compared(r) for r in records}
    assert sorted(s for p, s in by_key if p == "train") == list(range(STEPS))
    assert _checkpoints(reference) == [4, 6]
    return {"config": config, "tmp": tmp, "reference": by_key}


def _launch(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "pd_train.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **ONE_DEVICE},
            start_new_session=True,  # SIGSTOP/SIGCONT reach its plot workers too
        )


def _can_mount_tmpfs(where: Path) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return False
    subprocess.run(["umount", str(where)], check=True)
    return True


class RunDirStates(RuleBasedStateMachine):
    """One run dir; every rule is one or two real ``pd-train run`` processes."""

    def __init__(self, setup: dict[str, Any], tmpfs: bool) -> None:
        super().__init__()
        self.config = setup["config"]
        self.reference = setup["reference"]
        self.work = Path(tempfile.mkdtemp(dir=setup["tmp"], prefix="example-")).absolute()
        self.mount: Path | None = None
        if tmpfs:
            self.mount = self.work / "mnt"
            self.mount.mkdir()
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", TMPFS_OPTIONS, "tmpfs", str(self.mount)], check=True
            )
            self.run_dir = self.mount / "run"
        else:
            self.run_dir = self.work / "run"
        self.log = self.work / "pd-train.log"
        self.finished: set[int] = set()  # every checkpoint step ever seen finished
        self.killed = False  # the last process died by SIGKILL (it may leave a partial line)
        self.history: list[str] = []
        self.failed = False

    @contextlib.contextmanager
    def _step(self, what: str) -> Iterator[None]:
        """One rule: ``failed`` stays set when it raises (teardown then skips the final run)."""
        self.history.append(what)
        self.failed = True
        yield
        self.failed = False

    # ------------------------------------------------------------------------------------
    # Processes

    def _args(self, how: str) -> list[str]:
        if how == "resume":
            return ["run", "--resume", str(self.run_dir)]
        return ["run", str(self.config), "--run-dir", str(self.run_dir)]

    def _start(self, how: str) -> tuple[subprocess.Popen[bytes], float, int]:
        """Launch; returns the process, its launch time and the log's size before it."""
        with self.log.open("ab") as out:
            out.write(f"\n===== {how} {self.history}\n".encode())
        offset = self.log.stat().st_size
        launched = time.time()
        return _launch(self._args(how), self.log), launched, offset

    def _output(self, offset: int) -> str:
        return self.log.read_bytes()[offset:].decode(errors="replace")

    def _wait(self, proc: subprocess.Popen[bytes]) -> int:
        try:
            return proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"pd-train did not end in {TIMEOUT} s")

    def _reached(self, proc: subprocess.Popen[bytes], point: tuple[str, int], since: float) -> bool:
        """Wait until the run reaches ``point`` (True) or ends (False)."""
        kind, n = point
        deadline = time.time() + TIMEOUT
        while proc.poll() is None:
            if kind == "lock" and _lock_pid(self.run_dir) == proc.pid:
                return True
            if kind == "saving" and _partial_saves(self.run_dir):
                return True
            if kind == "record":
                records, _ = _records_quiet(self.run_dir)
                mine = [r for r in records if r["phase"] == "train" and r["time"] >= since]
                if len(mine) > n:
                    return True
            assert time.time() < deadline, f"{point} not reached in {TIMEOUT} s"
            time.sleep(0.005)
        return False

    def _refusable(self, how: str) -> bool:
        """Whether ``how`` is refused on the run dir as it is (``--resume`` needs a run dir
        with config.yaml and a finished checkpoint)."""
        return how == "resume" and (
            not (self.run_dir / "config.yaml").is_file() or not _checkpoints(self.run_dir)
        )

    def _expect_refusal(self, proc: subprocess.Popen[bytes], offset: int, before: Any) -> None:
        rc = self._wait(proc)
        self.history[-1] += " (refused)"
        out = self._output(offset)
        assert rc == 2, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        assert _snapshot(self.run_dir) == before, "a refused command changed the run dir"

    def _expect_completed(self, rc: int, offset: int) -> None:
        """A run that ended by itself: exit 0, no traceback, no partial save, no lock."""
        out = self._output(offset)
        assert rc == 0, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        self._check_ended()

    def _check_ended(self) -> None:
        assert not _partial_saves(self.run_dir), _partial_saves(self.run_dir)
        assert not (self.run_dir / LOCK).exists(), "a run that ended left its lock"

    # ------------------------------------------------------------------------------------
    # Rules

    @rule(how=st.sampled_from(["start", "resume"]))
    def run_to_the_end(self, how: str) -> None:
        with self._step(f"{how}"):
            before, refusable = _snapshot(self.run_dir), self._refusable(how)
            proc, _, offset = self._start(how)
            self.killed = False
            if refusable:
                self._expect_refusal(proc, offset, before)
                return
            self._expect_completed(self._wait(proc), offset)
            self._check_complete()

    @rule(how=st.sampled_from(["start", "resume"]), point=POINTS)
    def kill_9(self, how: str, point: tuple[str, int]) -> None:
        with self._step(f"kill -9 {how} at {point}"):
            before, refusable = _snapshot(self.run_dir), self._refusable(how)
            proc, launched, offset = self._start(how)
            if refusable:
                self.killed = False
                self._expect_refusal(proc, offset, before)
                return
            if self._reached(proc, point, launched):
                proc.send_signal(signal.SIGKILL)
                self._wait(proc)
                self.killed = True
                self.history[-1] += f" (killed; checkpoints {_checkpoints(self.run_dir)})"
            else:
                self.killed = False
                self._expect_completed(self._wait(proc), offset)

    @rule(how=st.sampled_from(["start", "resume"]), n=st.integers(0, STEPS - 1))
    def sigterm(self, how: str, n: int) -> None:
        """SIGTERM once this attempt logged n+1 steps: it saves at the next step boundary and
        exits 0, its checkpoint naming the steps logged."""
        with self._step(f"SIGTERM {how} after record {n}"):
            before, refusable = _snapshot(self.run_dir), self._refusable(how)
            proc, launched, offset = self._start(how)
            self.killed = False
            if refusable:
                self._expect_refusal(proc, offset, before)
                return
            if self._reached(proc, ("record", n), launched):
                proc.send_signal(signal.SIGTERM)
                self.history[-1] += " (sent)"
            self._expect_completed(self._wait(proc), offset)
            records, _ = _records(self.run_dir)
            train = sorted(r["step"] for r in records if r["phase"] == "train")
            assert _checkpoints(self.run_dir)[-1] == train[-1] + 1, (
                _checkpoints(self.run_dir),
                train,
            )

    @rule(point=POINTS, second=st.sampled_from(["start", "resume"]))
    def concurrent_start(self, point: tuple[str, int], second: str) -> None:
        """A second command on the run dir while the first holds it (stopped meanwhile with
        SIGSTOP, so that the run dir cannot change under the comparison): refused, exit 2,
        naming the owner, the run dir byte-identical; the first then runs to its end."""
        with self._step(f"start, then {second} at {point}"):
            self.killed = False
            first, launched, offset = self._start("start")
            if self._reached(first, point, launched) and _lock_pid(self.run_dir) == first.pid:
                os.killpg(first.pid, signal.SIGSTOP)
                self.history[-1] += " (stopped)"
                try:
                    before = _snapshot(self.run_dir)
                    proc, _, second_offset = self._start(second)
                    rc = self._wait(proc)
                    out = self._output(second_offset)
                    assert rc == 2, out[-3000:]
                    assert "Traceback" not in out, out[-3000:]
                    if not self._refusable(second):
                        assert f"is in use by pid {first.pid}" in out, out[-3000:]
                    assert _snapshot(self.run_dir) == before, (
                        "a refused command changed the run dir"
                    )
                finally:
                    os.killpg(first.pid, signal.SIGCONT)
            self._expect_completed(self._wait(first), offset)
            self._check_complete()

    @precondition(lambda self: self.mount is not None)
    @rule(how=st.sampled_from(["start", "resume"]), full=st.sampled_from(["inodes", "space"]))
    def disk_full(self, how: str, full: str) -> None:
        """A run on a full tmpfs: ``inodes`` leaves room for the run's small files but not a
        checkpoint's ~35 (orbax starts writing, then fails); ``space`` leaves less room than a
        checkpoint takes (refused by the free-space check before orbax writes). The run stops
        at its first save with exit 1 and one line, the partial save removed; or, with nothing
        left to save, it ends normally. Then the disk is freed."""
        assert self.mount is not None
        with self._step(f"{how} on a disk full of {full}"):
            before, refusable = _snapshot(self.run_dir), self._refusable(how)
            filler = self.mount / "filler"
            filler.mkdir()
            try:
                if full == "inodes":
                    free = os.statvfs(self.mount).f_favail
                    for i in range(free - 10):
                        (filler / str(i)).touch()
                else:
                    stat = os.statvfs(self.mount)
                    used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
                    _remount(self.mount, f"size={used + 96 * 1024}")
                proc, _, offset = self._start(how)
                self.killed = False
                if refusable:
                    self._expect_refusal(proc, offset, before)
                    return
                rc = self._wait(proc)
                self.history[-1] += f" (exit {rc})"
                out = self._output(offset)
                assert "Traceback" not in out, out[-3000:]
                assert rc in (0, 1), out[-3000:]
                if rc == 1:
                    last = out.strip().splitlines()[-1]
                    assert last.startswith("pd-train: error: checkpoint at step"), out[-3000:]
                    assert "could not be written" in last, last
                    self._check_ended()
                else:
                    self._expect_completed(rc, offset)
                    self._check_complete()
            finally:
                shutil.rmtree(filler)
                _remount(self.mount, "size=64m")

    # ------------------------------------------------------------------------------------
    # What holds after every rule

    @invariant()
    def logged_once_and_as_the_reference(self) -> None:
        self.failed = True
        records, partial = _records(self.run_dir)
        assert not partial or self.killed, "a partial line in metrics.jsonl of a run that ended"
        keys = [(r["phase"], r["step"]) for r in records]
        assert len(keys) == len(set(keys)), f"steps logged twice: {keys}"
        for record in records:
            key = (record["phase"], record["step"])
            assert key in self.reference, key
            assert _compared(record) == self.reference[key], key
        steps = _checkpoints(self.run_dir)
        if steps:  # every step up to the latest checkpoint is there
            train = {s for p, s in keys if p == "train"}
            assert set(range(steps[-1])) <= train, (steps, sorted(train))
        self.failed = False

    @invariant()
    def no_finished_checkpoint_lost(self) -> None:
        self.failed = True
        steps = _checkpoints(self.run_dir)
        self.finished |= set(steps)
        for step in self.finished:
            superseded = sum(s > step for s in steps) >= KEEP
            assert step in steps or superseded, (
                f"checkpoint {step} lost: {steps} on disk, {sorted(self.finished)} seen"
            )
        self.failed = False

    # ------------------------------------------------------------------------------------

    def _check_complete(self) -> None:
        records, _ = _records(self.run_dir)
        train = {r["step"]: _compared(r) for r in records if r["phase"] == "train"}
        expected = {s: v for (p, s), v in self.reference.items() if p == "train"}
        assert train == expected, "the completed trajectory differs from the uninterrupted one"
        assert _checkpoints(self.run_dir)[-1] == STEPS

    def teardown(self) -> None:
        try:
            if not self.failed:
                # Whatever the sequence left, the run completes with the same trajectory.
                with self._step("end"):
                    proc, _, offset = self._start("start")
                    self.killed = False
                    self._expect_completed(self._wait(proc), offset)
                    self._check_complete()
                    self.logged_once_and_as_the_reference()
                    self.no_finished_checkpoint_lost()
        finally:
            print("sequence:", " | ".join(self.history), "(failed)" if self.failed else "")
            if self.failed and self.run_dir.exists():  # kept for a look: log and run dir
                shutil.copytree(self.run_dir, self.work / "run-at-failure", symlinks=True)
                print("kept:", self.work)
            if self.mount is not None:
                subprocess.run(["umount", "-l", str(self.mount)], check=False)
            if not self.failed:
                shutil.rmtree(self.work, ignore_errors=True)


def _records_quiet(run_dir: Path) -> tuple[list[dict[str, Any]], bool]:
    """:func:`_records` while a run writes: a line being written is not yet a record."""
    try:
        return _records(run_dir)
    except (OSError, json.JSONDecodeError):
        return [], False


def _remount(mount: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(mount)], check=True)


@pytest.mark.slow
def test_random_sequences_lose_nothing_and_duplicate_nothing(
    setup: dict[str, Any], tmp_path: Path
) -> None:
    tmpfs = _can_mount_tmpfs(tmp_path / "probe")
    run_state_machine_as_test(
        seed(SEED)(lambda: RunDirStates(setup, tmpfs)),
        settings=settings(
            max_examples=int(os.environ.get("PD_STATES_EXAMPLES", 4)),
            stateful_step_count=int(os.environ.get("PD_STATES_RULES", 4)),
            derandomize=False,  # the fixed seed instead
            database=None,
            deadline=None,
            phases=(Phase.explicit, Phase.generate),
            suppress_health_check=list(HealthCheck),
            print_blob=False,
        ),
    )
