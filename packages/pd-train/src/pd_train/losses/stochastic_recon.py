"""``stochastic_recon``: KL(clean ‖ masked) with every site live, mean over ``n_samples`` draws."""

from __future__ import annotations

from typing import Any

from pd_train.config.pd import StochasticRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import register_loss_term
from pd_train.losses.plan import ReconPlan, all_sites_plan
from pd_train.losses.recon import SampledReconTerm

__all__ = ["StochasticReconTerm"]


class StochasticReconTerm(SampledReconTerm):
    """Route-all plan, drawn sources; one draw pairs with the persistent-PGD term's forward.
    Structural: ``n_samples``."""

    config_cls = StochasticRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        return all_sites_plan(decomposition)

    def pairs_with_sources(self, config: Any) -> bool:
        return bool(config.n_samples == 1)


register_loss_term(StochasticReconTerm())
