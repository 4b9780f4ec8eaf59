"""pd-train's GPT-2, Qwen2 and Qwen3 forwards against transformers on the same weights, and their
loaders' refusals.

The fixtures under ``fixtures/{gpt2,gpt2_bare,qwen2,qwen3}/`` (a Hugging Face checkpoint plus input
ids and the logits transformers computed in fp32 and fp64) are written once by
``scripts/make_hf_families.py``; torch and transformers are not needed here.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from pd_train.models import gpt2, llama
from pd_train.models.hf import (
    CheckpointError,
    HFConfigError,
    gpt2_config_from_hf,
    load_gpt2_checkpoint,
    load_llama_checkpoint,
    load_qwen2_checkpoint,
    load_qwen3_checkpoint,
    qwen2_config_from_hf,
    qwen3_config_from_hf,
    read_hf_config,
)

FIXTURES = Path(__file__).parent / "fixtures"
ATOL = 1e-4
LOADERS = {
    "gpt2": (load_gpt2_checkpoint, gpt2.forward),
    "gpt2_bare": (load_gpt2_checkpoint, gpt2.forward),
    "qwen2": (load_qwen2_checkpoint, llama.forward),
    "qwen3": (load_qwen3_checkpoint, llama.forward),
}


def load_case(name: str):
    loader, forward = LOADERS[name]
    config, params = loader(FIXTURES / name)
    ref = np.load(FIXTURES / name / "reference.npz")
    return config, params, forward, ref


@pytest.mark.parametrize("name", sorted(LOADERS))
def test_logits_match_transformers(name):
    config, params, forward, ref = load_case(name)
    got = np.asarray(jax.jit(forward, static_argnums=2)(params, ref["input_ids"], config))
    assert got.shape == ref["logits"].shape
    err = np.abs(got - ref["logits"]).max()
    err64 = np.abs(got - ref["logits_fp64"]).max()
    assert err < ATOL, f"{name}: max |pd - transformers fp32| = {err:.3e}"
    assert err64 < ATOL, f"{name}: max |pd - transformers fp64| = {err64:.3e}"


def test_fixtures_cover_what_they_claim():
    modern, bare = read_hf_config(FIXTURES / "gpt2"), read_hf_config(FIXTURES / "gpt2_bare")
    assert "n_embd" in modern and "hidden_size" not in modern
    assert "hidden_size" in bare and "n_embd" not in bare and "torch_dtype" in bare
    assert any(k.startswith("transformer.") for k in load_file(FIXTURES / "gpt2/model.safetensors"))
    bare_names = set(load_file(FIXTURES / "gpt2_bare/model.safetensors"))
    assert "h.0.attn.bias" in bare_names and not any(
        k.startswith("transformer.") for k in bare_names
    )
    g, gp, *_ = load_case("gpt2")
    assert g.tie_word_embeddings and "lm_head" not in gp
    gb, gbp, *_ = load_case("gpt2_bare")
    assert not gb.tie_word_embeddings and "lm_head" in gbp and gb.inner == 48

    q2 = read_hf_config(FIXTURES / "qwen2")
    assert "rope_theta" in q2 and "rope_parameters" not in q2  # the legacy dialect
    q3 = read_hf_config(FIXTURES / "qwen3")
    assert "rope_parameters" in q3 and "rope_theta" not in q3  # the transformers-5 dialect
    c2, p2, *_ = load_case("qwen2")
    assert c2.qkv_bias and not c2.qk_norm and "q_bias" in p2["layers"]
    assert c2.num_key_value_heads < c2.num_attention_heads and "lm_head" in p2
    assert np.abs(np.asarray(p2["layers"]["v_bias"])).min() > 0  # drawn, not zeros
    c3, p3, *_ = load_case("qwen3")
    assert c3.qk_norm and not c3.qkv_bias and c3.tie_word_embeddings
    assert c3.num_attention_heads * c3.resolved_head_dim != c3.hidden_size
    assert not np.allclose(np.asarray(p3["layers"]["q_norm"]), 1.0)


def test_gpt2_split_sites_are_the_fused_columns():
    """q/k/v are exactly c_attn's column blocks (the split changes no value)."""
    _, params = load_gpt2_checkpoint(FIXTURES / "gpt2")
    raw = load_file(FIXTURES / "gpt2/model.safetensors")
    w, b = raw["transformer.h.1.attn.c_attn.weight"], raw["transformer.h.1.attn.c_attn.bias"]
    d = w.shape[0]
    for j, k in enumerate("qkv"):
        np.testing.assert_array_equal(
            np.asarray(params["layers"][f"{k}_proj"][1]), w[:, j * d : (j + 1) * d]
        )
        np.testing.assert_array_equal(
            np.asarray(params["layers"][f"{k}_bias"][1]), b[j * d : (j + 1) * d]
        )


# ------------------------------------------------------------------------------------ refusals


def _copy(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(FIXTURES / name, out)
    return out


def _edit_tensors(path: Path, edit) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def _edit_config(path: Path, **changes) -> None:
    d = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is _DROP:
            d.pop(k, None)
        else:
            d[k] = v
    (path / "config.json").write_text(json.dumps(d))


_DROP = object()


@pytest.mark.parametrize(
    ("name", "tensor"),
    [
        ("qwen2", "model.layers.1.self_attn.k_proj.bias"),
        ("qwen3", "model.layers.0.self_attn.q_norm.weight"),
        ("gpt2", "transformer.h.1.attn.c_attn.bias"),
        ("gpt2_bare", "h.2.mlp.c_fc.weight"),
    ],
)
def test_missing_tensor_is_named(tmp_path, name, tensor):
    path = _copy(tmp_path, name)
    _edit_tensors(path, lambda t: t.pop(tensor))
    with pytest.raises(CheckpointError, match=f"tensor '{tensor}' is missing"):
        LOADERS[name][0](path)


@pytest.mark.parametrize(
    ("name", "extra", "hint"),
    [
        ("qwen2", "model.layers.0.self_attn.o_proj.bias", "q/k/v biases only"),
        ("qwen3", "model.layers.0.self_attn.q_proj.bias", "attention_bias false"),
        ("gpt2", "lm_head.weight", "tie_word_embeddings true"),
        ("gpt2", "transformer.h.0.attn.c_attn.extra", ""),
    ],
)
def test_unaccounted_tensor_is_refused_by_name(tmp_path, name, extra, hint):
    path = _copy(tmp_path, name)
    _edit_tensors(path, lambda t: t.__setitem__(extra, np.zeros((2, 2), np.float32)))
    with pytest.raises(CheckpointError, match=extra.replace(".", r"\.")) as err:
        LOADERS[name][0](path)
    assert hint in str(err.value)


def test_qwen_checkpoint_refused_by_the_llama_loader_and_back():
    with pytest.raises(HFConfigError, match=r"architectures: got \['Qwen2ForCausalLM'\]"):
        load_llama_checkpoint(FIXTURES / "qwen2")
    with pytest.raises(HFConfigError, match=r"architectures: got \['Qwen3ForCausalLM'\]"):
        load_qwen2_checkpoint(FIXTURES / "qwen3")
    with pytest.raises(HFConfigError, match=r"architectures: got \['GPT2LMHeadModel'\]"):
        load_qwen3_checkpoint(FIXTURES / "gpt2")
    with pytest.raises(HFConfigError, match=r"architectures: got \['Qwen2ForCausalLM'\]"):
        load_gpt2_checkpoint(FIXTURES / "qwen2")


def test_wrong_shape_is_named(tmp_path):
    path = _copy(tmp_path, "gpt2")
    _edit_tensors(
        path,
        lambda t: t.__setitem__(
            "transformer.h.0.attn.c_attn.weight", np.zeros((32, 64), np.float32)
        ),
    )
    with pytest.raises(
        CheckpointError, match=r"c_attn\.weight.*shape \[32, 64\]; config\.json implies \[32, 96\]"
    ):
        load_gpt2_checkpoint(path)


def _qwen2_dict(**changes):
    d = dict(read_hf_config(FIXTURES / "qwen2"))
    d.update(changes)
    return d


@pytest.mark.parametrize(
    ("changes", "field", "allowed"),
    [
        ({"use_sliding_window": True}, "use_sliding_window", "false"),
        (
            {"layer_types": ["full_attention", "sliding_attention"]},
            "layer_types[1]",
            "full_attention",
        ),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            "rope_scaling.rope_type",
            "'default'",
        ),
        ({"hidden_act": "gelu"}, "hidden_act", "'silu'"),
        ({"num_key_value_heads": 2.0}, "num_key_value_heads", "integer"),
        ({"use_sliding_window": "false"}, "use_sliding_window", "true or false"),
    ],
)
def test_qwen2_config_refusals_name_the_field(changes, field, allowed):
    with pytest.raises(HFConfigError) as err:
        qwen2_config_from_hf(_qwen2_dict(**changes))
    assert err.value.field == field and allowed in err.value.message


def test_qwen_defaults_are_transformers():
    d = _qwen2_dict(hidden_size=64, num_attention_heads=32)
    for k in ("num_key_value_heads", "max_position_embeddings"):
        del d[k]
    c = qwen2_config_from_hf(d)
    assert c.num_key_value_heads == 32  # Qwen2Config's default, not num_attention_heads
    assert c.max_position_embeddings == 32_768
    c = qwen2_config_from_hf(_qwen2_dict(num_key_value_heads=None))
    assert c.num_key_value_heads == c.num_attention_heads == 4  # null: as many as the heads
    d3 = dict(read_hf_config(FIXTURES / "qwen3"))
    del d3["head_dim"]
    d3["num_attention_heads"], d3["num_key_value_heads"] = 1, 1
    assert qwen3_config_from_hf(d3).resolved_head_dim == 128  # Qwen3Config's default
    with pytest.raises(HFConfigError, match="attention_bias"):
        qwen3_config_from_hf({**read_hf_config(FIXTURES / "qwen3"), "attention_bias": True})


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"activation_function": "relu"}, "activation_function"),
        ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ({"scale_attn_weights": False}, "scale_attn_weights"),
        ({"add_cross_attention": True}, "add_cross_attention"),
        ({"hidden_size": 64}, "hidden_size"),  # disagrees with n_embd 32
        ({"n_layer": 2.0}, "n_layer"),
        ({"n_head": 5}, "n_embd"),  # 5 does not divide 32
        ({"n_embd": _DROP}, "n_embd"),
    ],
)
def test_gpt2_config_refusals_name_the_field(changes, field):
    d = dict(read_hf_config(FIXTURES / "gpt2"))
    for k, v in changes.items():
        if v is _DROP:
            del d[k]
        else:
            d[k] = v
    with pytest.raises(HFConfigError) as err:
        gpt2_config_from_hf(d)
    assert err.value.field == field, err.value


def test_gpt2_strict_false_loads_a_prefix_of_layers(tmp_path):
    path = _copy(tmp_path, "gpt2_bare")
    _edit_config(path, num_hidden_layers=2)
    with pytest.raises(CheckpointError, match="decoder layers 2 past"):
        load_gpt2_checkpoint(path)
    config, params = load_gpt2_checkpoint(path, strict=False)
    assert config.n_layer == 2 and params["layers"]["q_proj"].shape[0] == 2
