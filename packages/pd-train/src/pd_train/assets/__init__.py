"""The tiny Llama that ships with pd-train and the synthetic corpus it was trained on.

Made by ``scripts/make_tiny_llama.py`` (see there for the language and the training run):

* ``tiny_llama/``: a Hugging Face checkpoint directory (``config.json``, fp32
  ``model.safetensors``) of a 4-layer ``LlamaForCausalLM``, hidden 64, 4 heads over 2 kv heads,
  MLP 256, vocabulary 384, untied, Llama-3 RoPE scaling; plus ``vocab.json`` (id → word).
* ``tiny_corpus.npy`` / ``tiny_corpus_val.npy``: uint16 training and held-out tokens [N].
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

__all__ = ["tiny_corpus_path", "tiny_llama_path", "tiny_vocab"]


def _asset(name: str) -> Path:
    # The wheel installs assets as plain files, so the package's resource root is a directory.
    path = Path(str(resources.files(__name__) / name))
    if not path.exists():
        msg = f"pd_train asset {name!r} is missing at {path}; rebuild it with scripts/make_tiny_llama.py"
        raise FileNotFoundError(msg)
    return path


def tiny_llama_path() -> Path:
    """Directory of the tiny Llama checkpoint, loadable with ``load_llama_checkpoint``."""
    return _asset("tiny_llama")


def tiny_corpus_path(split: str = "train") -> Path:
    """The tiny corpus's token file (``.npy``, uint16, 1-D) for ``split`` 'train' or 'val'."""
    files = {"train": "tiny_corpus.npy", "val": "tiny_corpus_val.npy"}
    if split not in files:
        msg = f"split is {split!r}; expected one of {sorted(files)}"
        raise ValueError(msg)
    return _asset(files[split])


@cache
def tiny_vocab() -> tuple[str, ...]:
    """The tiny language's words, indexed by token id (``tiny_vocab()[0] == '<bos>'``)."""
    return tuple(json.loads((tiny_llama_path() / "vocab.json").read_text()))
