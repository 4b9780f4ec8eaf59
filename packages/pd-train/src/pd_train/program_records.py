"""Why a jit missed the persistent compile cache: the nearest cached program, and what differs.

Beside the programs it caches, ``pd-train compile`` and ``pd-train run`` keep a small record
per jit and config in ``<compile cache dir>/program-records/`` (process 0 only): the config's
structural fields (:mod:`pd_train.config.hyperparameters`, with the target's resolved architecture),
its value fields, and the environment that enters every cache key (jax, the backend and its
devices, ``XLA_FLAGS``, pd's source). When a jit misses the cache, the record nearest to this
run's is found and one line says what differs::

    cache miss: train_step: the nearest cached train_step differs in structural fields:
      pd.batch_size (8 there, 16 here); a structural change compiles new programs

or that it differs only in values that are still trace-time constants (issue 27), or in pd's
source, or that no program of that jit was recorded in this cache yet.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_train.config import hyperparameters

__all__ = ["RECORDS_DIR", "Difference", "ProgramRecords", "explaining", "fingerprint"]

#: The records' folder inside the compile cache's directory.
RECORDS_DIR = "program-records"
#: Records kept per jit (the oldest go first).
MAX_RECORDS_PER_JIT = 64
_SHOWN = 6


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def _architecture(model: Any) -> dict[str, Any]:
    import attrs

    if model is None:
        return {}
    if attrs.has(type(model)):
        return {f"target.architecture.{k}": v for k, v in attrs.asdict(model).items()}
    return {"target.architecture": repr(model)}


def environment() -> dict[str, Any]:
    """What enters every program's cache key besides the config."""
    import importlib.metadata

    import jax

    from pd_train.process_env import source_digest

    devices = jax.devices()
    return {
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "backend": devices[0].platform,
        "devices": [d.device_kind for d in devices],
        "processes": jax.process_count(),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
        "pd source": source_digest()[:16],
    }


def fingerprint(config: Any, model: Any = None) -> dict[str, dict[str, Any]]:
    """``{"structural": {path: value}, "values": {path: value}, "environment": {...}}`` of a
    run config (paths as in the config: ``pd.loss_metrics[1].coeff``). A value with a
    structural switch (``pd.components.clip``: null or not) also adds its switch
    (``pd.components.clip is null``) to the structural fields; ``model``: the target's
    resolved architecture (a LlamaConfig), recorded as structural fields too."""
    from pd_train.config.io import unstructure

    structural, values = hyperparameters.split_leaves(unstructure(config))
    structural.update(_architecture(model))
    return _jsonable({"structural": structural, "values": values, "environment": environment()})


@dataclass(frozen=True)
class Difference:
    """One field that differs between a cached program's record and this run."""

    path: str
    there: Any
    here: Any

    def __str__(self) -> str:
        def short(v: Any) -> str:
            text = "absent" if v is _ABSENT else json.dumps(v)
            return text if len(text) <= 40 else text[:37] + "..."

        return f"{self.path} ({short(self.there)} there, {short(self.here)} here)"


_ABSENT = object()


def _differences(there: Mapping[str, Any], here: Mapping[str, Any]) -> list[Difference]:
    keys = [*here, *(k for k in there if k not in here)]
    return [
        Difference(k, there.get(k, _ABSENT), here.get(k, _ABSENT))
        for k in keys
        if there.get(k, _ABSENT) != here.get(k, _ABSENT)
    ]


@dataclass(frozen=True)
class Nearest:
    record: dict[str, Any]
    structural: list[Difference]
    environment: list[Difference]
    constants: list[Difference]
    data: list[Difference]


def _listed(diffs: list[Difference]) -> str:
    shown = "; ".join(str(d) for d in diffs[:_SHOWN])
    return shown + (f"; and {len(diffs) - _SHOWN} more" if len(diffs) > _SHOWN else "")


class ProgramRecords:
    """The records of one compile cache, seen from one run (its :func:`fingerprint`)."""

    def __init__(self, cache_dir: Path, here: dict[str, dict[str, Any]]) -> None:
        self.directory = Path(cache_dir) / RECORDS_DIR
        self.here = here
        self._lock = threading.Lock()

    @classmethod
    def for_config(cls, cache_dir: Path | None, config: Any, model: Any) -> ProgramRecords | None:
        """The records for a run of ``config`` with ``cache_dir`` as its compile cache; None
        without a cache, or in a process other than 0 (only process 0 writes the cache)."""
        import jax

        if cache_dir is None or jax.process_index() != 0:
            return None
        return cls(cache_dir, fingerprint(config, model))

    # -- the files
    def _records(self, jit: str) -> list[tuple[Path, dict[str, Any]]]:
        found = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being written, or damaged: not a comparison
            if isinstance(record, dict) and record.get("jit") == jit:
                found.append((path, record))
        return found

    def remember(self, jit: str) -> None:
        """Record that ``jit`` of this run is in the cache now (written or refreshed)."""
        record = {"jit": jit, **self.here}
        digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:20]
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in jit)[:60]
        path = self.directory / f"{safe}-{digest}.json"
        with self._lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            record["recorded_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
            tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            os.replace(tmp, path)
            records = self._records(jit)
            records.sort(key=lambda pr: pr[0].stat().st_mtime)
            for old, _ in records[: max(len(records) - MAX_RECORDS_PER_JIT, 0)]:
                old.unlink(missing_ok=True)

    # -- the comparison
    def nearest(self, jit: str) -> Nearest | None:
        """The recorded program of ``jit`` that differs from this run in the fewest structural
        (and environment) fields, then constant values, then the rest; the newest on a tie."""
        best: tuple[tuple[int, int, int, float], Nearest] | None = None
        for path, record in self._records(jit):
            structural = _differences(record.get("structural", {}), self.here["structural"])
            env = _differences(record.get("environment", {}), self.here["environment"])
            values = _differences(record.get("values", {}), self.here["values"])
            constants = [v for v in values if not _is_data(v.path)]
            data = [v for v in values if _is_data(v.path)]
            try:
                age = -path.stat().st_mtime
            except OSError:
                continue
            score = (len(structural) + len(env), len(constants), len(data), age)
            if best is None or score < best[0]:
                best = (score, Nearest(record, structural, env, constants, data))
        return None if best is None else best[1]

    def is_empty(self) -> bool:
        """Does this cache hold no program records at all (a new cache)?"""
        return not any(self.directory.glob("*.json"))

    def explain_new(self) -> str:
        """The one line for a run's misses in a cache that held no programs before it."""
        return (
            f"cache miss: the compile cache {self.directory.parent} holds no programs yet: each "
            "is compiled here the first time (a later run with the same shapes loads them)"
        )

    def explain(self, jit: str) -> str:
        """One line: why ``jit`` missed the cache, judged from the nearest record."""
        near = self.nearest(jit)
        head = f"cache miss: {jit}:"
        if near is None:
            return (
                f"{head} no {jit} program was recorded in this compile cache before "
                f"({self.directory.parent}); a first compile of it here"
            )
        there = f"the nearest cached {jit} (recorded {near.record.get('recorded_at', '?')})"
        if near.structural:
            return (
                f"{head} {there} differs in structural fields: {_listed(near.structural)}; "
                "a structural change compiles new programs (docs/hyperparameters.md)"
            )
        if near.environment:
            return (
                f"{head} {there} has the same structural fields but another environment: "
                f"{_listed(near.environment)}; any change of these compiles anew"
            )
        if near.constants:
            return (
                f"{head} {there} differs only in value fields that are still compiled in as "
                f"constants: {_listed(near.constants)} (issue 27 makes them data; "
                "docs/hyperparameters.md)"
            )
        values = f" (values that are data: {_listed(near.data)})" if near.data else ""
        return (
            f"{head} {there} differs in no structural field, environment or constant value"
            f"{values}; unexpected: the cached program may have been evicted or not stored "
            "(runtime.compile_cache.min_compile_time_s), or a value entered it as a constant"
        )


def _is_data(path: str) -> bool:
    """Whether the concrete value path ``path`` enters every program as data: it is not one of
    :data:`~pd_train.config.hyperparameters.CONSTANT_VALUE_FIELDS` (their paths hold no list index, so
    the concrete path is the schema path)."""
    return path not in hyperparameters.CONSTANT_VALUE_FIELDS


def label(info: Mapping[str, Any]) -> str:
    """A compile's jit as the recorder announces it: the phase, with the function's name when
    it is another (``init: init_params``)."""
    name, jit = str(info.get("name")), str(info.get("jit"))
    return name if jit in (name, "?") else f"{name}: {jit}"


def explaining(
    on_compile: Callable[[str, dict[str, Any]], None] | None,
    records: ProgramRecords | None,
    *,
    stream: Any = None,
) -> Callable[[str, dict[str, Any]], None] | None:
    """An ``on_compile`` callback for :class:`pd_probe.Recorder` that, around ``on_compile``
    (e.g. a :class:`pd_probe.CompileAnnouncer`; may be None), writes the explanation of each
    cache miss to ``stream`` (default stderr; None with ``on_compile`` None: explain nothing,
    only record) as soon as the miss is known, and records every jit served from or written to
    the cache. Without ``records`` (no cache, or not process 0): ``on_compile`` itself."""
    if records is None:
        return on_compile
    quiet = on_compile is None and stream is None
    # A cache that held no records when the run began: one line says so, not one per jit.
    new_cache = records.is_empty()
    said_new = False

    def callback(event: str, info: dict[str, Any]) -> None:
        nonlocal said_new
        jit = label(info)
        if event == "cache" and info.get("cache") == "miss" and not quiet:
            if new_cache and records.nearest(jit) is None:
                line, said_new = (None if said_new else records.explain_new()), True
            else:
                line = records.explain(jit)
            if line is not None:
                out = stream if stream is not None else sys.stderr
                out.write(line + "\n")
                out.flush()
        if on_compile is not None:
            on_compile(event, info)
        if event == "done" and info.get("cache") in ("hit", "miss"):
            records.remember(jit)

    return callback
