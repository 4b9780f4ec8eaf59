"""The GPT-2 target (:mod:`pd_train.models.gpt2`, Hugging Face ``GPT2LMHeadModel``) behind the
:class:`~pd_train.targets.Target` interface, and its registered kind ``gpt2``.

Six sites per block, named as every pd LM target names them: ``layers.{i}.self_attn.{q,k,v}_proj``
(the fused ``attn.c_attn`` split into its query, key and value columns; see
:mod:`pd_train.models.gpt2` for why), ``layers.{i}.self_attn.o_proj`` (``attn.c_proj``),
``layers.{i}.mlp.up_proj`` (``mlp.c_fc``) and ``layers.{i}.mlp.down_proj`` (``mlp.c_proj``).
Inputs tokens [B, T]; output logits [B, T, vocab] compared by KL.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import attrs
import jax

from pd_train.models import gpt2, hf
from pd_train.models.gpt2 import GPT2Config
from pd_train.targets._hf import (
    HFDecoderTarget,
    HFTargetConfig,
    hf_architecture,
    hf_shardings,
)
from pd_train.targets.base import Linear, Lookup
from pd_train.targets.registry import TargetKind, register_target

__all__ = ["GPT2", "GPT2_PRESETS", "GPT2Target", "GPT2TargetConfig", "gpt2_census"]


@attrs.frozen(kw_only=True)
class GPT2Target(HFDecoderTarget):
    """A GPT-2 decoder (see the module docstring for its sites; what every Hugging Face
    decoder shares: :class:`~pd_train.targets._hf.HFDecoderTarget`)."""

    config: GPT2Config
    module: ClassVar[Any] = gpt2

    def start(
        self, params: Any, inputs: jax.Array, dtype: Any, lookup: Lookup | None = None
    ) -> tuple[jax.Array, Any]:
        return self.embed(params, inputs, dtype, lookup), None

    def layer(
        self,
        h: jax.Array,
        layer_params: Mapping[str, jax.Array],
        ctx: Any,
        linear: Linear | None = None,
    ) -> jax.Array:
        del ctx
        if linear is None:
            return gpt2.decoder_layer(h, layer_params, self.config)
        return gpt2.decoder_layer(h, layer_params, self.config, linear)


@attrs.frozen(kw_only=True)
class GPT2TargetConfig(HFTargetConfig):
    """``target: {type: gpt2, checkpoint: DIR}``: a Hugging Face ``GPT2LMHeadModel`` checkpoint
    (or ``architecture``: a mapping of GPT2Config fields, for random weights)."""

    type: Literal["gpt2"] = "gpt2"


#: ``target.architecture: gpt2``: GPT-2 small (124M), as openai-community/gpt2's config.json.
GPT2_PRESETS = {
    "gpt2": lambda: GPT2Config(
        vocab_size=50_257, n_positions=1024, n_embd=768, n_layer=12, n_head=12
    ),
}


def _architecture(config: GPT2TargetConfig, *, base: Path | None) -> GPT2Config:
    return hf_architecture(  # type: ignore[no-any-return]
        config, base=base, from_hf=hf.gpt2_config_from_hf, presets=GPT2_PRESETS
    )


def _load(config: GPT2TargetConfig, checkpoint: Path, *, shardings: Any, dtype: Any) -> Any:
    return hf.load_gpt2_checkpoint(
        checkpoint, shardings=shardings, dtype=dtype, strict=config.strict
    )[1]


def gpt2_census(model: GPT2Config, pd: Any, *, seq_len: int) -> Any:
    """The FLOP census of one step (:func:`pd_train.flops.step_census`): GPT-2's six kinds
    counted as Llama's are (biases, LayerNorms and the position table are elementwise)."""
    from pd_train.flops import step_census

    return step_census(model, pd, seq_len=seq_len)


GPT2 = register_target(
    TargetKind(
        name="gpt2",
        config=GPT2TargetConfig,
        architecture=_architecture,
        load=_load,
        owns=lambda model: isinstance(model, GPT2Config),
        target=lambda model: GPT2Target(config=model),
        shardings=lambda model, layout, params: hf_shardings(
            layout, params, hidden_size=model.n_embd
        ),
        census=gpt2_census,
    )
)
