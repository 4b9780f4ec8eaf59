"""The params a short toy decomposition ends at, for tests that compare two ways of computing
the same steps (the K-step programs' chunk loop, the CI MLPs over blocks of rows)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from pd_train.config.pd import PDConfig
from pd_train.targets.toys import ToyConfig, decompose, toy_data, toy_weights


def final_params(toy: ToyConfig, target: Any, pd: PDConfig, *, seed: int) -> list[np.ndarray]:
    """The leaves of the params after ``pd.steps`` steps of ``toy``'s data from ``toy``'s shipped
    weights, 10 steps a call."""
    _, state = decompose(
        target, toy_weights(toy.weights), pd, seed=seed,
        feature_probability=toy.feature_probability, data=toy_data(toy), steps_per_call=10,
        log_every=10,
    )  # fmt: skip
    return jax.tree_util.tree_leaves(jax.device_get(state.params))
