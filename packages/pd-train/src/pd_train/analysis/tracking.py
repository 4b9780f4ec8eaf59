"""Experiment tracking (optional): a run's ``metrics.jsonl`` mirrored into a Weights & Biases run.

``metrics.jsonl`` stays the source of truth: :func:`sync_wandb` reads it and logs every finite
scalar of every train and eval record (``train/<key>``, ``eval/<key>``; eval keys already
starting with ``eval/`` keep their name) at the record's step, so every tracked value comes from
the file. Non-scalar entries (CI histograms, per-component density vectors) stay in the file and
the report; warmup records (negative steps) go into the W&B summary only, as
``warmup/<key>``. Only the calling process logs: ``pd-train run`` with a ``tracking:``
section runs a :class:`WandbTracker` on process 0 that follows the file as it is written;
``pd-train track`` (:func:`sync_wandb`) is one process that syncs after the fact.

Beside the scalars (see :mod:`pd_train.analysis.wandb_io`): the figures of each eval as images
at its step (``figures: every_eval``, the default; ``final``: the last eval's only; ``none``),
rendered in a background thread so the steps go on, and when the run ends the decomposition
(config, records, plots, the latest checkpoint without its optimizer state) as the model
artifact ``pd-<W&B run id>`` (``checkpoint: final``, the default; ``none``), which
``pd-train pull`` / ``pd-train analyze wandb:ENTITY/PROJECT/runs/ID`` load back.

The W&B run id is kept in ``RUN_DIR/tracking/wandb.json`` with the last step logged: syncing
again after the run went on (or was resumed) continues the same W&B run (``resume="allow"``)
from the next step. ``mode: offline`` writes under ``RUN_DIR/tracking/`` without network
(upload later with ``wandb sync``); ``disabled`` logs nothing.

Config (:mod:`pd_train.config.tracking`), from ``pd-train track`` flags or a ``tracking:``
section of the run's ``config.yaml``::

    tracking:
      wandb: {project: pd, entity: my-team, mode: offline, tags: [tiny],
              figures: every_eval, checkpoint: final}

``wandb`` is an extra: ``pip install 'pd-train[wandb]'``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

# The ``tracking:`` section's schema lives with the config; re-exported here, its old home.
from pd_train.config.tracking import CHECKPOINT, FIGURES, MODES, WandbConfig, parse_tracking

__all__ = [
    "CHECKPOINT",
    "FIGURES",
    "MODES",
    "SyncResult",
    "WandbConfig",
    "WandbTracker",
    "parse_tracking",
    "sync_wandb",
]

STATE_FILE = "wandb.json"
TRACKING_DIR = "tracking"


@dataclass(frozen=True)
class SyncResult:
    run_id: str | None
    logged_steps: int
    last_step: int | None
    summary: dict[str, Any]
    #: Images logged now (eval figures and the run dir's plots).
    images: int = 0
    #: (artifact name, checkpoint step) of the decomposition artifact logged now, or None.
    artifact: tuple[str, int | None] | None = None


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
    the newest step seen (its eval record may still follow); an eval step waits for its figures,
    rendered in a background thread from the records up to that step, and the steps after it
    wait with it (W&B steps only go forward). :meth:`close` logs the rest, sets the warmup
    summary, logs the decomposition artifact, finishes the W&B run and keeps its id and last
    step in ``RUN_DIR/tracking/wandb.json``, so a resumed run continues the same W&B run. Steps
    at or before the last step already logged (a resume re-runs the steps after its checkpoint)
    are not logged again. ``mode: disabled`` opens nothing and logs nothing.
    """

    def __init__(self, run_dir: str | Path, config: WandbConfig, *, run_config: Any = None):
        self.run_dir = Path(run_dir)
        self.config = config
        self.logged = 0
        #: Images logged (files rendered at evals, and the run dir's plots by sync_wandb).
        self.images_logged = 0
        #: (artifact name, checkpoint step) of the artifact logged by :meth:`close`, if any.
        self.artifact: tuple[str, int | None] | None = None
        self._offset = 0
        self._pending: dict[int, dict[str, float]] = {}
        self._warmup: dict[str, float] = {}
        self._records: list[dict[str, Any]] = []  # kept to render the eval figures from
        self._eval_steps: set[int] = set()
        self._figures: dict[int, Future[list[Path]]] = {}
        self._renderer: ThreadPoolExecutor | None = None
        self._figure_dir: Path | None = None
        self._plots_dir = self.run_dir / "plots"
        self._run: Any = None
        self._state_path = self.run_dir / TRACKING_DIR / STATE_FILE
        state = json.loads(self._state_path.read_text()) if self._state_path.is_file() else {}
        self._state: dict[str, Any] = state
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
        if self.config.figures != "none":
            self._records += records
        self._eval_steps |= {
            r["step"]
            for r in records
            if r.get("phase") == "eval" and isinstance(r.get("step"), int)
        }
        steps, warmup = history(records)
        self._warmup.update(warmup)
        for step, values in steps.items():
            self._pending.setdefault(step, {}).update(values)

    def _render(self, step: int) -> Future[list[Path]]:
        """The eval figures of ``step`` (rendered from the records up to it), started once."""
        if step not in self._figures:
            from pd_train.analysis.wandb_io import FIGURE_THREAD, render_eval_figures

            if self._renderer is None:
                self._renderer = ThreadPoolExecutor(1, thread_name_prefix=FIGURE_THREAD)
                self._figure_dir = Path(tempfile.mkdtemp(prefix="pd-wandb-figures-"))
            records = [r for r in self._records if isinstance(r.get("step"), int)]
            upto = [r for r in records if r["step"] <= step]
            out = cast(Path, self._figure_dir) / f"step-{step:08d}"
            self._figures[step] = self._renderer.submit(render_eval_figures, upto, out)
        return self._figures[step]

    def _figures_due(self, step: int, *, final: bool) -> bool:
        if self.last_step is not None and step <= self.last_step:
            return False
        if self.config.figures == "every_eval":
            return step in self._eval_steps
        return self.config.figures == "final" and final

    def _log_until(
        self, limit: int | None, *, wait: bool = False, plots: dict[str, str] | None = None
    ) -> None:
        """Log the pending steps before ``limit`` (all with None); with ``plots`` (file name →
        sha256 under ``self._plots_dir``), their images go with the last step logged."""
        from pd_train.analysis.wandb_io import images

        last = max(self._pending, default=None)
        todo = [s for s in sorted(self._pending) if limit is None or s < limit]
        for step in todo:
            values: dict[str, Any] = self._pending[step]
            if self._figures_due(step, final=limit is None and step == last):
                future = self._render(step)
                if not wait and not future.done():
                    break  # this step and the ones after it wait for its figures
                paths = future.result()
                values = {**values, **images(paths, "eval/figures")}
                self.images_logged += len(paths)
            del self._pending[step]
            if self.last_step is not None and step <= self.last_step:
                continue
            if plots and step == todo[-1]:
                values = {**values, **self._plot_images(plots)}
                plots = None
            self._run.log(values, step=step, commit=True)
            self.last_step = step
            self.logged += 1
        if plots and self.last_step is None:
            # Nothing to go with (a run dir without train/eval records): W&B's first step.
            self._run.log(self._plot_images(plots), step=0, commit=True)

    def _write_state(self) -> None:
        tmp = self._state_path.with_name(f".{STATE_FILE}.tmp")
        self._state.update(
            run_id=self.run_id, project=self.config.project, last_step=self.last_step
        )
        tmp.write_text(json.dumps(self._state))
        os.replace(tmp, self._state_path)

    def sync(self) -> None:
        """Log the records written since the last call, all but the newest step's."""
        if self._run is None:
            return
        self._read_new()
        if self._pending:
            self._log_until(max(self._pending))
            self._write_state()

    def _new_plots(self, plots_dir: Path) -> dict[str, str]:
        """The PNGs of ``plots_dir`` (name → sha256) that no eval figure covers and that were
        not logged before with the same content."""
        from pd_train.analysis.wandb_io import is_eval_figure

        self._plots_dir = plots_dir
        seen: dict[str, str] = self._state.get("plots", {})
        new: dict[str, str] = {}
        for path in sorted(plots_dir.glob("*.png")):
            if ".tmp" in path.name or (self.config.figures != "none" and is_eval_figure(path.name)):
                continue
            digest = _sha256(path)
            if seen.get(path.name) != digest:
                new[path.name] = digest
        return new

    def _plot_images(self, plots: dict[str, str]) -> dict[str, Any]:
        """``figures/<name>`` images of ``plots``, noted as logged."""
        from pd_train.analysis.wandb_io import images

        self.images_logged += len(plots)
        self._state["plots"] = {**self._state.get("plots", {}), **plots}
        return images([self._plots_dir / n for n in plots], "figures")

    def _log_artifact(self) -> None:
        from pd_train.analysis.wandb_io import latest_checkpoint, log_run_artifact

        key = {
            "checkpoint_step": latest_checkpoint(self.run_dir),
            "metrics_bytes": self._offset,
        }
        if self._state.get("artifact") == key or not (self.run_dir / "config.yaml").is_file():
            return  # logged already (a sync with nothing new), or nothing a pull could load
        self.artifact = log_run_artifact(self._run, self.run_dir, copy=self.config.mode != "online")
        self._state["artifact"] = key

    def close(self, *, plots_dir: Path | None = None) -> dict[str, Any]:
        """Log everything left (with the last figures; ``plots_dir``'s new PNGs, given by
        :func:`sync_wandb`, with the last step), log the decomposition artifact, finish the W&B run and keep its
        id; returns its summary."""
        if self._run is None:
            return {}
        try:
            self._read_new()
            plots = None
            if plots_dir is not None and plots_dir.is_dir():
                plots = self._new_plots(plots_dir)
            self._log_until(None, wait=True, plots=plots)
            for key, value in self._warmup.items():
                self._run.summary[key] = value
            if self.config.checkpoint == "final":
                self._log_artifact()
            summary = {k: self._run.summary[k] for k in self._run.summary.keys()}  # noqa: SIM118
        finally:
            self._run.finish()
            if self._renderer is not None:
                self._renderer.shutdown(wait=True, cancel_futures=True)
                shutil.rmtree(cast(Path, self._figure_dir), ignore_errors=True)
        self._write_state()
        self._run = None
        return summary


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def sync_wandb(run_dir: str | Path, config: WandbConfig, *, run_config: Any = None) -> SyncResult:
    """Log ``run_dir``'s records after the last synced step to its W&B run (see the module
    docstring), the eval figures, the PNGs of ``RUN_DIR/plots`` not logged yet and the
    decomposition artifact; returns the run id, the number of steps logged now, the last step
    and the W&B run's summary."""
    tracker = WandbTracker(run_dir, config, run_config=run_config)
    run_id = tracker.run_id
    summary = tracker.close(plots_dir=Path(run_dir) / "plots")
    if run_id is not None:
        import wandb  # type: ignore[import-not-found,unused-ignore]  # the optional extra

        # W&B's service process writes an offline run's log after finish() returns; ending it
        # here leaves the log complete on return (a pull of it may follow at once).
        wandb.teardown()
    return SyncResult(
        run_id=run_id,
        logged_steps=tracker.logged,
        last_step=tracker.last_step,
        summary=summary,
        images=tracker.images_logged,
        artifact=tracker.artifact,
    )
