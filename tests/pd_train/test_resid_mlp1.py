"""resid_mlp1's recipe at a reduced size (20 features, d_embed 100, d_mlp 10) recovers its known
mechanism in mlp_in: one component per feature, asserted for at least 90 % of the features."""

from __future__ import annotations

import attrs
import jax
import numpy as np

from pd_train.config import DecompositionTarget
from pd_train.targets.resid_mlp import (
    ResidMLPConfig,
    ResidMLPTarget,
    pretrain_resid_mlp,
    resid_mlp_features,
)
from pd_train.targets.toys import (
    decompose,
    features_recovered,
    ground_truth_metrics,
    one_hot_ci,
    toy_config,
)

N_FEATURES = 20


def test_resid_mlp1_reduced_recovers_one_component_per_feature() -> None:
    toy = toy_config("resid_mlp1")
    target = ResidMLPTarget(config=ResidMLPConfig(n_features=N_FEATURES, d_embed=100, d_mlp=10))
    probability = 1.0 / N_FEATURES  # one active feature per sample on average, as at full size
    weights, loss = pretrain_resid_mlp(
        target, seed=0, steps=1000, batch_size=2048, lr=3e-3, feature_probability=probability
    )
    assert loss < 0.01
    # The built-in recipe (losses, coefficients, lr schedule), shorter and with C for 20 features.
    pd = attrs.evolve(
        toy.pd,
        steps=600,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*", C=40),),
    )
    seen: list[int] = []
    trainer, state = decompose(
        target,
        weights,
        pd,
        seed=0,
        feature_probability=probability,
        data=resid_mlp_features,
        on_step=lambda i, m: seen.append(i),
    )
    assert seen == list(range(600))
    ci = one_hot_ci(trainer, state.params, weights, N_FEATURES)
    mlp_in = ci["layers.0.mlp_in"]
    shown = np.array2string(mlp_in[:, mlp_in.max(axis=0) > 0.1], precision=2)
    ok = features_recovered(mlp_in)
    assert ok.mean() >= 0.9, f"{int(ok.sum())}/{N_FEATURES} features recovered:\n{shown}"

    metrics = ground_truth_metrics(ci, toy.identity_sites)
    assert metrics["gt/features_recovered/layers.0.mlp_in"] == ok.mean()
    # mlp_out reads the neurons (dense): only its alive count is reported.
    assert "gt/alive/layers.0.mlp_out" in metrics
    assert "gt/recovered/layers.0.mlp_out" not in metrics

    # The metric can fail: the untrained decomposition recovers (almost) nothing.
    init = trainer.init_state(key=jax.random.key(0))
    untrained = features_recovered(
        one_hot_ci(trainer, init.params, weights, N_FEATURES)["layers.0.mlp_in"]
    )
    assert untrained.mean() < 0.5
