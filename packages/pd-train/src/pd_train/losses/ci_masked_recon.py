"""``ci_masked_recon``: recon with every site live at every position under m = ci_lower and no
delta component (spd's ``CIMaskedReconLoss``), as a training term."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from pd_train.config.pd import CIMaskedRecon
from pd_train.decomposition import Decomposition
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term
from pd_train.losses.plan import ReconPlan, all_sites_plan
from pd_train.losses.recon import recon_term_value

__all__ = ["CIMaskedReconTerm", "fixed_mask_recon"]


def fixed_mask_recon(
    inputs: TermInputs, plan: ReconPlan, *, key: jax.Array, ones: bool
) -> jax.Array:
    """The recon of ``plan`` with zero sources (m = ci, δ = 0), or with ``ones`` m = 1, δ = 0:
    sources {kind: [n_k, 1, 1, C + 1]} of zeros broadcast over the batch and positions."""
    assert inputs.ci_lower is not None
    ci = inputs.ci_lower
    if ones:
        ci = {k: jnp.ones_like(v) for k, v in ci.items()}
    zeros = {k: jnp.zeros((v.shape[0], 1, 1, v.shape[-1] + 1), v.dtype) for k, v in ci.items()}
    inputs = dataclasses.replace(inputs, ci_lower=ci)
    return recon_term_value(inputs, plan, n_samples=1, key=key, sources=zeros)


class CIMaskedReconTerm(LossTerm):
    """Route-all plan, m = ci_lower, δ = 0 (with :attr:`ones`, m = 1: ``unmasked_recon``). No
    structural fields."""

    config_cls: ClassVar[type] = CIMaskedRecon
    #: m = 1 at every site instead of m = ci_lower (:func:`fixed_mask_recon`'s ``ones``).
    ones: ClassVar[bool] = False

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
        return fixed_mask_recon(inputs, plan, key=key, ones=self.ones), {}


register_loss_term(CIMaskedReconTerm())
