"""Tiny Hugging Face Llama checkpoints the loader tests write themselves: `config.json` in both
dialects (`config_v4`, `config_v5`), random tensors (`hf_tensors`), the files
(`write_checkpoint`), and what loading them must give (`EXPECTED`, `expected_params`)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from pd_train.models.llama_config import LlamaConfig, RopeScaling

# vocab 24, hidden 16, 4 heads of 4 (kv 2), ff 40, 2 layers: every dim divides a 2x4 mesh.
BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 24,
    "hidden_size": 16,
    "intermediate_size": 40,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 4,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256,
    "attention_bias": False,
    "mlp_bias": False,
}
LLAMA3 = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def config_v4(*, tied: bool = False, dtype: str = "float32") -> dict:
    """The dialect of most Llama 3.x checkpoints: top-level rope_theta, rope_scaling."""
    return {
        **BASE,
        "rope_theta": 500000.0,
        "rope_scaling": {**LLAMA3, "rope_type": "llama3"},
        "torch_dtype": dtype,
        "tie_word_embeddings": tied,
    }


def config_v5(*, tied: bool = False, dtype: str = "float32") -> dict:
    """The dialect transformers >= 5 writes: rope_parameters, dtype."""
    return {
        **BASE,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", **LLAMA3},
        "dtype": dtype,
        "tie_word_embeddings": tied,
    }


EXPECTED = LlamaConfig(
    vocab_size=24,
    hidden_size=16,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=4,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling=RopeScaling(**LLAMA3),
    max_position_embeddings=256,
    tie_word_embeddings=False,
)


def hf_tensors(config: dict, dtype, *, seed: int = 0) -> dict[str, np.ndarray]:
    """Random tensors named and shaped as a Hugging Face LlamaForCausalLM stores them."""
    rng = np.random.default_rng(seed)
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, d)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        }
    return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}


def write_checkpoint(root: Path, config: dict, tensors: dict, *, n_files: int = 1) -> Path:
    """config.json plus model.safetensors, or ``n_files`` shards named by an index json."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    if n_files == 1:
        save_file(tensors, str(root / "model.safetensors"))
        return root
    names = sorted(tensors)
    weight_map = {}
    for k in range(n_files):
        fname = f"model-{k + 1:05d}-of-{n_files:05d}.safetensors"
        part = names[k::n_files]
        save_file({n: tensors[n] for n in part}, str(root / fname))
        weight_map |= dict.fromkeys(part, fname)
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def expected_params(config: dict, tensors: dict) -> dict:
    """The target layout computed directly from the HF tensors, with plain numpy."""
    L = config["num_hidden_layers"]

    def stack(suffix: str, transpose: bool) -> np.ndarray:
        arrs = [tensors[f"model.layers.{i}.{suffix}.weight"] for i in range(L)]
        return np.stack([a.T if transpose else a for a in arrs])

    out = {
        "embed_tokens": tensors["model.embed_tokens.weight"],
        "norm": tensors["model.norm.weight"],
        "layers": {
            "input_layernorm": stack("input_layernorm", False),
            "post_attention_layernorm": stack("post_attention_layernorm", False),
            **{k: stack(f"self_attn.{k}", True) for k in ("q_proj", "k_proj", "v_proj", "o_proj")},
            **{k: stack(f"mlp.{k}", True) for k in ("gate_proj", "up_proj", "down_proj")},
        },
    }
    if not config["tie_word_embeddings"]:
        out["lm_head"] = tensors["lm_head.weight"].T
    return out


def assert_tree_equal(got: dict, want: dict) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        w = dict(jax.tree_util.tree_leaves_with_path(want))[path]
        assert g.shape == w.shape, path
        assert g.dtype == w.dtype, path
        np.testing.assert_array_equal(np.asarray(g), w, err_msg=str(path))
