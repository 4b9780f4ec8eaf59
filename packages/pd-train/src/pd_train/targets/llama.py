"""The Llama target: :mod:`pd_train.models.llama` behind the :class:`~pd_train.targets.Target`
interface (seven kinds per decoder layer, KL on logits)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp

from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig
from pd_train.targets.base import Linear

__all__ = ["LlamaTarget"]


@attrs.frozen(kw_only=True)
class LlamaTarget:
    """A Llama decoder: sites ``layers.{i}.self_attn.{q,k,v,o}_proj`` and
    ``layers.{i}.mlp.{gate,up,down}_proj``; inputs tokens [B, T]; output logits [B, T, vocab]."""

    config: LlamaConfig

    @property
    def kinds(self) -> tuple[str, ...]:
        return llama.KINDS

    @property
    def n_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def output_loss(self) -> Literal["kl", "mse"]:
        return "kl"

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        return self.config.site_shapes()

    def init_params(self, *, key: jax.Array, dtype: Any = jnp.float32) -> Any:
        return llama.init_params(self.config, key=key, dtype=dtype)

    def start(self, params: Any, inputs: jax.Array, dtype: Any) -> tuple[jax.Array, Any]:
        h = llama.embed(params, inputs, dtype)
        return h, llama.rope_cos_sin(self.config, inputs.shape[1], dtype)

    def layer(
        self,
        h: jax.Array,
        layer_params: Mapping[str, jax.Array],
        ctx: Any,
        linear: Linear | None = None,
    ) -> jax.Array:
        cos, sin = ctx
        if linear is None:
            return llama.decoder_layer(h, layer_params, cos, sin, self.config)
        return llama.decoder_layer(h, layer_params, cos, sin, self.config, linear)

    def finish(self, params: Any, h: jax.Array) -> jax.Array:
        return llama.unembed(params, h, self.config)
