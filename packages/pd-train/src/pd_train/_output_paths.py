"""Whether an output path can be written, asked before any work starts; a fresh dated
directory to write into (:func:`dated_dir`).

Every command that writes (``run``'s ``output_dir`` and ``--run-dir``, ``analyze --out`` and
its default under the run dir, ``report --out``, ``tokenize --out``, ``pretrain --out``,
``compile --record``, ``probe --out``) asks :func:`directory_problem` or :func:`file_problem`
first, and refuses with exit 2 and the answer, instead of failing after the work.

Permission bits are not enough to answer: root may write anywhere the bits forbid, and a
directory can refuse new entries whatever its bits say (``/proc``, a read-only mount). So the
answer comes from the filesystem: an empty temp file is created in the directory that would
be written (the path itself, or its nearest existing ancestor when the path is still to be
made) and removed at once. Nothing else is created.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime
from pathlib import Path

__all__ = ["dated_dir", "directory_problem", "file_problem"]


def dated_dir(root: str | Path, name: str) -> Path:
    """A directory that does not exist yet (nothing is made): ``root/NAME-YYYYmmdd-HHMMSS``,
    then ``-2``, ``-3``, ... appended while that exists; a relative ``root`` (``~`` expanded)
    is under the working directory. A new run dir, sweep dir or toy run dir."""
    root = Path(root).expanduser()
    if not root.is_absolute():
        root = Path.cwd() / root
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = root / f"{name}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{name}-{stamp}-{n}"
    return path


def _write_error(directory: Path) -> str | None:
    """Why a new file cannot be made in the existing directory ``directory``, or None."""
    try:
        fd, name = tempfile.mkstemp(prefix=".pd-write-check-", dir=directory)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(name)
    return None


def directory_problem(path: Path, *, base: Path | None = None) -> str | None:
    """Why the directory ``path`` (relative to ``base``, default the working directory) cannot
    be used or created, or None. An existing path must be a directory that takes new files;
    otherwise its nearest existing ancestor must be one."""
    path = Path(path)
    path = path if path.is_absolute() else (base or Path.cwd()) / path
    if path.exists():
        if not path.is_dir():
            return f"{str(path)!r} is a file, not a directory"
        why = _write_error(path)
        return None if why is None else f"{str(path)!r} is not writable ({why})"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot create {str(path)!r}: {str(ancestor)!r} is a file, not a directory"
    why = _write_error(ancestor)
    if why is not None:
        return f"cannot create {str(path)!r}: {str(ancestor)!r} is not writable ({why})"
    return None


def file_problem(path: Path, *, base: Path | None = None) -> str | None:
    """Why the file ``path`` cannot be written (created, or replaced when it exists), or None:
    it must not be a directory, an existing file must be writable, and its directory must take
    new files (writers go through a temp file beside it) or be creatable."""
    path = Path(path)
    path = path if path.is_absolute() else (base or Path.cwd()) / path
    if path.is_dir():
        return f"{str(path)!r} is a directory; expected a file"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{str(path)!r} is not writable"
    return directory_problem(path.parent)
