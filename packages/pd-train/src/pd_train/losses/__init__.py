"""The loss terms: one registered :class:`LossTerm` per ``pd.loss_metrics`` type, each in its
own module, over pure functions of small arrays reduced in fp32.

To add a term: a config class (attrs, frozen, kw_only, ``type`` tag, ``coeff``) and a
``LossTerm`` subclass with ``config_cls`` set, registered by ``register_loss_term(MyTerm())``
(see :mod:`pd_train.losses._term` for what a term describes; a recon term over drawn sources
subclasses :class:`~pd_train.losses.recon.SampledReconTerm` and gives its plan; a term with
param-decomp's coefficient schedule subclasses
:class:`~pd_train.losses.importance.ScheduledCoeffTerm` and puts
:func:`coeff_schedule_hyperparams` in its hyperparameters). The built-in terms:

* :mod:`~pd_train.losses.faithfulness`, :mod:`~pd_train.losses.importance` (importance
  minimality), :mod:`~pd_train.losses.stochastic_recon`,
  :mod:`~pd_train.losses.subset_recon`, :mod:`~pd_train.losses.chunkwise_subset_recon`,
  :mod:`~pd_train.losses.pgd_recon`,
  :mod:`~pd_train.losses.smooth_l0` (smooth-L0 importance minimality, frequency EMA),
  :mod:`~pd_train.losses.static_probability_subset_recon`,
  :mod:`~pd_train.losses.ci_masked_recon`, :mod:`~pd_train.losses.unmasked_recon`,
  :mod:`~pd_train.losses.stochastic_hidden_acts_recon`,
  :mod:`~pd_train.losses.persistent_pgd_recon`.

What they build on:

* :mod:`~pd_train.losses.faithfulness` — ‖W − V@U‖²;
* :mod:`~pd_train.losses.importance` — importance minimality (p annealing, the coefficient's
  schedule) and L0;
* :mod:`~pd_train.losses.plan` — recon plans (the chunks of live sites, the routing);
* :mod:`~pd_train.losses.recon` — per-position routing and the scanned recon loss;
* :mod:`~pd_train.losses.pgd` — adversarial sources: fresh PGD and persistent PGD.
"""

from __future__ import annotations

from pd_train.losses._term import (
    LOSS_TERMS,
    LossTerm,
    TermInputs,
    check_one_adversary,
    loss_term,
    register_loss_term,
)
from pd_train.losses.chunkwise_subset_recon import ChunkwiseSubsetReconTerm
from pd_train.losses.ci_masked_recon import CIMaskedReconTerm
from pd_train.losses.faithfulness import FaithfulnessTerm, faithfulness
from pd_train.losses.importance import (
    ImportanceMinimalityTerm,
    ScheduledCoeffTerm,
    annealed_pnorm,
    coeff_multiplier,
    coeff_schedule_hyperparams,
    importance_minimality,
    importance_terms,
    l0,
    pnorm_at,
)
from pd_train.losses.persistent_pgd_recon import PersistentPGDReconTerm
from pd_train.losses.pgd import FreshPGD, PersistentPGD, adam_ascent, sign_ascent
from pd_train.losses.pgd_recon import PGDReconTerm
from pd_train.losses.plan import ReconPlan, all_sites_plan, all_sites_subset_plan, chunkwise_plan
from pd_train.losses.recon import (
    SampledReconTerm,
    kl_clean_masked,
    paired_all_sites_loss,
    recon_loss,
    routing_masks,
    site_grid,
)
from pd_train.losses.smooth_l0 import (
    SmoothL0ImportanceMinimality,
    SmoothL0ImportanceMinimalityTerm,
)
from pd_train.losses.static_probability_subset_recon import StaticProbabilitySubsetReconTerm
from pd_train.losses.stochastic_hidden_acts_recon import (
    StochasticHiddenActsReconTerm,
    hidden_acts_recon,
)
from pd_train.losses.stochastic_recon import StochasticReconTerm
from pd_train.losses.subset_recon import SubsetReconTerm
from pd_train.losses.unmasked_recon import UnmaskedReconTerm

__all__ = [
    "LOSS_TERMS",
    "CIMaskedReconTerm",
    "ChunkwiseSubsetReconTerm",
    "FaithfulnessTerm",
    "FreshPGD",
    "ImportanceMinimalityTerm",
    "LossTerm",
    "PGDReconTerm",
    "PersistentPGD",
    "PersistentPGDReconTerm",
    "ReconPlan",
    "SampledReconTerm",
    "ScheduledCoeffTerm",
    "SmoothL0ImportanceMinimality",
    "SmoothL0ImportanceMinimalityTerm",
    "StaticProbabilitySubsetReconTerm",
    "StochasticHiddenActsReconTerm",
    "StochasticReconTerm",
    "SubsetReconTerm",
    "TermInputs",
    "UnmaskedReconTerm",
    "adam_ascent",
    "all_sites_plan",
    "all_sites_subset_plan",
    "annealed_pnorm",
    "check_one_adversary",
    "chunkwise_plan",
    "coeff_multiplier",
    "coeff_schedule_hyperparams",
    "faithfulness",
    "hidden_acts_recon",
    "importance_minimality",
    "importance_terms",
    "kl_clean_masked",
    "l0",
    "loss_term",
    "paired_all_sites_loss",
    "pnorm_at",
    "recon_loss",
    "register_loss_term",
    "routing_masks",
    "sign_ascent",
    "site_grid",
]
