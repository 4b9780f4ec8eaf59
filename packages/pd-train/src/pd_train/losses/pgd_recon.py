"""``pgd_recon``: recon under masks found afresh each step by sign-gradient ascent
(:class:`pd_train.losses.pgd.FreshPGD`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pd_train.config.pd import PDConfig, PGDRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import Hyperparams, register_loss_term
from pd_train.losses.pgd import FreshPGD
from pd_train.losses.plan import ReconPlan, all_sites_plan, chunkwise_plan
from pd_train.losses.recon import SampledReconTerm

if TYPE_CHECKING:
    from pd_train.census import CensusContext

__all__ = ["PGDReconTerm"]


class PGDReconTerm(SampledReconTerm):
    """Route-all plan (``sites_per_chunk`` null) or the chunkwise-subset plan. Values: coeff,
    step_size. Structural: init, n_steps, mask_scope, sites_per_chunk, n_samples."""

    config_cls = PGDRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        if config.sites_per_chunk is None:
            return all_sites_plan(decomposition)
        return chunkwise_plan(decomposition, config.sites_per_chunk)

    def hyperparams(self, config: Any, pd: PDConfig) -> dict[str, float | int]:
        return {"coeff": float(config.coeff), "step_size": float(config.step_size)}

    def recon_options(self, config: Any, hp: Hyperparams) -> dict[str, Any]:
        return {"pgd": FreshPGD.of(config, step_size=hp["step_size"])}

    def flops(self, config: Any, census: CensusContext, *, plan: ReconPlan | None) -> None:
        assert plan is not None
        census.recon_forwards(
            config.type,
            plan,
            samples=config.n_samples,
            ascents=config.n_steps * config.n_samples,
        )


register_loss_term(PGDReconTerm())
