"""Target models.

``LlamaForCausalLM`` (the Flax module) is imported on first use, so importing the config does not
import JAX or Flax.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pd_train.models.llama_config import LlamaConfig, RopeScaling

if TYPE_CHECKING:
    from pd_train.models.flax_llama import LlamaForCausalLM
    from pd_train.models.gguf import gguf_llama_config, load_gguf_checkpoint

__all__ = [
    "LlamaConfig",
    "LlamaForCausalLM",
    "RopeScaling",
    "gguf_llama_config",
    "load_gguf_checkpoint",
]


def __getattr__(name: str) -> Any:
    if name == "LlamaForCausalLM":
        from pd_train.models.flax_llama import LlamaForCausalLM

        return LlamaForCausalLM
    if name in ("gguf_llama_config", "load_gguf_checkpoint"):  # GGUF checkpoints (import jax)
        from pd_train.models import gguf

        return getattr(gguf, name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
