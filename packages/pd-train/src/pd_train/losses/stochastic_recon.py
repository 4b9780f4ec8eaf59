"""``stochastic_recon``: KL(clean ‖ masked) with every site live, mean over ``n_samples`` draws."""

from __future__ import annotations

from typing import Any

import jax

from pd_train.config.pd import StochasticRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term
from pd_train.losses.recon import ReconPlan, all_sites_plan, recon_term_value

__all__ = ["StochasticReconTerm"]


class StochasticReconTerm(LossTerm):
    """Route-all plan, drawn sources; one draw pairs with the persistent-PGD term's forward.
    Structural: ``n_samples``."""

    config_cls = StochasticRecon

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
        return recon_term_value(inputs, plan, n_samples=config.n_samples, key=key), {}

    def pairs_with_sources(self, config: Any) -> bool:
        return bool(config.n_samples == 1)


register_loss_term(StochasticReconTerm())
