"""What the subcommand modules share: the config and device arguments, the error line, the
shipped-config names."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = [
    "DEFAULT_CONFIG",
    "EXIT_INTERRUPTED",
    "add_config_args",
    "add_device_args",
    "add_distributed_args",
    "config_source",
    "fail",
    "is_toy_config",
    "positive_int",
    "restart_hint",
]

DEFAULT_CONFIG = "builtin:default"
EXIT_INTERRUPTED = 130  # pd_train.run.EXIT_INTERRUPTED (not imported: it pulls the run module)


def add_config_args(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    parser.add_argument(
        "config",
        nargs="?" if optional else None,
        default=DEFAULT_CONFIG if optional else None,
        help="YAML config (builtin:default names the embedded tiny decomposition)",
    )
    from pd_train.config.io import add_override_argument  # cattrs, yaml: after a relaunch

    add_override_argument(parser)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (``--max-steps``, ``--simulate-devices``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; expected a whole number >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {value}; must be >= 1")
    return value


def add_device_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--simulate-devices",
        type=positive_int,
        metavar="N",
        help="run on N >= 1 simulated CPU devices (sets XLA_FLAGS before JAX starts)",
    )


def add_distributed_args(parser: argparse.ArgumentParser, *, help: str) -> None:
    """``--distributed`` (``help``: what the process layout is for this subcommand) and the
    explicit layout's ``--coordinator``, ``--num-processes``, ``--process-id``,
    ``--process-per`` (read by :func:`pd_train.run.distributed.resolve_placement`)."""
    parser.add_argument(
        "--distributed", choices=("none", "slurm", "explicit"), default="none", help=help
    )
    parser.add_argument("--coordinator", help="HOST:PORT of process 0 (--distributed explicit)")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--process-per", choices=("node", "device"), default="node")


def fail(message: str, code: int = 2, *, command: str = "pd-train") -> int:
    """Print ``COMMAND: error: MESSAGE`` on stderr; ``code`` back (the exit status)."""
    print(f"{command}: error: {message}", file=sys.stderr)
    return code


def is_toy_config(value: str) -> bool:
    """Whether ``value`` names a toy (:func:`pd_train.cli.toy.is_toy_config`). A shipped
    config (``builtin:default``) is answered without importing the toy module, which imports
    scipy (~1.5 s before the first step); no toy shares a shipped config's name."""
    from pd_train.configs import builtin_configs

    if value.startswith("builtin:") and value.removeprefix("builtin:") in builtin_configs():
        return False
    from pd_train.cli import toy as toy_cli

    return toy_cli.is_toy_config(value)


def restart_hint(run_dir: Path) -> str:
    """How to (re)start the run in ``run_dir`` that has no checkpoint, as a command that is
    then accepted: the same dir for a decomposition run (``--run-dir`` with the same config
    starts at step 0); a new dir for a toy run without a checkpoint."""
    config = run_dir / "config.yaml"
    if is_toy_config(str(config)):
        return (
            f"{run_dir} is a toy run without a checkpoint: run it again into a new dir with "
            f"`pd-train run {config} --run-dir NEW_DIR`"
        )
    return f"start the run with `pd-train run {config} --run-dir {run_dir}`"


def config_source(value: str) -> str | Path:
    from pd_train.configs import builtin_config

    if value.startswith("builtin:"):
        return builtin_config(value.removeprefix("builtin:"))
    return Path(value)
