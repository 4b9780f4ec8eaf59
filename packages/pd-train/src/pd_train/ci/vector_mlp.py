"""``pd.ci.type: vector_mlp`` — per site, C separate MLPs, each on the site's full input x
(spd's ``vector_mlp``): component c's CI reads x [d_in] through its own d_in -> hidden -> 1."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import jax
import jax.numpy as jnp

from pd_train.ci._base import ParamSpec, SiteCIFunction, gelu
from pd_train.ci._registry import CIType, register_ci_type
from pd_train.ci.mlp import component_mlp_flops, component_mlp_rest, component_mlp_specs
from pd_train.config.pd import VectorMLPCI
from pd_train.decomposition import KindLayout

if TYPE_CHECKING:
    from pd_train.census import CensusContext

__all__ = ["VectorMLPCIFunction", "VectorMLPCIType"]


@attrs.frozen(kw_only=True)
class VectorMLPCIFunction(SiteCIFunction):
    """Per site and component c, an MLP d_in -> hidden_dims -> 1 on x, exact GELU between.

    Params per site: ``w0`` [C, d_in, h0], ``b0`` [C, h0], ``w{i}`` [C, h_{i-1}, h_i],
    ``b{i}`` [C, h_i], ``w_out`` [C, h_last], ``b_out`` [C]. (``w0`` holds C·d_in·h0 numbers per
    site: this family is for small targets.)
    """

    hidden_dims: tuple[int, ...]
    remat: bool = False

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        return component_mlp_specs(
            layout.C, self.hidden_dims, w0_in=(layout.d_in,), w0_fan_in=layout.d_in
        )

    def site_apply(self, params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
        """x [B, T, d_in] -> CI pre-activations [B, T, C] (fp32)."""
        dt = x.dtype
        h = gelu(jnp.einsum("btd,cdh->btch", x, params["w0"].astype(dt)) + params["b0"].astype(dt))
        return component_mlp_rest(params, h, len(self.hidden_dims))

    def site_fn(self, params: Mapping[str, jax.Array], x: jax.Array, V: jax.Array) -> jax.Array:
        del V
        return self.site_apply(params, x)


class VectorMLPCIType(CIType):
    """``vector_mlp``: params per kind (:class:`VectorMLPCIFunction`)."""

    config_cls = VectorMLPCI

    def build(
        self, config: Any, *, decomposition: Any, remat: bool, constrain: Any
    ) -> VectorMLPCIFunction:
        return VectorMLPCIFunction(hidden_dims=tuple(config.hidden_dims), remat=remat)

    def flops(self, config: Any, fn: Any, census: CensusContext) -> None:
        for layout in census.decomposition.kinds:
            component_mlp_flops(layout, tuple(config.hidden_dims), census, on_x=True)


register_ci_type(VectorMLPCIType())
