"""``pd-train compile``: lower and compile every jit of a run (or a toy) on abstract inputs; one
table of seconds, memory and FLOPs (:mod:`pd_train.run.compile`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pd_train.cli._common import (
    add_config_args,
    add_device_args,
    config_source,
    fail,
    is_toy_config,
)

__all__ = ["add_parser", "compile_command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compile", help="AOT-compile every jit of a run on abstract inputs")
    add_config_args(p, optional=True)
    p.add_argument("--record", type=Path, help="write per-jit compile records (JSON) here")
    add_device_args(p)


def compile_command(args: argparse.Namespace) -> int:
    """``pd-train compile``: the table of every jit's compile seconds and memory."""
    from pd_train._output_paths import file_problem
    from pd_train.run.compile import compile_all, format_compile_table

    if args.config is not None and is_toy_config(args.config):  # builtin:tms_5_2
        from pd_train.cli import toy as toy_cli

        if args.record is not None:
            return fail("--record is not supported for a toy config")
        print(format_compile_table(toy_cli.compile_toy(args.config, args.overrides)))
        return 0
    if args.record is not None and (problem := file_problem(args.record)) is not None:
        return fail(f"--record: {problem}")
    rows = compile_all(
        config_source(args.config), args.overrides, record=args.record, progress=sys.stderr
    )
    print(format_compile_table(rows))
    return 0
