"""The params a short toy decomposition ends at, for tests that compare two ways of computing
the same steps (the K-step programs' chunk loop, the CI MLPs over blocks of rows)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from pd_train.config.pd import PDConfig
from pd_train.targets.toys import ToyConfig, decompose, toy_compiler_options, toy_data, toy_weights
from pd_train.train import Trainer

from ._tiny import FAST


def final_params(toy: ToyConfig, target: Any, pd: PDConfig, *, seed: int) -> list[np.ndarray]:
    """The leaves of the params after ``pd.steps`` steps of ``toy``'s data from ``toy``'s shipped
    weights, 10 steps a call; the toy trainer's options and unoptimized XLA code (the same
    HLO, compiled faster: both ways compared compile alike)."""
    trainer = Trainer(target, pd, compiler_options={**toy_compiler_options(), **FAST})
    _, state = decompose(
        target, toy_weights(toy.weights), pd, seed=seed,
        feature_probability=toy.feature_probability, data=toy_data(toy), steps_per_call=10,
        log_every=10, trainer=trainer,
    )  # fmt: skip
    return jax.tree_util.tree_leaves(jax.device_get(state.params))
