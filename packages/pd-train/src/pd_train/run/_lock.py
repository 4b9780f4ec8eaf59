"""A run dir has one owner: ``RUN_DIR/.pd-train.lock``, taken before anything else is written.

Mechanism, and why it holds on the filesystems clusters share run dirs on (NFSv3/v4, Lustre,
GPFS, BeeGFS, CephFS):

* **The lock file is created with ``O_CREAT | O_EXCL``**, and holds its owner as JSON (host,
  pid, the pid's start time, when). Exclusive create is atomic on a local disk and on every
  one of those filesystems (NFS since v3 with Linux ≥ 2.6, where the server decides; the
  distributed filesystems through their metadata server), and it needs no lock daemon and no
  mount option. Of two processes, on any nodes, exactly one creates the file; the other finds
  it and is refused, with the owner named (exit 2).
* **The owner also holds an ``fcntl`` write lock on the file** for its lifetime. The kernel
  drops it when the process dies, however it dies. Where the filesystem propagates POSIX locks
  across nodes (NFS via NLM/NFSv4, Lustre mounted with ``flock``, GPFS, CephFS), a live owner
  on another node is seen as such; where it does not (Lustre ``localflock``), the lock still
  serializes the processes of one node — which is all a takeover needs, see below. A
  filesystem without ``fcntl`` locks (Lustre ``noflock``: ENOSYS) falls back to the pid check
  alone.
* **A stale lock is taken over only on the owner's own host**, and only when its pid is gone
  (or now belongs to a process started at another time: a reused pid) *and* its ``fcntl`` lock
  can be taken: then the process is certainly dead. The takeover holds that ``fcntl`` lock,
  checks that the path still names the very file it locked (same inode: no one replaced it
  meanwhile), unlinks it and creates a new one with ``O_EXCL`` — so two processes taking over
  one stale lock cannot both win. A lock of another host is never taken over (its pid means
  nothing here): the message says to remove the file once that process is known to be gone.

A multi-process run is owned by its process 0 (the only one that writes run-dir files); the
others reach it through ``jax.distributed``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from pd_train.run._run_dir import RunDirError

log = logging.getLogger("pd_train")

LOCK_FILE = ".pd-train.lock"


class RunDirLocked(RunDirError):
    """The run dir is owned by another live process (nothing was written)."""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), or
    None where /proc does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    if start is not None:
        now = _start_time(pid)
        if now is not None and now != start:
            return False  # the pid was reused
    return True


def _try_fcntl(fd: int) -> bool | None:
    """Take a non-blocking fcntl write lock on ``fd``: True when taken, False when another
    process holds one, None where the filesystem has no fcntl locks."""
    import fcntl

    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK):
            return None
        raise
    return True


class RunDirLock:
    """The lock of one run dir (see the module docstring). :meth:`acquire` creates the run dir
    if needed and the lock file, or raises :class:`RunDirLocked`; :meth:`release` removes the
    lock file, and the run dir when this lock created it and nothing else was written there.
    A context manager; ``enabled=False`` (processes other than 0) does nothing."""

    def __init__(self, run_dir: Path, *, enabled: bool = True) -> None:
        self.run_dir = Path(run_dir).absolute()
        self.path = self.run_dir / LOCK_FILE
        self.enabled = enabled
        self._fd: int | None = None
        self._created_dirs: list[Path] = []  # made by acquire, deepest first

    def owner(self) -> dict[str, Any]:
        return {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "start": _start_time(os.getpid()),
            "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        }

    def acquire(self) -> RunDirLock:
        if not self.enabled or self._fd is not None:
            return self
        if not self.run_dir.exists():
            missing = [self.run_dir]
            while not missing[-1].parent.exists():
                missing.append(missing[-1].parent)
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._created_dirs = missing
        try:
            for _ in range(10):
                if self._create():
                    return self
                self._take_over_stale()  # raises for a live or foreign owner
            msg = f"--run-dir {self.run_dir}: could not take its lock {self.path}"
            raise RunDirLocked(msg)
        except BaseException:
            self._remove_dir()
            raise

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        _try_fcntl(fd)  # held until release or death; None where unsupported: O_EXCL alone
        os.write(fd, (json.dumps(self.owner()) + "\n").encode())
        os.fsync(fd)
        self._fd = fd
        return True

    def _take_over_stale(self) -> bool:
        """Remove the existing lock if its owner is certainly dead (returns True: try to
        create again); raise :class:`RunDirLocked` naming a live or foreign owner; False when
        the file vanished or changed meanwhile (try again)."""
        try:
            fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            locked = _try_fcntl(fd)
            try:
                text = os.read(fd, 4096).decode(errors="replace")
                if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                    return False  # replaced since we opened it
            except FileNotFoundError:
                return False
            owner = _parse(text)
            here = socket.gethostname()
            if owner is None:
                # An empty or torn file: its creator is between O_EXCL and the write, or died
                # there. Only a free fcntl lock and an old file make it stale.
                age = time.time() - os.fstat(fd).st_mtime
                if locked is False or age < 10:
                    raise RunDirLocked(self._refusal("a process that is starting (no owner yet)"))
            else:
                who = f"pid {owner.get('pid')} on {owner.get('host')} since {owner.get('since')}"
                if owner.get("host") != here:
                    raise RunDirLocked(self._refusal(who, foreign=True))
                pid = owner.get("pid")
                alive = not isinstance(pid, int) or _alive(pid, owner.get("start"))
                if alive:
                    raise RunDirLocked(self._refusal(who))
                if locked is False:
                    # A dead owner's file whose fcntl lock another process holds: that process
                    # is taking it over; look again at what it creates (not the dead owner).
                    time.sleep(0.05)
                    return False
                log.warning(
                    "run dir %s: taking over the stale lock of %s (gone)", self.run_dir, who
                )
            os.unlink(self.path)
            return True
        finally:
            os.close(fd)  # releases our fcntl lock on the old file

    def _refusal(self, who: str, *, foreign: bool = False) -> str:
        if foreign:
            after = (
                f"its pid cannot be checked from {socket.gethostname()}; if that process is "
                f"gone, remove {self.path}"
            )
        else:
            after = "wait for it to end, stop it, or use another --run-dir"
        return f"--run-dir {self.run_dir} is in use by {who} (lock {self.path}); {after}"

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)
        self._fd = None
        self._remove_dir()

    def _remove_dir(self) -> None:
        """Remove the directories :meth:`acquire` made (the run dir and the parents it had to
        make, e.g. ``output_dir``), each only if nothing else was written there: a run refused
        after taking the lock leaves nothing behind."""
        for made in self._created_dirs:
            try:
                made.rmdir()
            except OSError:  # not empty: the run wrote there
                break
        self._created_dirs = []

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _parse(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None
