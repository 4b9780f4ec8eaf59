"""``persistent_pgd_recon``: route-all recon under per-site sources that persist across steps
in ``TrainState.adversary`` (:class:`pd_train.losses.pgd.PersistentPGD`).

The term's value reads the step's warmed sources (``TermInputs.sources``); the Trainer runs
the warm-up ascents before the terms and the final ascent after the backward (it needs the
main gradient), with this term's hyperparameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax

from pd_train.config.pd import ConfigError, PDConfig, PersistentPGDRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term
from pd_train.losses.pgd import PersistentPGD, persistent_pgd_hyperparams
from pd_train.losses.plan import ReconPlan, all_sites_plan
from pd_train.losses.recon import recon_term_value

if TYPE_CHECKING:
    from pd_train.census import CensusContext

__all__ = ["PersistentPGDReconTerm"]


class PersistentPGDReconTerm(LossTerm):
    """Values: coeff (the final ascent divides the main gradient by it), the sources' lr
    schedule, b1, b2, eps. Structural: scope, n_warmup_steps, the optimizer type."""

    config_cls = PersistentPGDRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        return all_sites_plan(decomposition)

    def hyperparams(self, config: Any, pd: PDConfig) -> dict[str, Any]:
        return {"coeff": float(config.coeff), **persistent_pgd_hyperparams(config, pd.steps)}

    def value(
        self,
        config: Any,
        inputs: TermInputs,
        *,
        plan: ReconPlan | None,
        hp: Hyperparams,
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        assert plan is not None and inputs.sources is not None
        value = recon_term_value(inputs, plan, n_samples=1, key=key, sources=inputs.sources)
        return value, {}

    def adversary(
        self,
        config: Any,
        decomposition: Decomposition,
        *,
        batch_size: int,
        seq_len: int | None,
        total_steps: int,
        layout: Any,
        where: str,
    ) -> PersistentPGD:
        if seq_len is None or seq_len < 1:
            msg = f"got seq_len={seq_len!r}; a persistent_pgd_recon term needs the batches' T"
            raise ConfigError([(f"{where} (Trainer seq_len)", msg)])
        if layout is not None and config.scope == "bsc" and batch_size % layout.data_size:
            msg = (
                f"scope 'bsc' shards its sources [B, T, C + 1] over the data axes (size "
                f"{layout.data_size}), which pd.batch_size {batch_size} is not a multiple of; "
                "use scope 'sc' or a batch size that is"
            )
            raise ConfigError([(f"{where}.scope", msg)])
        return PersistentPGD(
            config,
            decomposition,
            batch_size=batch_size,
            seq_len=seq_len,
            total_steps=total_steps,
            layout=layout,
        )

    def flops(self, config: Any, census: CensusContext, *, plan: ReconPlan | None) -> None:
        assert plan is not None
        census.recon_forwards(config.type, plan, samples=1, ascents=config.n_warmup_steps)
        lead = census.batch_size if config.scope == "bsc" else 1
        kinds = census.decomposition.kinds
        numel = sum(len(k.layers) * lead * census.seq_len * (k.C + 1) for k in kinds)
        census.optimizer(numel, term=config.type)


register_loss_term(PersistentPGDReconTerm())
