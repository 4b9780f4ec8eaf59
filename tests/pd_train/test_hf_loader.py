"""The Hugging Face Llama loader against tiny checkpoints these tests write themselves."""

from __future__ import annotations

import json

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pd_train.models import hf
from pd_train.models.hf import (
    CheckpointError,
    llama_config_from_hf,
    llama_param_shapes,
    load_llama_checkpoint,
)
from pd_train.models.llama_config import RopeScaling

from ._hf import (
    BASE,
    EXPECTED,
    LLAMA3,
    assert_tree_equal,
    config_v4,
    config_v5,
    expected_params,
    hf_tensors,
    write_checkpoint,
)

# --------------------------------------------------------------------------------------------
# config.json


def test_both_dialects_read_the_same_config():
    assert llama_config_from_hf(config_v4()) == EXPECTED
    assert llama_config_from_hf(config_v5()) == EXPECTED


def test_missing_fields_take_transformers_defaults():
    d = {k: BASE[k] for k in ("vocab_size", "hidden_size", "intermediate_size")}
    d |= {"num_hidden_layers": 2, "num_attention_heads": 4}
    cfg = llama_config_from_hf(d)
    assert cfg.num_key_value_heads == 4
    assert cfg.head_dim is None and cfg.resolved_head_dim == 4
    assert cfg.rms_norm_eps == 1e-6
    assert cfg.rope_theta == 10_000.0
    assert cfg.rope_scaling is None
    assert cfg.max_position_embeddings == 2048
    assert cfg.tie_word_embeddings is False


def test_default_rope_and_legacy_type_key():
    d = {**BASE, "rope_theta": 1234.0, "rope_scaling": None}
    assert llama_config_from_hf(d).rope_scaling is None
    assert llama_config_from_hf(d).rope_theta == 1234.0
    d = {**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 99.0}}
    assert llama_config_from_hf(d).rope_theta == 99.0
    # Older checkpoints spell the rope type "type".
    d = {**BASE, "rope_scaling": {**LLAMA3, "type": "llama3"}}
    assert llama_config_from_hf(d).rope_scaling == RopeScaling(**LLAMA3)


def test_llama3_original_context_falls_back_to_max_position_embeddings():
    rope = {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}
    cfg = llama_config_from_hf({**BASE, "rope_scaling": {**rope, "rope_type": "llama3"}})
    assert cfg.rope_scaling is not None
    assert cfg.rope_scaling.original_max_position_embeddings == 256


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        ({"architectures": ["MistralForCausalLM"]}, ["architectures", "MistralForCausalLM"]),
        ({"model_type": "gemma"}, ["model_type", "gemma"]),
        ({"hidden_act": "gelu"}, ["hidden_act", "gelu", "silu"]),
        ({"attention_bias": True}, ["attention_bias", "True"]),
        ({"mlp_bias": True}, ["mlp_bias", "True"]),
        (
            {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
            ["rope_scaling.rope_type", "yarn"],
        ),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, ["rope_scaling.type", "linear"]),
        (
            {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1.0}},
            ["rope_parameters.rope_type", "dynamic"],
        ),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ["llama3", "low_freq_factor"]),
        ({"partial_rotary_factor": 0.5}, ["partial_rotary_factor", "0.5"]),
        ({"num_key_value_heads": 3}, ["num_key_value_heads", "3"]),
        ({"vocab_size": None}, ["vocab_size", "missing"]),
    ],
)
def test_unsupported_configs_are_refused_naming_field_and_value(change, needles):
    with pytest.raises(CheckpointError) as info:
        llama_config_from_hf({**BASE, **change})
    for needle in needles:
        assert needle in str(info.value)


# --------------------------------------------------------------------------------------------
# loading


CASES = [
    # (dialect, dtype, tied, n_files)
    (config_v4, np.float32, False, 1),
    (config_v5, np.float32, True, 3),
    (config_v4, ml_dtypes.bfloat16, True, 1),
    (config_v5, ml_dtypes.bfloat16, False, 3),
    (config_v5, np.float16, False, 1),
]


@pytest.mark.parametrize(("dialect", "dtype", "tied", "n_files"), CASES)
def test_load_matches_transposed_stacked_source(tmp_path, dialect, dtype, tied, n_files):
    config = dialect(tied=tied, dtype=np.dtype(dtype).name)
    tensors = hf_tensors(config, dtype)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=n_files)
    cfg, params = load_llama_checkpoint(root)
    assert cfg.tie_word_embeddings is tied
    assert ("lm_head" in params) is (not tied)
    assert_tree_equal(params, expected_params(config, tensors))
    shapes = llama_param_shapes(cfg, dtype)
    assert jax.tree.map(lambda s: (s.shape, s.dtype), shapes) == jax.tree.map(
        lambda a: (a.shape, a.dtype), params
    )


def test_dtype_argument_converts_on_load(tmp_path):
    config = config_v5()
    tensors = hf_tensors(config, ml_dtypes.bfloat16)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors)
    _, params = load_llama_checkpoint(root, dtype=np.float32)
    want = jax.tree.map(lambda a: a.astype(np.float32), expected_params(config, tensors))
    assert_tree_equal(params, want)


def test_layers_loads_a_prefix_of_the_model(tmp_path):
    config = {**config_v4(), "num_hidden_layers": 3}
    tensors = hf_tensors(config, np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=2)
    cfg, params = load_llama_checkpoint(root, layers=2)
    assert cfg.num_hidden_layers == 2
    want = expected_params(config, tensors)
    want["layers"] = {k: v[:2] for k, v in want["layers"].items()}
    assert_tree_equal(params, want)


def mesh_shardings(mesh, *, tied: bool) -> dict:
    """A mixed layout over a (data=2, model=4) mesh: split, replicated and partly replicated."""

    def s(*spec):
        return NamedSharding(mesh, P(*spec))

    out = {
        "embed_tokens": s("data", "model"),
        "norm": s(),
        "layers": {
            "input_layernorm": s("data", "model"),
            "post_attention_layernorm": s(None, "model"),
            "q_proj": s("data", "model", None),
            "k_proj": s(None, None, "model"),
            "v_proj": s("data", None, "model"),
            "o_proj": s(None, "model", "data"),
            "gate_proj": s(None, "data", "model"),
            "up_proj": s(None, ("data", "model")),
            "down_proj": s(None, ("model", "data"), None),
        },
    }
    if not tied:
        out["lm_head"] = s("model", "data")
    return out


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("n_files", [1, 3])
def test_sharded_load_over_8_devices(tmp_path, dtype, n_files):
    assert jax.device_count() == 8
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    config = config_v5(tied=False)
    tensors = hf_tensors(config, dtype)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=n_files)
    shardings = mesh_shardings(mesh, tied=False)
    _, params = load_llama_checkpoint(root, shardings=shardings)
    want = expected_params(config, tensors)
    assert_tree_equal(params, want)
    flat_want = dict(jax.tree_util.tree_leaves_with_path(want))
    for (path, array), sharding in zip(
        jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(shardings), strict=True
    ):
        assert array.sharding == sharding, path
        for shard in array.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), flat_want[path][shard.index])


def test_each_device_reads_only_its_slice(tmp_path, monkeypatch):
    """Count what the loader asks the safetensors files for: a split array's shards are each
    read once and together cover it exactly; a replicated array is read once, not per device."""
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    config = config_v4(tied=False)
    tensors = hf_tensors(config, np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=2)
    reads: list[tuple[str, tuple, int]] = []
    real = hf._Checkpoint.read_slice

    def counting(self, name, index):
        out = real(self, name, index)
        reads.append((name, tuple((s.start, s.stop) for s in index), out.size))
        return out

    monkeypatch.setattr(hf._Checkpoint, "read_slice", counting)
    shardings = mesh_shardings(mesh, tied=False)
    load_llama_checkpoint(root, shardings=shardings)

    def elements(name):
        return sum(n for t, _, n in reads if t == name)

    # Split over all 8 devices: every element read exactly once, in 8 distinct slices.
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert elements(name) == tensors[name].size
        assert len([r for r in reads if r[0] == name]) == 8
    # q_proj [L=2 over data, d over model, out whole]: each layer's tensor read in 4 slices.
    q0 = [r for r in reads if r[0] == "model.layers.0.self_attn.q_proj.weight"]
    assert len(q0) == 4
    assert all(n == tensors[q0[0][0]].size // 4 for _, _, n in q0)
    # k_proj sharded over model only (replicated over data): 4 distinct slices per layer, not 8.
    k1 = [r for r in reads if r[0] == "model.layers.1.self_attn.k_proj.weight"]
    assert len(k1) == 4 and sum(n for _, _, n in k1) == tensors[k1[0][0]].size
    # Fully replicated norm: one read for all 8 devices.
    assert len([r for r in reads if r[0] == "model.norm.weight"]) == 1
    # Nothing anywhere is read more than once per distinct slice.
    assert len(reads) == len({(t, i) for t, i, _ in reads})


def test_one_sharding_for_everything(tmp_path):
    mesh = jax.make_mesh((8,), ("d",))
    config = config_v5(tied=True)
    tensors = hf_tensors(config, np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors)
    replicated = NamedSharding(mesh, P())
    _, params = load_llama_checkpoint(root, shardings=replicated)
    assert all(a.sharding == replicated for a in jax.tree.leaves(params))
    assert_tree_equal(params, expected_params(config, tensors))


# --------------------------------------------------------------------------------------------
# errors


def good_checkpoint(tmp_path, *, n_files=1, tied=False):
    config = config_v5(tied=tied)
    tensors = hf_tensors(config, np.float32)
    return config, tensors, write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=n_files)


@pytest.mark.parametrize("n_files", [1, 2])
def test_missing_tensor_names_tensor_and_file(tmp_path, n_files):
    config = config_v5()
    tensors = hf_tensors(config, np.float32)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=n_files)
    if n_files > 1:  # the index still names the tensor, but its file lacks it
        index = json.loads((root / "model.safetensors.index.json").read_text())
        index["weight_map"]["model.layers.1.mlp.up_proj.weight"] = (
            "model-00001-of-00002.safetensors"
        )
        (root / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight") as info:
        load_llama_checkpoint(root)
    assert str(root) in str(info.value)


def test_untied_config_without_lm_head_is_an_error(tmp_path):
    config = config_v5(tied=False)
    tensors = hf_tensors({**config, "tie_word_embeddings": True}, np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors)
    with pytest.raises(CheckpointError, match=r"'lm_head\.weight' is missing"):
        load_llama_checkpoint(root)


def test_shape_mismatch_names_tensor_file_and_shapes(tmp_path):
    config = config_v5()
    tensors = hf_tensors(config, np.float32)
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((4, 16), np.float32)
    root = write_checkpoint(tmp_path / "ckpt", config, tensors, n_files=2)
    with pytest.raises(CheckpointError) as info:
        load_llama_checkpoint(root)
    text = str(info.value)
    assert "model.layers.0.self_attn.k_proj.weight" in text
    assert ".safetensors" in text and "[4, 16]" in text and "[8, 16]" in text


def test_directory_without_weights_or_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"config\.json"):
        load_llama_checkpoint(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text(json.dumps(config_v5()))
    with pytest.raises(CheckpointError, match=r"neither model\.safetensors nor"):
        load_llama_checkpoint(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="not a directory"):
        load_llama_checkpoint(tmp_path / "nowhere")


def test_index_naming_a_missing_shard(tmp_path):
    _, _, root = good_checkpoint(tmp_path, n_files=3)
    (root / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model-00002-of-00003\.safetensors.*does not exist"):
        load_llama_checkpoint(root)


def test_bad_arguments(tmp_path):
    _, _, root = good_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match=r"layers: got 3; expected an int in \[1, 2\]"):
        load_llama_checkpoint(root, layers=3)
    with pytest.raises(CheckpointError, match="dtype: got int32"):
        load_llama_checkpoint(root, dtype=np.int32)
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    shardings = mesh_shardings(mesh, tied=True)  # no lm_head entry for an untied checkpoint
    with pytest.raises(CheckpointError, match=r"missing \['lm_head'\]"):
        load_llama_checkpoint(root, shardings=shardings)
    shardings = mesh_shardings(mesh, tied=False)
    shardings["layers"]["extra"] = shardings["norm"]
    with pytest.raises(CheckpointError, match=r"unexpected \['layers\.extra'\]"):
        load_llama_checkpoint(root, shardings=shardings)
    shardings = mesh_shardings(mesh, tied=False)
    # k_proj is [L=2, 16, 8]: its 2 layers cannot split over 8 devices.
    shardings["layers"]["k_proj"] = NamedSharding(jax.make_mesh((8,), ("d",)), P("d", None, None))
    with pytest.raises(
        CheckpointError, match=r"shardings\.layers\.k_proj: cannot shard shape \[2, 16, 8\]"
    ):
        load_llama_checkpoint(root, shardings=shardings)
