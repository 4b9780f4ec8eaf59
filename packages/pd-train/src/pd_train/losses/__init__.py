"""The loss terms, each a pure function of small arrays, reduced in fp32.

* :mod:`~pd_train.losses.faithfulness` — ‖W − V@U‖²;
* :mod:`~pd_train.losses.importance` — importance minimality (p annealing) and L0;
* :mod:`~pd_train.losses.recon` — recon plans, per-position routing and the scanned recon loss;
* :mod:`~pd_train.losses.pgd` — adversarial sources: fresh PGD and persistent PGD.
"""

from __future__ import annotations

from pd_train.losses.faithfulness import faithfulness
from pd_train.losses.importance import importance_minimality, l0, pnorm_at
from pd_train.losses.pgd import FreshPGD, PersistentPGD, adam_ascent, sign_ascent
from pd_train.losses.recon import (
    ReconPlan,
    all_sites_plan,
    chunkwise_plan,
    kl_clean_masked,
    paired_all_sites_loss,
    recon_loss,
    routing_masks,
    site_grid,
)

__all__ = [
    "FreshPGD",
    "PersistentPGD",
    "ReconPlan",
    "adam_ascent",
    "all_sites_plan",
    "chunkwise_plan",
    "faithfulness",
    "importance_minimality",
    "kl_clean_masked",
    "l0",
    "paired_all_sites_loss",
    "pnorm_at",
    "recon_loss",
    "routing_masks",
    "sign_ascent",
    "site_grid",
]
