"""``pd-train pretrain``: train a built-in toy target (``builtin:tms_5_2``) deterministically and
write its weights (or, with ``--check``, compare them with the shipped ones)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pd_train.cli._common import fail

__all__ = ["add_parser", "pretrain"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "pretrain", help="train a built-in toy target (builtin:tms_5_2); writes its weights"
    )
    p.add_argument("config", help="builtin:<toy> (e.g. builtin:tms_5_2)")
    p.add_argument("--out", type=Path, help="default: overwrite the shipped weights' file")
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 unless the result matches the shipped weights (within "
        "1e-5 of each array's scale: another CPU rounds differently)",
    )


def pretrain(args: argparse.Namespace) -> int:
    from pd_train.cli.toy import pretrain_toy_cli

    if args.check and args.out is not None:
        return fail("--check writes nothing; leave --out out")
    if args.out is not None:
        from pd_train._output_paths import file_problem

        problem = file_problem(args.out)
        if problem is not None:  # refused before the pretraining, not after it
            return fail(f"--out: {problem}")
    text, same = pretrain_toy_cli(args.config, out=args.out, check=args.check)
    print(text)
    return 1 if args.check and not same else 0
