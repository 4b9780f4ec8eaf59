"""The run's plots rendered by worker processes started ahead (pd_train.outputs.PlotWorkers)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pd_train.outputs import PlotWorkers, read_metrics, write_plots
from pd_train.outputs._plot_workers import _COST, NEEDS_ANALYSIS, split_plots
from pd_train.outputs.plots import PLOTS

SITES = ("layers.0.self_attn.q_proj", "layers.0.mlp.up_proj", "layers.1.mlp.down_proj")


def _run_dir(tmp: Path) -> Path:
    """A run dir whose metrics.jsonl has what every plot but the slow-eval one draws."""
    run_dir = tmp / "run"
    run_dir.mkdir()
    lines = [{"step": -1, "phase": "warmup", "time": 0.0, "loss/faithfulness": 0.5}]
    for step in range(12):
        lines.append(
            {
                "step": step,
                "phase": "train",
                "time": float(step),
                "loss/total": 1.0 / (step + 1),
                "loss/faithfulness": 0.1 / (step + 1),
                **{f"l0/{site}": 8.0 - step / 3 - i for i, site in enumerate(SITES)},
            }
        )
        if step % 6 == 5:
            lines.append(
                {
                    "step": step,
                    "phase": "eval",
                    "time": float(step),
                    "eval/kl_ci": 0.2 / (step + 1),
                    "eval/ce_ci": 2.0 + 0.1 / (step + 1),
                    **{f"l0/{site}": 7.0 - i for i, site in enumerate(SITES)},
                    **{
                        f"ci_hist/{site}": {"edges": [0.0, 0.25, 0.5, 1.0], "counts": [9, 3, i + 1]}
                        for i, site in enumerate(SITES)
                    },
                    **{
                        f"density/{site}": [0.0, 0.01 * (i + 1), 0.2, 0.5, 0.9]
                        for i, site in enumerate(SITES)
                    },
                }
            )
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_dir


def test_workers_render_the_same_files_in_other_processes(tmp_path: Path) -> None:
    """Two workers render all plots, split between them, and the PNGs equal the run process's
    own rendering byte for byte."""
    run_dir = _run_dir(tmp_path)
    here = write_plots(read_metrics(run_dir), tmp_path / "here")
    assert len(here) >= 5, here  # every plot with data drew
    with PlotWorkers(2) as workers:
        there = workers.write(run_dir, tmp_path / "there")
    assert sorted(p.name for p in there) == sorted(p.name for p in here)
    for path in here:
        assert path.read_bytes() == (tmp_path / "there" / path.name).read_bytes(), path.name
    # Both workers rendered (their own processes), neither is this one, and both have exited.
    assert sorted(workers.answered) == sorted(workers.pids)
    assert len(set(workers.answered)) == 2 and os.getpid() not in workers.answered
    assert all(p.poll() is not None for p in workers._procs)


def test_a_dead_worker_leaves_its_plots_to_the_run_process(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    workers = PlotWorkers(2)
    workers._procs[0].kill()
    workers._procs[0].wait()
    paths = workers.write(run_dir, tmp_path / "plots", timeout=120)
    expected = {p.name for p in write_plots(read_metrics(run_dir), tmp_path / "here")}
    assert {p.name for p in paths} == expected
    assert workers.answered == [workers.pids[1]]


def test_unused_workers_are_ended_by_close() -> None:
    workers = PlotWorkers(1)
    workers.close()
    assert workers._procs[0].poll() is not None


def test_split_plots_balances_and_keeps_order() -> None:
    names = [plot.__name__ for plot in PLOTS]
    groups = split_plots(names, 2)
    assert sorted(n for g in groups for n in g) == sorted(names)
    assert all(g == sorted(g, key=names.index) for g in groups)
    cost = [sum(_COST[name] for name in g) for g in groups]
    assert len(groups) == 2 and max(cost) <= 0.6 * sum(cost), groups  # balanced by cost
    # The two plots that import pd_train.analysis (and jax) share one worker.
    assert sum(bool(set(NEEDS_ANALYSIS) & set(g)) for g in groups) == 1
    assert split_plots(names[:1], 3) == [names[:1]]
    with pytest.raises(ValueError, match="n: got 0; must be >= 1"):
        PlotWorkers(0)
