"""Target models."""

from pd_train.models.llama_config import LlamaConfig, RopeScaling

__all__ = ["LlamaConfig", "RopeScaling"]
