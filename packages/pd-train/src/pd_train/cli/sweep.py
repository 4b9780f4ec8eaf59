"""``pd-train sweep CONFIG --set-grid PATH=[V1,V2] ...``: one run dir per grid point, then run.

Order (nothing is written before every point passed every check):

1. each ``--set-grid PATH=[...]`` is a non-empty list of distinct values; the points are their
   product (the first grid varies slowest), each with the plain ``--set`` overrides too. No
   field is set twice in a point: two grids (or a grid and a ``--set``) over one path, or one
   path inside another (``pd.loss_metrics[1]`` and ``pd.loss_metrics[1].coeff``), are refused.
   A grid may cover a structural field (``pd.ci.type``, a ``C``): such points compile their
   own programs; points that differ only in values (docs/hyperparameters.md) share them;
2. every point is validated as ``pd-train run`` would (:func:`pd_train.run.prepare`), and with
   ``--slurm`` its launch section as ``pd-train submit`` would; one bad point refuses the whole
   sweep (exit 2), naming the point and the field path;
3. the sweep dir is filled in a hidden temporary directory and renamed: ``sweep.json`` (the
   source, the grids, the points) and per point ``point-NNN/`` with its resolved
   ``config.yaml`` and ``point.json`` (its overrides);
4. locally (the default) the points run one after another, each as
   ``pd-train run point-NNN/config.yaml --run-dir point-NNN`` (a fresh process; they share one
   compile cache, so a point whose programs another point compiled loads them), then a summary
   table (point, overrides, final step and losses) is printed and written to ``summary.md``;
   with ``--slurm`` one SLURM array job is submitted through pd-launch instead, task i running
   point i exactly as ``pd-train submit`` runs a run dir (resuming when it has a checkpoint).

A toy config (``builtin:tms_5_2_fast``, a toy's YAML) sweeps the same way, locally: each point
is validated as ``pd-train run`` validates a toy (:func:`pd_train.cli.toy.load_toy_config`),
its ``config.yaml`` is the resolved toy config, and the summary adds the reference's verdict
(reproduced, IdentityCIError, DenseCIError, MMCS) from each point's ``summary.json``.

``--dry-run`` validates and prints the plan (with ``--slurm``: the sbatch script) and writes
nothing. Exit codes: 0 every point ran (or was submitted), 1 a point failed (the others still
ran), 2 bad input, 130 stopped by Ctrl-C.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_train._output_paths import dated_dir
from pd_train.config.io import ConfigError, add_override_argument, parse_override, parse_path

__all__ = ["Point", "add_parser", "parse_grid", "plan_points", "structural_notes", "sweep"]

SWEEP_FILE = "sweep.json"
POINT_FILE = "point.json"
SUMMARY_FILE = "summary.md"
SCRIPT_FILE = "job.sh"
SUBMISSION_FILE = "submission.json"
LOG_DIR = "logs"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep",
        help="one run per point of a grid of overrides, run one after another or as a SLURM array",
        description=(
            "Prepare one run dir per point of the grid (all points validated first), then run "
            "them one after another (pd-train run --run-dir each) or submit one SLURM array job. "
            "Example: --set-grid 'pd.components.lr=[1e-3,2e-3]' "
            "--set-grid 'pd.loss_metrics[1].coeff=[1e-4,3e-4]' (4 points)."
        ),
    )
    p.add_argument(
        "config",
        help="YAML config or toy config (builtin:NAME names a shipped one: builtin:default, "
        "builtin:tms_5_2_fast, ...)",
    )
    add_override_argument(p, what="a field for every point")
    p.add_argument(
        "--set-grid",
        dest="grids",
        action="append",
        default=[],
        metavar="PATH=[V1,V2,...]",
        help="a field's values, one point each (repeatable: the points are the product)",
    )
    p.add_argument(
        "--sweep-dir",
        type=Path,
        help="create the sweep here (default: output_dir/RUN_NAME-sweep-TIME)",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        help="stop each point after this many steps (local runs; the schedule stays pd.steps)",
    )
    p.add_argument(
        "--slurm",
        action="store_true",
        help="submit one SLURM array job (the config's launch section) instead of running here",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and print the plan (with --slurm: the sbatch script); write nothing",
    )
    return p


# ---------------------------------------------------------------------------------------------
# The grid


def parse_grid(text: str) -> tuple[str, list[Any]]:
    """``"pd.components.lr=[1e-3,2e-3]"`` → ``("pd.components.lr", [0.001, 0.002])``."""
    parts, values = parse_override(text)
    dotted = text.split("=", 1)[0].strip()
    if not isinstance(values, list) or not values:
        msg = (
            f"--set-grid {text!r}: expected a non-empty list of values in brackets, e.g. "
            f"{dotted}=[1e-3,2e-3]"
        )
        raise ConfigError([(dotted, msg)])
    del parts
    return dotted, values


@dataclass(frozen=True)
class Point:
    """One point of a sweep: its index, the grid's values there, and every override."""

    index: int
    grid: tuple[tuple[str, Any], ...]
    overrides: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"point-{self.index:03d}"

    def describe(self) -> str:
        return ", ".join(f"{path}={json.dumps(value)}" for path, value in self.grid)


def _same_value(a: Any, b: Any) -> bool:
    """Whether two grid values configure the same thing (``1`` and ``1.0`` do; ``true`` and
    ``1`` do not)."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _overlap(a: tuple[str | int, ...], b: tuple[str | int, ...]) -> bool:
    """Whether one field path is the other or lies inside it."""
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _grid_problems(sets: Sequence[str], parsed: Sequence[tuple[str, list[Any]]]) -> list[Any]:
    """Grids that would set one field twice (the same path, however spelled, or one path inside
    another, also a ``--set`` one: the later would silently win), and repeated values (two
    identical points)."""
    problems: list[tuple[str, str]] = []
    given = [(tuple(parse_override(s)[0]), s.split("=", 1)[0].strip()) for s in sets]
    seen: list[tuple[tuple[str | int, ...], str]] = []
    for path, values in parsed:
        parts = tuple(parse_path(path))
        for other_parts, other in seen:
            if other_parts == parts:
                msg = "appears in two --set-grid options; give its values once"
            elif _overlap(parts, other_parts):
                msg = f"overlaps --set-grid {other}; one point would set the field twice"
            else:
                continue
            problems.append((path, msg))
            break
        for other_parts, other in given:
            if _overlap(parts, other_parts):
                if other_parts == parts:
                    msg = "is given by --set and by --set-grid; keep one"
                else:
                    msg = f"overlaps --set {other}; one point would set the field twice"
                problems.append((path, msg))
        seen.append((parts, path))
        for i, value in enumerate(values):
            if any(_same_value(value, v) for v in values[:i]):
                msg = (
                    f"the value {json.dumps(value)} appears twice in --set-grid {path}; two "
                    "points would be the same run"
                )
                problems.append((path, msg))
                break
    return problems


def plan_points(sets: Sequence[str], grids: Sequence[str]) -> list[Point]:
    """The product of ``grids`` (the first varies slowest), each point with ``sets`` first."""
    if not grids:
        msg = "no --set-grid given; a sweep needs at least one, e.g. --set-grid 'seed=[0,1]'"
        raise ConfigError([("--set-grid", msg)])
    parsed = [parse_grid(g) for g in grids]
    problems = _grid_problems(sets, parsed)
    if problems:
        raise ConfigError(problems)
    points = []
    for i, combo in enumerate(itertools.product(*(values for _, values in parsed))):
        grid = tuple((path, value) for (path, _), value in zip(parsed, combo, strict=True))
        overrides = (*sets, *(f"{path}={json.dumps(value)}" for path, value in grid))
        points.append(Point(i, grid, overrides))
    return points


def structural_notes(points: Sequence[Point], raw: Any) -> list[str]:
    """One line per grid over a structural field (docs/hyperparameters.md): allowed, but each
    of its values compiles its own programs (a grid over values alone compiles once)."""
    from pd_train.config.hyperparameters import leaf_class

    notes = []
    for path, _ in points[0].grid if points else ():
        try:
            field = leaf_class(path, raw)
        except (KeyError, IndexError, TypeError, ValueError):  # a section, not a leaf
            continue
        if field.kind == "structural":
            msg = f"{path} is structural ({field.why}): each of its values compiles its programs"
            notes.append(msg)
    return notes


# ---------------------------------------------------------------------------------------------
# Validation: every point, before anything is written


def _validate(source: str | Path, points: Sequence[Point], *, slurm: bool) -> list[Any]:
    """The prepared config of each point; raises one ConfigError listing every bad point."""
    from pd_train import run as runner

    prepared, problems = [], []
    for point in points:
        try:
            p = runner.prepare(source, point.overrides, for_run=True)
            if slurm:
                from pd_train.cli.submit import launch_problems

                launch = launch_problems(p.config)
                if launch:
                    raise ConfigError(launch)
        except ConfigError as exc:
            where = f"point {point.index} ({point.describe()})"
            problems += [(path, f"{where}: {message}") for path, message in exc.problems]
            continue
        prepared.append(p)
    if slurm and prepared:
        first = prepared[0].config.launch
        for point, p in zip(points, prepared, strict=False):
            if p.config.launch != first:
                msg = (
                    f"point {point.index} ({point.describe()}) changes the launch section; one "
                    "array job runs every point with the same one"
                )
                problems.append(("launch", msg))
                break
    if problems:
        raise ConfigError(problems, source=str(source))
    return prepared


# ---------------------------------------------------------------------------------------------
# The sweep dir


def _default_sweep_dir(prepared: Any) -> Path:
    return dated_dir(prepared.config.output_dir, f"{prepared.config.run_name}-sweep")


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _write_sweep_dir(
    sweep_dir: Path, args: argparse.Namespace, points: Sequence[Point], configs: Sequence[str]
) -> None:
    """Fill a hidden temporary directory beside ``sweep_dir`` (each point's resolved config
    text from ``configs``), then rename it into place."""
    from pd_train import run as runner

    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = sweep_dir.with_name(f".{sweep_dir.name}.preparing-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        record = {
            "config_source": str(args.config),
            "overrides": list(args.overrides),
            "grid": dict(parse_grid(g) for g in args.grids),
            "points": [
                {
                    "index": p.index,
                    "run_dir": str(sweep_dir / p.name),
                    "grid": dict(p.grid),
                    "overrides": list(p.overrides),
                }
                for p in points
            ],
        }
        _write_json(staging / SWEEP_FILE, record)
        for point, text in zip(points, configs, strict=True):
            run_dir = staging / point.name
            run_dir.mkdir()
            (run_dir / runner.CONFIG_FILE).write_text(text)
            _write_json(
                run_dir / POINT_FILE,
                {
                    "sweep_dir": str(sweep_dir),
                    "index": point.index,
                    "grid": dict(point.grid),
                    "overrides": list(point.overrides),
                    "config_source": str(args.config),
                },
            )
        os.rename(staging, sweep_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------------
# Running locally


def run_command(run_dir: Path, *, max_steps: int | None = None) -> list[str]:
    """``pd-train run`` of a prepared point (resuming when its run dir has a checkpoint)."""
    from pd_train import run as runner

    command = [sys.executable, "-m", "pd_train.cli", "run"]
    if runner.checkpoint_steps(run_dir):
        command += ["--resume", str(run_dir)]
    else:
        command += [str(run_dir / runner.CONFIG_FILE), "--run-dir", str(run_dir)]
    if max_steps is not None:
        command += ["--max-steps", str(max_steps)]
    return command


def _final_losses(run_dir: Path) -> tuple[int | None, dict[str, float]]:
    """The last train record's step and its ``loss/*`` values (metrics.jsonl)."""
    from pd_train import run as runner

    path = run_dir / runner.METRICS_FILE
    last: dict[str, Any] | None = None
    if path.is_file():
        for line in path.read_text().splitlines():
            if not line.endswith("}"):
                continue  # a record being written
            record = json.loads(line)
            if record.get("phase") == "train":
                last = record
    if last is None:
        return None, {}
    losses = {k: float(v) for k, v in last.items() if k.startswith("loss/")}
    return int(last["step"]), losses


#: A toy run's verdict in its ``summary.json`` (:func:`pd_train.cli.toy.run_toy_cli`): the
#: summary table's column for each key a point has.
TOY_RESULTS = (
    ("reproduced", "reproduced"),
    ("gt/identity_ci_error", "IdentityCIError"),
    ("gt/dense_ci_error", "DenseCIError"),
    ("gt/mmcs", "MMCS"),
)


def _toy_results(run_dir: Path) -> dict[str, str]:
    """A toy point's verdict (``TOY_RESULTS``' columns) from its ``summary.json``; empty for
    a decomposition run or a toy run that did not finish."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(summary, dict) or "reproduced" not in summary:
        return {}
    cells: dict[str, str] = {}
    for key, column in TOY_RESULTS:
        value = summary.get(key)
        if isinstance(value, bool):
            cells[column] = "yes" if value else "no"
        elif isinstance(value, int | float):
            cells[column] = f"{value:.3f}" if key == "gt/mmcs" else f"{value:.0f}"
    return cells


def summary_table(sweep_dir: Path, points: Sequence[Point], status: dict[int, str]) -> str:
    """A markdown table: point, its grid values, status, final step, a toy's verdict (where the
    points are toy runs) and the final losses."""
    finals = {p.index: _final_losses(sweep_dir / p.name) for p in points}
    verdicts = {p.index: _toy_results(sweep_dir / p.name) for p in points}
    names: list[str] = ["loss/total"] if any("loss/total" in f[1] for f in finals.values()) else []
    for _, losses in finals.values():
        names += [n for n in losses if n not in names]
    shown = [c for _, c in TOY_RESULTS if any(c in v for v in verdicts.values())]
    paths = [path for path, _ in points[0].grid] if points else []
    header = ["point", *paths, "status", "final step", *shown, *names]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for p in points:
        step, losses = finals[p.index]
        cells = [
            p.name,
            *(json.dumps(v) for _, v in p.grid),
            status.get(p.index, "not run"),
            "-" if step is None else str(step),
            *(verdicts[p.index].get(c, "-") for c in shown),
            *(f"{losses[n]:.6g}" if n in losses else "-" for n in names),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _wait_for(command: list[str]) -> tuple[int, bool]:
    """Run ``command``; its exit code, and whether Ctrl-C was pressed meanwhile. The point's
    process gets the Ctrl-C too and stops after saving (a second one aborts it): this waits
    for it rather than killing it (as ``subprocess.run`` would)."""
    interrupted = False
    proc = subprocess.Popen(command)
    while True:
        try:
            return proc.wait(), interrupted
        except KeyboardInterrupt:
            interrupted = True


def _run_points(sweep_dir: Path, points: Sequence[Point], *, max_steps: int | None) -> int:
    from pd_train.cli._common import EXIT_INTERRUPTED

    status: dict[int, str] = {}
    code = 0
    for point in points:
        run_dir = sweep_dir / point.name
        command = run_command(run_dir, max_steps=max_steps)
        print(f"pd-train sweep: {point.name} ({point.describe()}): {shlex.join(command)}")
        sys.stdout.flush()
        rc, interrupted = _wait_for(command)
        status[point.index] = "done" if rc == 0 else f"exit {rc}"
        if interrupted or rc == EXIT_INTERRUPTED:
            status[point.index] = "interrupted"
            code = EXIT_INTERRUPTED
            break
        if rc != 0:
            code = 1
    table = summary_table(sweep_dir, points, status)
    (sweep_dir / SUMMARY_FILE).write_text(table)
    print(f"\nsweep {sweep_dir}:\n{table}", end="")
    return code


# ---------------------------------------------------------------------------------------------
# One SLURM array job


def array_job(config: Any, sweep_dir: Path, points: Sequence[Point], *, chdir: Path) -> Any:
    """The pd-launch job: one array task per point; task i runs ``point-i`` as ``pd-train
    submit``'s job runs its run dir (``pd_train.cli.submit.job_command``)."""
    import attrs

    from pd_train.cli.submit import build_job, job_command

    base = build_job(config, sweep_dir, chdir=chdir)
    dirs = " ".join(shlex.quote(str(sweep_dir / p.name)) for p in points)
    _, flag, script = job_command(config.launch, sweep_dir)
    select = [
        f"dirs=({dirs})",
        'export PD_RUN_DIR="${dirs[$SLURM_ARRAY_TASK_ID]}"',
    ]
    log_dir = Path(config.launch.log_dir).expanduser() if config.launch.log_dir else None
    if log_dir is not None and not log_dir.is_absolute():
        log_dir = chdir / log_dir
    output = (log_dir or sweep_dir / LOG_DIR) / "slurm-%A_%a.out"
    env = {k: v for k, v in base.env.items() if k != "PD_RUN_DIR"}
    return attrs.evolve(
        base,
        command=("bash", flag, "\n".join([*select, script])),
        output=str(output),
        env=env,
        array=f"0-{len(points) - 1}",
    )


def _submit_array(
    job: Any, sweep_dir: Path, args: argparse.Namespace, points: Sequence[Point], configs: Any
) -> int:
    import pd_launch

    scrubbed = pd_launch.scrub_environment(os.environ, overrides=job.env).env
    if shutil.which("sbatch", path=scrubbed.get("PATH", os.defpath)) is None:
        msg = (
            f"sbatch is not on PATH ({scrubbed.get('PATH', '')}); --slurm needs SLURM's client "
            "commands (run it on a login node). Nothing was written."
        )
        print(f"pd-train sweep: error: {msg}", file=sys.stderr)
        return 1
    _write_sweep_dir(sweep_dir, args, points, configs)
    log_dir = Path(str(job.output)).parent
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        submission = pd_launch.submit(job, script_path=sweep_dir / SCRIPT_FILE)
    except pd_launch.LaunchError as exc:
        shutil.rmtree(sweep_dir, ignore_errors=True)
        print(f"pd-train sweep: error: {exc}\nThe sweep dir was removed.", file=sys.stderr)
        return 2 if isinstance(exc, pd_launch.UnknownPartitionError) else 1
    _write_json(
        sweep_dir / SUBMISSION_FILE,
        {"job_id": submission.job_id, "cluster": submission.cluster, "points": len(points)},
    )
    print(f"submitted array job {submission.job_id} ({len(points)} tasks)")
    print(f"sweep dir: {sweep_dir}")
    return 0


# ---------------------------------------------------------------------------------------------
# The command


def _validate_toy(value: str, points: Sequence[Point]) -> list[dict[str, Any]]:
    """Each point's resolved toy config (:func:`pd_train.cli.toy.load_toy_config`); raises one
    ConfigError listing every bad point."""
    from pd_train.cli import toy as toy_cli

    resolved, problems = [], []
    for point in points:
        try:
            resolved.append(toy_cli.load_toy_config(value, point.overrides))
        except ConfigError as exc:
            where = f"point {point.index} ({point.describe()})"
            problems += [(path, f"{where}: {message}") for path, message in exc.problems]
    if problems:
        source = None if value.startswith("builtin:") else value
        raise ConfigError(problems, source=source)
    return resolved


def _sweep_dir(args: argparse.Namespace, default: Path) -> Path:
    """``--sweep-dir`` (else ``default``), checked: new, and in a directory that can hold it."""
    sweep_dir = args.sweep_dir.expanduser().absolute() if args.sweep_dir is not None else default
    if sweep_dir.exists():
        msg = f"{sweep_dir} already exists; a sweep always starts in a new directory"
        raise ConfigError([("--sweep-dir", msg)])
    from pd_train import run as runner

    problem = runner.directory_problem(sweep_dir.parent, base=Path.cwd())
    if problem is not None:
        raise ConfigError([("--sweep-dir", problem)])
    return sweep_dir


def _print_plan(sweep_dir: Path, points: Sequence[Point], notes: Sequence[str]) -> None:
    print(f"# --dry-run: nothing written. {len(points)} points in {sweep_dir}:")
    for point in points:
        print(f"#   {point.name}: {point.describe()}")
    for note in notes:
        print(f"# {note}")


def _toy_sweep(args: argparse.Namespace) -> int:
    """:func:`sweep` of a toy config: validated as a toy run is, run here (a toy run is one
    process; there is no array job for it)."""
    import yaml

    from pd_train._output_paths import dated_dir

    if args.slurm:
        msg = (
            f"{args.config} is a toy: its points run here, one after another (a toy run is one "
            "process, not a SLURM job); leave --slurm out"
        )
        raise ConfigError([("--slurm", msg)])
    points = plan_points(args.overrides, args.grids)
    resolved = _validate_toy(args.config, points)
    sweep_dir = _sweep_dir(args, dated_dir(Path.cwd() / "outputs", f"{resolved[0]['toy']}-sweep"))
    if args.dry_run:
        _print_plan(sweep_dir, points, [])
        return 0
    configs = [yaml.safe_dump(raw, sort_keys=False) for raw in resolved]
    _write_sweep_dir(sweep_dir, args, points, configs)
    return _run_points(sweep_dir, points, max_steps=args.max_steps)


def sweep(args: argparse.Namespace) -> int:
    from pd_train.cli._common import config_source, is_toy_config
    from pd_train.config.run import to_yaml

    if args.max_steps is not None and args.max_steps < 1:
        raise ConfigError([("--max-steps", f"got {args.max_steps}; must be >= 1")])
    if args.slurm and args.max_steps is not None:
        raise ConfigError([("--max-steps", "is for local runs; leave it out with --slurm")])
    if is_toy_config(args.config):
        return _toy_sweep(args)
    source = config_source(args.config)
    points = plan_points(args.overrides, args.grids)
    prepared = _validate(source, points, slurm=args.slurm)
    sweep_dir = _sweep_dir(args, _default_sweep_dir(prepared[0]))

    job = None
    if args.slurm:
        job = array_job(prepared[0].config, sweep_dir, points, chdir=Path.cwd())
    notes = structural_notes(points, prepared[0].raw)
    if args.dry_run:
        _print_plan(sweep_dir, points, notes)
        if job is not None:
            import pd_launch

            print(pd_launch.render_script(job), end="")
        return 0
    configs = [to_yaml(p.config) for p in prepared]
    if job is not None:
        return _submit_array(job, sweep_dir, args, points, configs)
    _write_sweep_dir(sweep_dir, args, points, configs)
    for note in notes:
        print(f"pd-train sweep: {note}")
    return _run_points(sweep_dir, points, max_steps=args.max_steps)
