"""Real orbax checkpoints: two items, last N kept, restore onto another device count."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pd_train.run.checkpoints import CheckpointError, Checkpoints, abstract_like


def _mesh(n: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:n]), ("data",))


def _trees(n_devices: int, scale: float) -> tuple[dict, dict]:
    sharding = NamedSharding(_mesh(n_devices), P(None, "data"))
    v = jax.device_put(jnp.arange(2 * 16, dtype=jnp.float32).reshape(2, 16) * scale, sharding)
    decomposition = {"V": {"q_proj": v}}
    training = {
        "step": jnp.asarray(int(scale), jnp.int32),
        "key": jax.random.key_data(jax.random.key(int(scale))),
        "mu": {"q_proj": v + 1},
    }
    return decomposition, training


def test_keeps_last_n_and_restores_latest(tmp_path) -> None:
    with Checkpoints(tmp_path / "ckpt", keep_last_n=2) as ckpts:
        for step in (1, 2, 3):
            decomposition, training = _trees(8, float(step))
            ckpts.save(step, decomposition=decomposition, training=training)
        assert ckpts.steps() == [2, 3]
        dec, train, step = ckpts.restore(
            decomposition=abstract_like(decomposition), training=abstract_like(training)
        )
    assert step == 3
    np.testing.assert_array_equal(dec["V"]["q_proj"], decomposition["V"]["q_proj"])
    np.testing.assert_array_equal(train["key"], training["key"])
    assert int(train["step"]) == 3


def test_restores_onto_a_different_device_count(tmp_path) -> None:
    decomposition, training = _trees(8, 2.0)
    with Checkpoints(tmp_path / "ckpt") as ckpts:
        ckpts.save(5, decomposition=decomposition, training=training)
    target_sharding = NamedSharding(_mesh(2), P(None, "data"))
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=target_sharding),
        decomposition,
    )
    with Checkpoints(tmp_path / "ckpt") as ckpts:
        dec, _, _ = ckpts.restore(decomposition=target, training=abstract_like(training))
    restored = dec["V"]["q_proj"]
    assert restored.sharding == target_sharding
    np.testing.assert_array_equal(restored, decomposition["V"]["q_proj"])


def test_restore_without_checkpoint_is_a_clear_error(tmp_path) -> None:
    with (
        Checkpoints(tmp_path / "empty") as ckpts,
        pytest.raises(CheckpointError, match="nothing to resume"),
    ):
        ckpts.restore(decomposition={}, training={})


def test_keep_last_n_must_be_positive(tmp_path) -> None:
    with pytest.raises(ValueError, match="keep_last_n must be >= 1, got 0"):
        Checkpoints(tmp_path / "c", keep_last_n=0)
    assert not (tmp_path / "c").exists()


def test_the_run_removes_partial_saves_an_earlier_attempt_left_and_a_reader_does_not(
    tmp_path,
) -> None:
    """A failed save's late writes can recreate its temporary directory after that run removed
    it; the next attempt (the writer) removes it when it opens the checkpoints, while a reader
    (``pd-train analyze`` of a live run) never touches a save in progress."""
    import time

    directory = tmp_path / "checkpoints"
    (directory / "8.orbax-checkpoint-tmp").mkdir(parents=True)
    (directory / "8.orbax-checkpoint-tmp" / "part").write_text("x")

    def left_after(checkpoints: Checkpoints, wait: float) -> list[str]:
        """What is left once orbax's start-up cleanup (a thread; a save waits for it) ran."""
        assert checkpoints.steps() == []
        deadline = time.monotonic() + wait
        while list(directory.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        checkpoints.close()
        return [p.name for p in directory.iterdir()]

    assert left_after(Checkpoints(directory), wait=2) == ["8.orbax-checkpoint-tmp"]
    assert left_after(Checkpoints(directory, writer=True), wait=30) == []


def test_partial_saves_are_removed_until_none_reappears(tmp_path) -> None:
    """A thread recreates the partial save twice after the first removal (as a failed save's
    queued tensorstore writes do once its removal frees the inodes): one pass would leave it,
    the removal that waits for a quiet spell leaves nothing."""
    import threading
    import time

    from pd_train.run._checkpointing import partial_saves, remove_partial_saves_until_quiet

    directory = tmp_path / "checkpoints"
    partial = directory / "8.orbax-checkpoint-tmp"
    partial.mkdir(parents=True)
    recreated = []

    def late_writes() -> None:
        for _ in range(2):
            time.sleep(0.15)
            (partial / "d").mkdir(parents=True, exist_ok=True)
            recreated.append(time.monotonic())

    writer = threading.Thread(target=late_writes)
    writer.start()
    remove_partial_saves_until_quiet(directory, quiet=0.5, limit=5.0)
    writer.join()
    assert len(recreated) == 2
    assert partial_saves(directory) == []
