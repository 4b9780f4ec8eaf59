"""pd-train: stochastic parameter decomposition of Llama-family language models with JAX.

The step API (see ``pd_train.train`` for the key scheme and state layout)::

    trainer = Trainer(model_config, pd_config, runtime_config, mesh=mesh)
    state = trainer.init_state(key=init_key)
    state, warm = trainer.faithfulness_warmup(state, target)
    state, metrics = trainer.train_step(state, target, tokens, step_key(run_key, step))
    compiled = trainer.compile_step(batch_size=B, seq_len=T)   # AOT, nothing allocated

Names below are imported on first use, so ``import pd_train`` (and ``pd-train --version``)
does not import JAX.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from pd_train import _moved  # old module paths import, with a warning

_moved.install()

_EXPORTS = {
    "CIConfig": "pd_train.config.pd",
    "CIType": "pd_train.ci",
    "LossMetric": "pd_train.config.pd",
    "LossTerm": "pd_train.losses",
    "register_ci_type": "pd_train.ci",
    "register_loss_term": "pd_train.losses",
    "ChunkwiseSubsetRecon": "pd_train.config.pd",
    "Census": "pd_train.flops",
    "MFUMeter": "pd_train.flops",
    "compiled_cost": "pd_train.flops",
    "step_census": "pd_train.flops",
    "ChunkwiseTransformerCI": "pd_train.config.pd",
    "GlobalTransformerCI": "pd_train.config.pd",
    "VectorMLPCI": "pd_train.config.pd",
    "DecompositionTarget": "pd_train.config.pd",
    "Faithfulness": "pd_train.config.pd",
    "FaithfulnessWarmup": "pd_train.config.pd",
    "ImportanceMinimality": "pd_train.config.pd",
    "MLPCI": "pd_train.config.pd",
    "OptimizerConfig": "pd_train.config.pd",
    "PDConfig": "pd_train.config.pd",
    "PGDEval": "pd_train.config.pd",
    "PGDOptimizer": "pd_train.config.pd",
    "PGDRecon": "pd_train.config.pd",
    "PersistentPGDRecon": "pd_train.config.pd",
    "ReconConfig": "pd_train.config.pd",
    "RematConfig": "pd_train.config.pd",
    "RuntimeConfig": "pd_train.config.pd",
    "SharedMLPCI": "pd_train.config.pd",
    "StochasticRecon": "pd_train.config.pd",
    "SubsetRecon": "pd_train.config.pd",
    "FrequencyPenalty": "pd_train.config.pd",
    "Decomposition": "pd_train.decomposition",
    "build_decomposition": "pd_train.decomposition",
    "LlamaConfig": "pd_train.models.llama_config",
    "GROUPS": "pd_train.train",
    "TrainState": "pd_train.train",
    "Trainer": "pd_train.train",
    "step_key": "pd_train.train",
}

__all__ = [
    "GROUPS",
    "MLPCI",
    "CIConfig",
    "CIType",
    "Census",
    "ChunkwiseSubsetRecon",
    "ChunkwiseTransformerCI",
    "Decomposition",
    "DecompositionTarget",
    "Faithfulness",
    "FaithfulnessWarmup",
    "FrequencyPenalty",
    "GlobalTransformerCI",
    "ImportanceMinimality",
    "LlamaConfig",
    "LossMetric",
    "LossTerm",
    "MFUMeter",
    "OptimizerConfig",
    "PDConfig",
    "PGDEval",
    "PGDOptimizer",
    "PGDRecon",
    "PersistentPGDRecon",
    "ReconConfig",
    "RematConfig",
    "RuntimeConfig",
    "SharedMLPCI",
    "StochasticRecon",
    "SubsetRecon",
    "TrainState",
    "Trainer",
    "VectorMLPCI",
    "__version__",
    "build_decomposition",
    "compiled_cost",
    "register_ci_type",
    "register_loss_term",
    "step_census",
    "step_key",
]

if TYPE_CHECKING:
    from pd_train.ci import CIType, register_ci_type
    from pd_train.config.pd import (
        MLPCI,
        ChunkwiseSubsetRecon,
        ChunkwiseTransformerCI,
        CIConfig,
        DecompositionTarget,
        Faithfulness,
        FaithfulnessWarmup,
        FrequencyPenalty,
        GlobalTransformerCI,
        ImportanceMinimality,
        LossMetric,
        OptimizerConfig,
        PDConfig,
        PersistentPGDRecon,
        PGDEval,
        PGDOptimizer,
        PGDRecon,
        ReconConfig,
        RematConfig,
        RuntimeConfig,
        SharedMLPCI,
        StochasticRecon,
        SubsetRecon,
        VectorMLPCI,
    )
    from pd_train.decomposition import Decomposition, build_decomposition
    from pd_train.flops import Census, MFUMeter, compiled_cost, step_census
    from pd_train.losses import LossTerm, register_loss_term
    from pd_train.models.llama_config import LlamaConfig
    from pd_train.train import GROUPS, Trainer, TrainState, step_key


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module 'pd_train' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
