"""Experiment tracking (optional): a run's ``metrics.jsonl`` mirrored into a Weights & Biases run.

``metrics.jsonl`` stays the source of truth: :func:`sync_wandb` reads it and logs every finite
scalar of every train and eval record (``train/<key>``, ``eval/<key>``; eval keys already
starting with ``eval/`` keep their name) at the record's step, so every tracked value comes from
the file. Non-scalar entries (CI histograms, per-component density vectors) stay in the file and
the report; warmup records (negative steps) go into the W&B summary only, as
``warmup/<key>``. Only the calling process logs (``pd-train track`` is one process).

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

__all__ = ["SyncResult", "WandbConfig", "parse_tracking", "sync_wandb"]

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
    problems += [(f"{where}.{k}", "unknown key; allowed: 'wandb'") for k in unknown]
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


def sync_wandb(run_dir: str | Path, config: WandbConfig, *, run_config: Any = None) -> SyncResult:
    """Log ``run_dir``'s records after the last synced step to its W&B run (see the module
    docstring); returns the run id, the number of steps logged now, the last step and the W&B
    run's summary."""
    from pd_train.outputs import read_metrics

    run_dir = Path(run_dir)
    steps, warmup = history(read_metrics(run_dir))
    if config.mode == "disabled":
        return SyncResult(run_id=None, logged_steps=0, last_step=None, summary={})
    import wandb  # type: ignore[import-not-found,unused-ignore]  # the optional extra

    directory = run_dir / TRACKING_DIR
    directory.mkdir(parents=True, exist_ok=True)
    state_path = directory / STATE_FILE
    state = json.loads(state_path.read_text()) if state_path.is_file() else {}
    run_id = state.get("run_id")  # None the first time: W&B assigns one, kept below
    last = state.get("last_step")
    run = wandb.init(
        project=config.project,
        entity=config.entity,
        mode=cast(Any, config.mode),  # one of MODES, checked by parse_tracking
        tags=list(config.tags),
        id=run_id,
        resume="allow",
        dir=str(directory),
        name=run_dir.name,
        config=run_config,
    )
    logged = 0
    try:
        for step in sorted(steps):
            if last is not None and step <= last:
                continue
            run.log(steps[step], step=step, commit=True)
            last = step
            logged += 1
        for key, value in warmup.items():
            run.summary[key] = value
        summary = {k: run.summary[k] for k in run.summary.keys()}  # noqa: SIM118
    finally:
        run.finish()
    tmp = state_path.with_name(f".{STATE_FILE}.tmp")
    tmp.write_text(json.dumps({"run_id": run.id, "project": config.project, "last_step": last}))
    os.replace(tmp, state_path)
    return SyncResult(run_id=run.id, logged_steps=logged, last_step=last, summary=summary)
