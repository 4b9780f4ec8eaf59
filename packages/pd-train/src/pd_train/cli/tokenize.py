"""``pd-train tokenize``: text files → one token ``.npy`` with a GGUF checkpoint's tokenizer.

    pd-train tokenize notes.txt more.txt --checkpoint builtin:smollm2 --out tokens.npy

Each file is one document, followed by a separator token (``--separator``, default the GGUF's
EOS). The output is what ``data.path`` reads. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "tokenize"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "tokenize",
        help="tokenize text files into a .npy of token ids (tokenizer from a GGUF checkpoint)",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument(
        "text_files",
        nargs="+",
        type=Path,
        metavar="TEXT_FILES",
        help="UTF-8 text, one document per file",
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a .gguf file whose tokenizer.ggml.* metadata holds the tokenizer (builtin:smollm2 names SmolLM2-135M)",
    )
    p.add_argument("--out", required=True, type=Path, help="the token file to write (.npy)")
    p.add_argument(
        "--separator", help="token appended after each document (default: the GGUF's EOS token)"
    )
    p.set_defaults(handler=tokenize)
    return p


def tokenize(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pd_train.config.io import FieldValueError
    from pd_train.config.run import resolve_path
    from pd_train.models.tokenizer import TokenizerError, tokenize_files

    try:
        checkpoint = resolve_path(args.checkpoint)
    except (FieldValueError, FileNotFoundError) as exc:
        print(f"pd-train: error: --checkpoint: {exc}", file=sys.stderr)
        return 2
    total = sum(f.stat().st_size for f in args.text_files if f.is_file())
    bar: Any = None

    def progress(n_bytes: int) -> None:
        # Created on the first call, which comes once every input has been checked: an error
        # in the arguments is printed alone, without an empty bar above it.
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, unit="B", unit_scale=True, desc="tokenize", file=sys.stderr)
        bar.update(n_bytes)

    try:
        tokens = tokenize_files(
            args.text_files,
            checkpoint=checkpoint,
            out=args.out,
            separator=args.separator,
            progress=progress,
        )
    except TokenizerError as exc:
        if bar is not None:
            bar.close()
        print(f"pd-train: error: {exc}", file=sys.stderr)
        return 2
    if bar is not None:
        bar.close()
    print(
        f"wrote {tokens.size} {tokens.dtype} tokens from {len(args.text_files)} file(s) to {args.out}"
    )
    return 0
