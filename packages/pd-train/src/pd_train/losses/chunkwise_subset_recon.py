"""``chunkwise_subset_recon``: per chunk of ``sites_per_chunk`` sites and draw, each position
routes a uniform-k random subset of the chunk's sites (the rest frozen)."""

from __future__ import annotations

from typing import Any

import jax

from pd_train.config.pd import ChunkwiseSubsetRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term
from pd_train.losses.recon import ReconPlan, chunkwise_plan, recon_term_value

__all__ = ["ChunkwiseSubsetReconTerm"]


class ChunkwiseSubsetReconTerm(LossTerm):
    """Chunkwise plan with subset routing. Structural: ``sites_per_chunk``, ``n_samples``."""

    config_cls = ChunkwiseSubsetRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        return chunkwise_plan(decomposition, config.sites_per_chunk)

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


register_loss_term(ChunkwiseSubsetReconTerm())
