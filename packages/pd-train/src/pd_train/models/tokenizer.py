"""Tokenizers read from a GGUF file's metadata, and text files → a token ``.npy``.

:func:`gguf_tokenizer` builds a ``tokenizers.Tokenizer`` (Hugging Face's Rust tokenizers) from
``tokenizer.ggml.*``: the GPT-2 style byte-level BPE that llama.cpp calls ``gpt2``, with its
vocabulary (``tokens``), ``merges`` and control tokens (``token_type`` 3) as special tokens. The
pre-tokenizer follows ``tokenizer.ggml.pre``: ``smollm`` splits digits one by one before
GPT-2's regex (as SmolLM2's own tokenizer.json does); ``gpt2``/``default`` is GPT-2's regex
alone; other pre-tokenizers are refused. No BOS/EOS is added by ``encode``.

:func:`tokenize_files` writes the tokens of a list of text files (each file one document,
followed by a separator token) as one 1-D ``.npy`` — the format ``data.path`` reads.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pd_train.models.gguf import open_gguf
from pd_train.models.hf import CheckpointError

__all__ = ["TokenizerError", "gguf_tokenizer", "tokenize_files"]

_PRE_TOKENIZERS = ("smollm", "gpt2", "default")
_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


class TokenizerError(ValueError):
    """A tokenizer that cannot be built, or text that cannot be tokenized as asked."""


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - only without the extra
        msg = "tokenizing needs the 'tokenizers' package: pip install 'pd-train[smollm2]'"
        raise TokenizerError(msg) from None
    return tokenizers


def gguf_tokenizer(path: str | Path) -> Any:
    """The ``tokenizers.Tokenizer`` described by a GGUF file's ``tokenizer.ggml.*`` metadata."""
    tk = _tokenizers()
    reader = open_gguf(path)
    fields = reader.fields

    def get(key: str) -> Any:
        if key not in fields:
            msg = f"tokenizer: {path} has no metadata key {key!r}"
            raise TokenizerError(msg)
        return fields[key].contents()

    model = get("tokenizer.ggml.model")
    if model != "gpt2":
        msg = f"tokenizer: {path}: tokenizer.ggml.model is {model!r}; pd reads 'gpt2' (byte-level BPE)"
        raise TokenizerError(msg)
    pre = fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in fields else "default"
    if pre not in _PRE_TOKENIZERS:
        msg = f"tokenizer: {path}: tokenizer.ggml.pre is {pre!r}; pd reads {list(_PRE_TOKENIZERS)}"
        raise TokenizerError(msg)
    tokens = get("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]
    if any(len(m) != 2 for m in merges):
        msg = f"tokenizer: {path}: tokenizer.ggml.merges holds an entry without a space ('a b')"
        raise TokenizerError(msg)
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        msg = f"tokenizer: {path}: tokenizer.ggml.tokens repeats a token"
        raise TokenizerError(msg)
    types = (
        fields["tokenizer.ggml.token_type"].contents()
        if "tokenizer.ggml.token_type" in fields
        else []
    )

    tokenizer = tk.Tokenizer(
        tk.models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    )
    byte_level = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tokenizer.pre_tokenizer = tk.pre_tokenizers.Sequence(
            [tk.pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = tk.decoders.ByteLevel()
    special = [tokens[i] for i, t in enumerate(types) if t == _CONTROL]
    if special:
        tokenizer.add_special_tokens(
            [tk.AddedToken(s, special=True, normalized=False) for s in special]
        )
    return tokenizer


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        msg = f"TEXT_FILES: {path} is not UTF-8 text ({e})"
        raise TokenizerError(msg) from None


def _check_utf8(path: Path) -> None:
    """A TokenizerError naming ``path`` unless it is UTF-8 (read in 1 MiB pieces, not kept)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    with path.open("rb") as f:
        try:
            while piece := f.read(1 << 20):
                decoder.decode(piece)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            msg = f"TEXT_FILES: {path} is not UTF-8 text ({e})"
            raise TokenizerError(msg) from None


def tokenize_files(
    files: Sequence[str | Path],
    *,
    checkpoint: str | Path,
    out: str | Path,
    separator: str | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Tokenize ``files`` (UTF-8 text, each one document) with ``checkpoint``'s tokenizer and
    write the tokens, each document followed by ``separator``'s id, to ``out`` (a 1-D ``.npy``:
    uint16 when the vocabulary fits, else uint32). ``separator`` is a token of the vocabulary
    (default: the GGUF's ``tokenizer.ggml.eos_token_id``). Every argument is checked (files
    exist and are UTF-8, the tokenizer loads, the separator is a token) before any tokenizing;
    then ``progress(0)`` is called once, and ``progress(n_bytes)`` after each file. Returns the
    tokens."""
    out = Path(out)
    if out.suffix != ".npy":
        msg = f"--out: got {str(out)!r}; expected a .npy file"
        raise TokenizerError(msg)
    paths = [Path(f) for f in files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        msg = f"TEXT_FILES: {missing} do not exist or are not files"
        raise TokenizerError(msg)
    for path in paths:
        _check_utf8(path)
    if out.is_dir():
        msg = f"--out: {str(out)!r} is a directory; expected a .npy file"
        raise TokenizerError(msg)
    from pd_train._output_paths import file_problem

    problem = file_problem(out)
    if problem is not None:
        raise TokenizerError(f"--out: {problem}")
    try:
        tokenizer = gguf_tokenizer(checkpoint)
    except CheckpointError as e:
        raise TokenizerError(f"--checkpoint: {e}") from None
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if separator is None:
        fields = open_gguf(checkpoint).fields
        if "tokenizer.ggml.eos_token_id" not in fields:
            msg = (
                f"--separator: {checkpoint} names no tokenizer.ggml.eos_token_id; give --separator"
            )
            raise TokenizerError(msg)
        sep_id = int(fields["tokenizer.ggml.eos_token_id"].contents())
    else:
        found = tokenizer.token_to_id(separator)
        if found is None:
            msg = f"--separator: {separator!r} is not a token of {checkpoint}'s vocabulary"
            raise TokenizerError(msg)
        sep_id = int(found)
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    if progress is not None:
        progress(0)
    parts = []
    for path in paths:
        raw = path.read_bytes()
        text = _decode(path, raw)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        parts.append(np.asarray([*ids, sep_id], dtype=dtype))
        if progress is not None:
            progress(len(raw))
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial.npy")
    np.save(tmp, tokens)
    tmp.replace(out)  # nothing half-written under the final name
    return tokens
