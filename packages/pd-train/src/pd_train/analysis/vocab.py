"""A target's vocabulary, where its checkpoint directory has one, to decode token ids.

Read from the checkpoint directory, in this order:

* ``vocab.json`` as a list (id → token; the built-in tiny Llama's words) or as a mapping
  (token → id, as GPT-2-style tokenizers write it);
* ``tokenizer.json`` (Hugging Face ``tokenizers``): ``model.vocab`` plus ``added_tokens``.
  Byte-level BPE markers are shown as text (``Ġ`` → space, ``Ċ`` → newline).

No vocabulary (random-weight targets, a checkpoint without either file): ids print as ``#17``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Vocabulary", "load_vocabulary"]

_BYTE_LEVEL = {"Ġ": " ", "Ċ": "\n", "ĉ": "\t"}


class Vocabulary:
    """``vocab.token(id)``; ``vocab.join(tokens)`` puts decoded tokens back into text."""

    def __init__(self, tokens: Sequence[str | None], *, source: str, spaced: bool) -> None:
        self.tokens = list(tokens)
        self.source = source
        #: Word vocabularies (the tiny language) join with spaces; subword ones carry their own.
        self.spaced = spaced

    def token(self, token_id: int) -> str:
        if 0 <= token_id < len(self.tokens) and self.tokens[token_id] is not None:
            return self.tokens[token_id]  # type: ignore[return-value]
        return f"#{token_id}"

    def join(self, pieces: Sequence[str]) -> str:
        return (" " if self.spaced else "").join(pieces)


def _from_mapping(mapping: dict[str, int]) -> list[str | None]:
    size = max(mapping.values(), default=-1) + 1
    tokens: list[str | None] = [None] * size
    for text, index in mapping.items():
        tokens[index] = text
    return tokens


def _byte_level(tokens: list[str | None]) -> list[str | None]:
    def show(text: str | None) -> str | None:
        if text is None:
            return None
        for marker, plain in _BYTE_LEVEL.items():
            text = text.replace(marker, plain)
        return text

    return [show(t) for t in tokens]


def load_vocabulary(checkpoint: str | Path | None) -> Vocabulary | None:
    """The vocabulary of a checkpoint directory, or None when it has none (see the module
    docstring). A file that exists but is not a vocabulary raises ValueError naming it."""
    if checkpoint is None:
        return None
    root = Path(checkpoint)
    vocab_file = root / "vocab.json"
    if vocab_file.is_file():
        data = json.loads(vocab_file.read_text())
        if isinstance(data, list) and all(isinstance(t, str) for t in data):
            return Vocabulary(data, source=str(vocab_file), spaced=True)
        if isinstance(data, dict) and all(isinstance(v, int) for v in data.values()):
            return Vocabulary(
                _byte_level(_from_mapping(data)), source=str(vocab_file), spaced=False
            )
        msg = f"{vocab_file}: expected a list of tokens or a mapping token → id"
        raise ValueError(msg)
    tokenizer_file = root / "tokenizer.json"
    if tokenizer_file.is_file():
        data = json.loads(tokenizer_file.read_text())
        mapping = dict(data.get("model", {}).get("vocab") or {})
        if not isinstance(mapping, dict) or not mapping:
            msg = f"{tokenizer_file}: no model.vocab mapping"
            raise ValueError(msg)
        for added in data.get("added_tokens") or []:
            mapping[added["content"]] = int(added["id"])
        return Vocabulary(
            _byte_level(_from_mapping(mapping)), source=str(tokenizer_file), spaced=False
        )
    return None
