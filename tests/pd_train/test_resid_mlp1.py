"""resid_mlp1's shipped target is the paper's architecture: 100 features in a 1000-dim residual
stream with unit-norm embedding rows, 50 neurons, no biases. (Its ``*_fast`` recipe against the
reference's criteria: test_resid_mlp_recipes.py and docs/toys.md, not reached yet.)"""

from __future__ import annotations

import numpy as np

from pd_train.targets.toys import toy_weights


def test_shipped_resid_mlp1_is_the_papers_architecture() -> None:
    w = toy_weights("resid_mlp1")
    assert w["embed"].shape == (100, 1000)
    np.testing.assert_allclose(np.linalg.norm(w["embed"], axis=1), 1.0, rtol=1e-5)
    assert sorted(w["layers"]) == ["mlp_in", "mlp_out"]  # no biases
    assert w["layers"]["mlp_in"].shape == (1, 1000, 50)
