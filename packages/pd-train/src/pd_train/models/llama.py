"""A Llama-family target in plain JAX: a nested dict of arrays and pure functions.

Parameters use Hugging Face's names, weights right-multiplied (``x @ W``, [d_in, d_out]) and
layers stacked on a leading axis, so the layer loop is one ``lax.scan``::

    {"embed_tokens": [vocab, hidden], "lm_head": [hidden, vocab] (absent when tied),
     "norm": [hidden],
     "layers": {"input_layernorm": [L, hidden], "post_attention_layernorm": [L, hidden],
                "q_proj": [L, hidden, heads*hd], "k_proj": [L, hidden, kv*hd],
                "v_proj": [L, hidden, kv*hd], "o_proj": [L, heads*hd, hidden],
                "gate_proj": [L, hidden, ff], "up_proj": [L, hidden, ff],
                "down_proj": [L, ff, hidden],
                # with qkv_bias (Qwen2): "q_bias" [L, heads*hd], "k_bias"/"v_bias" [L, kv*hd]
                # with qk_norm (Qwen3): "q_norm"/"k_norm" [L, hd]
                }}

Numerics follow ``transformers``' LlamaForCausalLM: RMSNorm computes its variance in fp32 and casts
back before the weight; RoPE uses the rotate-half convention (not interleaved) with cos/sin
computed in fp32; Llama-3 RoPE scaling smooths the band between the low- and high-frequency
cut-offs derived from ``original_max_position_embeddings``; attention softmax runs in fp32.

The layer body takes a ``linear(kind, x, w)`` callback for its seven matmuls; the decomposition
substitutes its component path there and reuses everything else.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.models.llama_config import LlamaConfig

__all__ = [
    "KINDS",
    "Linear",
    "apply_rope",
    "attention",
    "attention_probs",
    "decoder_layer",
    "decoder_layer_with_attention",
    "embed",
    "forward",
    "init_params",
    "rms_norm",
    "rope_cos_sin",
    "rope_inv_freq",
    "unembed",
]

#: The seven matmul kinds of a decoder layer, in canonical order.
KINDS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)

Params = dict[str, Any]
#: ``linear(kind, x, w) -> y`` with x [..., d_in], w [d_in, d_out], y [..., d_out].
Linear = Callable[[str, jax.Array, jax.Array], jax.Array]


def _frozen_linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
    del kind
    return x @ w.astype(x.dtype)


def init_params(config: LlamaConfig, *, key: jax.Array, dtype: Any = jnp.float32) -> Params:
    """Random parameters for tests and probes: weights N(0, 1/d_in), norms 1, embeddings N(0, 1).

    One jit; works under ``jax.eval_shape`` for abstract shapes.
    """
    return _init_params(config, key, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_params(config: LlamaConfig, key: jax.Array, dtype: Any) -> Params:
    layers_n = config.num_hidden_layers
    d = config.hidden_size
    shapes = config.site_shapes()
    # (name, shape, std); drawn as one flat normal vector: one RNG op compiles far faster on CPU
    # than one per array, and these values only need to be random, not stable across configs.
    draws: list[tuple[str, tuple[int, ...], float]] = [
        ("embed_tokens", (config.vocab_size, d), 1.0)
    ]
    draws += [(k, (layers_n, *shapes[k]), shapes[k][0] ** -0.5) for k in KINDS]
    if not config.tie_word_embeddings:
        draws.append(("lm_head", (d, config.vocab_size), d**-0.5))
    sizes = [math.prod(shape) for _, shape, _ in draws]
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    values: dict[str, jax.Array] = {}
    offset = 0
    for (name, shape, std), size in zip(draws, sizes, strict=True):
        values[name] = (flat[offset : offset + size].reshape(shape) * std).astype(dtype)
        offset += size
    layers: Params = {
        "input_layernorm": jnp.ones((layers_n, d), dtype),
        "post_attention_layernorm": jnp.ones((layers_n, d), dtype),
        **{k: values[k] for k in KINDS},
    }
    if config.qkv_bias:  # small non-zero biases, so a test sees them
        for k in ("q", "k", "v"):
            width = shapes[f"{k}_proj"][1]
            layers[f"{k}_bias"] = jnp.full((layers_n, width), 0.01, dtype)
    if config.qk_norm:
        for k in ("q", "k"):
            layers[f"{k}_norm"] = jnp.ones((layers_n, config.resolved_head_dim), dtype)
    params: Params = {
        "embed_tokens": values["embed_tokens"],
        "norm": jnp.ones((d,), dtype),
        "layers": layers,
    }
    if not config.tie_word_embeddings:
        params["lm_head"] = values["lm_head"]
    return params


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm as Hugging Face computes it: variance in fp32, cast back, then scale. [..., d]."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * normed.astype(x.dtype)


def rope_inv_freq(config: LlamaConfig) -> np.ndarray:
    """Inverse frequencies [head_dim // 2] in fp32, with Llama-3 scaling when configured (or
    divided by ``rope_freq_factors`` when given).

    Frequencies whose wavelength exceeds ``original_max_position_embeddings / low_freq_factor``
    are divided by ``factor``; those shorter than ``... / high_freq_factor`` are kept; the band in
    between interpolates linearly in ``original_max_position_embeddings / wavelength``.
    """
    dim = config.resolved_head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (1.0 / (np.float32(config.rope_theta) ** exponents)).astype(np.float32)
    if config.rope_freq_factors is not None:  # per-frequency divisors (a GGUF's rope_freqs)
        return (inv_freq / np.asarray(config.rope_freq_factors, np.float32)).astype(np.float32)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    old_context = float(scaling.original_max_position_embeddings)
    low_freq_wavelen = old_context / scaling.low_freq_factor
    high_freq_wavelen = old_context / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_context / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(config: LlamaConfig, seq_len: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
    """cos, sin [seq_len, head_dim] for positions 0..seq_len-1 (fp32 math, cast to ``dtype``)."""
    inv_freq = jnp.asarray(rope_inv_freq(config))
    positions = jnp.arange(seq_len, dtype=jnp.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE. x [B, T, heads, head_dim]; cos/sin [T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def attention_probs(q: jax.Array, k: jax.Array) -> jax.Array:
    """Causal grouped-query attention probabilities in fp32. q [B, T, H, hd]; k [B, T, KV, hd]
    -> [B, KV, H // KV, T_query, T_key] (query head h is group ``h // (H // KV)``, member
    ``h % (H // KV)``); future keys get probability exactly 0."""
    b, t, heads, hd = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(b, t, kv_heads, heads // kv_heads, hd)
    scores = jnp.einsum("bqgrd,bkgd->bgrqk", q, k).astype(jnp.float32) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores, axis=-1)


def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal grouped-query attention. q [B, T, H, hd]; k, v [B, T, KV, hd] -> [B, T, H, hd].

    Query head h reads key/value head ``h // (H // KV)``, as Hugging Face's ``repeat_kv`` does.
    """
    return _attend(attention_probs(q, k), v, q.shape)


def _attend(probs: jax.Array, v: jax.Array, q_shape: tuple[int, ...]) -> jax.Array:
    out = jnp.einsum("bgrqk,bkgd->bqgrd", probs.astype(v.dtype), v)
    return out.reshape(q_shape)


def decoder_layer(
    h: jax.Array,
    layer: Mapping[str, jax.Array],
    cos: jax.Array,
    sin: jax.Array,
    config: LlamaConfig,
    linear: Linear = _frozen_linear,
) -> jax.Array:
    """One decoder layer on the residual stream h [B, T, hidden]; ``layer`` holds one layer's
    slice of ``params["layers"]``. Every matmul goes through ``linear(kind, x, layer[kind])``."""
    return _decoder_layer(h, layer, cos, sin, config, linear)[0]


def decoder_layer_with_attention(
    h: jax.Array,
    layer: Mapping[str, jax.Array],
    cos: jax.Array,
    sin: jax.Array,
    config: LlamaConfig,
    linear: Linear = _frozen_linear,
) -> tuple[jax.Array, jax.Array]:
    """:func:`decoder_layer` that also returns the layer's attention probabilities
    [B, heads, T_query, T_key] in fp32 (for evaluation; the training forwards never ask)."""
    h, probs = _decoder_layer(h, layer, cos, sin, config, linear)
    b, g, r, t, _ = probs.shape
    return h, probs.reshape(b, g * r, t, t)


def _decoder_layer(
    h: jax.Array,
    layer: Mapping[str, jax.Array],
    cos: jax.Array,
    sin: jax.Array,
    config: LlamaConfig,
    linear: Linear,
) -> tuple[jax.Array, jax.Array]:
    b, t, _ = h.shape
    hd = config.resolved_head_dim
    x = rms_norm(h, layer["input_layernorm"], config.rms_norm_eps)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    q = _projection(linear, "q", x, layer, config).reshape(b, t, heads, hd)
    k = _projection(linear, "k", x, layer, config).reshape(b, t, kv_heads, hd)
    v = _projection(linear, "v", x, layer, config).reshape(b, t, kv_heads, hd)
    if config.qk_norm:  # Qwen3: RMSNorm over each head's dims, before RoPE
        q = rms_norm(q, layer["q_norm"], config.rms_norm_eps)
        k = rms_norm(k, layer["k_norm"], config.rms_norm_eps)
    q = apply_rope(q, cos, sin)
    probs = attention_probs(q, apply_rope(k, cos, sin))
    attn = _attend(probs, v, q.shape)
    h = h + linear("o_proj", attn.reshape(b, t, -1), layer["o_proj"])
    x = rms_norm(h, layer["post_attention_layernorm"], config.rms_norm_eps)
    gated = jax.nn.silu(linear("gate_proj", x, layer["gate_proj"])) * linear(
        "up_proj", x, layer["up_proj"]
    )
    return h + linear("down_proj", gated, layer["down_proj"]), probs


def _projection(
    linear: Linear, name: str, x: jax.Array, layer: Mapping[str, jax.Array], config: LlamaConfig
) -> jax.Array:
    """``linear`` on the ``{name}_proj`` site, plus its frozen bias when the config has one
    (never decomposed: the site is the weight alone, as spd keeps biases)."""
    y = linear(f"{name}_proj", x, layer[f"{name}_proj"])
    if config.qkv_bias:
        y = y + layer[f"{name}_bias"].astype(y.dtype)
    return y


#: ``lookup(kind, tokens [B, T] int, table [vocab, d]) -> rows [B, T, d]``: the embedding's hook.
Lookup = Callable[[str, jax.Array, jax.Array], jax.Array]


def frozen_lookup(kind: str, tokens: jax.Array, table: jax.Array) -> jax.Array:
    del kind
    return jnp.take(table, tokens, axis=0)


def embed(
    params: Params, tokens: jax.Array, dtype: Any = None, lookup: Lookup = frozen_lookup
) -> jax.Array:
    """tokens [B, T] int -> residual stream [B, T, hidden] (in ``dtype``, default the table's);
    the row lookup goes through ``lookup("embed_tokens", tokens, table)``."""
    table = params["embed_tokens"]
    dtype = dtype or table.dtype
    return lookup("embed_tokens", tokens, table).astype(dtype)


def unembed(
    params: Params, h: jax.Array, config: LlamaConfig, linear: Linear = _frozen_linear
) -> jax.Array:
    """Final norm and LM head: h [B, T, hidden] -> logits [B, T, vocab] (in h's dtype); the
    head's matmul goes through ``linear("lm_head", x, head)``."""
    x = rms_norm(h, params["norm"], config.rms_norm_eps)
    head = params["embed_tokens"].T if config.tie_word_embeddings else params["lm_head"]
    return linear("lm_head", x, head)


def forward(
    params: Params, tokens: jax.Array, config: LlamaConfig, *, linear: Linear | None = None
) -> jax.Array:
    """The plain target: tokens [B, T] -> logits [B, T, vocab], in the parameters' dtype,
    positions 0..T-1, causal. Layers run under one ``lax.scan``.

    ``linear(kind, x, w)`` replaces each layer's seven matmuls (see :func:`decoder_layer`);
    None is the frozen ``x @ w``. The embedding and LM head never go through it.
    """
    layer_linear = _frozen_linear if linear is None else linear
    h = embed(params, tokens)
    cos, sin = rope_cos_sin(config, tokens.shape[1], h.dtype)

    def body(carry: jax.Array, layer: Mapping[str, jax.Array]) -> tuple[jax.Array, None]:
        return decoder_layer(carry, layer, cos, sin, config, layer_linear), None

    h, _ = jax.lax.scan(body, h, params["layers"])
    return unembed(params, h, config)
