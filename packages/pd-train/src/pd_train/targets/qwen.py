"""The Qwen kinds: ``qwen2`` (Qwen2 and Qwen2.5, ``Qwen2ForCausalLM``) and ``qwen3``
(``Qwen3ForCausalLM``).

Both are Llama decoders with one difference each, so they run on the Llama target
(:class:`~pd_train.targets.llama.LlamaTarget`, the same seven sites per layer, named
``layers.{i}.self_attn.q_proj`` … ``layers.{i}.mlp.down_proj``) with a switch of
:class:`~pd_train.models.LlamaConfig`: Qwen2's q/k/v biases (``qkv_bias``; frozen, added after
the site: the decomposed site is the weight alone, as spd keeps biases) and Qwen3's RMSNorm over
each query and key head before RoPE (``qk_norm``). What each kind owns is its config.json
reading and its checkpoint's tensors (:mod:`pd_train.models.hf`); shardings and the FLOP census
are Llama's (biases and head norms are no matmuls).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from pd_train.models import hf
from pd_train.models.llama_config import LlamaConfig
from pd_train.targets._hf import HFTargetConfig, hf_architecture
from pd_train.targets.llama import LlamaTarget, llama_census, llama_shardings
from pd_train.targets.registry import TargetKind, register_target

__all__ = [
    "QWEN2",
    "QWEN2_PRESETS",
    "QWEN3",
    "QWEN3_PRESETS",
    "Qwen2TargetConfig",
    "Qwen3TargetConfig",
]


@attrs.frozen(kw_only=True)
class Qwen2TargetConfig(HFTargetConfig):
    """``target: {type: qwen2, checkpoint: DIR}``: a Hugging Face Qwen2 / Qwen2.5 checkpoint
    (or ``architecture``: a mapping of Qwen2Config fields, for random weights)."""

    type: Literal["qwen2"] = "qwen2"


@attrs.frozen(kw_only=True)
class Qwen3TargetConfig(HFTargetConfig):
    """``target: {type: qwen3, checkpoint: DIR}``: a Hugging Face Qwen3 checkpoint (or
    ``architecture``: a mapping of Qwen3Config fields, for random weights)."""

    type: Literal["qwen3"] = "qwen3"


#: ``target.architecture`` presets: the 7B/8B-class members, as their config.json describe them.
QWEN2_PRESETS: dict[str, Callable[[], LlamaConfig]] = {
    "qwen2_5_7b": lambda: LlamaConfig(
        vocab_size=152_064,
        hidden_size=3584,
        intermediate_size=18_944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=131_072,
        qkv_bias=True,
    ),
}
QWEN3_PRESETS: dict[str, Callable[[], LlamaConfig]] = {
    "qwen3_8b": lambda: LlamaConfig(
        vocab_size=151_936,
        hidden_size=4096,
        intermediate_size=12_288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=40_960,
        qk_norm=True,
    ),
}


def _kind(
    name: str,
    config: type,
    from_hf: Callable[..., LlamaConfig],
    loader: Callable[..., tuple[LlamaConfig, Any]],
    owns: Callable[[Any], bool],
    presets: Mapping[str, Callable[[], LlamaConfig]],
) -> TargetKind:
    def architecture(target: HFTargetConfig, *, base: Path | None) -> LlamaConfig:
        return hf_architecture(target, base=base, from_hf=from_hf, presets=presets)  # type: ignore[no-any-return]

    def load(target: HFTargetConfig, checkpoint: Path, *, shardings: Any, dtype: Any) -> Any:
        return loader(checkpoint, shardings=shardings, dtype=dtype, strict=target.strict)[1]

    return TargetKind(
        name=name,
        config=config,
        architecture=architecture,
        load=load,
        owns=owns,
        target=lambda model: LlamaTarget(config=model),
        shardings=llama_shardings,
        census=llama_census,
    )


QWEN2 = register_target(
    _kind(
        "qwen2",
        Qwen2TargetConfig,
        hf.qwen2_config_from_hf,
        hf.load_qwen2_checkpoint,
        lambda m: isinstance(m, LlamaConfig) and m.qkv_bias and not m.qk_norm,
        QWEN2_PRESETS,
    )
)
QWEN3 = register_target(
    _kind(
        "qwen3",
        Qwen3TargetConfig,
        hf.qwen3_config_from_hf,
        hf.load_qwen3_checkpoint,
        lambda m: isinstance(m, LlamaConfig) and m.qk_norm,
        QWEN3_PRESETS,
    )
)
