"""The run's plots rendered by worker processes that started while the steps ran.

Rendering the six plots of the default run in the run's process took ~5 s after its last step
(matplotlib's import ~1 s, then one figure after another on one core). :class:`PlotWorkers`
starts processes early (``pd-train run`` starts them while the steps still have seconds to
go, when the second core is idle); each imports matplotlib and the plot modules and waits.
At the end each renders its share of the plots from the run's ``metrics.jsonl`` — the same
functions as :func:`write_plots`, so the same PNG files, byte for byte — in parallel. A worker
that fails or dies leaves its plots to the run's process (``write_plots``' behaviour: a plot
that fails is logged and skipped; plotting never ends a run).

Run as ``python -m pd_train.outputs._plot_worker NAME...`` (the plot functions it renders), a
worker reads one JSON job line from stdin (``{"run_dir": ..., "out_dir": ...}``), after printing
``ready`` once its imports are done, and answers one JSON line (``{"paths": [...], "pid":
...}``; a plot that fails there is logged and skipped, as :func:`write_plots` does).
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("pd_train.outputs")

#: CPU seconds of each plot in the default run (matplotlib imported, one figure drawn), for
#: splitting them among the workers.
_COST = {
    "plot_loss_curves": 0.6,
    "plot_eval_curves": 1.2,
    "plot_l0": 0.45,
    "plot_ci_histograms": 0.9,
    "plot_density": 0.8,
    "plot_recon": 0.5,
}


#: Plots that import the ``pd_train.analysis`` package (and with it jax, ~1.6 CPU s): they go
#: to one worker, so that only one pays for the import.
NEEDS_ANALYSIS = ("plot_density", "plot_recon")


def split_plots(names: Sequence[str], n: int) -> list[list[str]]:
    """``names`` in at most ``n`` groups of about equal cost (dearest first, each to the
    cheapest group so far; the plots of :data:`NEEDS_ANALYSIS` stay together); empty groups
    are dropped; each group keeps ``names``' order."""
    together = [name for name in names if name in NEEDS_ANALYSIS]
    units = [[name] for name in names if name not in NEEDS_ANALYSIS]
    units += [together] if together else []
    groups: list[list[str]] = [[] for _ in range(n)]
    totals = [0.0] * n
    for unit in sorted(units, key=lambda u: -sum(_COST.get(m, 1.0) for m in u)):
        i = totals.index(min(totals))
        groups[i] += unit
        totals[i] += sum(_COST.get(name, 1.0) for name in unit)
    order = {name: k for k, name in enumerate(names)}
    return [sorted(g, key=order.__getitem__) for g in groups if g]


class PlotWorkers:
    """``n`` worker processes, started now; :meth:`write` gives them the plots.

    Use ``close()`` (or the context manager) to end workers that were never given a job.
    """

    def __init__(self, n: int = 2) -> None:
        if n < 1:
            msg = f"n: got {n}; must be >= 1"
            raise ValueError(msg)
        from pd_train.outputs.plots import PLOTS

        self.started = time.perf_counter()
        #: The plot functions' names each worker renders (it imports only what they need).
        self.groups = split_plots([plot.__name__ for plot in PLOTS], n)
        self._procs: list[subprocess.Popen[str]] = []
        for group in self.groups:
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "pd_train.outputs._plot_worker", *group],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    # Its own session: Ctrl-C in the terminal reaches the run's process
                    # group, never a worker (mid-import it would print a traceback); the run
                    # ends a worker through its stdin or kills it.
                    start_new_session=True,
                )
            )
        #: The workers' pids, and the pids that answered :meth:`write`'s jobs.
        self.pids = [p.pid for p in self._procs]
        self.answered: list[int] = []
        #: Per answering worker: its job's wall and CPU seconds (rendering only).
        self.timings: list[tuple[float, float]] = []

    def __enter__(self) -> PlotWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(
        self, run_dir: str | Path, out_dir: str | Path, *, timeout: float = 300.0
    ) -> list[Path]:
        """All plots of ``run_dir``'s ``metrics.jsonl`` into ``out_dir``, split among the
        workers; what a worker could not do is rendered here. Never raises for a plot."""
        from pd_train.outputs._metrics import read_metrics
        from pd_train.outputs.plots import PLOTS

        names = [plot.__name__ for plot in PLOTS]
        jobs: list[tuple[subprocess.Popen[str], list[str]]] = []
        left: list[str] = []
        for proc, group in zip(self._procs, self.groups, strict=True):
            job = {"run_dir": str(run_dir), "out_dir": str(out_dir)}
            try:
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(job) + "\n")
                proc.stdin.flush()
                jobs.append((proc, group))
            except (OSError, ValueError):
                left += group
        paths: list[Path] = []
        deadline = time.monotonic() + timeout
        for proc, group in jobs:
            answer = _answer(proc, deadline)
            if answer is None:
                log.warning("plots: a worker process failed; rendering %s here", ", ".join(group))
                left += group
                continue
            self.answered.append(int(answer["pid"]))
            self.timings.append((float(answer["seconds"]), float(answer["cpu_seconds"])))
            paths += [Path(p) for p in answer["paths"]]
        self.close()
        if left:
            records = read_metrics(run_dir)
            paths += _render(records, out_dir, [n for n in names if n in left])
        return paths

    def close(self) -> None:
        """End the workers: those that answered have exited; the others (no job, or still
        importing) are killed."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None and not stream.closed:
                    with contextlib.suppress(OSError):  # a job buffered for a dead worker
                        stream.close()


def _answer(proc: subprocess.Popen[str], deadline: float) -> dict[str, Any] | None:
    """The worker's JSON answer line, or None (it died, answered nonsense, or ran past the
    deadline: then it is killed)."""
    import select

    assert proc.stdout is not None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            proc.kill()
            proc.wait()
            return None
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if not ready:
            continue
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            return None
        if line.strip() == "ready":
            continue
        try:
            answer = json.loads(line)
        except ValueError:
            return None
        proc.wait()
        return answer if isinstance(answer, dict) and "paths" in answer else None


def _render(records: Any, out_dir: str | Path, names: Sequence[str]) -> list[Path]:
    """The named plots, rendered in this process as :func:`write_plots` does."""
    from pd_train.outputs.plots import write_plots

    return write_plots(records, out_dir, names=names)
