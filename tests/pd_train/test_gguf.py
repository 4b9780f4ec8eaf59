"""GGUF checkpoints and GGUF tokenizers, against tiny GGUF files these tests write themselves
with gguf's own GGUFWriter (llama.cpp's layout: Q/K rows permuted for its RoPE)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

from pd_train.cli import main as pd_train
from pd_train.config.io import ConfigError
from pd_train.models.gguf import (
    check_gguf_checkpoint,
    gguf_llama_config,
    is_gguf,
    load_gguf_checkpoint,
)
from pd_train.models.hf import CheckpointError, llama_param_shapes, load_llama_checkpoint
from pd_train.models.llama import forward, rope_inv_freq
from pd_train.models.llama_config import LlamaConfig
from pd_train.models.tokenizer import TokenizerError, gguf_tokenizer, tokenize_files

# vocab 40, hidden 32, 4 heads of 8 over 2 kv heads, ff 64, 2 layers: every row a whole
# number of 32-wide quantization blocks, every dim divisible by a 2x4 mesh.
CONFIG = LlamaConfig(
    vocab_size=40,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=None,
    rms_norm_eps=1e-5,
    rope_theta=10_000.0,
    max_position_embeddings=256,
    tie_word_embeddings=False,
)
LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "gate_proj": "ffn_gate",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
}


def hf_weights(config: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights named and shaped as a Hugging Face checkpoint stores them ([out, in])."""
    rng = np.random.default_rng(seed)
    shapes = llama_param_shapes(config)
    out = {
        "embed_tokens": rng.normal(size=shapes["embed_tokens"].shape),
        "norm": rng.normal(size=shapes["norm"].shape),
    }
    if "lm_head" in shapes:
        out["lm_head"] = rng.normal(size=shapes["lm_head"].shape).T
    for key, spec in shapes["layers"].items():
        for i in range(config.num_hidden_layers):
            w = rng.normal(size=spec.shape[1:])
            out[f"{i}.{key}"] = w.T if w.ndim == 2 else w
    return {k: v.astype(np.float32) for k, v in out.items()}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permute of a q/k weight [n_head*hd, d] (HF → GGUF rows)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(
    path: Path,
    weights: dict[str, np.ndarray],
    config: LlamaConfig = CONFIG,
    *,
    arch: str = "llama",
    qtype: gguf.GGMLQuantizationType | None = None,
    drop: tuple[str, ...] = (),
    raw: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]] | None = None,
    tokenizer: bool = False,
    extra: dict[str, np.ndarray] | None = None,
    rope_scaling_type: str | None = None,
) -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    if rope_scaling_type is not None:
        w.add_string(f"{arch}.rope.scaling.type", rope_scaling_type)
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_freq_base(config.rope_theta)
    w.add_vocab_size(config.vocab_size)
    if tokenizer:
        add_tiny_tokenizer(w)
    tensors = {"token_embd.weight": weights["embed_tokens"], "output_norm.weight": weights["norm"]}
    if "lm_head" in weights:
        tensors["output.weight"] = weights["lm_head"]
    for i in range(config.num_hidden_layers):
        for key, name in LAYER_NAMES.items():
            t = weights[f"{i}.{key}"]
            if key == "q_proj":
                t = llama_cpp_permute(t, config.num_attention_heads)
            elif key == "k_proj":
                t = llama_cpp_permute(t, config.num_key_value_heads)
            tensors[f"blk.{i}.{name}.weight"] = t
    tensors |= extra or {}
    for name, t in tensors.items():
        if name in drop:
            continue
        if raw and name in raw:
            data, raw_type = raw[name]
            w.add_tensor(name, data, raw_dtype=raw_type)
        elif qtype is not None and t.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def expected_params(weights: dict[str, np.ndarray], config: LlamaConfig = CONFIG) -> dict:
    """pd's params layout of HF-ordered ``weights``: Linear weights transposed, layers stacked."""
    shapes = llama_param_shapes(config)
    out: dict = {k: weights[k].T if k == "lm_head" else weights[k] for k in shapes if k != "layers"}
    out["layers"] = {
        key: np.stack([weights[f"{i}.{key}"].T for i in range(config.num_hidden_layers)])
        for key in shapes["layers"]
    }
    return out


# ---------------------------------------------------------------------------------------------
# checkpoints


def test_f32_gguf_loads_exactly_with_the_rope_permutation_undone(tmp_path: Path) -> None:
    weights = hf_weights(CONFIG)
    path = write_gguf(tmp_path / "tiny.gguf", weights)
    assert is_gguf(path)
    config, params = load_gguf_checkpoint(path)
    assert config == CONFIG
    got = jax.tree.map(np.asarray, params)
    want = expected_params(weights)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for (where, a), b in zip(
        jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want), strict=True
    ):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(where))
        assert a.dtype == np.float32


def test_sharded_load_reads_the_same_values(tmp_path: Path) -> None:
    """Each device's callback reads only its rows and columns, q/k rows through the permutation."""
    weights = hf_weights(CONFIG, seed=1)
    path = write_gguf(tmp_path / "tiny.gguf", weights)
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    shapes = llama_param_shapes(CONFIG)
    shardings = jax.tree.map(
        lambda s: NamedSharding(
            mesh, P(*([None] * (len(s.shape) - 2)), "a", "b") if len(s.shape) >= 2 else P("b")
        ),
        shapes,
    )
    _, params = load_gguf_checkpoint(path, shardings=shardings)
    assert params["layers"]["q_proj"].sharding == shardings["layers"]["q_proj"]
    want = expected_params(weights)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_quantized_gguf_dequantizes_to_the_requested_dtype(tmp_path: Path) -> None:
    weights = hf_weights(CONFIG, seed=2)
    path = write_gguf(tmp_path / "q8.gguf", weights, qtype=gguf.GGMLQuantizationType.Q8_0)
    _, params = load_gguf_checkpoint(path, dtype=jax.numpy.bfloat16)
    assert params["layers"]["down_proj"].dtype == jax.numpy.bfloat16
    _, params = load_gguf_checkpoint(path)
    q8 = gguf.GGMLQuantizationType.Q8_0
    # The stored (permuted) q rows, dequantized, then un-permuted by the loader.
    stored = llama_cpp_permute(weights["1.q_proj"], CONFIG.num_attention_heads)
    deq = gguf.quants.dequantize(gguf.quants.quantize(stored, q8), q8)
    unpermuted = deq.reshape(4, 4, 2, -1).swapaxes(1, 2).reshape(deq.shape)
    np.testing.assert_array_equal(np.asarray(params["layers"]["q_proj"][1]), unpermuted.T)
    # Q8_0 is close to the float weights: the loader did not scramble blocks.
    np.testing.assert_allclose(
        np.asarray(params["layers"]["q_proj"][1]), weights["1.q_proj"].T, atol=0.05
    )


def test_tied_embeddings_when_there_is_no_output_tensor(tmp_path: Path) -> None:
    weights = hf_weights(CONFIG)
    del weights["lm_head"]
    path = write_gguf(tmp_path / "tied.gguf", weights)
    config, params = load_gguf_checkpoint(path)
    assert config.tie_word_embeddings
    assert "lm_head" not in params


def test_non_llama_architecture_is_refused_by_name(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "gpt2.gguf", hf_weights(CONFIG), arch="gpt2")
    with pytest.raises(
        CheckpointError, match=r"general.architecture is 'gpt2'; pd reads \['llama'\]"
    ) as e:
        load_gguf_checkpoint(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_corrupted_gguf_names_the_file(tmp_path: Path, damage: str) -> None:
    path = write_gguf(tmp_path / "bad.gguf", hf_weights(CONFIG))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"NOTGGUF" + data[7:])
    with pytest.raises(CheckpointError, match="not a readable GGUF file") as e:
        load_gguf_checkpoint(path)
    assert str(path.resolve()) in str(e.value)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf", hf_weights(CONFIG), drop=("blk.1.ffn_up.weight",))
    with pytest.raises(
        CheckpointError, match=r"tensor 'blk.1.ffn_up.weight' \(pd's up_proj\) is missing"
    ):
        load_gguf_checkpoint(path)


def test_quantization_type_it_cannot_dequantize_is_named(tmp_path: Path) -> None:
    q81 = gguf.GGMLQuantizationType.Q8_1
    block, nbytes = gguf.GGML_QUANT_SIZES[q81]
    junk = np.zeros((CONFIG.intermediate_size, CONFIG.hidden_size // block * nbytes), np.uint8)
    raw = {"blk.0.ffn_gate.weight": (junk, q81)}
    path = write_gguf(tmp_path / "q81.gguf", hf_weights(CONFIG), raw=raw)
    with pytest.raises(CheckpointError, match=r"'blk.0.ffn_gate.weight' .* stored as Q8_1, which"):
        load_gguf_checkpoint(path)


def test_metadata_that_disagrees_with_a_tensor_is_named(tmp_path: Path) -> None:
    weights = hf_weights(CONFIG)
    weights["0.down_proj"] = weights["0.down_proj"][:, :32]  # [hidden, 32] instead of [hidden, ff]
    path = write_gguf(tmp_path / "s.gguf", weights)
    with pytest.raises(
        CheckpointError,
        match=r"'blk.0.ffn_down.weight' .* has shape \[32, 32\]; the metadata implies \[32, 64\]",
    ):
        load_gguf_checkpoint(path)


def test_blocks_past_block_count_are_refused_unless_strict_is_off(tmp_path: Path) -> None:
    """A GGUF with a block its block_count does not count is refused, as the safetensors
    loader refuses a layer past num_hidden_layers; strict=False skips whole extra blocks."""
    weights = hf_weights(CONFIG)
    extra = {f"blk.2.{name}.weight": weights[f"1.{key}"] for key, name in LAYER_NAMES.items()}
    path = write_gguf(tmp_path / "deep.gguf", weights, extra=extra)
    with pytest.raises(CheckpointError) as e:
        load_gguf_checkpoint(path)
    message = str(e.value)
    assert str(path) in message and "'blk.2.attn_norm.weight'" in message
    assert "past its metadata's block_count (2)" in message and "target.strict: false" in message
    with pytest.raises(CheckpointError, match="block_count"):
        check_gguf_checkpoint(path)
    config, params = load_gguf_checkpoint(path, strict=False)
    assert config.num_hidden_layers == 2
    np.testing.assert_array_equal(
        np.asarray(params["layers"]["down_proj"]), expected_params(weights)["layers"]["down_proj"]
    )
    # strict=False skips only whole blocks past block_count: an unknown tensor is still refused.
    odd = write_gguf(tmp_path / "odd.gguf", weights, extra={"mystery.weight": weights["norm"]})
    with pytest.raises(
        CheckpointError, match=r"1 tensor\(s\) its metadata does not account .*'mystery\.weight'"
    ):
        load_gguf_checkpoint(odd, strict=False)


def test_integer_weights_are_refused_by_name(tmp_path: Path) -> None:
    weights = hf_weights(CONFIG)
    i32 = gguf.GGMLQuantizationType.I32
    raw = {"blk.0.ffn_gate.weight": ((weights["0.gate_proj"] * 100).astype(np.int32), i32)}
    path = write_gguf(tmp_path / "i32.gguf", weights, raw=raw)
    with pytest.raises(CheckpointError) as e:
        check_gguf_checkpoint(path)
    assert f"tensor 'blk.0.ffn_gate.weight' in {path} is stored as I32 (integers)" in str(e.value)


def _gguf_run_config(tmp_path: Path, gguf_path: Path) -> Path:
    """The tiny default decomposition, pointed at ``gguf_path`` and tokens below its vocab."""
    import yaml

    from pd_train.config.io import read_yaml
    from pd_train.configs import builtin_config

    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.random.default_rng(0).integers(0, CONFIG.vocab_size, 4096, np.uint16))
    raw = read_yaml(builtin_config("default"))
    raw["target"] = {"checkpoint": str(gguf_path)}
    raw["data"] = {"path": str(tokens), "seq_len": 16}
    raw["output_dir"] = str(tmp_path / "runs")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    return config


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("missing", ["'blk.1.ffn_up.weight' (pd's up_proj) is missing from"]),
        ("embedding", ["'token_embd.weight'", "has shape [30, 32]; the metadata implies [40, 32]"]),
        ("i32", ["'blk.0.ffn_gate.weight'", "stored as I32 (integers)"]),
        ("deep", ["'blk.2.attn_norm.weight'", "past its metadata's block_count (2)"]),
    ],
)
def test_gguf_tensor_errors_stop_the_run_before_its_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, words: list[str]
) -> None:
    """Each is exit 2 at validation naming the file and the tensor; no run dir is made."""
    weights = hf_weights(CONFIG)
    kwargs: dict = {}
    if case == "missing":
        kwargs["drop"] = ("blk.1.ffn_up.weight",)
    elif case == "embedding":
        weights = {**weights, "embed_tokens": weights["embed_tokens"][:30]}
    elif case == "i32":
        i32 = gguf.GGMLQuantizationType.I32
        kwargs["raw"] = {"blk.0.ffn_gate.weight": (weights["0.gate_proj"].astype(np.int32), i32)}
    else:
        kwargs["extra"] = {
            f"blk.2.{name}.weight": weights[f"1.{key}"] for key, name in LAYER_NAMES.items()
        }
    path = write_gguf(tmp_path / f"{case}.gguf", weights, **kwargs)
    config = _gguf_run_config(tmp_path, path)
    assert pd_train(["run", str(config)]) == 2
    err = capsys.readouterr().err
    assert "target.checkpoint:" in err and str(path) in err, err
    for word in words:
        assert word in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def llama_cpp_rope_factors(
    head_dim: int, theta: float, factor: float, low: float, high: float, old_context: int
) -> np.ndarray:
    """``rope_freqs.weight`` as llama.cpp's convert_hf_to_gguf computes it for a Hugging Face
    ``rope_scaling: {rope_type: llama3}`` (float32 frequencies, one divisor per frequency)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    out = []
    for freq in freqs.astype(np.float32):
        wavelen = 2 * np.pi / freq
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def test_llama3_rope_scaling_from_rope_freqs_matches_the_safetensors_path(
    tmp_path: Path,
) -> None:
    """A Llama 3.x GGUF carries llama3 RoPE scaling as ``rope_freqs.weight``; pd's logits on it
    equal those of the same weights as safetensors with ``rope_scaling: llama3`` in config.json.
    With head_dim 8 and theta 1e4 the wavelengths are 6.3, 63, 628 and 6283: one kept, one in
    the interpolated band (32..256), two divided by the factor."""
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0}
    old = 256
    weights = hf_weights(CONFIG, seed=3)
    factors = llama_cpp_rope_factors(8, CONFIG.rope_theta, *scaling.values(), old)
    assert 1.0 < factors[1] < 8.0 and factors[0] == 1.0 and factors[3] == 8.0
    path = write_gguf(tmp_path / "l3.gguf", weights, extra={"rope_freqs.weight": factors})

    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    hf_config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": CONFIG.vocab_size,
        "hidden_size": CONFIG.hidden_size,
        "intermediate_size": CONFIG.intermediate_size,
        "num_hidden_layers": CONFIG.num_hidden_layers,
        "num_attention_heads": CONFIG.num_attention_heads,
        "num_key_value_heads": CONFIG.num_key_value_heads,
        "rms_norm_eps": CONFIG.rms_norm_eps,
        "rope_theta": CONFIG.rope_theta,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "rope_scaling": {
            "rope_type": "llama3",
            **scaling,
            "original_max_position_embeddings": old,
        },
    }
    (hf_dir / "config.json").write_text(json.dumps(hf_config))
    tensors = {"model.embed_tokens.weight": weights["embed_tokens"]}
    tensors["model.norm.weight"] = weights["norm"]
    tensors["lm_head.weight"] = weights["lm_head"]
    blocks = dict.fromkeys(["q_proj", "k_proj", "v_proj", "o_proj"], "self_attn.")
    blocks |= dict.fromkeys(["gate_proj", "up_proj", "down_proj"], "mlp.")
    for i in range(CONFIG.num_hidden_layers):
        for key in LAYER_NAMES:
            name = f"model.layers.{i}.{blocks.get(key, '')}{key}.weight"
            tensors[name] = weights[f"{i}.{key}"]
    save_file(
        {k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(hf_dir / "model.safetensors")
    )

    g_config, g_params = load_gguf_checkpoint(path)
    h_config, h_params = load_llama_checkpoint(hf_dir)
    assert g_config.rope_freq_factors == tuple(float(f) for f in factors)
    assert g_config.rope_scaling is None and h_config.rope_scaling is not None
    np.testing.assert_allclose(rope_inv_freq(g_config), rope_inv_freq(h_config), rtol=1e-6)
    tokens = np.random.default_rng(0).integers(0, CONFIG.vocab_size, size=(1, 96))
    run = jax.jit(forward, static_argnums=2)
    g_logits = np.asarray(run(g_params, tokens, g_config))
    h_logits = np.asarray(run(h_params, tokens, h_config))
    np.testing.assert_allclose(g_logits, h_logits, atol=2e-4, rtol=0)
    # The factors matter: without them the logits past the short wavelengths differ.
    plain = np.asarray(run(g_params, tokens, CONFIG))
    assert np.abs(plain - g_logits).max() > 1e-2


def test_rope_freq_factors_are_checked_on_construction() -> None:
    import attrs

    from pd_train.config.io import FieldValueError
    from pd_train.models.llama_config import RopeScaling

    with pytest.raises(FieldValueError, match="has 3 entries; must have head_dim / 2 = 4"):
        attrs.evolve(CONFIG, rope_freq_factors=(1.0, 2.0, 3.0))
    with pytest.raises(FieldValueError, match="finite numbers > 0"):
        attrs.evolve(CONFIG, rope_freq_factors=(1.0, 2.0, 0.0, 1.0))
    with pytest.raises(FieldValueError, match="and so is rope_scaling"):
        attrs.evolve(CONFIG, rope_freq_factors=(1.0,) * 4, rope_scaling=RopeScaling())


def test_other_rope_scaling_and_bad_rope_freqs_are_refused_by_name(tmp_path: Path) -> None:
    weights = hf_weights(CONFIG)
    yarn = write_gguf(tmp_path / "yarn.gguf", weights, rope_scaling_type="yarn")
    with pytest.raises(CheckpointError, match=r"llama\.rope\.scaling\.type is 'yarn'"):
        gguf_llama_config(yarn)
    short = np.ones(3, np.float32)
    bad = write_gguf(tmp_path / "bad.gguf", weights, extra={"rope_freqs.weight": short})
    with pytest.raises(CheckpointError, match=r"'rope_freqs\.weight'.*shape \[3\].*\[4\]"):
        gguf_llama_config(bad)
    zero = np.array([1, 0, 1, 1], np.float32)
    bad = write_gguf(tmp_path / "zero.gguf", weights, extra={"rope_freqs.weight": zero})
    with pytest.raises(CheckpointError, match=r"'rope_freqs\.weight'.*finite and > 0"):
        gguf_llama_config(bad)


def test_a_gguf_checkpoint_in_a_config_gives_its_architecture(tmp_path: Path) -> None:
    from pd_train.run import prepare

    path = write_gguf(tmp_path / "tiny.gguf", hf_weights(CONFIG))
    from pd_train.config.io import read_yaml
    from pd_train.configs import builtin_config

    raw = read_yaml(builtin_config("default"))  # the tiny default, pointed at this GGUF
    raw["target"] = {"checkpoint": str(path)}
    prepared = prepare(raw, for_run=False)
    assert prepared.model == gguf_llama_config(path) == CONFIG
    path.write_bytes(b"GGUF but not really")
    with pytest.raises(ConfigError, match=r"target\.checkpoint.*not a readable GGUF file"):
        prepare(raw, for_run=False)


# ---------------------------------------------------------------------------------------------
# tokenizer


def add_tiny_tokenizer(w: gguf.GGUFWriter) -> None:
    """A byte-level BPE over GPT-2's byte alphabet with a few merges and one control token."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    merges = ["h e", "l l", "he ll", "Ġ t", "Ġt he", "o r", "Ġ w", "Ġw or"]
    tokens = ["<|endoftext|>", *alphabet, *(m.replace(" ", "") for m in merges)]
    types = [3] + [1] * (len(tokens) - 1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(0)


@pytest.fixture(scope="module")
def tokenizer_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import attrs

    config = attrs.evolve(CONFIG, vocab_size=265)
    path = tmp_path_factory.mktemp("tok") / "tok.gguf"
    return write_gguf(path, hf_weights(config), config, tokenizer=True)


def test_tokenizer_merges_and_splits_digits(tokenizer_gguf: Path) -> None:
    tok = gguf_tokenizer(tokenizer_gguf)
    pieces = tok.encode("hello the world 123", add_special_tokens=False).tokens
    assert pieces == ["hell", "o", "Ġthe", "Ġwor", "l", "d", "Ġ", "1", "2", "3"]
    assert tok.encode("<|endoftext|>").ids == [0]


@settings(max_examples=40, derandomize=True, deadline=None)
@given(text=st.text(max_size=40))
def test_tokenization_round_trips(tokenizer_gguf: Path, text: str) -> None:
    tok = gguf_tokenizer(tokenizer_gguf)
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_tokenize_command_writes_documents_with_separators(
    tokenizer_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("hello world")
    b.write_text("the 42")
    out = tmp_path / "tokens.npy"
    code = pd_train(
        ["tokenize", str(a), str(b), "--checkpoint", str(tokenizer_gguf), "--out", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    tokens = np.load(out)
    tok = gguf_tokenizer(tokenizer_gguf)
    want = [*tok.encode("hello world").ids, 0, *tok.encode("the 42").ids, 0]
    assert tokens.dtype == np.uint16
    assert tokens.tolist() == want
    assert f"wrote {len(want)} uint16 tokens from 2 file(s)" in capsys.readouterr().out


def test_tokenize_errors_come_before_any_progress_bar(
    tokenizer_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad argument (a missing file, a file that is not UTF-8, a separator not in the
    vocabulary) is reported alone: no empty progress bar is printed above the error."""
    good = tmp_path / "good.txt"
    good.write_text("hello")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    out = tmp_path / "t.npy"
    cases = [
        ([str(tmp_path / "missing.txt")], [], "TEXT_FILES: ["),
        ([str(good), str(latin1)], [], "is not UTF-8 text"),
        ([str(good)], ["--separator", "<nope>"], "--separator: '<nope>' is not a token"),
    ]
    for files, extra, message in cases:
        argv = ["tokenize", *files, "--checkpoint", str(tokenizer_gguf), "--out", str(out)]
        assert pd_train([*argv, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err
        assert "tokenize:" not in err and "|" not in err, err
        assert not out.exists()
    # A good run does show the bar.
    argv = ["tokenize", str(good), "--checkpoint", str(tokenizer_gguf), "--out", str(out)]
    assert pd_train(argv) == 0
    assert "tokenize: 100%|" in capsys.readouterr().err


def test_tokenize_out_that_cannot_be_written_is_refused_before_tokenizing(
    tokenizer_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "a.txt"
    text.write_text("hello")
    out = Path("/proc/pd-output-check/t.npy")  # /proc takes no new entries, even from root
    argv = ["tokenize", str(text), "--checkpoint", str(tokenizer_gguf), "--out", str(out)]
    assert pd_train(argv) == 2
    err = capsys.readouterr().err
    assert "--out: cannot create '/proc/pd-output-check': '/proc' is not writable" in err, err
    assert "tokenize:" not in err and "Traceback" not in err, err


def test_tokenize_errors_name_the_argument(
    tokenizer_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "a.txt"
    text.write_text("hello")
    out = tmp_path / "t.npy"
    assert (
        pd_train(
            [
                "tokenize",
                str(text),
                "--checkpoint",
                str(tokenizer_gguf),
                "--out",
                str(out),
                "--separator",
                "<nope>",
            ]
        )
        == 2
    )
    assert "--separator: '<nope>' is not a token" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(TokenizerError, match="TEXT_FILES"):
        tokenize_files([tmp_path / "missing.txt"], checkpoint=tokenizer_gguf, out=out)
    no_tokenizer = write_gguf(tmp_path / "plain.gguf", hf_weights(CONFIG))
    with pytest.raises(TokenizerError, match=r"no metadata key 'tokenizer\.ggml\.model'"):
        gguf_tokenizer(no_tokenizer)
