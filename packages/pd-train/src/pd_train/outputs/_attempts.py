"""What a run dir says about its earlier attempts: the device count each one ran on.

Every attempt of a run writes ``compile.json`` (pd-probe's record, with ``jax.device_count``);
a later attempt moves it to ``compile-attempt-N.json`` first (:func:`pd_train.run`'s
``_keep_compile_record``). A resume on another device count restores the state exactly, but
the steps after it may reduce over another split of the batch, so the trajectory is not
guaranteed to be bit-exact with an uninterrupted run (5e-7 apart in the loss was seen; on the
tiny test config, 1 → 2 devices, two steps happened to match): :func:`resume_device_warning`
says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["earlier_device_count", "resume_device_warning"]

_ATTEMPT = re.compile(r"compile-attempt-(\d+)\.json")


def _latest_record(run_dir: Path) -> Path | None:
    """``compile.json`` if the latest attempt's record is still there, else the highest
    ``compile-attempt-N.json``, else None."""
    current = run_dir / "compile.json"
    if current.is_file():
        return current
    attempts = [
        (int(m.group(1)), p)
        for p in run_dir.glob("compile-attempt-*.json")
        if (m := _ATTEMPT.fullmatch(p.name))
    ]
    return max(attempts)[1] if attempts else None


def earlier_device_count(run_dir: Path) -> tuple[int, str] | None:
    """``(device count, record file name)`` of the latest earlier attempt of the run in
    ``run_dir``, or None when no readable record says."""
    record = _latest_record(Path(run_dir))
    if record is None:
        return None
    try:
        count = json.loads(record.read_text())["jax"]["device_count"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a record cut short by a killed run: nothing to compare with
    if isinstance(count, bool) or not isinstance(count, int):
        return None
    return count, record.name


def resume_device_warning(run_dir: Path, device_count: int) -> str | None:
    """A warning for a resume of ``run_dir`` on ``device_count`` devices when its latest
    earlier attempt ran on another count (None when it is the same, or unknown)."""
    earlier = earlier_device_count(run_dir)
    if earlier is None or earlier[0] == device_count:
        return None
    count, name = earlier
    return (
        f"resuming {run_dir} on {device_count} device(s); its last attempt ran on {count} "
        f"({name}). The state is restored exactly, but the steps from here may reduce over "
        "another split of the batch, so the run is not guaranteed to be bit-exact with one that "
        f"ran on {count} device(s) throughout (differences in the last digits, ~5e-7 in the loss, "
        f"have been seen); resume on {count} device(s) for a bit-exact continuation"
    )
