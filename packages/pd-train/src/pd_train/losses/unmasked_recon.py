"""``unmasked_recon``: recon of the V@U model (every site live at every position, m = 1, no
delta component; spd's ``UnmaskedReconLoss``), as a training term. It reads no CI."""

from __future__ import annotations

from typing import Any

import jax

from pd_train.config.pd import UnmaskedRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term
from pd_train.losses.ci_masked_recon import fixed_mask_recon
from pd_train.losses.recon import ReconPlan, all_sites_plan

__all__ = ["UnmaskedReconTerm"]


class UnmaskedReconTerm(LossTerm):
    """Route-all plan, m = 1, δ = 0. No structural fields."""

    config_cls = UnmaskedRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        return all_sites_plan(decomposition)

    def value(
        self,
        config: Any,
        inputs: TermInputs,
        *,
        plan: ReconPlan | None,
        hp: Hyperparams,
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        assert plan is not None
        return fixed_mask_recon(inputs, plan, key=key, ones=True), {}


register_loss_term(UnmaskedReconTerm())
