"""`pd-train sweep`: every point validated first, one run dir per point with its overrides,
the points run one after another on one compile cache, or one SLURM array job."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from pd_train.cli import main

from ._cli import tiny_config, write_config


def _config(tmp: Path) -> Path:
    config = tiny_config(tmp, tmp / "cache", steps=2)
    config["pd"]["faithfulness_warmup"] = {"steps": 0}
    config["cadence"] = {"train_log_every": 1, "save_every": 0}
    return write_config(tmp, config)


def test_a_bad_point_refuses_the_whole_sweep_and_writes_nothing(tmp_path: Path, capsys) -> None:
    path = _config(tmp_path)
    sweep_dir = tmp_path / "sweep"
    grid = ["--set-grid", "pd.components.lr=[1e-3,-1.0]", "--set-grid", "seed=[0,1]"]
    assert main(["sweep", str(path), *grid, "--sweep-dir", str(sweep_dir)]) == 2
    err = capsys.readouterr().err
    # Both points with the bad lr are named, with the field path and what is allowed.
    assert "pd.components.lr: point 2 (pd.components.lr=-1.0, seed=0): got -1.0; must be > 0" in err
    assert "point 3 (pd.components.lr=-1.0, seed=1)" in err, err
    assert "point 0" not in err and "point 1 " not in err, err
    assert not sweep_dir.exists()
    assert not (tmp_path / "runs").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []

    # A grid that is not a list, and a field in --set and --set-grid: refused alike.
    assert main(["sweep", str(path), "--set-grid", "seed=3", "--sweep-dir", str(sweep_dir)]) == 2
    assert "seed: --set-grid 'seed=3': expected a non-empty list" in capsys.readouterr().err
    both = ["--set", "seed=1", "--set-grid", "seed=[1,2]"]
    assert main(["sweep", str(path), *both, "--sweep-dir", str(sweep_dir)]) == 2
    assert "seed: is given by --set and by --set-grid" in capsys.readouterr().err
    assert not sweep_dir.exists()


def _rendered_task(script: str, task: int) -> str:
    """Run the array script's task ``task``: its exports, then its srun command without srun;
    its output."""
    lines = script.splitlines()
    env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(task))
    for line in lines:
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0]
    # From `exec srun` to the end: its `bash -c '...'` spans lines.
    argv = shlex.split(script[script.index("\nexec srun") :])
    command = argv[argv.index("bash") :]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout


def test_slurm_renders_one_array_job_whose_task_i_runs_point_i(tmp_path: Path, capsys) -> None:
    path = _config(tmp_path)
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "ran: $*"\n')
    fake.chmod(0o755)
    sweep_dir = tmp_path / "sweep"
    args = [
        "sweep", str(path), "--slurm", "--dry-run", "--sweep-dir", str(sweep_dir),
        "--set-grid", "pd.components.lr=[1e-3,2e-3]", "--set-grid", "seed=[0,1]",
        "--set", f"launch.python={fake}",
    ]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-3\n" in out, out
    assert f"#SBATCH --output={sweep_dir}/logs/slurm-%A_%a.out" in out, out
    assert "#   point-002: pd.components.lr=0.002, seed=0" in out
    assert not sweep_dir.exists()
    ran = _rendered_task(out, 2)
    assert ran.strip() == (
        f"ran: -m pd_train.cli run {sweep_dir}/point-002/config.yaml --run-dir "
        f"{sweep_dir}/point-002 --distributed slurm --process-per node"
    ), ran


def _train_step_compiles(run_dir: Path) -> int:
    """How many times a run compiled its train step (a persistent-cache miss); 0 when it
    loaded it from the executable or the persistent cache."""
    record = json.loads((run_dir / "compile.json").read_text())
    step = record["jits"].get("train_step", {"compiles": []})
    return sum(c["cache"] == "miss" for c in step["compiles"])


def _sweep(tmp: Path, grids: list[str], capfd) -> tuple[Path, str, str]:
    """Run a sweep; its directory and what it and its points' processes printed."""
    path = _config(tmp)
    sweep_dir = tmp / "sweep"
    sets = [arg for grid in grids for arg in ("--set-grid", grid)]
    assert main(["sweep", str(path), *sets, "--sweep-dir", str(sweep_dir)]) == 0
    out, err = capfd.readouterr()
    return sweep_dir, out, err


@pytest.mark.slow
def test_a_seed_and_lr_sweep_prepares_a_run_dir_per_point_and_compiles_the_step_once(
    tmp_path: Path, capfd
) -> None:
    """Two seeds times two learning rates, both values of the step: only point 0 compiles it
    (point 1 differs from it in the learning rate alone, point 2 in the seed alone). One sweep
    for both fields, since each compile of the step is a compile in CI."""
    grids = ["seed=[0,1]", "pd.components.lr=[1e-3,2e-3]"]
    sweep_dir, out, err = _sweep(tmp_path, grids, capfd)
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["grid"] == {"seed": [0, 1], "pd.components.lr": [1e-3, 2e-3]}
    points = [(seed, lr) for seed in (0, 1) for lr in (1e-3, 2e-3)]  # the first grid slowest
    for i, (seed, lr) in enumerate(points):
        run_dir = sweep_dir / f"point-{i:03d}"
        point = json.loads((run_dir / "point.json").read_text())
        assert point["grid"] == {"seed": seed, "pd.components.lr": lr}
        assert point["overrides"] == [f"seed={seed}", f"pd.components.lr={lr}"]
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["seed"] == seed and config["pd"]["components"]["lr"] == lr
        assert (run_dir / "metrics.jsonl").is_file()
    compiles = [_train_step_compiles(sweep_dir / f"point-{i:03d}") for i in range(4)]
    assert compiles == [1, 0, 0, 0], compiles
    # The summary: one row per point with its final step and losses.
    rows = [line for line in out.splitlines() if line.startswith("| point-")]
    assert len(rows) == 4 and all("| done | 1 |" in row for row in rows), out
    assert (sweep_dir / "summary.md").read_text() in out
    header = next(line for line in out.splitlines() if line.startswith("| point |"))
    assert header.startswith("| point | seed | pd.components.lr | status |"), header
    column = [cell.strip() for cell in header.split("|")].index("loss/total")
    losses = [float(row.split("|")[column]) for row in rows]
    assert len(set(losses)) == 4  # another seed or learning rate, another run
    # `pd-train run` explained the misses in one line (a new cache) and recorded
    # the step's program beside the cache.
    misses = [line for line in err.splitlines() if line.startswith("cache miss: ")]
    assert len(misses) == 1 and "holds no programs yet" in misses[0], err
    assert list((tmp_path / "cache" / "program-records").glob("train_step-*.json"))


# --- toy sweeps -------------------------------------------------------------------------------


def test_a_bad_toy_point_refuses_the_whole_toy_sweep_and_writes_nothing(
    tmp_path: Path, capsys
) -> None:
    sweep_dir = tmp_path / "sweep"
    grid = ["--set-grid", "eval_every=[100,150]", "--set-grid", "pd.components.lr=[1e-2,-1.0]"]
    argv = ["sweep", "builtin:tms_5_2_fast", *grid, "--sweep-dir", str(sweep_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    # Every bad point is named with the field path (the K-step cadence, the lr's bound).
    assert (
        "eval_every: point 2 (eval_every=150, pd.components.lr=0.01): got 150; must be a "
        "multiple of steps_per_call (100)"
    ) in err, err
    assert "pd.components.lr: point 1 (eval_every=100, pd.components.lr=-1.0): got -1.0" in err
    assert "point 0 " not in err, err
    assert not sweep_dir.exists()
    assert [p.name for p in tmp_path.iterdir()] == []
    # --dry-run of good points prints the plan and writes nothing.
    argv = ["sweep", "builtin:tms_5_2_fast", "--set-grid", "seed=[3,4]", "--dry-run"]
    assert main([*argv, "--sweep-dir", str(sweep_dir)]) == 0
    out = capsys.readouterr().out
    assert "#   point-000: seed=3" in out and "#   point-001: seed=4" in out, out
    assert not sweep_dir.exists()


@pytest.mark.slow
def test_a_toy_sweep_runs_each_point_and_tabulates_the_reference_verdict(
    tmp_path: Path, capfd
) -> None:
    """Two seeds of a shortened tms_5_2_fast: each point runs its own resolved toy config in
    its prepared run dir, the second loading the first's K-step program from the toy runs'
    compile cache (the seed is data), and the summary shows each run's verdict as its
    summary.json has it."""
    sweep_dir = tmp_path / "sweep"
    argv = ["sweep", "builtin:tms_5_2_fast", "--set", "pd.steps=200", "--set-grid", "seed=[0,1]"]
    argv += ["--set", f"compile_cache.dir={tmp_path / 'cache'}"]
    assert main([*argv, "--sweep-dir", str(sweep_dir)]) == 0
    out, err = capfd.readouterr()
    step_compiles = re.findall(r"compiled train_step in [\d.]+ s \((.+?)\)", err)
    assert step_compiles == ["cache miss", "cache hit"], err[-3000:]
    rows = [line for line in out.splitlines() if line.startswith("| point-")]
    header = next(line for line in out.splitlines() if line.startswith("| point |"))
    columns = [cell.strip() for cell in header.split("|")]
    assert columns[1:7] == [
        "point",
        "seed",
        "status",
        "final step",
        "reproduced",
        "IdentityCIError",
    ]
    assert "MMCS" in columns and "loss/total" in columns, header
    assert "DenseCIError" not in columns  # TMS 5-2 has no dense site
    for seed, row in zip((0, 1), rows, strict=True):
        run_dir = sweep_dir / f"point-{seed:03d}"
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["toy"] == "tms_5_2_fast" and config["seed"] == seed
        assert config["pd"]["steps"] == 200
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] == 200
        cells = [cell.strip() for cell in row.split("|")]
        assert cells[columns.index("status")] == "done"
        assert cells[columns.index("final step")] == "199"
        assert cells[columns.index("reproduced")] == ("yes" if summary["reproduced"] else "no")
        want = f"{summary['gt/identity_ci_error']:.0f}"
        assert cells[columns.index("IdentityCIError")] == want
        assert cells[columns.index("MMCS")] == f"{summary['gt/mmcs']:.3f}"
    # Two seeds, two runs.
    assert (
        rows[0].split("|")[columns.index("loss/total")]
        != rows[1].split("|")[columns.index("loss/total")]
    )
    assert (sweep_dir / "summary.md").read_text() in out


def test_a_toy_run_refuses_a_run_dir_prepared_for_another_config(tmp_path: Path, capsys) -> None:
    """A run dir holding only a toy config starts the run of that config, and no other."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    other = {"toy": "tms_5_2_fast", "seed": 5}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(other))
    argv = ["run", "builtin:tms_5_2_fast", "--run-dir", str(run_dir), "--max-steps", "100"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--run-dir: {run_dir} holds a config.yaml that is not this run's" in err, err
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]
    (run_dir / "notes.txt").write_text("mine")
    assert main(argv) == 2
    assert f"{run_dir} exists and is not empty" in capsys.readouterr().err
