"""The ``pd-train`` command: a thin layer that composes pd-train with its sibling packages.

Subcommands:
  config   print a config resolved with its defaults and overrides
  run      run (or resume) a decomposition
  compile  lower and compile every jit of a run on abstract inputs; print seconds and memory
  pretrain train a built-in toy target (builtin:tms_5_2) deterministically; write its weights
  submit   submit a run to SLURM through pd-launch
  sweep    one run per point of a grid of overrides, one after another or as a SLURM array
  probe    compile probes of a config through pd-probe
  analyze  per-component density, mean CI and top contexts of a run's checkpoint (Parquet)
  report   one static HTML page of a run
  track    mirror a run's metrics.jsonl into a Weights & Biases run (pd-train[wandb])
  pull     load a decomposition back from a W&B run into a run dir (pd-train[wandb])
  tokenize text files → a token .npy, with a GGUF checkpoint's tokenizer

Exit codes: 0 success (also a run stopped by SIGTERM after saving: SLURM requeues it), 1 failure
while running, 2 bad input (config, arguments; nothing was written), 130 stopped by Ctrl-C (after
saving a checkpoint and the summary at the next step boundary, the plots skipped; a second Ctrl-C aborts at
once).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from pd_train import __version__
from pd_train.cli._common import (
    EXIT_INTERRUPTED,
    config_source,
    fail,
    is_toy_config,
    positive_int,
    restart_hint,
)
from pd_train.cli.run import HUGEPAGE_TUNABLE, exit_now, hugepage_environment

__all__ = [
    "EXIT_INTERRUPTED",
    "HUGEPAGE_TUNABLE",
    "build_parser",
    "config_source",
    "exit_now",
    "hugepage_environment",
    "is_toy_config",
    "main",
    "positive_int",
    "restart_hint",
]


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand's parser, each added by its own module (imported here: none imports
    JAX at module level)."""
    from pd_train.cli import analyze, pretrain, probe, submit, sweep, tokenize
    from pd_train.cli import compile as compile_cli
    from pd_train.cli import config as config_cli
    from pd_train.cli import run as run_cli

    parser = argparse.ArgumentParser(
        prog="pd-train",
        description="Stochastic parameter decomposition of transformer language models with JAX.",
    )
    parser.add_argument("--version", action="version", version=f"pd-train {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    config_cli.add_parser(sub)
    run_cli.add_parser(sub)
    pretrain.add_parser(sub)
    compile_cli.add_parser(sub)
    submit.add_parser(sub)
    sweep.add_parser(sub)
    probe.add_parser(sub)
    analyze.add_parsers(sub)
    tokenize.add_parser(sub)
    return parser


def _handlers() -> dict[str, Callable[[argparse.Namespace], int]]:
    """Subcommand → its function (``args`` → exit code)."""
    from pd_train.cli import analyze, pretrain, probe, submit, sweep, tokenize
    from pd_train.cli import compile as compile_cli
    from pd_train.cli import config as config_cli
    from pd_train.cli import run as run_cli

    return {
        "config": config_cli.config,
        "run": run_cli.run,
        "compile": compile_cli.compile_command,
        "pretrain": pretrain.pretrain,
        "submit": submit.submit,
        "sweep": sweep.sweep,
        "probe": probe.probe,
        "analyze": analyze.analyze,
        "report": analyze.report,
        "track": analyze.track,
        "pull": analyze.pull,
        "tokenize": tokenize.tokenize,
    }


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["run"]:
        from pd_train.cli.run import relaunch_with_hugepages

        try:
            relaunch_with_hugepages()
        except ValueError as err:
            return fail(str(err))
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if getattr(args, "simulate_devices", None) is not None:
        flag = f"--xla_force_host_platform_device_count={args.simulate_devices}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")

    from pd_train.config.io import ConfigError
    from pd_train.process_env import setup_logging

    setup_logging()
    try:
        code = _handlers()[args.command](args)
    except ConfigError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        # Ctrl-C outside the step loop (which saves first; see pd_train.run): one line, no
        # traceback.
        print("pd-train: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if argv is None and getattr(args, "exit_now", False):
        exit_now(code, force=getattr(args, "exit_force", False))
    return code


if __name__ == "__main__":
    sys.exit(main())
