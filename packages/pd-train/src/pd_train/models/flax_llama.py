"""The Llama target as a Flax (linen) module over pd-train's stacked parameter dict.

The module owns no math: it declares the parameters of :mod:`pd_train.models.llama` under the same
names, shapes and layout, and its ``__call__`` runs that module's functions. So::

    model = LlamaForCausalLM(config)
    params = model.init(jax.random.key(0), tokens)["params"]   # == llama.init_params' tree
    model.apply({"params": params}, tokens)                    # == llama.forward(params, ...)

and ``params`` is a target the :class:`~pd_train.train.Trainer` takes as it is.

Why linen and not nnx (flax 0.12): linen's variables are a plain nested dict of arrays, which is
exactly pd-train's target tree, so ``init``/``apply`` need no conversion; nnx keeps parameters in
``nnx.Param`` objects on a mutable module and would need ``nnx.split``/``nnx.merge`` (and
wrapper types in the state) on every hand-over to the trainer and the checkpoint loader.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig

__all__ = ["LlamaForCausalLM"]


def _normal(std: float) -> nn.initializers.Initializer:
    """N(0, std²), drawn in fp32 and cast, as :func:`llama.init_params` draws."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return (jax.random.normal(key, shape, jnp.float32) * std).astype(dtype)

    return init


class _StackedLayers(nn.Module):
    """Declares ``params["layers"]``: norms [L, hidden] and each kind [L, d_in, d_out]."""

    config: LlamaConfig
    param_dtype: Any

    @nn.compact
    def __call__(self) -> dict[str, jax.Array]:
        n, d = self.config.num_hidden_layers, self.config.hidden_size
        layers = {
            name: self.param(name, nn.initializers.ones, (n, d), self.param_dtype)
            for name in ("input_layernorm", "post_attention_layernorm")
        }
        for kind, (d_in, d_out) in self.config.site_shapes().items():
            layers[kind] = self.param(kind, _normal(d_in**-0.5), (n, d_in, d_out), self.param_dtype)
        return layers


class LlamaForCausalLM(nn.Module):
    """Hugging Face's LlamaForCausalLM semantics, computed by :mod:`pd_train.models.llama`.

    Parameters (``variables["params"]``), as :func:`llama.init_params` lays them out::

        embed_tokens [vocab, hidden] ~ N(0, 1)     norm [hidden] = 1
        lm_head [hidden, vocab] ~ N(0, 1/hidden)   (only when not tie_word_embeddings)
        layers: input_layernorm, post_attention_layernorm [L, hidden] = 1,
                q_proj ... down_proj [L, d_in, d_out] ~ N(0, 1/d_in)   (x @ W)

    Attributes:
        config: the architecture.
        dtype: computation dtype; None computes in the parameters' dtype (as
            :func:`llama.forward` does), otherwise parameters are cast to it first.
        param_dtype: dtype of the parameters ``init`` creates (``llama.init_params``' ``dtype``).
        linear: optional ``linear(kind, x, w) -> y`` (x [..., d_in], w [d_in, d_out]) replacing
            the seven per-layer matmuls, as the decomposition substitutes its component path;
            None is the plain ``x @ w``.

    ``jax.eval_shape(model.init, key, tokens)`` gives the abstract tree without allocating.
    """

    config: LlamaConfig
    dtype: Any = None
    param_dtype: Any = jnp.float32
    linear: llama.Linear | None = None

    def setup(self) -> None:
        config, dt = self.config, self.param_dtype
        d = config.hidden_size
        self.embed_tokens = self.param("embed_tokens", _normal(1.0), (config.vocab_size, d), dt)
        self.norm = self.param("norm", nn.initializers.ones, (d,), dt)
        self.layers = _StackedLayers(config, dt)
        if not config.tie_word_embeddings:
            self.lm_head = self.param("lm_head", _normal(d**-0.5), (d, config.vocab_size), dt)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """tokens [B, T] int -> logits [B, T, vocab], positions 0..T-1, causal."""
        params = self.param_tree()
        if self.dtype is not None:
            params = jax.tree_util.tree_map(lambda a: a.astype(self.dtype), params)
        return llama.forward(params, tokens, self.config, linear=self.linear)

    def param_tree(self) -> dict[str, Any]:
        """The parameters as one dict (``init`` creates them in ``param_dtype``).
        ``model.init(key, method="param_tree")`` initializes without a forward (no tokens)."""
        params: dict[str, Any] = {
            "embed_tokens": self.embed_tokens,
            "norm": self.norm,
            "layers": self.layers(),
        }
        if not self.config.tie_word_embeddings:
            params["lm_head"] = self.lm_head
        return params
