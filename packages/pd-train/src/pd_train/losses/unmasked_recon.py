"""``unmasked_recon``: recon of the V@U model (every site live at every position, m = 1, no
delta component; spd's ``UnmaskedReconLoss``), as a training term. It reads no CI."""

from __future__ import annotations

from pd_train.config.pd import UnmaskedRecon
from pd_train.losses._term import register_loss_term
from pd_train.losses.ci_masked_recon import CIMaskedReconTerm

__all__ = ["UnmaskedReconTerm"]


class UnmaskedReconTerm(CIMaskedReconTerm):
    """Route-all plan, m = 1, δ = 0. No structural fields."""

    config_cls = UnmaskedRecon
    ones = True


register_loss_term(UnmaskedReconTerm())
