"""Experiment tracking (optional): a run's ``metrics.jsonl`` mirrored into a Weights & Biases run.

``metrics.jsonl`` stays the source of truth: :func:`sync_wandb` reads it and logs every finite
scalar of every train and eval record (``train/<key>``, ``eval/<key>``; eval keys already
starting with ``eval/`` keep their name) at the record's step, so every tracked value comes from
the file. Non-scalar entries (CI histograms, per-component density vectors) stay in the file and
the report; warmup records (negative steps) go into the W&B summary only, as
``warmup/<key>``. Only the calling process logs: ``pd-train run`` with a ``tracking:``
section runs a :class:`WandbTracker` on process 0 that follows the file as it is written;
``pd-train track`` (:func:`sync_wandb`) is one process that syncs after the fact.

The W&B run id is kept in ``RUN_DIR/tracking/wandb.json`` with the last step logged: syncing
again after the run went on (or was resumed) continues the same W&B run (``resume="allow"``)
from the next step. ``mode: offline`` writes under ``RUN_DIR/tracking/`` without network
(upload later with ``wandb sync``); ``disabled`` logs nothing.

Config, from ``pd-train track`` flags or a ``tracking:`` section of the run's ``config.yaml``::

    tracking:
      wandb: {project: pd, entity: my-team, mode: offline, tags: [tiny]}

``wandb`` is an extra: ``pip install 'pd-train[wandb]'``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

__all__ = ["SyncResult", "WandbConfig", "WandbTracker", "parse_tracking", "sync_wandb"]

MODES = ("online", "offline", "disabled")
STATE_FILE = "wandb.json"
TRACKING_DIR = "tracking"


@dataclass(frozen=True)
class WandbConfig:
    project: str
    entity: str | None = None
    mode: str = "online"
    tags: tuple[str, ...] = ()


def parse_tracking(raw: Any, *, where: str = "tracking") -> WandbConfig:
    """A :class:`WandbConfig` from ``{"wandb": {project, entity, mode, tags}}``; every problem
    raises ConfigError together, each naming its field path (``tracking.wandb.mode``)."""
    from pd_train._config_io import ConfigError

    problems: list[tuple[str, str]] = []
    if not isinstance(raw, Mapping):
        raise ConfigError([(where, f"got {raw!r}; must be a mapping with a 'wandb' section")])
    unknown = sorted(set(raw) - {"wandb"})
    problems += [
        (
            f"{where}.{k}",
            "unknown tracker; pd-train mirrors metrics.jsonl into Weights & Biases only "
            "(tracking: {wandb: {project: NAME}}); another tracker can read RUN_DIR/metrics.jsonl",
        )
        for k in unknown
    ]
    if unknown and "wandb" not in raw:
        raise ConfigError(problems)  # no W&B section was meant: nothing to say about one
    section = raw.get("wandb")
    path = f"{where}.wandb"
    if not isinstance(section, Mapping):
        problems.append(
            (path, f"got {section!r}; must be a mapping with project, entity, mode, tags")
        )
        raise ConfigError(problems)
    allowed = ("project", "entity", "mode", "tags")
    problems += [
        (f"{path}.{k}", f"unknown key; allowed: {', '.join(allowed)}")
        for k in sorted(set(section) - set(allowed))
    ]
    project = section.get("project")
    if not isinstance(project, str) or not project.strip():
        problems.append((f"{path}.project", f"got {project!r}; must be a non-empty string"))
    entity = section.get("entity")
    if entity is not None and (not isinstance(entity, str) or not entity.strip()):
        problems.append((f"{path}.entity", f"got {entity!r}; must be a non-empty string or null"))
    mode = section.get("mode", "online")
    if mode not in MODES:
        problems.append((f"{path}.mode", f"got {mode!r}; must be one of {', '.join(MODES)}"))
    tags = section.get("tags", [])
    if not isinstance(tags, list | tuple) or not all(isinstance(t, str) and t for t in tags):
        problems.append((f"{path}.tags", f"got {tags!r}; must be a list of non-empty strings"))
    if problems:
        raise ConfigError(problems)
    return WandbConfig(project=str(project), entity=entity, mode=mode, tags=tuple(tags))


@dataclass(frozen=True)
class SyncResult:
    run_id: str | None
    logged_steps: int
    last_step: int | None
    summary: dict[str, Any]


def _scalar(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _key(phase: str, name: str) -> str:
    return name if name.startswith(f"{phase}/") else f"{phase}/{name}"


def history(
    records: Sequence[Mapping[str, Any]],
) -> tuple[dict[int, dict[str, float]], dict[str, float]]:
    """``({step: {key: value}}, warmup summary)`` of metric records: the finite scalars of train
    and eval records per step, and the last warmup value of each warmup key."""
    steps: dict[int, dict[str, float]] = {}
    warmup: dict[str, float] = {}
    skip = {"step", "phase", "time"}
    for record in records:
        phase, step = record.get("phase"), record.get("step")
        if not isinstance(step, int) or phase not in ("train", "eval", "warmup"):
            continue
        values = {
            _key(phase, k): x
            for k, v in record.items()
            if k not in skip and (x := _scalar(v)) is not None
        }
        if phase == "warmup":
            warmup.update(values)
        else:
            steps.setdefault(step, {}).update(values)
    return steps, warmup


class WandbTracker:
    """A W&B run that follows ``RUN_DIR/metrics.jsonl`` while it is written (``pd-train run``
    with a ``tracking:`` section, on process 0 only) or after the fact (:func:`sync_wandb`).

    :meth:`sync` reads the lines appended since the last call and logs every step older than
    the newest step seen (its eval record may still follow); :meth:`close` logs the rest, sets
    the warmup summary, finishes the W&B run and keeps its id and last step in
    ``RUN_DIR/tracking/wandb.json``, so a resumed run continues the same W&B run. Steps at or
    before the last step already logged (a resume re-runs the steps after its checkpoint) are
    not logged again. ``mode: disabled`` opens nothing and logs nothing.
    """

    def __init__(self, run_dir: str | Path, config: WandbConfig, *, run_config: Any = None):
        self.run_dir = Path(run_dir)
        self.config = config
        self.logged = 0
        self._offset = 0
        self._pending: dict[int, dict[str, float]] = {}
        self._warmup: dict[str, float] = {}
        self._run: Any = None
        self._state_path = self.run_dir / TRACKING_DIR / STATE_FILE
        state = json.loads(self._state_path.read_text()) if self._state_path.is_file() else {}
        self.last_step: int | None = state.get("last_step")
        if config.mode == "disabled":
            return
        import wandb  # type: ignore[import-not-found,unused-ignore]  # the optional extra

        self._state_path.parent.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=config.project,
            entity=config.entity,
            mode=cast(Any, config.mode),  # one of MODES, checked by parse_tracking
            tags=list(config.tags),
            id=state.get("run_id"),  # None the first time: W&B assigns one, kept below
            resume="allow",
            dir=str(self._state_path.parent),
            name=self.run_dir.name,
            config=run_config,
        )

    @property
    def run_id(self) -> str | None:
        return None if self._run is None else str(self._run.id)

    def _read_new(self) -> None:
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return
        with path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # complete lines only; a line being written waits
        self._offset += end
        records = [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        steps, warmup = history(records)
        self._warmup.update(warmup)
        for step, values in steps.items():
            self._pending.setdefault(step, {}).update(values)

    def _log_until(self, limit: int | None) -> None:
        for step in sorted(self._pending):
            if limit is not None and step >= limit:
                break
            values = self._pending.pop(step)
            if self.last_step is not None and step <= self.last_step:
                continue
            self._run.log(values, step=step, commit=True)
            self.last_step = step
            self.logged += 1

    def _write_state(self) -> None:
        tmp = self._state_path.with_name(f".{STATE_FILE}.tmp")
        state = {"run_id": self.run_id, "project": self.config.project, "last_step": self.last_step}
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._state_path)

    def sync(self) -> None:
        """Log the records written since the last call, all but the newest step's."""
        if self._run is None:
            return
        self._read_new()
        if self._pending:
            self._log_until(max(self._pending))
            self._write_state()

    def close(self) -> dict[str, Any]:
        """Log everything left, finish the W&B run, keep its id; returns its summary."""
        if self._run is None:
            return {}
        try:
            self._read_new()
            self._log_until(None)
            for key, value in self._warmup.items():
                self._run.summary[key] = value
            summary = {k: self._run.summary[k] for k in self._run.summary.keys()}  # noqa: SIM118
        finally:
            self._run.finish()
        self._write_state()
        self._run = None
        return summary


def sync_wandb(run_dir: str | Path, config: WandbConfig, *, run_config: Any = None) -> SyncResult:
    """Log ``run_dir``'s records after the last synced step to its W&B run (see the module
    docstring); returns the run id, the number of steps logged now, the last step and the W&B
    run's summary."""
    tracker = WandbTracker(run_dir, config, run_config=run_config)
    run_id = tracker.run_id
    summary = tracker.close()
    return SyncResult(
        run_id=run_id, logged_steps=tracker.logged, last_step=tracker.last_step, summary=summary
    )
