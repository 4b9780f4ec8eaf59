"""Target models.

``LlamaForCausalLM`` (the Flax module) is imported on first use, so importing the config does not
import JAX or Flax.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pd_train.models.llama_config import LlamaConfig, RopeScaling

if TYPE_CHECKING:
    from pd_train.models.flax_llama import LlamaForCausalLM

__all__ = ["LlamaConfig", "LlamaForCausalLM", "RopeScaling"]


def __getattr__(name: str) -> Any:
    if name == "LlamaForCausalLM":
        from pd_train.models.flax_llama import LlamaForCausalLM

        return LlamaForCausalLM
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
