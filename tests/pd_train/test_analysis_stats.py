"""Component statistics and the harvest's running top-k, against hand computations and a
brute-force numpy reference on the same CI values (no model: CI tensors are given)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pd_sharding
from pd_train.analysis import (
    EvalComponentStats,
    component_counts,
    grouped_l0,
    harvest_update,
    init_harvest_state,
    l0_groups,
    load_vocabulary,
    resolve_l0_groups,
)
from pd_train.config.io import ConfigError
from pd_train.config.pd import DecompositionTarget
from pd_train.decomposition import build_decomposition

from ._tiny import TINY

MODEL = TINY
DEC = build_decomposition(
    MODEL,
    [
        DecompositionTarget(module_pattern="layers.*.self_attn.q_proj", C=3),
        DecompositionTarget(module_pattern="layers.1.mlp.down_proj", C=5),
    ],
)


def test_density_and_mean_ci_by_hand() -> None:
    # One site, B=2, T=3, C=2.
    ci = np.array(
        [
            [[0.0, 1.0], [0.3, 0.2], [0.25, 0.9]],
            [[0.5, 0.0], [0.26, 0.0], [1.0, 0.1]],
        ],
        np.float32,
    )[None]
    counts = jax.device_get(component_counts({"q_proj": jnp.asarray(ci)}, 0.25))
    # Component 0: values 0, .3, .25, .5, .26, 1 → above .25: .3, .5, .26, 1 (.25 is not >).
    # Component 1: 1, .2, .9, 0, 0, .1 → above .25: 1, .9.
    np.testing.assert_array_equal(counts["active"]["q_proj"], [[4, 2]])
    np.testing.assert_allclose(counts["ci_sum"]["q_proj"], [[2.31, 2.2]], rtol=1e-6)
    # density = active / 6 tokens, mean CI = ci_sum / 6.
    assert counts["active"]["q_proj"].dtype == np.int32


def test_l0_groups_per_layer_kind_and_total() -> None:
    groups = l0_groups(DEC.sites)
    assert groups == {
        "layer.0": ["layers.0.self_attn.q_proj"],
        "layer.1": ["layers.1.self_attn.q_proj", "layers.1.mlp.down_proj"],
        "kind.q_proj": ["layers.0.self_attn.q_proj", "layers.1.self_attn.q_proj"],
        "kind.down_proj": ["layers.1.mlp.down_proj"],
        "total": [s.name for s in DEC.sites],
    }
    site_l0 = {
        "layers.0.self_attn.q_proj": 1.5,
        "layers.1.self_attn.q_proj": 2.0,
        "layers.1.mlp.down_proj": 0.25,
    }
    assert grouped_l0(site_l0, groups) == {
        "layer.0": 1.5,
        "layer.1": 2.25,
        "kind.q_proj": 3.5,
        "kind.down_proj": 0.25,
        "total": 3.75,
    }


def _reference(cis: list[np.ndarray], threshold: float, top_k: int, window: int) -> dict:
    """Brute force over all batches of one kind: cis[i] [n, B, T, C]."""
    all_ci = np.stack(cis)  # [N, n, B, T, C]
    n_batches, n, rows, length, c = all_ci.shape
    out = {
        "active": (all_ci > threshold).sum(axis=(0, 2, 3)),
        "ci_sum": all_ci.astype(np.float64).sum(axis=(0, 2, 3)),
        "top_ci": np.full((n, c, top_k), -np.inf),
        "top_where": np.full((n, c, top_k, 3), -1),
        "top_window": np.full((n, c, top_k, 2 * window + 1), np.nan),
    }
    b, r, t = np.meshgrid(np.arange(n_batches), np.arange(rows), np.arange(length), indexing="ij")
    b, r, t = b.ravel(), r.ravel(), t.ravel()
    for s in range(n):
        for comp in range(c):
            values = all_ci[b, s, r, t, comp]
            # Sort by (-value, batch, row, position): np.lexsort sorts by the last key first.
            order = np.lexsort((t, r, b, -values))[:top_k]
            for k, i in enumerate(order):
                out["top_ci"][s, comp, k] = values[i]
                out["top_where"][s, comp, k] = (b[i], r[i], t[i])
                for j, o in enumerate(range(-window, window + 1)):
                    if 0 <= t[i] + o < length:
                        out["top_window"][s, comp, k, j] = all_ci[b[i], s, r[i], t[i] + o, comp]
    return out


@pytest.mark.parametrize(("rows", "length", "top_k", "window"), [(8, 6, 4, 2), (8, 2, 20, 1)])
def test_harvest_top_k_matches_brute_force(rows: int, length: int, top_k: int, window: int) -> None:
    """Sharded over 8 devices along the batch, 3 batches, CI values with many exact ties (as
    ci_lower has at 0 and 1); the second case has fewer positions per batch than K."""
    mesh = pd_sharding.make_mesh(data=8)  # Auto axes, as runs use
    batch_sharding = NamedSharding(mesh, P(None, ("replicate", "data")))
    replicated = NamedSharding(mesh, P())
    threshold = 0.25
    rng = np.random.default_rng(0)
    cis: dict[str, list[np.ndarray]] = {layout.kind: [] for layout in DEC.kinds}
    state = init_harvest_state(DEC, top_k=top_k, window=window, sharding=replicated)
    update = jax.jit(
        functools.partial(harvest_update, threshold=threshold, top_k=top_k, window=window),
        out_shardings=replicated,
    )
    for i in range(3):
        batch = {}
        for layout in DEC.kinds:
            shape = (len(layout.layers), rows, length, layout.C)
            ci = (rng.integers(0, 5, shape) / 4).astype(np.float32)  # 0, .25, .5, .75, 1
            cis[layout.kind].append(ci)
            batch[layout.kind] = jax.device_put(ci, batch_sharding)
        state = update(state, batch, jax.device_put(np.int32(i), replicated))
    host = jax.device_get(state)
    for kind, ref in ((k, _reference(v, threshold, top_k, window)) for k, v in cis.items()):
        got = host[kind]
        np.testing.assert_array_equal(got["active"], ref["active"])
        np.testing.assert_allclose(got["ci_sum"], ref["ci_sum"], rtol=1e-6)
        np.testing.assert_array_equal(got["top_ci"], ref["top_ci"])
        np.testing.assert_array_equal(got["top_where"], ref["top_where"])
        np.testing.assert_array_equal(got["top_window"], ref["top_window"])


def test_eval_component_stats_record_by_hand() -> None:
    """Two eval batches of 6 tokens each: densities, mean CI, alive counts and L0 groups."""
    stats = EvalComponentStats(DEC)
    q = {"active": np.array([[3, 0, 1], [6, 6, 0]]), "ci_sum": np.array([[1.5, 0, 0.5], [6, 3, 0]])}
    down = {"active": np.array([[0, 1, 2, 3, 0]]), "ci_sum": np.array([[0, 0.5, 1, 1.5, 0.25]])}
    for _ in range(2):
        stats.add(
            {
                "active": {"q_proj": q["active"], "down_proj": down["active"]},
                "ci_sum": {"q_proj": q["ci_sum"], "down_proj": down["ci_sum"]},
            },
            n_tokens=6,
        )
    record = stats.record()
    np.testing.assert_allclose(record["density/layers.0.self_attn.q_proj"], [0.5, 0, 1 / 6])
    np.testing.assert_allclose(record["ci_mean/layers.1.self_attn.q_proj"], [1.0, 0.5, 0])
    np.testing.assert_allclose(record["density/layers.1.mlp.down_proj"], [0, 1 / 6, 1 / 3, 0.5, 0])
    assert record["alive/layers.0.self_attn.q_proj"] == 2
    assert record["alive/layers.1.self_attn.q_proj"] == 2
    assert record["alive/layers.1.mlp.down_proj"] == 3
    # L0 of a site = Σ_c density: q0 = 2/3, q1 = 2, down1 = 1.
    assert record["l0_group/layer.0"] == pytest.approx(2 / 3)
    assert record["l0_group/layer.1"] == pytest.approx(3.0)
    assert record["l0_group/kind.q_proj"] == pytest.approx(8 / 3)
    assert record["l0_group/kind.down_proj"] == pytest.approx(1.0)
    assert record["l0_group/total"] == pytest.approx(11 / 3)


def test_configured_l0_groups_match_site_patterns() -> None:
    """``pd.l0_groups``: members in canonical order, overlapping patterns counted once; the
    record has exactly the configured groups; None keeps the defaults."""
    groups = resolve_l0_groups(
        {"attn": ["layers.*.self_attn.*"], "late": ["layers.1.*", "layers.1.mlp.down_proj"]},
        DEC.sites,
    )
    assert groups == {
        "attn": ["layers.0.self_attn.q_proj", "layers.1.self_attn.q_proj"],
        "late": ["layers.1.self_attn.q_proj", "layers.1.mlp.down_proj"],
    }
    assert resolve_l0_groups(None, DEC.sites) == l0_groups(DEC.sites)
    stats = EvalComponentStats(DEC, {"late": ["layers.1.*"]})
    stats.add(
        {
            "active": {"q_proj": np.array([[1, 0, 0], [2, 1, 0]]), "down_proj": np.ones((1, 5))},
            "ci_sum": {"q_proj": np.zeros((2, 3)), "down_proj": np.zeros((1, 5))},
        },
        n_tokens=2,
    )
    record = stats.record()
    assert [k for k in record if k.startswith("l0_group/")] == ["l0_group/late"]
    assert record["l0_group/late"] == pytest.approx(1.5 + 2.5)


def test_configured_l0_groups_errors_name_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_l0_groups(
            {"mlp": ["layers.*.mlp.up_proj", "layers.1.mlp.*"], "a/b": ["*"], "none": []},
            DEC.sites,
        )
    text = str(info.value)
    assert "pd.l0_groups.mlp[0]: 'layers.*.mlp.up_proj' matches no decomposed site" in text
    assert "pd.l0_groups.mlp[1]" not in text  # that one matches layers.1.mlp.down_proj
    assert "pd.l0_groups.a/b: group name 'a/b'" in text
    assert "pd.l0_groups.none: is empty" in text


def test_vocabulary_from_a_checkpoint_directory(tmp_path: Path) -> None:
    from pd_train.assets import tiny_llama_path, tiny_vocab

    tiny = load_vocabulary(tiny_llama_path())
    assert tiny is not None and tiny.tokens == list(tiny_vocab())
    assert tiny.join([tiny.token(0), tiny.token(10)]) == "<bos> the"
    assert tiny.token(10_000) == "#10000"
    assert load_vocabulary(tmp_path) is None  # random-weight targets, no files
    (tmp_path / "tokenizer.json").write_text(
        json.dumps(
            {
                "model": {"vocab": {"Ġthe": 0, "cat": 1, "Ċ": 3}},
                "added_tokens": [{"id": 4, "content": "<|end|>"}],
            }
        )
    )
    bpe = load_vocabulary(tmp_path)
    assert bpe is not None
    assert [bpe.token(i) for i in range(5)] == [" the", "cat", "#2", "\n", "<|end|>"]
    assert bpe.join([bpe.token(0), bpe.token(1)]) == " thecat"
    (tmp_path / "vocab.json").write_text('{"a": "b"}')
    with pytest.raises(ValueError, match=r"vocab\.json: expected a list of tokens"):
        load_vocabulary(tmp_path)
