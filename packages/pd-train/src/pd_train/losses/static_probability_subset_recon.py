"""``static_probability_subset_recon``: per draw, each live site at each position takes its
component path with a fixed probability p (spd's ``StaticProbabilityRouter``), the rest frozen;
over every site in one forward, or chunks of ``sites_per_chunk``."""

from __future__ import annotations

from typing import Any

from pd_train.config.pd import PDConfig, StaticProbabilitySubsetRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import Hyperparams, register_loss_term
from pd_train.losses.plan import ReconPlan, chunkwise_plan
from pd_train.losses.recon import SampledReconTerm

__all__ = ["StaticProbabilitySubsetReconTerm"]


class StaticProbabilitySubsetReconTerm(SampledReconTerm):
    """Values: coeff, p. Structural: ``sites_per_chunk``, ``n_samples``."""

    config_cls = StaticProbabilitySubsetRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        n = config.sites_per_chunk or len(decomposition.sites)
        return chunkwise_plan(decomposition, n, routing="static_probability")

    def hyperparams(self, config: Any, pd: PDConfig) -> dict[str, float | int]:
        del pd
        return {"coeff": float(config.coeff), "p": float(config.p)}

    def recon_options(self, config: Any, hp: Hyperparams) -> dict[str, Any]:
        return {"route_probability": hp["p"]}


register_loss_term(StaticProbabilitySubsetReconTerm())
