"""Targets: the models pd decomposes, behind one interface (:class:`Target`).

``LlamaTarget`` (Llama decoders, from a ``LlamaConfig``), ``TMSTarget`` (toy models of
superposition), ``ResidMLPTarget`` (the residual MLP toy). Adding an architecture is one module
with a class that implements :class:`Target`, plus its loader. The toy runner and the
ground-truth metrics live in :mod:`pd_train.targets.toys` (it imports the step, so it is not
imported here).
"""

from pd_train.targets.base import Linear, Target, as_target
from pd_train.targets.llama import LlamaTarget
from pd_train.targets.resid_mlp import ResidMLPConfig, ResidMLPTarget
from pd_train.targets.tms import TMSConfig, TMSTarget

__all__ = [
    "Linear",
    "LlamaTarget",
    "ResidMLPConfig",
    "ResidMLPTarget",
    "TMSConfig",
    "TMSTarget",
    "Target",
    "as_target",
]
