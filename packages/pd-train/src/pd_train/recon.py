"""Recon plans and the recon loss; they live in :mod:`pd_train.losses.recon` (this module keeps
``pd_train.recon`` imports working)."""

from __future__ import annotations

from pd_train.losses.recon import (
    ReconPlan,
    _routing,
    all_sites_plan,
    chunkwise_plan,
    kl_clean_masked,
    recon_loss,
    routing_masks,
    site_grid,
)

__all__ = [
    "ReconPlan",
    "_routing",
    "all_sites_plan",
    "chunkwise_plan",
    "kl_clean_masked",
    "recon_loss",
    "routing_masks",
    "site_grid",
]
