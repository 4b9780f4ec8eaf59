"""A GPT-2 target in plain JAX (Hugging Face ``GPT2LMHeadModel``): a nested dict and pure functions.

Parameters, weights right-multiplied (``x @ W``, [d_in, d_out]: Hugging Face's ``Conv1D``
already stores them so, no transpose) and layers stacked on a leading axis::

    {"embed_tokens": [vocab, d] (wte), "embed_positions": [n_positions, d] (wpe),
     "norm": [d], "norm_bias": [d] (ln_f), "lm_head": [d, vocab] (absent when tied, the default),
     "layers": {"input_layernorm", "input_layernorm_bias",                 [L, d]  (ln_1)
                "post_attention_layernorm", "post_attention_layernorm_bias", [L, d]  (ln_2)
                "q_proj", "k_proj", "v_proj": [L, d, d],  "q_bias", "k_bias", "v_bias": [L, d]
                "o_proj": [L, d, d], "o_bias": [L, d]                          (attn.c_proj)
                "up_proj": [L, d, ff], "up_bias": [L, ff]                      (mlp.c_fc)
                "down_proj": [L, ff, d], "down_bias": [L, d]}}                 (mlp.c_proj)

**The fused ``c_attn`` is split into three sites**, ``q_proj``, ``k_proj`` and ``v_proj``: its
output columns are exactly ``[q | k | v]`` (transformers splits them the same way right after
the matmul), so the split changes no value, and it gives GPT-2 the sites every other pd target
has: queries, keys and values are different mechanisms (a component that writes keys is not one
that writes values), the importance and recon terms see them apart as for Llama, and the CI
functions, recon plans, FLOP census and analysis need no GPT-2 case. Decomposing ``c_attn`` as
one [d, 3d] site would force one C and one component budget on three matrices of different
roles. Kinds keep Llama's names: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` (``attn.c_proj``),
``up_proj`` (``mlp.c_fc``) and ``down_proj`` (``mlp.c_proj``), so the sites are
``layers.{i}.self_attn.q_proj`` … ``layers.{i}.mlp.down_proj`` and one pattern speaks of the
same role in every family. Biases stay frozen (added after the site, as spd keeps them).

Numerics follow transformers: LayerNorm in fp32 with biased variance (``eps`` =
``layer_norm_epsilon``), scores scaled by 1/sqrt(head_dim), causal softmax in fp32, the MLP's
GELU the tanh approximation (``gelu_new``/``gelu_pytorch_tanh``) or exact (``gelu``).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp

from pd_train.config.io import FieldValueError
from pd_train.models.llama import Linear, Lookup, attention, frozen_lookup

__all__ = ["KINDS", "GPT2Config", "decoder_layer", "embed", "forward", "init_params", "unembed"]

#: The six matmul kinds of a GPT-2 block, in canonical order (a subset of Llama's names).
KINDS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")

Params = dict[str, Any]


def _positive_int(_instance: Any, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise FieldValueError(attribute.name, f"got {value!r}; must be an int > 0")


def _positive_float(_instance: Any, attribute: Any, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0 < float(value) < math.inf
    ):
        raise FieldValueError(attribute.name, f"got {value!r}; must be a finite number > 0")


def _bool(_instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, bool):
        raise FieldValueError(attribute.name, f"got {value!r}; must be true or false")


@attrs.frozen(kw_only=True)
class GPT2Config:
    """The fields of a Hugging Face ``GPT2Config`` that the forward pass reads (named as
    config.json names them). ``n_inner`` null: 4·n_embd. Checked on construction: sizes are
    ints > 0, ``n_head`` divides ``n_embd``, ``activation_function`` is one pd computes."""

    vocab_size: int = attrs.field(validator=_positive_int)
    n_positions: int = attrs.field(validator=_positive_int)
    n_embd: int = attrs.field(validator=_positive_int)
    n_layer: int = attrs.field(validator=_positive_int)
    n_head: int = attrs.field(validator=_positive_int)
    n_inner: int | None = attrs.field(default=None)
    layer_norm_epsilon: float = attrs.field(default=1e-5, validator=_positive_float)
    activation_function: Literal["gelu_new", "gelu_pytorch_tanh", "gelu"] = "gelu_new"
    tie_word_embeddings: bool = attrs.field(default=True, validator=_bool)

    def __attrs_post_init__(self) -> None:
        if self.n_inner is not None:
            _positive_int(self, attrs.fields(GPT2Config).n_inner, self.n_inner)
        if self.n_embd % self.n_head:
            msg = f"got {self.n_embd!r}; must be a multiple of n_head ({self.n_head!r})"
            raise FieldValueError("n_embd", msg)
        allowed = ("gelu_new", "gelu_pytorch_tanh", "gelu")
        if self.activation_function not in allowed:
            msg = f"got {self.activation_function!r}; must be one of {', '.join(allowed)}"
            raise FieldValueError("activation_function", msg)

    @property
    def inner(self) -> int:
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    # transformers' attribute_map aliases, which the run reads for every LM target
    @property
    def hidden_size(self) -> int:
        return self.n_embd

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layer

    @property
    def num_attention_heads(self) -> int:
        return self.n_head

    @property
    def max_position_embeddings(self) -> int:
        return self.n_positions

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        """``(d_in, d_out)`` of each kind, in canonical order."""
        d, f = self.n_embd, self.inner
        return {"q_proj": (d, d), "k_proj": (d, d), "v_proj": (d, d), "o_proj": (d, d),
                "up_proj": (d, f), "down_proj": (f, d)}  # fmt: skip


def _frozen_linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
    del kind
    return x @ w.astype(x.dtype)


def init_params(config: GPT2Config, *, key: jax.Array, dtype: Any = jnp.float32) -> Params:
    """Random parameters (tests, abstract shapes): weights N(0, 1/d_in), embeddings
    N(0, 0.02²)·50, biases 0.01, norm scales 1 and biases 0. One jit."""
    return _init_params(config, key, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_params(config: GPT2Config, key: jax.Array, dtype: Any) -> Params:
    L, d, v = config.n_layer, config.n_embd, config.vocab_size
    shapes = config.site_shapes()
    draws: list[tuple[str, tuple[int, ...], float]] = [
        ("embed_tokens", (v, d), 1.0),
        ("embed_positions", (config.n_positions, d), 0.1),
    ]
    draws += [(k, (L, *shapes[k]), shapes[k][0] ** -0.5) for k in KINDS]
    if not config.tie_word_embeddings:
        draws.append(("lm_head", (d, v), d**-0.5))
    keys = jax.random.split(key, len(draws))
    values = {
        name: (jax.random.normal(k, shape, jnp.float32) * std).astype(dtype)
        for k, (name, shape, std) in zip(keys, draws, strict=True)
    }
    layers: Params = {k: values[k] for k in KINDS}
    for k in KINDS:
        layers[k.removesuffix("_proj") + "_bias"] = jnp.full((L, shapes[k][1]), 0.01, dtype)
    for norm in ("input_layernorm", "post_attention_layernorm"):
        layers[norm] = jnp.ones((L, d), dtype)
        layers[norm + "_bias"] = jnp.zeros((L, d), dtype)
    params: Params = {
        "embed_tokens": values["embed_tokens"],
        "embed_positions": values["embed_positions"],
        "norm": jnp.ones((d,), dtype),
        "norm_bias": jnp.zeros((d,), dtype),
        "layers": layers,
    }
    if not config.tie_word_embeddings:
        params["lm_head"] = values["lm_head"]
    return params


def layer_norm(x: jax.Array, weight: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    """LayerNorm over the last axis in fp32 (biased variance), cast back, then scale and shift."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    normed = ((x32 - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype)
    return normed * weight.astype(x.dtype) + bias.astype(x.dtype)


def _gelu(x: jax.Array, kind: str) -> jax.Array:
    return jax.nn.gelu(x, approximate=kind != "gelu")


def decoder_layer(
    h: jax.Array,
    layer: Mapping[str, jax.Array],
    config: GPT2Config,
    linear: Linear = _frozen_linear,
) -> jax.Array:
    """One GPT-2 block on h [B, T, d]; every weight matmul goes through ``linear(kind, x, w)``
    and its frozen bias is added after it."""
    b, t, d = h.shape
    heads = config.n_head
    eps = config.layer_norm_epsilon

    def site(kind: str, x: jax.Array) -> jax.Array:
        bias = layer[kind.removesuffix("_proj") + "_bias"]
        return linear(kind, x, layer[kind]) + bias.astype(x.dtype)

    x = layer_norm(h, layer["input_layernorm"], layer["input_layernorm_bias"], eps)
    q, k, v = (site(kind, x).reshape(b, t, heads, d // heads) for kind in KINDS[:3])
    h = h + site("o_proj", attention(q, k, v).reshape(b, t, d))
    x = layer_norm(
        h, layer["post_attention_layernorm"], layer["post_attention_layernorm_bias"], eps
    )
    return h + site("down_proj", _gelu(site("up_proj", x), config.activation_function))


def embed(
    params: Params, tokens: jax.Array, dtype: Any = None, lookup: Lookup = frozen_lookup
) -> jax.Array:
    """tokens [B, T] -> wte[tokens] + wpe[0..T-1]: [B, T, d] (in ``dtype``, default wte's);
    the wte lookup goes through ``lookup("embed_tokens", tokens, wte)`` (positions never do)."""
    table = params["embed_tokens"]
    dtype = dtype or table.dtype
    positions = params["embed_positions"][: tokens.shape[1]]
    rows = lookup("embed_tokens", tokens, table)
    return (rows + positions[None]).astype(dtype)


def unembed(
    params: Params, h: jax.Array, config: GPT2Config, linear: Linear = _frozen_linear
) -> jax.Array:
    """ln_f and the LM head (wte transposed when tied): h [B, T, d] -> logits [B, T, vocab];
    the head's matmul goes through ``linear("lm_head", x, head)``."""
    x = layer_norm(h, params["norm"], params["norm_bias"], config.layer_norm_epsilon)
    head = params["embed_tokens"].T if config.tie_word_embeddings else params["lm_head"]
    return linear("lm_head", x, head)


def forward(
    params: Params, tokens: jax.Array, config: GPT2Config, *, linear: Linear | None = None
) -> jax.Array:
    """The plain target: tokens [B, T] -> logits [B, T, vocab], layers under one ``lax.scan``."""
    layer_linear = _frozen_linear if linear is None else linear
    h = embed(params, tokens)

    def body(carry: jax.Array, layer: Mapping[str, jax.Array]) -> tuple[jax.Array, None]:
        return decoder_layer(carry, layer, config, layer_linear), None

    h, _ = jax.lax.scan(body, h, params["layers"])
    return unembed(params, h, config)
