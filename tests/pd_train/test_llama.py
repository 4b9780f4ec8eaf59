"""The JAX Llama against an independent float64 numpy port of Hugging Face's LlamaForCausalLM."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig, RopeScaling


def _np_inv_freq(config: LlamaConfig) -> np.ndarray:
    """Hugging Face's ``_compute_llama3_parameters``, element by element, in float64."""
    dim = config.resolved_head_dim
    base = [1.0 / config.rope_theta ** (i / dim) for i in range(0, dim, 2)]
    s = config.rope_scaling
    if s is None:
        return np.array(base)
    out = []
    low_wl = s.original_max_position_embeddings / s.low_freq_factor
    high_wl = s.original_max_position_embeddings / s.high_freq_factor
    for f in base:
        wavelen = 2 * math.pi / f
        if wavelen < high_wl:
            out.append(f)
        elif wavelen > low_wl:
            out.append(f / s.factor)
        else:
            smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
                s.high_freq_factor - s.low_freq_factor
            )
            out.append((1 - smooth) * f / s.factor + smooth * f)
    return np.array(out)


def _np_forward(params: dict, tokens: np.ndarray, config: LlamaConfig) -> np.ndarray:
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    hd = config.resolved_head_dim
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    b, t = tokens.shape

    def norm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + config.rms_norm_eps)

    freqs = np.arange(t)[:, None] * _np_inv_freq(config)[None, :]
    cos, sin = (
        np.cos(np.concatenate([freqs, freqs], -1)),
        np.sin(np.concatenate([freqs, freqs], -1)),
    )

    def rope(x: np.ndarray) -> np.ndarray:  # x [B, heads, T, hd]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    h = p["embed_tokens"][tokens]
    for i in range(config.num_hidden_layers):
        lp = {k: v[i] for k, v in p["layers"].items()}
        x = norm(h, lp["input_layernorm"])
        q = (x @ lp["q_proj"]).reshape(b, t, heads, hd).transpose(0, 2, 1, 3)
        k = (x @ lp["k_proj"]).reshape(b, t, kv, hd).transpose(0, 2, 1, 3)
        v = (x @ lp["v_proj"]).reshape(b, t, kv, hd).transpose(0, 2, 1, 3)
        q, k = rope(q), rope(k)
        k = np.repeat(k, heads // kv, axis=1)  # HF repeat_kv: each kv head n_rep times in a row
        v = np.repeat(v, heads // kv, axis=1)
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, heads * hd)
        h = h + attn @ lp["o_proj"]
        x = norm(h, lp["post_attention_layernorm"])
        gate = x @ lp["gate_proj"]
        h = h + (gate / (1 + np.exp(-gate)) * (x @ lp["up_proj"])) @ lp["down_proj"]
    head = p["embed_tokens"].T if config.tie_word_embeddings else p["lm_head"]
    return norm(h, p["norm"]) @ head


# head_dim 32 and original context 64: wavelengths 2π·θ^(i/32) span below 16, 16..64 and above 64.
BAND = RopeScaling(
    factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
)


def test_rope_inv_freq_matches_the_llama3_formula_in_every_band() -> None:
    config = LlamaConfig(
        vocab_size=8,
        hidden_size=64,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        rope_theta=10_000.0,
        rope_scaling=BAND,
    )
    base = _np_inv_freq(attrs_evolve_no_scaling(config))
    wavelen = 2 * math.pi / base
    high = wavelen < 64 / 4
    low = wavelen > 64 / 1
    medium = ~high & ~low
    assert high.sum() > 0 and low.sum() > 0 and medium.sum() > 0
    got = llama.rope_inv_freq(config)
    want = _np_inv_freq(config)
    np.testing.assert_allclose(got, want, rtol=2e-6)
    # The band really is smoothed: strictly between the unscaled and fully scaled frequencies.
    assert np.all(got[medium] < base[medium]) and np.all(got[medium] > base[medium] / 8)
    np.testing.assert_allclose(got[high], base[high], rtol=2e-6)
    np.testing.assert_allclose(got[low], base[low] / 8, rtol=2e-6)


def attrs_evolve_no_scaling(config: LlamaConfig) -> LlamaConfig:
    import attrs

    return attrs.evolve(config, rope_scaling=None)


CASES = {
    "gqa_untied_scaled": LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        rms_norm_eps=1e-5,
        rope_theta=10_000.0,
        rope_scaling=BAND,
        tie_word_embeddings=False,
    ),
    "mha_tied_unscaled_explicit_head_dim": LlamaConfig(
        vocab_size=61,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,  # heads * head_dim != hidden_size
        rms_norm_eps=1e-6,
        rope_theta=500_000.0,
        tie_word_embeddings=True,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_matches_numpy_reference(name: str) -> None:
    config = CASES[name]
    params = llama.init_params(config, key=jax.random.key(0))
    # Non-trivial norm weights, so a misplaced norm scale would show.
    rng = np.random.default_rng(0)
    params["layers"]["input_layernorm"] = jnp.asarray(
        1 + 0.1 * rng.standard_normal(params["layers"]["input_layernorm"].shape), jnp.float32
    )
    params["norm"] = jnp.asarray(1 + 0.1 * rng.standard_normal(params["norm"].shape), jnp.float32)
    assert ("lm_head" in params) != config.tie_word_embeddings
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (2, 40)), jnp.int32)
    got = jax.jit(llama.forward, static_argnums=2)(params, tokens, config)
    want = _np_forward(params, np.asarray(tokens), config)
    assert got.shape == (2, 40, config.vocab_size)
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-4, rtol=2e-4)


def test_forward_is_causal_and_bf16_follows_fp32() -> None:
    config = CASES["gqa_untied_scaled"]
    params = llama.init_params(config, key=jax.random.key(0))
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (1, 16))
    changed = tokens.copy()
    changed[0, 10] = (tokens[0, 10] + 1) % config.vocab_size
    fwd = jax.jit(llama.forward, static_argnums=2)
    a = fwd(params, jnp.asarray(tokens), config)
    b = fwd(params, jnp.asarray(changed), config)
    np.testing.assert_array_equal(np.asarray(a[:, :10]), np.asarray(b[:, :10]))
    assert not np.allclose(np.asarray(a[:, 10:]), np.asarray(b[:, 10:]))
    bf16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
    low = fwd(bf16, jnp.asarray(tokens), config)
    assert low.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(low, np.float32), np.asarray(a), atol=0.15, rtol=0.1)


def test_init_params_shapes_follow_the_contract() -> None:
    config = CASES["gqa_untied_scaled"]
    p = llama.init_params(config, key=jax.random.key(0), dtype=jnp.bfloat16)
    layers = p["layers"]
    assert layers["q_proj"].shape == (3, 64, 4 * 32)
    assert layers["k_proj"].shape == (3, 64, 2 * 32)
    assert layers["o_proj"].shape == (3, 4 * 32, 64)
    assert layers["down_proj"].shape == (3, 96, 64)
    assert layers["input_layernorm"].shape == (3, 64)
    assert p["lm_head"].shape == (64, 97) and p["embed_tokens"].shape == (97, 64)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(p))
