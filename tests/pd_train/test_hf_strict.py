"""No silently wrong answers from the Hugging Face loader (issue 14, items 1-3).

Each test here failed before its fix: config.json values were coerced (``"false"`` → True, a
boolean → 1 layer, 4.5 heads → 4), tensors config.json does not account for were ignored, a
corrupt safetensors file raised an error naming no file, and a checkpoint of mixed dtypes
loaded each tensor in its own dtype. Checkpoints are real safetensors files in tmp dirs.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from pd_train.config.io import ConfigError, structure
from pd_train.config.run import TargetConfig
from pd_train.models.hf import (
    CheckpointError,
    HFConfigError,
    llama_config_from_hf,
    load_llama_checkpoint,
    read_hf_config,
)

from ._hf import (
    EXPECTED,
    assert_tree_equal,
    config_v4,
    config_v5,
    expected_params,
    hf_tensors,
    write_checkpoint,
)

# --------------------------------------------------------------------------------------------
# 1. config.json types are checked, never coerced


@pytest.mark.parametrize(
    ("field", "value", "needles"),
    [
        # The reported cases: each of these used to load as a different model.
        ("tie_word_embeddings", "false", ["'false' (a string)", "true or false"]),
        ("num_hidden_layers", True, ["True (a boolean)", "must be an integer"]),
        ("num_attention_heads", 4.5, ["4.5 (a number)", "must be an integer"]),
        ("rope_theta", "abc", ["'abc' (a string)", "must be a number"]),
        # 32.0 is refused too (transformers would pass the float to nn.Linear and fail).
        ("hidden_size", 16.0, ["16.0", "write 16, not 16.0"]),
        ("num_key_value_heads", "2", ["'2' (a string)"]),
        ("head_dim", False, ["False (a boolean)"]),
        ("max_position_embeddings", 256.5, ["256.5"]),
        ("vocab_size", [24], ["[24] (an array)"]),
        ("rms_norm_eps", True, ["True (a boolean)", "must be a number"]),
        ("rms_norm_eps", "1e-5", ["'1e-5' (a string)"]),
        ("rope_theta", float("nan"), ["nan", "finite"]),
        ("rope_theta", float("inf"), ["inf", "finite"]),
        ("rope_theta", 10**400, ["finite"]),
        ("tie_word_embeddings", 0, ["0 (an integer)", "true or false"]),
        ("tie_word_embeddings", None, ["None (null)", "true or false"]),
        ("attention_bias", 0, ["0 (an integer)"]),
        ("mlp_bias", "false", ["'false' (a string)"]),
        ("partial_rotary_factor", True, ["True (a boolean)"]),
        ("model_type", ["llama"], ["['llama'] (an array)"]),
        ("hidden_act", "SiLU", ["'SiLU'", "'silu'"]),
        ("architectures", "LlamaForCausalLM", ["'LlamaForCausalLM' (a string)"]),
    ],
)
def test_wrong_json_types_are_refused_naming_field_and_file(tmp_path, field, value, needles):
    config = {**config_v4(), field: value}
    file = tmp_path / "config.json"
    file.write_text(json.dumps(config))
    with pytest.raises(HFConfigError) as info:
        llama_config_from_hf(read_hf_config(tmp_path))
    text = str(info.value)
    assert info.value.field == field
    assert f"{file}: {field}: got " in text, text
    for needle in needles:
        assert needle in text, text


@pytest.mark.parametrize(
    ("rope", "field"),
    [
        (
            {"rope_type": "llama3", "factor": "8", "low_freq_factor": 1.0, "high_freq_factor": 4.0},
            "rope_parameters.factor",
        ),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64.0,
            },
            "rope_parameters.original_max_position_embeddings",
        ),
        ({"rope_type": True}, "rope_parameters.rope_type"),
        ({"rope_type": "default", "rope_theta": None}, "rope_parameters.rope_theta"),
        ({"rope_type": "default", "rope_theta": "1e4"}, "rope_parameters.rope_theta"),
    ],
)
def test_rope_dict_fields_are_type_checked(rope, field):
    d = {**config_v5(), "rope_parameters": rope}
    with pytest.raises(HFConfigError) as info:
        llama_config_from_hf(d, source="some/config.json")
    assert info.value.field == field
    assert str(info.value).startswith(f"checkpoint config: some/config.json: {field}: got ")


def test_a_falsy_rope_scaling_of_the_wrong_type_is_not_skipped():
    # false/0/"" for rope_scaling used to fall through to rope_parameters silently.
    for value in (False, 0, ""):
        with pytest.raises(HFConfigError, match=r"rope_scaling: got .*; pd supports an object"):
            llama_config_from_hf({**config_v5(), "rope_scaling": value})


def test_exact_values_in_other_json_spellings_read_the_same():
    # An integer where a float is expected is exact, so it is taken; nulls that transformers
    # reads as "unset" are unset; both dialects agree.
    v4 = {**config_v4(), "rope_theta": 500000, "rms_norm_eps": 1e-5}
    assert llama_config_from_hf(v4) == EXPECTED
    assert llama_config_from_hf(v4).rope_theta == 500000.0
    assert isinstance(llama_config_from_hf(v4).rope_theta, float)
    v5 = config_v5()
    v5["rope_parameters"] = {**v5["rope_parameters"], "factor": 8, "partial_rotary_factor": 1}
    assert llama_config_from_hf(v5) == EXPECTED
    nulls = {**config_v5(), "num_key_value_heads": None, "head_dim": None, "rope_scaling": None}
    got = llama_config_from_hf(nulls)
    assert (got.num_key_value_heads, got.head_dim) == (4, None)


def test_load_errors_name_the_config_file(tmp_path):
    config = {**config_v5(), "tie_word_embeddings": "false"}
    root = write_checkpoint(tmp_path / "ckpt", config, hf_tensors(config_v5(), np.float32))
    with pytest.raises(HFConfigError, match=rf"{root / 'config.json'}: tie_word_embeddings"):
        load_llama_checkpoint(root)


# --------------------------------------------------------------------------------------------
# 2. tensors config.json does not account for


def test_a_deeper_checkpoint_than_config_json_is_refused(tmp_path):
    tensors = hf_tensors({**config_v4(), "num_hidden_layers": 4}, np.float32)
    config = {**config_v4(), "num_hidden_layers": 3}
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=2)
    with pytest.raises(CheckpointError) as info:
        load_llama_checkpoint(root)
    text = str(info.value)
    assert "9 tensor(s) config.json does not account for" in text
    assert "model.layers.3.input_layernorm.weight (model-0000" in text
    assert "decoder layers 3 past config.json's num_hidden_layers (3)" in text
    assert "strict=False" in text


def test_strict_false_loads_the_prefix_config_json_describes(tmp_path, caplog):
    tensors = hf_tensors({**config_v4(), "num_hidden_layers": 4}, np.float32)
    config = {**config_v4(), "num_hidden_layers": 2}
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=3)
    with caplog.at_level("WARNING", logger="pd_train.models.hf"):
        cfg, params = load_llama_checkpoint(root, strict=False)
    assert "skipping decoder layers 2-3" in caplog.text
    assert cfg.num_hidden_layers == 2
    assert_tree_equal(params, expected_params(config, tensors))


def test_layers_argument_stays_the_explicit_prefix_under_strict(tmp_path):
    # layers=k asks for fewer layers than config.json describes: nothing is unaccounted for.
    config = {**config_v4(), "num_hidden_layers": 3}
    tensors = hf_tensors(config, np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors)
    cfg, _ = load_llama_checkpoint(root, layers=1, strict=True)
    assert cfg.num_hidden_layers == 1
    with pytest.raises(CheckpointError, match="strict: got 'no'"):
        load_llama_checkpoint(root, strict="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("strict", [True, False])
def test_biases_are_refused_even_when_not_strict(tmp_path, strict):
    config = config_v4()
    tensors = hf_tensors(config, np.float32)
    tensors["model.layers.1.self_attn.q_proj.bias"] = np.ones(16, np.float32)
    tensors["model.layers.0.mlp.down_proj.bias"] = np.ones(16, np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors)
    with pytest.raises(CheckpointError) as info:
        load_llama_checkpoint(root, strict=strict)
    text = str(info.value)
    assert "model.layers.0.mlp.down_proj.bias (model.safetensors)" in text
    assert "model.layers.1.self_attn.q_proj.bias" in text
    assert "attention_bias/mlp_bias false" in text


def test_lm_head_with_tied_embeddings_is_refused(tmp_path):
    config = config_v5(tied=True)
    tensors = hf_tensors({**config, "tie_word_embeddings": False}, np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors)
    with pytest.raises(
        CheckpointError,
        match=r"lm_head\.weight \(model\.safetensors\); config\.json says tie_word_embeddings true",
    ):
        load_llama_checkpoint(root)


def test_unknown_tensors_even_outside_the_index_are_refused(tmp_path):
    config = config_v5()
    tensors = hf_tensors(config, np.float32)
    tensors["model.extra_scale"] = np.ones(3, np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=2)
    index = json.loads((root / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.extra_scale"]  # in a shard, not named by the index
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model\.extra_scale \(model-0000\d-of-00002"):
        load_llama_checkpoint(root, strict=False)


def test_old_rotary_inv_freq_buffers_are_ignored(tmp_path):
    config = config_v4()
    tensors = hf_tensors(config, np.float32)
    extra = {
        f"model.layers.{i}.self_attn.rotary_emb.inv_freq": np.ones(2, np.float32) for i in (0, 1)
    }
    root = write_checkpoint(tmp_path / "ckpt", config, {**tensors, **extra})
    _, params = load_llama_checkpoint(root)
    assert_tree_equal(params, expected_params(config, tensors))


def test_target_strict_is_a_checked_bool_defaulting_to_true():
    assert structure({}, TargetConfig).strict is True
    assert structure({"strict": False}, TargetConfig).strict is False
    with pytest.raises(ConfigError, match=r"strict"):
        structure({"strict": "false"}, TargetConfig)


# --------------------------------------------------------------------------------------------
# 3. corrupt files and mixed dtypes


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_a_corrupt_shard_is_named(tmp_path, damage):
    config = config_v5()
    root = write_checkpoint(tmp_path / "ckpt", config, hf_tensors(config, np.float32), n_files=3)
    shard = root / "model-00002-of-00003.safetensors"
    data = shard.read_bytes()
    damaged = {
        "truncate": data[: len(data) - 100],
        "garbage": b"not safetensors" * 40,
        "empty": b"",
    }
    shard.write_bytes(damaged[damage])
    with pytest.raises(CheckpointError) as info:
        load_llama_checkpoint(root)
    text = str(info.value)
    assert f"{shard} (shard 2 of 3) is not a readable safetensors file" in text, text
    assert "truncated or corrupt" in text


def test_a_truncated_single_file_is_named(tmp_path):
    config = config_v4()
    root = write_checkpoint(tmp_path / "ckpt", config, hf_tensors(config, np.float32))
    file = root / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match=rf"{file} is not a readable safetensors file"):
        load_llama_checkpoint(root)


def test_mixed_dtypes_need_an_explicit_dtype(tmp_path):
    config = config_v5()
    tensors = hf_tensors(config, ml_dtypes.bfloat16)
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].astype(np.float32)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=2)
    with pytest.raises(CheckpointError) as info:
        load_llama_checkpoint(root)
    text = str(info.value)
    assert "several dtypes (bfloat16: 19 tensor(s)" in text, text
    assert "float32: 2 tensor(s), e.g. 'model.embed_tokens.weight'" in text
    assert "Pass dtype=" in text
    _, params = load_llama_checkpoint(root, dtype=np.float32)
    want = {k: np.asarray(v).astype(np.float32) for k, v in tensors.items()}
    assert_tree_equal(params, expected_params(config, want))


def test_mixed_dtypes_across_layers_are_refused_too(tmp_path):
    config = config_v4()
    tensors = hf_tensors(config, np.float32)
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = tensors[name].astype(np.float16)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors)
    with pytest.raises(CheckpointError, match=rf"float16: 1 tensor\(s\), e.g. '{name}'"):
        load_llama_checkpoint(root)


def test_read_hf_config_is_a_plain_dict_that_remembers_its_file(tmp_path):
    path = Path(write_checkpoint(tmp_path / "c", config_v5(), {"x": np.zeros(1, np.float32)}))
    d = read_hf_config(path)
    assert d == config_v5() and isinstance(d, dict)
    assert d.path == str(path / "config.json")
    assert json.loads(json.dumps(d)) == config_v5()


def test_rope_scaling_and_rope_parameters_must_agree():
    both = {**config_v4(), "rope_parameters": config_v5()["rope_parameters"]}
    assert llama_config_from_hf(both) == EXPECTED  # the same settings spelled twice
    both["rope_parameters"] = {**both["rope_parameters"], "factor": 16.0}
    with pytest.raises(HFConfigError) as info:
        llama_config_from_hf(both)
    assert info.value.field == "rope_parameters.factor"
    assert "got 16.0 (a number) but rope_scaling.factor is 8.0 (a number)" in str(info.value)
