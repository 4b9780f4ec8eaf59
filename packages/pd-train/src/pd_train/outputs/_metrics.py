"""``RUN_DIR/metrics.jsonl``: one JSON object per line, written by the primary process only.

A record is ``{"step": int, "phase": "train" | "eval" | "warmup", "time": unix seconds, ...}``
plus the logged values: scalars become floats/ints/bools, small arrays nested lists, mappings
JSON objects (e.g. ``ci_hist/<site>: {"edges": [...], "counts": [...]}``). Non-finite floats are
written as Python's ``json`` writes them (``NaN``, ``Infinity``) so a diverging loss is kept;
:func:`read_metrics` reads them back.

Each record is written with one ``write`` and flushed, so a killed run keeps every record it
logged, at worst followed by one partial line, which :func:`read_metrics` skips (with a warning)
and :meth:`MetricsLog.truncate_from` drops.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

log = logging.getLogger("pd_train.outputs")

METRICS_FILE = "metrics.jsonl"
PHASES = ("train", "eval", "warmup")
RESERVED_KEYS = ("step", "phase", "time")
# Arrays up to this many elements are logged as lists (histograms, per-kind vectors); bigger
# ones are a mistake (a whole CI tensor) that would bloat the file.
MAX_ARRAY_SIZE = 4096


class MetricsError(ValueError):
    pass


def to_json_value(value: Any, *, key: str = "value") -> Any:
    """``value`` as plain JSON types: jax/numpy scalars → float/int/bool, arrays with at most
    ``MAX_ARRAY_SIZE`` elements → nested lists, mappings → dicts (keys as strings).

    Raises :class:`MetricsError` naming ``key`` for anything else (strings are kept as they are).
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v, key=f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_value(v, key=f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, np.generic | np.ndarray) or hasattr(value, "__array__"):
        # np.asarray fetches a jax array to the host (a device sync, as any logging is).
        array = np.asarray(value)
        if array.dtype.kind not in "biuf":
            msg = f"metric {key!r}: arrays must be numeric or bool, got dtype {array.dtype}"
            raise MetricsError(msg)
        if array.size > MAX_ARRAY_SIZE:
            msg = (
                f"metric {key!r}: array of shape {array.shape} has {array.size} elements; "
                f"at most {MAX_ARRAY_SIZE} can be logged (reduce it first, e.g. to a histogram)"
            )
            raise MetricsError(msg)
        return array.tolist()
    msg = (
        f"metric {key!r}: cannot log a {type(value).__name__}; allowed: numbers, bools, strings, "
        "numpy/jax scalars and arrays, lists and mappings of those"
    )
    raise MetricsError(msg)


class MetricsLog:
    """Appends records to ``RUN_DIR/metrics.jsonl``; on non-primary processes every method is a
    no-op, so all processes can call it unconditionally.

    On resume call :meth:`truncate_from` with the resume step before logging anything.
    """

    def __init__(self, run_dir: str | Path, *, is_primary: bool) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.is_primary = is_primary
        self._file: IO[str] | None = None

    def log(self, step: int, phase: str, metrics: Mapping[str, Any]) -> dict[str, Any] | None:
        """Write one record and flush it; returns the record written (None off the primary).

        Values are converted (and validated) on every process, so a bad metric fails the same
        way everywhere rather than only on process 0.
        """
        if isinstance(step, bool) or not isinstance(step, int | np.integer):
            msg = f"step must be an int, got {step!r} ({type(step).__name__})"
            raise MetricsError(msg)
        if phase not in PHASES:
            msg = f"phase must be one of {PHASES}, got {phase!r}"
            raise MetricsError(msg)
        clash = [k for k in metrics if k in RESERVED_KEYS]
        if clash:
            msg = f"metric names {clash} are reserved for the record itself ({RESERVED_KEYS})"
            raise MetricsError(msg)
        record: dict[str, Any] = {"step": int(step), "phase": phase, "time": time.time()}
        for name, value in metrics.items():
            record[str(name)] = to_json_value(value, key=str(name))
        if not self.is_primary:
            return None
        line = json.dumps(record) + "\n"
        if self._file is None:
            self._file = self._open()
        self._file.write(line)
        self._file.flush()
        return record

    def _open(self) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cut_short = False
        if self.path.exists() and self.path.stat().st_size > 0:
            with self.path.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                cut_short = f.read(1) != b"\n"
        file = self.path.open("a", encoding="utf-8")
        if cut_short:
            # A killed run's partial last line must not swallow the next record.
            file.write("\n")
        return file

    def truncate_from(self, step: int) -> int:
        """Drop train and eval records with ``record["step"] >= step`` (and any partial line left
        by a killed run); returns how many records were dropped.

        Warmup records are kept: warmup runs before training step 0, so it precedes every
        checkpoint. The file is rewritten atomically (temp file, then rename).
        """
        if not self.is_primary or not self.path.exists():
            return 0
        self.close()
        kept: list[str] = []
        dropped = 0
        for line, record in _parse_lines(self.path):
            if record is None:
                continue
            if record.get("phase") != "warmup" and record.get("step", -1) >= step:
                dropped += 1
                continue
            kept.append(line)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        if dropped:
            log.info("metrics.jsonl: dropped %d records with step >= %d (resume)", dropped, step)
        return dropped

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse_lines(path: Path) -> list[tuple[str, dict[str, Any] | None]]:
    """``(line, record or None if it does not parse)`` for every non-empty line.

    A line that does not parse is what a killed run leaves (a cut-short last line) or a damaged
    file holds (a byte that is not UTF-8: records are written as ASCII JSON); it is skipped with
    a warning naming the file and line, rather than failing the plots, summary and report of a
    long run over one line.
    """
    out: list[tuple[str, dict[str, Any] | None]] = []
    for lineno, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            log.warning(
                "%s:%d: skipping a line that is not UTF-8 text (byte 0x%02x at column %d): %.80r",
                path,
                lineno,
                raw[exc.start],
                exc.start + 1,
                raw,
            )
            out.append((raw.decode("utf-8", errors="replace"), None))
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            log.warning("%s:%d: skipping a line that is not a record: %.80r", path, lineno, line)
            record = None
        out.append((line, record))
    return out


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every record of ``RUN_DIR/metrics.jsonl`` in file order (a partial last line is skipped)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        msg = f"no metrics file at {path} (is {run_dir} a pd-train run directory?)"
        raise FileNotFoundError(msg)
    return [record for _, record in _parse_lines(path) if record is not None]
