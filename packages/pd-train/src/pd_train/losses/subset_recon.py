"""``subset_recon``: one masked forward per draw over *all* sites, each position routing a
uniform-k random subset of them (param-decomp's recon over all sites, SPEC S10′)."""

from __future__ import annotations

from typing import Any

from pd_train.config.pd import SubsetRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import register_loss_term
from pd_train.losses.plan import ReconPlan, all_sites_subset_plan
from pd_train.losses.recon import SampledReconTerm

__all__ = ["SubsetReconTerm"]


class SubsetReconTerm(SampledReconTerm):
    """One chunk of every site with subset routing. Structural: ``n_samples``."""

    config_cls = SubsetRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        return all_sites_subset_plan(decomposition)


register_loss_term(SubsetReconTerm())
