"""Faithfulness: how far the components' sum V@U is from the target weights W."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.config.pd import Faithfulness
from pd_train.decomposition import Decomposition, site_weights
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term

if TYPE_CHECKING:
    from pd_train.census import CensusContext
    from pd_train.losses.plan import ReconPlan

__all__ = ["FaithfulnessTerm", "faithfulness"]


def _layers_of(stack: jax.Array, layers: tuple[int, ...]) -> jax.Array:
    """``stack[list(layers)]``, as a static slice when the layers are contiguous."""
    if layers == tuple(range(layers[0], layers[0] + len(layers))):
        return jax.lax.slice_in_dim(stack, layers[0], layers[0] + len(layers))
    return jnp.take(stack, np.asarray(layers), axis=0)


def faithfulness(
    target_layers: Mapping[str, jax.Array],
    components: Mapping[str, Mapping[str, jax.Array]],
    decomposition: Decomposition,
) -> jax.Array:
    """Σ_sites ‖W − V@U‖² / Σ_sites numel(W), fp32.

    target_layers[kind]: [L, d_in, d_out]; components[kind]: V [n_k, d_in, C], U [n_k, C, d_out].
    One layer at a time (``lax.map``), so no [n_k, d_in, d_out] product is ever materialized.
    """
    total = jnp.zeros((), jnp.float32)
    numel = 0
    for layout in decomposition.kinds:
        w = _layers_of(target_layers[layout.kind], layout.layers)
        v, u = components[layout.kind]["V"], components[layout.kind]["U"]

        def site(args: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
            w_l, v_l, u_l = args
            diff = w_l.astype(jnp.float32) - v_l.astype(jnp.float32) @ u_l.astype(jnp.float32)
            return jnp.sum(diff * diff)

        total = total + jnp.sum(jax.lax.map(site, (w, v, u)))
        numel += len(layout.layers) * layout.d_in * layout.d_out
    # A Python float: at Llama-8B size numel is ~7e9, beyond the int32 a Python int becomes.
    return total / float(numel)


class FaithfulnessTerm(LossTerm):
    """``faithfulness``: needs no CI; one [d_in, C] @ [C, d_out] product per site."""

    config_cls = Faithfulness
    needs_ci = False

    def value(
        self,
        config: Any,
        inputs: TermInputs,
        *,
        plan: ReconPlan | None,
        hp: Hyperparams,
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        del config, plan, hp, key
        decomposition = inputs.spec.decomposition
        weights = site_weights(inputs.spec.target, inputs.target, decomposition)
        return faithfulness(weights, inputs.params["components"], decomposition), {}

    def flops(self, config: Any, census: CensusContext, *, plan: ReconPlan | None) -> None:
        del plan
        for lay in census.decomposition.kinds:
            census.acc.mm(lay.d_in, lay.C, lay.d_out, term=config.type, part="faithfulness",
                          kind=lay.kind, dx=True, dw=True, times=len(lay.layers))  # fmt: skip


register_loss_term(FaithfulnessTerm())
