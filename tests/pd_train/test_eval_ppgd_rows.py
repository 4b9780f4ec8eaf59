"""The eval of persistent ``bsc`` sources draws a training row per eval row (as param-decomp),
shard-locally: on 8 simulated devices no program gathers the sources, each eval row's source is
one of the training rows its own device holds, and the draw follows the key; on one device the
draw is the numpy gather of ``randint(key, [B_eval], 0, B_train)``."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pd_sharding
from pd_train.evaluate import EVAL_ROWS_FOLD, eval_sources

N_DEV, B_TRAIN, B_EVAL, T = 8, 16, 32, 3
C = {"q_proj": 4, "down_proj": 6}
N_K = {"q_proj": 2, "down_proj": 1}


def _sources(layout: pd_sharding.Zero1Layout | None = None) -> dict[str, jax.Array]:
    """Row i of every training source holds i + 100·(kind number), over T and every channel, so
    an eval row's values name the training row it got."""
    out = {}
    for n, (kind, c) in enumerate(C.items()):
        rows = np.arange(B_TRAIN, dtype=np.float32) + 100.0 * n
        src = np.broadcast_to(rows[None, :, None, None], (N_K[kind], B_TRAIN, T, c + 1)).copy()
        if layout is None:
            out[kind] = jnp.asarray(src)
        else:
            out[kind] = jax.device_put(src, NamedSharding(layout.mesh, P(None, layout.data)))
    return out


def _layout() -> pd_sharding.Zero1Layout:
    mesh = pd_sharding.make_mesh(data=N_DEV, devices=jax.devices()[:N_DEV])
    return pd_sharding.Zero1Layout(mesh)


def _draw(layout: pd_sharding.Zero1Layout, sources: dict, key: jax.Array) -> dict:
    return jax.jit(lambda s, k: eval_sources(s, B_EVAL, key=k, layout=layout))(sources, key)


COLLECTIVES = re.compile(
    r"\b(all-gather|all-reduce|all-to-all|collective-permute|reduce-scatter)(-start)?\("
)


def _collectives(hlo: str) -> list[str]:
    """The lines of compiled HLO text that move data between devices."""
    return [line.strip() for line in hlo.splitlines() if COLLECTIVES.search(line)]


@pytest.mark.skipif(len(jax.devices()) < N_DEV, reason="needs 8 (simulated) devices")
def test_the_shard_local_draw_moves_no_sources_between_devices() -> None:
    layout = _layout()
    sources = _sources(layout)
    key = jax.random.key(0)
    fn = jax.jit(lambda s, k: eval_sources(s, B_EVAL, key=k, layout=layout))
    hlo = fn.lower(sources, key).compile().as_text()
    assert _collectives(hlo) == [], _collectives(hlo)

    # The check can fail: the global draw (the reverted form) moves the sources between
    # devices (here as an all-reduce of the full [n_k, B_eval, T, C + 1] rows; at production
    # XLA chose an all-gather of the sources).
    def global_draw(s: dict, k: jax.Array) -> dict:
        rows = jax.random.randint(k, (B_EVAL,), 0, B_TRAIN)
        return {kind: jnp.take(v, rows, axis=1) for kind, v in s.items()}

    moved = _collectives(jax.jit(global_draw).lower(sources, key).compile().as_text())
    assert moved, "the global draw moved nothing: the HLO check would not see a gather"


@pytest.mark.skipif(len(jax.devices()) < N_DEV, reason="needs 8 (simulated) devices")
def test_each_eval_row_gets_one_of_its_own_devices_training_rows() -> None:
    layout = _layout()
    sources = _sources(layout)
    out = _draw(layout, sources, jax.random.key(0))
    per_device_train, per_device_eval = B_TRAIN // N_DEV, B_EVAL // N_DEV
    q, down = np.asarray(out["q_proj"]), np.asarray(out["down_proj"])
    assert q.shape == (N_K["q_proj"], B_EVAL, T, C["q_proj"] + 1)
    assert out["q_proj"].sharding.spec == P(None, layout.data)  # sharded like the eval rows
    got = q[0, :, 0, 0].astype(int)
    assert np.all(q == got[None, :, None, None])  # whole training rows, every layer
    np.testing.assert_array_equal(down[0, :, 0, 0], got + 100.0)  # one draw for every kind
    # Eval row j sits on device j // per_device_eval, which holds training rows
    # [d·per_device_train, (d + 1)·per_device_train).
    device = np.arange(B_EVAL) // per_device_eval
    assert np.all(got // per_device_train == device), got
    # It is a draw: not the identity, and both local rows appear somewhere.
    local = got % per_device_train
    assert set(local) == set(range(per_device_train))
    # Each device's eval rows hold the rows its own shard of the output holds.
    for shard in out["q_proj"].addressable_shards:
        rows = np.asarray(shard.data)[0, :, 0, 0].astype(int)
        first_eval = shard.index[1].start
        assert np.all(rows // per_device_train == first_eval // per_device_eval)


@pytest.mark.skipif(len(jax.devices()) < N_DEV, reason="needs 8 (simulated) devices")
def test_the_draw_follows_the_key() -> None:
    layout = _layout()
    sources = _sources(layout)
    a = np.asarray(_draw(layout, sources, jax.random.key(0))["q_proj"])[0, :, 0, 0]
    b = np.asarray(_draw(layout, sources, jax.random.key(1))["q_proj"])[0, :, 0, 0]
    again = np.asarray(_draw(layout, sources, jax.random.key(0))["q_proj"])[0, :, 0, 0]
    np.testing.assert_array_equal(a, again)
    assert not np.array_equal(a, b)


def test_one_device_is_the_numpy_gather_of_the_drawn_rows() -> None:
    """One device (no layout, or a one-device mesh): row numbers randint(key, [B_eval], 0,
    B_train), and the eval sources are src[:, rows] for every kind."""
    key = jax.random.fold_in(jax.random.key(3), EVAL_ROWS_FOLD)
    rows = np.asarray(jax.random.randint(key, (B_EVAL,), 0, B_TRAIN))
    src = {k: np.asarray(v) for k, v in _sources().items()}
    mesh = pd_sharding.make_mesh(data=1, devices=jax.devices()[:1])
    for layout in (None, pd_sharding.Zero1Layout(mesh)):
        sources = _sources(layout)
        out = jax.jit(lambda s, k, layout=layout: eval_sources(s, B_EVAL, key=k, layout=layout))(
            sources, key
        )
        for kind, want in src.items():
            np.testing.assert_array_equal(np.asarray(out[kind]), want[:, rows], err_msg=kind)
    # Shared (sc) sources [n_k, 1, T, C + 1] pass unchanged.
    shared = {"q_proj": jnp.asarray(src["q_proj"][:, :1])}
    assert eval_sources(shared, B_EVAL, key=key)["q_proj"].shape == (2, 1, T, C["q_proj"] + 1)


def _full_source_moves(hlo: str, n_k: dict[str, int], t: int, c: dict[str, int]) -> list[str]:
    """Collective lines whose result holds rows of persistent sources: a shape ending in
    [T, C + 1] of a decomposed kind (nothing else in the eval program ends so)."""
    tails = {(t, c_k + 1) for c_k in c.values()}
    moved = []
    for line in _collectives(hlo):
        result = line.split("=", 1)[1].split("all-")[0].split("collective-")[0]
        for dims in re.findall(r"\[([\d,]+)\]", result):
            shape = tuple(int(d) for d in dims.split(","))
            if len(shape) >= 2 and shape[-2:] in tails:
                moved.append(line)
    return moved


@pytest.mark.slow
@pytest.mark.skipif(len(jax.devices()) < N_DEV, reason="needs 8 (simulated) devices")
def test_the_compiled_eval_program_gathers_no_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """The eval jit of a persistent-PGD (bsc) trainer on 8 devices: no collective carries rows
    of the sources; with the global draw (no layout) one does."""
    import attrs

    from pd_train import evaluate
    from pd_train.config.pd import MLPCI, DecompositionTarget
    from pd_train.train import Trainer

    from ._pgd import T as SEQ
    from ._pgd import _pd
    from ._tiny import FAST, TINY

    pd = attrs.evolve(
        _pd(),
        batch_size=B_TRAIN,
        decomposition_targets=(  # every array's sharded dim a multiple of 8
            DecompositionTarget(module_pattern="layers.*.self_attn.q_proj", C=8),
            DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=16),
        ),
        ci=MLPCI(hidden_dims=(8,)),
    )
    mesh = pd_sharding.make_mesh(data=N_DEV, devices=jax.devices()[:N_DEV])
    trainer = Trainer(TINY, pd, mesh=mesh, compiler_options=FAST, seq_len=SEQ)
    c = {k.kind: k.C for k in trainer.decomposition.kinds}
    n_k = {k.kind: len(k.layers) for k in trainer.decomposition.kinds}

    def hlo() -> str:
        return evaluate.lower_eval(trainer, batch_size=B_TRAIN, seq_len=SEQ).compile().as_text()

    assert _full_source_moves(hlo(), n_k, SEQ, c) == []
    local = evaluate.eval_sources
    monkeypatch.setattr(
        evaluate,
        "eval_sources",
        lambda sources, batch_size, *, key, layout=None: local(sources, batch_size, key=key),
    )
    assert _full_source_moves(hlo(), n_k, SEQ, c) != []
