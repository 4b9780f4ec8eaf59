"""tms_5_2 decomposed end to end recovers its known mechanism: one component per feature in each
matrix, asserted on the one-hot CI; with two seeds. And the shipped weights are reproducible."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from pd_train.step import Trainer
from pd_train.targets.tms import TMSTarget
from pd_train.targets.toys import (
    alive_components,
    decompose,
    identity_ci_error,
    one_hot_ci,
    plot_permuted_ci,
    plot_tms_directions,
    pretrain_toy,
    toy_config,
    toy_weights,
)

TOY = toy_config("tms_5_2")
TARGET = TMSTarget(config=TOY.target)


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    return Trainer(TARGET, TOY.pd)  # one compile for both seeds


@pytest.mark.parametrize("seed", [0, 1])
def test_tms_5_2_recovers_one_component_per_feature(
    trainer: Trainer, seed: int, tmp_path: Path
) -> None:
    weights = toy_weights("tms_5_2")
    _, state = decompose(
        TARGET,
        weights,
        TOY.pd,
        seed=seed,
        feature_probability=TOY.feature_probability,
        mode=TOY.mode,
        trainer=trainer,
    )
    ci = one_hot_ci(trainer, state.params, weights, 5)
    assert sorted(ci) == ["layers.0.linear1", "layers.0.linear2"]
    for site, values in ci.items():
        shown = np.array2string(values[:, values.max(axis=0) > 0.01], precision=2)
        assert values.shape == (5, 20)
        assert alive_components(values) == 5, f"{site}:\n{shown}"
        top = values.argmax(axis=1)
        assert len(set(top.tolist())) == 5, f"{site}: two features share a component\n{shown}"
        assert (values.max(axis=1) > 0.5).all(), f"{site}:\n{shown}"
        others = values.copy()
        others[np.arange(5), top] = 0.0
        assert (others <= 0.1).all(), f"{site}:\n{shown}"
        assert identity_ci_error(values) < 0.2
    if seed == 0:  # the plots of a recovered decomposition
        png = plot_permuted_ci(ci, tmp_path / "ci.png")
        arrows = plot_tms_directions(
            weights, jax.device_get(state.params["components"]), ci, tmp_path / "dirs.png"
        )
        for path in (png, arrows):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pretrain_reproduces_the_shipped_weights() -> None:
    params, loss = pretrain_toy(TOY)
    shipped = toy_weights("tms_5_2")
    assert loss < 0.01
    for kind in ("linear1", "linear2"):
        np.testing.assert_allclose(params["layers"][kind], shipped["layers"][kind], atol=1e-5)
    np.testing.assert_allclose(params["b_final"], shipped["b_final"], atol=1e-5)
    # Tied: W2 = W1ᵀ.
    np.testing.assert_array_equal(
        shipped["layers"]["linear2"][0], shipped["layers"]["linear1"][0].T
    )
