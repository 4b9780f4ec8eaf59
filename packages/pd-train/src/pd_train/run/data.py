"""Pre-tokenized training data: fixed-length windows over memory-mapped token files.

A dataset is one token file or a directory of them: ``.npy`` (a 1-D integer array) or raw
``.bin`` (the token dtype given by the caller). Each file is cut into non-overlapping windows of
``seq_len`` tokens (a file's tail shorter than a window is skipped; windows never cross files).

The order of windows depends only on ``(seed, step)``: global sample ``g = step * batch_size + row``
is window ``perm(seed, epoch)[g % num_windows]`` with ``epoch = g // num_windows``, where
``perm(seed, epoch)`` is a permutation of all windows drawn from a numpy generator seeded with
``[seed, epoch]``. A resumed run asks for step k and gets exactly the batch an uninterrupted run
would have seen; the data position is just the step. Each process reads from disk only its own
rows of the global batch (rows ``[p * B/P, (p+1) * B/P)`` for process ``p`` of ``P``).

SPD reads inputs only, so a window is ``seq_len`` tokens; pass ``seq_len + 1`` to cut windows that
also hold next-token labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["Batches", "DataError", "TokenDataset", "token_range"]

TOKEN_DTYPES = ("uint16", "uint32", "int32")
SUFFIXES = (".npy", ".bin")


class DataError(ValueError):
    """Token files or loader settings that cannot produce batches."""


def _open_tokens(file: Path, dtype: str | None) -> np.ndarray:
    """A read-only memory map of ``file``'s tokens, 1-D."""
    if file.suffix == ".npy":
        with open(file, "rb") as f:
            magic = f.read(6)
        if magic != b"\x93NUMPY":
            msg = (
                f"data: {file} is named .npy but is not a NumPy .npy file (no NumPy header); "
                "write tokens with numpy.save, or name a raw token file .bin and set data.dtype"
            )
            raise DataError(msg)
        try:
            tokens = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, EOFError, OSError) as e:
            msg = f"data: {file} is not a readable .npy array ({e})"
            raise DataError(msg) from e
        if tokens.ndim != 1:
            msg = f"data: {file} holds an array of shape {list(tokens.shape)}; expected 1-D tokens"
            raise DataError(msg)
        if tokens.dtype.name not in TOKEN_DTYPES:
            msg = f"data: {file} holds {tokens.dtype.name} tokens; expected one of {list(TOKEN_DTYPES)}"
            raise DataError(msg)
        if dtype is not None and tokens.dtype.name != dtype:
            msg = f"data: {file} holds {tokens.dtype.name} tokens but data.dtype is {dtype!r}"
            raise DataError(msg)
        return tokens
    if dtype is None:
        msg = f"data: {file} is a raw .bin file; set dtype to one of {list(TOKEN_DTYPES)}"
        raise DataError(msg)
    size = file.stat().st_size
    itemsize = np.dtype(dtype).itemsize
    if size % itemsize:
        msg = f"data: {file} has {size} bytes, not a whole number of {dtype} tokens ({itemsize} bytes each)"
        raise DataError(msg)
    if size == 0:
        return np.zeros(0, dtype)
    return np.memmap(file, dtype=dtype, mode="r")


#: (path, size, mtime, inode, dtype) of a token file → its (smallest, largest) token id.
_TOKEN_RANGES: dict[tuple[object, ...], tuple[int, int]] = {}


def token_range(file: Path, tokens: np.ndarray) -> tuple[int, int]:
    """The smallest and largest token id of ``file`` (its memory map ``tokens``; ``(0, -1)``
    when empty): one pass over the file, remembered per (path, size, mtime, inode) so another
    dataset over the unchanged file (validation, then the run) does not read it again."""
    stat = file.stat()
    key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ino, tokens.dtype.str)
    if key not in _TOKEN_RANGES:
        step = 1 << 24  # 16 Mi tokens at a time: no full-size temporary
        chunks = [tokens[start : start + step] for start in range(0, tokens.size, step)]
        lows = [int(chunk.min()) for chunk in chunks]
        highs = [int(chunk.max()) for chunk in chunks]
        _TOKEN_RANGES[key] = (min(lows), max(highs)) if chunks else (0, -1)
    return _TOKEN_RANGES[key]


def _check_below_vocab(file: Path, tokens: np.ndarray, vocab_size: int) -> None:
    low, high = token_range(file, tokens)
    if low < 0 or high >= vocab_size:
        bad = int(np.argmax((tokens < 0) | (tokens >= vocab_size)))  # the first one, by position
        got = f"token ids down to {low}" if low < 0 else f"token ids up to {high}"
        msg = (
            f"data: {file} holds {got} (the first bad one, {int(tokens[bad])}, at position "
            f"{bad}); the target's vocab_size is {vocab_size}, so ids must be in "
            f"[0, {vocab_size}): were these tokens made with another model's tokenizer?"
        )
        raise DataError(msg)


class TokenDataset:
    """Windows of ``seq_len`` tokens over one token file or a directory of token files.

    Args:
      path: a ``.npy``/``.bin`` file, or a directory whose ``*.npy`` and ``*.bin`` files (sorted
        by name) are the shards.
      seq_len: tokens per window.
      dtype: token dtype; required for ``.bin``, checked against ``.npy`` when given.
      vocab_size: when given, every file's largest token must be below it (checked here,
        one pass per file, cached by the file's stat: see :func:`token_range`), and every
        window read is checked again.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        seq_len: int,
        dtype: str | None = None,
        vocab_size: int | None = None,
    ) -> None:
        path = Path(path)
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            msg = f"data: seq_len is {seq_len!r}; expected a positive int"
            raise DataError(msg)
        if dtype is not None and dtype not in TOKEN_DTYPES:
            msg = f"data: dtype is {dtype!r}; expected one of {list(TOKEN_DTYPES)}"
            raise DataError(msg)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
            if not files:
                msg = f"data: directory {path} holds no {' or '.join(SUFFIXES)} token files"
                raise DataError(msg)
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                msg = f"data: {path} has suffix {path.suffix!r}; expected one of {list(SUFFIXES)}"
                raise DataError(msg)
            files = [path]
        else:
            msg = f"data: {path} does not exist"
            raise DataError(msg)

        self.path = path
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.files: tuple[Path, ...] = tuple(files)
        self._tokens = [_open_tokens(f, dtype) for f in files]
        counts = []
        for file, tokens in zip(files, self._tokens, strict=True):
            n = len(tokens) // seq_len
            if n == 0:
                msg = f"data: {file} holds {len(tokens)} tokens, fewer than one window (seq_len {seq_len})"
                raise DataError(msg)
            counts.append(n)
        if vocab_size is not None:
            for file, tokens in zip(files, self._tokens, strict=True):
                _check_below_vocab(file, tokens, vocab_size)
        # _starts[i] is the global index of file i's first window.
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self.num_windows = int(self._starts[-1])
        self.num_tokens = int(sum(len(t) for t in self._tokens))

    def __len__(self) -> int:
        return self.num_windows

    def windows(self, indices: np.ndarray) -> np.ndarray:
        """Windows ``indices`` [n] as int32 tokens [n, seq_len], read from the memory maps."""
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_windows):
            msg = f"data: window index out of range [0, {self.num_windows})"
            raise DataError(msg)
        out = np.empty((len(indices), self.seq_len), dtype=np.int32)
        files = np.searchsorted(self._starts, indices, side="right") - 1
        for row, (i, f) in enumerate(zip(indices, files, strict=True)):
            start = (int(i) - int(self._starts[f])) * self.seq_len
            out[row] = self._tokens[f][start : start + self.seq_len]
            if self.vocab_size is not None and out[row].max(initial=0) >= self.vocab_size:
                msg = (
                    f"data: {self.files[f]} has token {int(out[row].max())} at or above vocab_size "
                    f"{self.vocab_size} (in tokens {start}..{start + self.seq_len})"
                )
                raise DataError(msg)
        return out


class Batches:
    """The batch stream of a run: ``batch(step)`` is this process's rows of global batch ``step``.

    A pure function of ``(seed, step)``: no state, so resuming at step k needs nothing but k.

    Args:
      dataset: the windows to draw from.
      batch_size: global batch size (rows across all processes).
      seed: the run's data seed (a non-negative int).
      process_index, process_count: this process and how many there are; default to
        ``jax.process_index()`` and ``jax.process_count()``.
    """

    def __init__(
        self,
        dataset: TokenDataset,
        *,
        batch_size: int,
        seed: int,
        process_index: int | None = None,
        process_count: int | None = None,
    ) -> None:
        if process_index is None or process_count is None:
            import jax  # only when asked to discover the process layout

            process_index = jax.process_index() if process_index is None else process_index
            process_count = jax.process_count() if process_count is None else process_count
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            msg = f"data: batch_size is {batch_size!r}; expected a positive int"
            raise DataError(msg)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            msg = f"data: seed is {seed!r}; expected a non-negative int"
            raise DataError(msg)
        if process_count < 1 or not 0 <= process_index < process_count:
            msg = (
                f"data: process_index {process_index} is outside [0, process_count={process_count})"
            )
            raise DataError(msg)
        if batch_size % process_count:
            msg = (
                f"data: batch_size {batch_size} does not divide evenly over {process_count} "
                f"processes; use a multiple of {process_count}"
            )
            raise DataError(msg)
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.process_index = process_index
        self.process_count = process_count
        self.local_batch_size = batch_size // process_count
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # consecutive steps touch at most two epochs at a time
                self._perms.pop(min(self._perms))
            rng = np.random.default_rng([self.seed, epoch])
            n = self.dataset.num_windows
            self._perms[epoch] = rng.permutation(n).astype(np.uint32 if n < 2**32 else np.int64)
        return self._perms[epoch]

    def indices(self, step: int) -> np.ndarray:
        """Window indices [batch_size] of global batch ``step`` (all processes' rows)."""
        return self._rows(step, 0, self.batch_size)

    def local_indices(self, step: int) -> np.ndarray:
        """Window indices [local_batch_size] of this process's rows of batch ``step``."""
        start = self.process_index * self.local_batch_size
        return self._rows(step, start, start + self.local_batch_size)

    def _rows(self, step: int, start: int, stop: int) -> np.ndarray:
        if step < 0:
            msg = f"data: step is {step}; expected >= 0"
            raise DataError(msg)
        n = self.dataset.num_windows
        g = step * self.batch_size + np.arange(start, stop, dtype=np.int64)
        epochs, pos = np.divmod(g, n)
        out = np.empty(len(g), dtype=np.int64)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            out[sel] = self._perm(int(epoch))[pos[sel]]
        return out

    def batch(self, step: int) -> np.ndarray:
        """This process's rows of global batch ``step``: int32 tokens [local_batch_size, seq_len]."""
        return self.dataset.windows(self.local_indices(step))

    def __call__(self, step: int) -> np.ndarray:
        return self.batch(step)

    def iterate(self, start_step: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """``(step, batch(step))`` for step = start_step, start_step + 1, …"""
        step = start_step
        while True:
            yield step, self.batch(step)
            step += 1
