"""``pd-train analyze`` and ``pd-train report``: what a decomposition found.

``pd-train analyze RUN_DIR`` harvests eval batches with a checkpoint of the run and writes the
component table (Parquet; see :mod:`pd_train.analysis.components`). ``pd-train report RUN_DIR``
writes one static HTML page of the run (see :mod:`pd_train.analysis.report`). Both exit 2, with
nothing written, when the run dir cannot be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pd_train.cli._common import fail

__all__ = ["add_parsers", "analyze", "pull", "report", "track"]


def add_parsers(subparsers: Any) -> None:
    """Register ``analyze``, ``report``, ``track`` and ``pull`` on the ``pd-train`` subparsers."""
    _add_analyze_parser(subparsers)
    _add_report_parser(subparsers)
    _add_track_parser(subparsers)
    _add_pull_parser(subparsers)


def _add_analyze_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="per-component density, mean CI and top-activating contexts of a run (Parquet)",
        description=(
            "Harvest N eval batches with a checkpoint of RUN_DIR (the latest by default, also "
            "while the run is going) and write one row per alive component: activation "
            "density, mean CI, and its top-k activating contexts."
        ),
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help=RUN_DIR_HELP)
    p.add_argument(
        "--checkpoint", type=int, metavar="STEP", help="checkpoint step (default latest)"
    )
    p.add_argument("--n-batches", type=int, default=16, metavar="N", help="eval batches (16)")
    p.add_argument("--top-k", type=int, default=10, metavar="K", help="contexts per component (10)")
    p.add_argument(
        "--threshold",
        type=float,
        metavar="T",
        help="ci_lower above T counts as active (default: the run's pd.l0_threshold)",
    )
    p.add_argument(
        "--window", type=int, default=8, metavar="W", help="context tokens on each side (8)"
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="Parquet file (default RUN_DIR/analysis/components-stepSTEP.parquet)",
    )
    from pd_train.cli._common import add_distributed_args, positive_int

    p.add_argument(
        "--simulate-devices", type=positive_int, metavar="N", help="N >= 1 simulated CPU devices"
    )
    add_distributed_args(
        p, help="process layout, as for `pd-train run` (process 0 writes the table)"
    )


def _add_report_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="one static HTML page of a run: config, curves, L0, components",
        description=(
            "Write RUN_DIR/report.html (or --out): the run's config and summary, loss curves, L0 "
            "per site over training, activation-density histograms and a browsable table of "
            "components with their top contexts (from the latest `pd-train analyze` file). "
            "Self-contained: no server, no network."
        ),
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help=RUN_DIR_HELP)
    p.add_argument(
        "--analysis",
        type=Path,
        metavar="FILE",
        help="component table to show (default: the latest in RUN_DIR/analysis/)",
    )
    p.add_argument(
        "--out", type=Path, metavar="FILE", help="HTML file (default RUN_DIR/report.html)"
    )


def _add_track_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "track",
        help="mirror a run's metrics.jsonl into a Weights & Biases run (pd-train[wandb])",
        description=(
            "Log every train/eval scalar of RUN_DIR/metrics.jsonl after the last synced step to "
            "a W&B run; the run id is kept in RUN_DIR/tracking/, so syncing again after the run "
            "went on or was resumed continues the same W&B run. Settings come from the flags or, "
            "without --project, from a `tracking: {wandb: ...}` section of RUN_DIR/config.yaml."
        ),
    )
    p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    p.add_argument("--project", help="W&B project")
    p.add_argument("--entity", help="W&B entity (team or user)")
    p.add_argument("--mode", default="online", help="online | offline | disabled (online)")
    p.add_argument("--tags", default="", help="comma-separated tags")
    p.add_argument("--figures", default="every_eval", help="every_eval | final | none (every_eval)")
    p.add_argument(
        "--checkpoint", default="final", help="final (the run dir as an artifact) | none"
    )


def _add_pull_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "pull",
        help="load a decomposition back from a W&B run into a run dir (pd-train[wandb])",
        description=(
            "Download the pd-<RUN_ID> artifact that `pd-train run` (with tracking:) or "
            "`pd-train track` logged: config, records, plots and the latest checkpoint, into a "
            "run dir that `pd-train analyze` and `pd-train report` read. SOURCE is a W&B run "
            "(wandb:ENTITY/PROJECT/runs/RUN_ID, or its URL) or, without a server, an offline "
            "run directory (RUN_DIR/tracking/wandb/offline-run-TIME-RUN_ID)."
        ),
    )
    p.add_argument("source", metavar="SOURCE")
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="the run dir (default ./outputs/wandb-RUN_ID)"
    )


RUN_DIR_HELP = (
    "a run dir, or a W&B run (wandb:ENTITY/PROJECT/runs/RUN_ID) pulled first into "
    "./outputs/wandb-RUN_ID (see `pd-train pull`)"
)


def _analysis_out_problem(run_dir: Path, out: Path | None) -> str | None:
    """Why the table cannot be written where it would go (``--out``, else the run dir's
    ``analysis/``), or None; a run dir that is not one is left to the analysis to refuse."""
    from pd_train._output_paths import directory_problem, file_problem

    if out is not None:
        problem = file_problem(out)
        return None if problem is None else f"--out: {problem}"
    if not run_dir.is_dir():
        return None
    problem = directory_problem(run_dir / "analysis")
    if problem is None:
        return None
    return f"the table goes to {run_dir / 'analysis'} by default, but {problem}; give --out FILE"


def _report_out_problem(run_dir: Path, out: Path | None) -> str | None:
    """As :func:`_analysis_out_problem`, for the page (``--out``, else RUN_DIR/report.html)."""
    from pd_train._output_paths import file_problem

    if out is not None:
        problem = file_problem(out)
        return None if problem is None else f"--out: {problem}"
    if not run_dir.is_dir():
        return None
    problem = file_problem(run_dir / "report.html")
    if problem is None:
        return None
    return f"the page goes to {run_dir / 'report.html'} by default, but {problem}; give --out FILE"


def analyze(args: argparse.Namespace) -> int:
    from pd_train.analysis import AnalysisError, analysis_path, analyze_run, write_table
    from pd_train.run.distributed import DistributedError, placement_from_flags

    try:
        placement = placement_from_flags(args)
    except DistributedError as exc:
        return fail(str(exc))
    args.run_dir = _run_dir(args.run_dir)
    if args.run_dir is None:
        return 2
    from pd_train.cli.toy import is_toy_run_dir

    if is_toy_run_dir(args.run_dir):  # the ground-truth metrics and plots at a checkpoint
        from pd_train.cli.toy import analyze_toy
        from pd_train.config.io import ConfigError

        try:
            _, text = analyze_toy(args.run_dir, checkpoint=args.checkpoint)
        except ConfigError as exc:
            return fail(str(exc))
        print(text)
        return 0
    problem = _analysis_out_problem(args.run_dir, args.out)
    if problem is not None:
        return fail(problem)
    try:
        table = analyze_run(
            args.run_dir,
            checkpoint=args.checkpoint,
            n_batches=args.n_batches,
            top_k=args.top_k,
            threshold=args.threshold,
            window=args.window,
            placement=placement,
        )
    except AnalysisError as exc:
        return fail(str(exc))
    if not placement.is_primary:
        return 0  # process 0 writes the table
    step = table.metadata["checkpoint_step"]
    out = args.out or analysis_path(args.run_dir, step)
    write_table(table, out)
    meta = table.metadata
    print(
        f"{meta['n_alive']}/{meta['n_components']} components alive at step {step} "
        f"(ci_lower > {meta['threshold']:g} on {meta['n_tokens']} tokens, harvested in "
        f"{meta['harvest_seconds']:.1f} s with the compile); wrote {out}"
    )
    return 0


def track(args: argparse.Namespace) -> int:
    import yaml

    from pd_train.analysis.tracking import parse_tracking, sync_wandb

    config_path = args.run_dir / "config.yaml"
    if not config_path.is_file():
        return fail(f"run dir {args.run_dir}: no config.yaml; not a run dir")
    run_config = yaml.safe_load(config_path.read_text())
    if args.project is not None:
        tags = [t for t in args.tags.split(",") if t]
        raw = {
            "wandb": {
                "project": args.project,
                "entity": args.entity,
                "mode": args.mode,
                "tags": tags,
                "figures": args.figures,
                "checkpoint": args.checkpoint,
            }
        }
    elif isinstance(run_config, dict) and "tracking" in run_config:
        raw = run_config["tracking"]
    else:
        return fail(
            f"no tracking settings: give --project, or a `tracking:` section in {config_path}"
        )
    config = parse_tracking(raw)
    if config.mode != "disabled":
        try:
            import wandb  # noqa: F401
        except ImportError:
            return fail("tracking needs wandb: pip install 'pd-train[wandb]'")
    result = sync_wandb(args.run_dir, config, run_config=run_config)
    artifact = ""
    if result.artifact is not None:
        name, step = result.artifact
        artifact = f", artifact {name}" + (f" (checkpoint {step})" if step is not None else "")
    print(
        f"W&B run {result.run_id} ({config.mode}): logged {result.logged_steps} steps, "
        f"last step {result.last_step}, {result.images} images{artifact}"
    )
    return 0


def _run_dir(text: str | Path) -> Path | None:
    """RUN_DIR of analyze/report: a path, or a W&B run pulled first; None after printing why
    a W&B run could not be pulled."""
    from pd_train.analysis.wandb_io import PullError, run_dir_of

    try:
        return run_dir_of(text)
    except PullError as exc:
        fail(str(exc))
        return None


def pull(args: argparse.Namespace) -> int:
    from pd_train.analysis.wandb_io import PullError
    from pd_train.analysis.wandb_io import pull as pull_run

    if args.out is not None:
        from pd_train._output_paths import directory_problem

        problem = None if (args.out / "pulled.json").is_file() else directory_problem(args.out)
        if problem is not None:
            return fail(f"--out: {problem}")
    try:
        out = pull_run(args.source, args.out)
    except PullError as exc:
        return fail(str(exc))
    print(f"pulled {args.source} into {out}; `pd-train analyze {out}`, `pd-train report {out}`")
    return 0


def report(args: argparse.Namespace) -> int:
    from pd_train.analysis.report import ReportError, write_report

    args.run_dir = _run_dir(args.run_dir)
    if args.run_dir is None:
        return 2
    problem = _report_out_problem(args.run_dir, args.out)
    if problem is not None:
        return fail(problem)
    try:
        out = write_report(args.run_dir, analysis=args.analysis, out=args.out)
    except ReportError as exc:
        return fail(str(exc))
    print(f"wrote {out}")
    empty = _empty_run_warning(args.run_dir)
    if empty is not None:
        print(f"pd-train: warning: {empty}", file=sys.stderr)
    return 0


def _empty_run_warning(run_dir: Path) -> str | None:
    """What to say when the run dir has nothing to show but its config (no metric records,
    no summary, no checkpoint): the page is written, but the user likely named the wrong dir
    or a run that never reached its first step."""
    from pd_train.run import METRICS_FILE

    metrics = run_dir / METRICS_FILE
    has_records = metrics.is_file() and metrics.stat().st_size > 0
    has_checkpoint = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
    if has_records or has_checkpoint or (run_dir / "summary.txt").is_file():
        return None
    from pd_train.cli._common import restart_hint

    return (
        f"{run_dir} holds no metrics, summary or checkpoint yet, so the page shows only its "
        "config: the run has not logged a step (still compiling, or it stopped before step 0). "
        f"Wait for its first step, or {restart_hint(run_dir)}; then run `pd-train report` again"
    )
