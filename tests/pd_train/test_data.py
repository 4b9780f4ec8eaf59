"""Token files → fixed windows → a batch stream that depends only on (seed, step)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pd_train.run.data import Batches, DataError, TokenDataset

SEQ = 8


def write_shards(root, lengths, *, dtype="uint16", kind="npy", start=0):
    """Shards whose token k (counting across shards) is ``start + k``, so every window says
    where it came from."""
    root.mkdir(parents=True, exist_ok=True)
    offset = start
    for i, n in enumerate(lengths):
        tokens = np.arange(offset, offset + n).astype(dtype)
        if kind == "npy":
            np.save(root / f"shard_{i:03d}.npy", tokens)
        else:
            tokens.tofile(root / f"shard_{i:03d}.bin")
        offset += n
    return root


def test_windows_come_from_files_and_skip_tails(tmp_path):
    # 21 tokens -> 2 windows (5 left over), 8 -> 1, 30 -> 3.
    root = write_shards(tmp_path / "d", [21, 8, 30])
    ds = TokenDataset(root, seq_len=SEQ)
    assert ds.num_windows == 6 and len(ds) == 6
    assert ds.num_tokens == 59
    got = ds.windows(np.arange(6))
    assert got.dtype == np.int32 and got.shape == (6, SEQ)
    starts = [0, 8, 21, 29, 37, 45]  # windows never cross a file boundary
    np.testing.assert_array_equal(got, [np.arange(s, s + SEQ) for s in starts])


@pytest.mark.parametrize(
    ("kind", "dtype"), [("npy", "uint16"), ("bin", "uint16"), ("bin", "uint32")]
)
def test_single_file_of_each_format(tmp_path, kind, dtype):
    write_shards(tmp_path, [40], dtype=dtype, kind=kind, start=70_000 if dtype == "uint32" else 0)
    file = next(tmp_path.iterdir())
    ds = TokenDataset(file, seq_len=SEQ, dtype=dtype if kind == "bin" else None)
    assert ds.num_windows == 5
    base = 70_000 if dtype == "uint32" else 0
    np.testing.assert_array_equal(ds.windows([4]), [np.arange(base + 32, base + 40)])


def test_stream_is_a_function_of_seed_and_step(tmp_path):
    ds = TokenDataset(write_shards(tmp_path / "d", [100, 57, 80]), seq_len=SEQ)
    a = Batches(ds, batch_size=4, seed=3, process_index=0, process_count=1)
    b = Batches(ds, batch_size=4, seed=3, process_index=0, process_count=1)
    steps = [0, 1, 7, 30, 2, 0]  # any order, repeated: same answers
    for s in steps:
        np.testing.assert_array_equal(a.batch(s), b.batch(s))
    other = Batches(ds, batch_size=4, seed=4, process_index=0, process_count=1)
    assert any(not np.array_equal(a.batch(s), other.batch(s)) for s in range(5))


def test_each_epoch_visits_every_window_once_in_a_new_order(tmp_path):
    ds = TokenDataset(write_shards(tmp_path / "d", [96, 64]), seq_len=SEQ)  # 20 windows
    stream = Batches(ds, batch_size=5, seed=0, process_index=0, process_count=1)
    epoch0 = np.concatenate([stream.indices(s) for s in range(4)])
    epoch1 = np.concatenate([stream.indices(s) for s in range(4, 8)])
    assert sorted(epoch0) == list(range(20)) and sorted(epoch1) == list(range(20))
    assert not np.array_equal(epoch0, epoch1)
    # A batch may straddle epochs when batch_size does not divide the window count.
    odd = Batches(ds, batch_size=6, seed=0, process_index=0, process_count=1)
    first = np.concatenate([odd.indices(s) for s in range(3)])  # 18 of epoch 0
    straddle = odd.indices(3)  # 2 of epoch 0, 4 of epoch 1
    assert sorted(np.concatenate([first, straddle[:2]])) == list(range(20))


def test_resume_continues_the_exact_stream(tmp_path):
    ds = TokenDataset(write_shards(tmp_path / "d", [123, 77, 200]), seq_len=SEQ)
    continuing = Batches(ds, batch_size=6, seed=11, process_index=0, process_count=1)
    uninterrupted = [b for _, b in itertools.islice(continuing.iterate(), 40)]
    # A "restarted" run: a fresh dataset and loader, starting at step 25.
    fresh = Batches(
        TokenDataset(tmp_path / "d", seq_len=SEQ),
        batch_size=6,
        seed=11,
        process_index=0,
        process_count=1,
    )
    resumed = list(itertools.islice(fresh.iterate(25), 15))
    assert [s for s, _ in resumed] == list(range(25, 40))
    for k, (_, batch) in enumerate(resumed):
        np.testing.assert_array_equal(batch, uninterrupted[25 + k])


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_rows_partition_the_global_batch(tmp_path, process_count):
    ds = TokenDataset(write_shards(tmp_path / "d", [300, 211]), seq_len=SEQ)
    whole = Batches(ds, batch_size=8, seed=5, process_index=0, process_count=1)
    parts = [
        Batches(ds, batch_size=8, seed=5, process_index=p, process_count=process_count)
        for p in range(process_count)
    ]
    for step in (0, 3, 9):
        local = [p.batch(step) for p in parts]
        assert all(b.shape == (8 // process_count, SEQ) for b in local)
        np.testing.assert_array_equal(np.concatenate(local), whole.batch(step))


def test_a_process_reads_only_its_rows(tmp_path, monkeypatch):
    ds = TokenDataset(write_shards(tmp_path / "d", [400]), seq_len=SEQ)
    stream = Batches(ds, batch_size=8, seed=0, process_index=1, process_count=4)
    asked: list[np.ndarray] = []
    real = ds.windows

    def recording(indices):
        asked.append(np.asarray(indices))
        return real(indices)

    monkeypatch.setattr(ds, "windows", recording)
    stream.batch(2)
    assert len(asked) == 1 and len(asked[0]) == 2
    np.testing.assert_array_equal(asked[0], stream.indices(2)[2:4])


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        TokenDataset(tmp_path / "missing.npy", seq_len=SEQ)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"holds no \.npy or \.bin token files"):
        TokenDataset(tmp_path / "empty", seq_len=SEQ)
    np.save(tmp_path / "floats.npy", np.zeros(64, np.float32))
    with pytest.raises(DataError, match=r"floats\.npy holds float32 tokens; expected one of"):
        TokenDataset(tmp_path / "floats.npy", seq_len=SEQ)
    np.save(tmp_path / "u32.npy", np.zeros(64, np.uint32))
    with pytest.raises(DataError, match=r"holds uint32 tokens but data\.dtype is 'uint16'"):
        TokenDataset(tmp_path / "u32.npy", seq_len=SEQ, dtype="uint16")
    np.save(tmp_path / "grid.npy", np.zeros((4, 16), np.uint16))
    with pytest.raises(DataError, match=r"shape \[4, 16\]; expected 1-D"):
        TokenDataset(tmp_path / "grid.npy", seq_len=SEQ)
    np.zeros(64, np.uint16).tofile(tmp_path / "raw.bin")
    with pytest.raises(DataError, match=r"raw \.bin file; set dtype"):
        TokenDataset(tmp_path / "raw.bin", seq_len=SEQ)
    with pytest.raises(DataError, match=r"dtype is 'float16'; expected one of"):
        TokenDataset(tmp_path / "raw.bin", seq_len=SEQ, dtype="float16")
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 7)
    with pytest.raises(DataError, match=r"7 bytes, not a whole number of uint32 tokens"):
        TokenDataset(tmp_path / "odd.bin", seq_len=SEQ, dtype="uint32")
    write_shards(tmp_path / "short", [64, 5])
    with pytest.raises(DataError, match=r"shard_001\.npy holds 5 tokens, fewer than one window"):
        TokenDataset(tmp_path / "short", seq_len=SEQ)
    (tmp_path / "tokens.txt").write_text("1 2 3")
    with pytest.raises(DataError, match=r"suffix '\.txt'"):
        TokenDataset(tmp_path / "tokens.txt", seq_len=SEQ)
    with pytest.raises(DataError, match="seq_len is 0"):
        TokenDataset(tmp_path / "u32.npy", seq_len=0)


def test_loader_errors(tmp_path):
    ds = TokenDataset(write_shards(tmp_path / "d", [64]), seq_len=SEQ)
    with pytest.raises(DataError, match=r"batch_size 6 does not divide evenly over 4 processes"):
        Batches(ds, batch_size=6, seed=0, process_index=0, process_count=4)
    with pytest.raises(DataError, match=r"process_index 4 is outside \[0, process_count=4\)"):
        Batches(ds, batch_size=8, seed=0, process_index=4, process_count=4)
    with pytest.raises(DataError, match="seed is -1"):
        Batches(ds, batch_size=8, seed=-1, process_index=0, process_count=1)
    with pytest.raises(DataError, match="batch_size is 0"):
        Batches(ds, batch_size=0, seed=0, process_index=0, process_count=1)


def test_vocab_check_names_file_and_token(tmp_path):
    """Checked when the dataset is made (at validation), not when a window is read."""
    root = write_shards(tmp_path / "d", [16, 16], start=100)  # tokens 100..131
    TokenDataset(root, seq_len=SEQ, vocab_size=132)  # all below 132
    with pytest.raises(DataError) as e:
        TokenDataset(root, seq_len=SEQ, vocab_size=120)
    message = str(e.value)
    assert (
        "shard_001.npy holds token ids up to 131 (the first bad one, 120, at position 4)" in message
    )
    assert "vocab_size is 120, so ids must be in [0, 120)" in message
    negative = tmp_path / "neg.npy"
    np.save(negative, np.array([3, 1, -2, 5] * 4, dtype=np.int32))
    with pytest.raises(
        DataError, match=r"token ids down to -2 \(the first bad one, -2, at position 2\)"
    ):
        TokenDataset(negative, seq_len=SEQ, vocab_size=120)


def test_token_range_is_one_pass_per_file_until_the_file_changes(tmp_path):
    """The range is remembered by the file's stat: a second dataset over the same file reads
    nothing, while a rewritten file (new size, mtime or inode) is read again."""
    from pd_train.run import data

    path = tmp_path / "t.npy"
    np.save(path, np.arange(40, dtype=np.uint16))
    TokenDataset(path, seq_len=SEQ, vocab_size=64)
    cached = {k: v for k, v in data._TOKEN_RANGES.items() if k[0] == str(path.resolve())}
    assert list(cached.values()) == [(0, 39)]
    # Same key, other remembered value: a second dataset trusts the cache (no second pass).
    key = next(iter(cached))
    data._TOKEN_RANGES[key] = (0, 99)
    with pytest.raises(DataError, match="up to 99"):
        TokenDataset(path, seq_len=SEQ, vocab_size=64)
    data._TOKEN_RANGES[key] = (0, 39)
    np.save(path, np.arange(41, dtype=np.uint16) + 30)  # rewritten: 30..70
    with pytest.raises(DataError, match="up to 70"):
        TokenDataset(path, seq_len=SEQ, vocab_size=64)


def test_defaults_use_jax_process_layout(tmp_path):
    ds = TokenDataset(write_shards(tmp_path / "d", [64]), seq_len=SEQ)
    stream = Batches(ds, batch_size=4, seed=0)
    assert (stream.process_index, stream.process_count, stream.local_batch_size) == (0, 1, 4)
