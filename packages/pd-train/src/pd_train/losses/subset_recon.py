"""``subset_recon``: one masked forward per draw over *all* sites, each position routing a
uniform-k random subset of them (param-decomp's recon over all sites, SPEC S10′)."""

from __future__ import annotations

from typing import Any

import jax

from pd_train.config.pd import SubsetRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term
from pd_train.losses.recon import ReconPlan, all_sites_subset_plan, recon_term_value

__all__ = ["SubsetReconTerm"]


class SubsetReconTerm(LossTerm):
    """One chunk of every site with subset routing. Structural: ``n_samples``."""

    config_cls = SubsetRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        return all_sites_subset_plan(decomposition)

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
        return recon_term_value(inputs, plan, n_samples=config.n_samples, key=key), {}


register_loss_term(SubsetReconTerm())
