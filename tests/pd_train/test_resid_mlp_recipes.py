"""The reference's criteria for ``resid_mlp1_fast`` on two seeds (goodfire-ai/spd's
``IdentityCIError`` config of resid_mlp1: ``identity_ci`` on ``layers.*.mlp_in`` with 100 features,
``dense_ci`` on ``layers.*.mlp_out`` with k = 50), on the one-hot CI at input 0.75, tolerance 0.1:

- IdentityCIError 0 on ``mlp_in``: each feature's own component ≥ 0.9, every other entry ≤ 0.1;
- DenseCIError 0 on ``mlp_out``: the 50 columns of most CI mass each hold an entry ≥ 0.9 and no
  other column anything above 0.1, i.e. ``mlp_out`` is one rank-50 block (the paper's finding);
- alive_one_hot (some one-hot input above 0.1): 100 in ``mlp_in``, 50 in ``mlp_out`` (the
  paper's counts).

Not reached yet, so a strict xfail on seed 0, run only with ``PD_TOY_RECIPES=1`` (~350 CPU s of
a known failure is too much for every CI run; both seeds are asserted, always, once a recipe
gets there). The recipe, target and metrics match the reference's field by field; the fast
recipe (3000 x 512, 1/40 of the paper's samples) stops before ``mlp_out`` converges. Measured
in docs/toys.md (section "resid_mlp1: why resid_mlp1_fast does not reproduce"), seed 0:
IdentityCIError 16 on mlp_in, DenseCIError 525 on mlp_out with 71 alive on the one-hot inputs;
on the current weights the same trajectory as far as measured (1144 / 885 / 76 at step 1000)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pd_train.targets.toys import run_toy


def _shown(ci: dict[str, np.ndarray]) -> str:
    rows = []
    for site, values in ci.items():
        alive = values[:, values.max(axis=0) > 0.1]
        rows.append(
            f"{site}: {alive.shape[1]} alive; max per feature min {values.max(axis=1).min():.2f}; "
            f"entries in (0.1, 0.9): {int(((alive > 0.1) & (alive < 0.9)).sum())}"
        )
    return "\n".join(rows)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("PD_TOY_RECIPES") != "1",
    reason="a known failure of ~350 CPU s: set PD_TOY_RECIPES=1 to run it",
)
@pytest.mark.xfail(
    strict=True,
    reason="resid_mlp1_fast (3000 x 512) measured IdentityCIError 16, DenseCIError 525, "
    "mlp_out 71 alive (docs/toys.md)",
)
@pytest.mark.parametrize("seed", [0])
def test_resid_mlp1_fast_reaches_the_reference_criteria(seed: int) -> None:
    metrics, ci, _ = run_toy("resid_mlp1_fast", seed=seed)
    assert metrics["gt/identity_ci_error/layers.0.mlp_in"] == 0, _shown(ci)
    assert metrics["gt/dense_ci_error/layers.0.mlp_out"] == 0, _shown(ci)
    assert metrics["gt/alive_one_hot/layers.0.mlp_in"] == 100, _shown(ci)
    assert metrics["gt/alive_one_hot/layers.0.mlp_out"] == 50, _shown(ci)
    assert metrics["reproduced"] == 1.0
