"""Sites, patterns, kinds, segments and the step's config checks."""

from __future__ import annotations

import pytest

from pd_train.config.pd import (
    ConfigError,
    DecompositionTarget,
    Faithfulness,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    check_pd_config,
)
from pd_train.decomposition import build_decomposition
from pd_train.losses.recon import chunkwise_plan, site_grid
from pd_train.models.llama_config import LlamaConfig, llama3_8b

MODEL = LlamaConfig(
    vocab_size=8,
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=32,
    num_attention_heads=2,
    num_key_value_heads=1,
)


def T(pattern: str, c: int = 4) -> DecompositionTarget:
    return DecompositionTarget(module_pattern=pattern, C=c)


def test_production_decomposition_has_224_sites_in_canonical_order() -> None:
    cs = {
        "q_proj": 2048,
        "k_proj": 2048,
        "v_proj": 4096,
        "o_proj": 4096,
        "gate_proj": 8192,
        "up_proj": 8192,
        "down_proj": 10240,
    }
    targets = [T(f"layers.*.*.{k}", c) for k, c in cs.items()]
    dec = build_decomposition(llama3_8b(), targets)
    sites = dec.sites
    assert len(sites) == 224
    assert [s.name for s in sites[:8]] == [
        "layers.0.self_attn.q_proj",
        "layers.0.self_attn.k_proj",
        "layers.0.self_attn.v_proj",
        "layers.0.self_attn.o_proj",
        "layers.0.mlp.gate_proj",
        "layers.0.mlp.up_proj",
        "layers.0.mlp.down_proj",
        "layers.1.self_attn.q_proj",
    ]
    assert sum(k.C for k in dec.kinds for _ in k.layers) == 1_245_184
    assert len(dec.segments) == 1 and dec.segments[0].size == 32
    plan = chunkwise_plan(dec, 56)
    assert plan.n_chunks == 4 and plan.is_uniform(dec)
    assert not chunkwise_plan(dec, 10).is_uniform(dec)


def test_character_classes_and_partial_kinds_make_segments() -> None:
    dec = build_decomposition(
        MODEL,
        [
            T("layers.2[4-9].self_attn.*"),
            T("layers.*.mlp.down_proj", 8),
            T("layers.3[01].mlp.up_proj"),
        ],
    )
    q = dec.kind("q_proj")
    assert q.layers == tuple(range(24, 30)) and q.C == 4
    assert dec.kind("down_proj").layers == tuple(range(32)) and dec.kind("down_proj").C == 8
    segs = [(s.start, s.stop, s.kinds, s.offsets) for s in dec.segments]
    attn = ("q_proj", "k_proj", "v_proj", "o_proj")
    assert segs == [
        (0, 24, ("down_proj",), (0,)),
        (24, 30, (*attn, "down_proj"), (0, 0, 0, 0, 24)),
        (30, 32, ("up_proj", "down_proj"), (0, 30)),
    ]
    grid = site_grid(dec)
    assert grid.shape == (32, 6)
    names = [s.name for s in dec.sites]
    assert names[grid[24, 0]] == "layers.24.self_attn.q_proj"
    assert grid[0, 0] == -1


def test_uncovered_layers_form_frozen_segments() -> None:
    dec = build_decomposition(MODEL, [T("layers.3.mlp.*")])
    assert [(s.start, s.stop, s.kinds) for s in dec.segments] == [
        (0, 3, ()),
        (3, 4, ("gate_proj", "up_proj", "down_proj")),
        (4, 32, ()),
    ]


def test_pattern_matching_nothing_names_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        build_decomposition(MODEL, [T("layers.*.mlp.down_proj"), T("layers.40.mlp.*")])
    text = str(err.value)
    assert "pd.decomposition_targets[1].module_pattern" in text
    assert "'layers.40.mlp.*' matches no site" in text and "layers 0..31" in text


def test_site_matching_two_patterns_names_both() -> None:
    with pytest.raises(ConfigError) as err:
        build_decomposition(MODEL, [T("layers.*.mlp.*"), T("layers.5.mlp.up_proj")])
    text = str(err.value)
    assert "pd.decomposition_targets[1].module_pattern" in text
    assert "layers.5.mlp.up_proj" in text and "pd.decomposition_targets[0]" in text


def test_one_kind_with_two_cs_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"decomposition_targets\[1\]\.C.*must share C"):
        build_decomposition(
            MODEL, [T("layers.[0-9].mlp.up_proj", 4), T("layers.1[0-9].mlp.up_proj", 8)]
        )


def _pd(**kw: object) -> PDConfig:
    base = dict(
        steps=10,
        decomposition_targets=(T("layers.*.mlp.up_proj"),),
        loss_metrics=(Faithfulness(coeff=1.0),),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
    )
    base.update(kw)
    return PDConfig(**base)  # type: ignore[arg-type]


def test_check_pd_config_duplicates_and_anneal_window() -> None:
    check_pd_config(_pd())
    bad = _pd(
        loss_metrics=(
            Faithfulness(coeff=1.0),
            ImportanceMinimality(coeff=1.0, anneal_start_frac=0.5, anneal_end_frac=0.2),
            Faithfulness(coeff=2.0),
        )
    )
    with pytest.raises(ConfigError) as err:
        check_pd_config(bad)
    text = str(err.value)
    assert "pd.loss_metrics[2].type" in text and "pd.loss_metrics[0]" in text
    assert "pd.loss_metrics[1].anneal_end_frac" in text
    with pytest.raises(ConfigError, match=r"pd.loss_metrics: is empty"):
        check_pd_config(_pd(loss_metrics=()))
