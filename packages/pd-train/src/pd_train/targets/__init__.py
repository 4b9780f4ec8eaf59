"""Targets: the models pd decomposes, behind one interface (:class:`Target`), and the registry of
target kinds (:mod:`pd_train.targets.registry`) that a run config's ``target.type`` names.

Registered kinds: ``llama`` (:mod:`~pd_train.targets.llama`; the default), ``qwen2`` and
``qwen3`` (:mod:`~pd_train.targets.qwen`), ``gpt2`` (:mod:`~pd_train.targets.gpt2`). The toy
targets ``TMSTarget`` and ``ResidMLPTarget`` implement :class:`Target` too; their runner and
ground-truth metrics live in :mod:`pd_train.targets.toys` (it imports the step, so it is not
imported here). Adding an architecture is one module with a class that implements
:class:`Target` and a :class:`TargetKind` registered with :func:`register_target`, listed in
``BUILTIN_KIND_MODULES`` (:mod:`pd_train.targets.registry`).
"""

from typing import Any

from pd_train.targets.registry import (
    BUILTIN_KIND_MODULES,
    TargetConfig,
    TargetKind,
    kind_of,
    register_target,
    target_kind,
    target_kinds,
)

# The rest import JAX: loaded on first use, so reading a config stays light.
_LAZY = {
    "Linear": "pd_train.targets.base",
    "Target": "pd_train.targets.base",
    "as_target": "pd_train.targets.base",
    "GPT2Target": "pd_train.targets.gpt2",
    "GPT2TargetConfig": "pd_train.targets.gpt2",
    "LlamaTarget": "pd_train.targets.llama",
    "LlamaTargetConfig": "pd_train.targets.llama",
    "Qwen2TargetConfig": "pd_train.targets.qwen",
    "Qwen3TargetConfig": "pd_train.targets.qwen",
    "ResidMLPConfig": "pd_train.targets.resid_mlp",
    "ResidMLPTarget": "pd_train.targets.resid_mlp",
    "TMSConfig": "pd_train.targets.tms",
    "TMSTarget": "pd_train.targets.tms",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = [
    "BUILTIN_KIND_MODULES",
    "GPT2Target",
    "GPT2TargetConfig",
    "Linear",
    "LlamaTarget",
    "LlamaTargetConfig",
    "Qwen2TargetConfig",
    "Qwen3TargetConfig",
    "ResidMLPConfig",
    "ResidMLPTarget",
    "TMSConfig",
    "TMSTarget",
    "Target",
    "TargetConfig",
    "TargetKind",
    "as_target",
    "kind_of",
    "register_target",
    "target_kind",
    "target_kinds",
]
