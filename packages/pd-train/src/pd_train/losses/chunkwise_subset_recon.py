"""``chunkwise_subset_recon``: per chunk of ``sites_per_chunk`` sites and draw, each position
routes a uniform-k random subset of the chunk's sites (the rest frozen)."""

from __future__ import annotations

from typing import Any

from pd_train.config.pd import ChunkwiseSubsetRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import register_loss_term
from pd_train.losses.plan import ReconPlan, chunkwise_plan
from pd_train.losses.recon import SampledReconTerm

__all__ = ["ChunkwiseSubsetReconTerm"]


class ChunkwiseSubsetReconTerm(SampledReconTerm):
    """Chunkwise plan with subset routing. Structural: ``sites_per_chunk``, ``n_samples``."""

    config_cls = ChunkwiseSubsetRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        return chunkwise_plan(decomposition, config.sites_per_chunk)


register_loss_term(ChunkwiseSubsetReconTerm())
