"""Targets: the models pd decomposes, behind one interface (:class:`Target`).

``LlamaTarget`` (Llama decoders, from a ``LlamaConfig``); ``TMSTarget`` (toy models of
superposition). Adding an architecture is one module with a class that implements
:class:`Target`, plus its loader.
"""

from pd_train.targets.base import Linear, Target, as_target
from pd_train.targets.llama import LlamaTarget

__all__ = ["Linear", "LlamaTarget", "Target", "as_target"]
