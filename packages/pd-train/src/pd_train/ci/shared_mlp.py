"""``pd.ci.type: shared_mlp`` — per site, one MLP on the site's input x to all C outputs."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import jax
import jax.numpy as jnp

import pd_init
from pd_train.ci._base import ParamSpec, SiteCIFunction, gelu, he, lecun
from pd_train.ci._registry import CIType, register_ci_type
from pd_train.config.pd import SharedMLPCI
from pd_train.decomposition import KindLayout

if TYPE_CHECKING:
    from pd_train.census import CensusContext

__all__ = ["SharedMLPCIFunction", "SharedMLPCIType"]


@attrs.frozen(kw_only=True)
class SharedMLPCIFunction(SiteCIFunction):
    """Per site, one MLP on the site input x: d_in -> hidden_dims -> C, exact GELU between.

    Params per site: ``w{i}`` [d_{i}, d_{i+1}], ``b{i}`` [d_{i+1}] with d = (d_in, *hidden, C).
    """

    hidden_dims: tuple[int, ...]
    remat: bool = False

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        dims = (layout.d_in, *self.hidden_dims, layout.C)
        specs = {}
        last = len(dims) - 2
        for i in range(len(dims) - 1):
            init = lecun(dims[i]) if i == last else he(dims[i])
            specs[f"w{i}"] = ParamSpec(shape=(dims[i], dims[i + 1]), init=init)
            specs[f"b{i}"] = ParamSpec(shape=(dims[i + 1],), init=pd_init.Zeros())
        return specs

    def site_apply(self, params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
        """x [B, T, d_in] -> CI pre-activations [B, T, C] (fp32)."""
        dt = x.dtype
        h = x
        n = len(self.hidden_dims) + 1
        for i in range(n):
            h = h @ params[f"w{i}"].astype(dt) + params[f"b{i}"].astype(dt)
            if i < n - 1:
                h = gelu(h)
        return h.astype(jnp.float32)

    def site_fn(self, params: Mapping[str, jax.Array], x: jax.Array, V: jax.Array) -> jax.Array:
        del V
        return self.site_apply(params, x)


class SharedMLPCIType(CIType):
    """``shared_mlp``: params per kind (:class:`SharedMLPCIFunction`)."""

    config_cls = SharedMLPCI

    def build(
        self, config: Any, *, decomposition: Any, remat: bool, constrain: Any
    ) -> SharedMLPCIFunction:
        return SharedMLPCIFunction(hidden_dims=tuple(config.hidden_dims), remat=remat)

    def flops(self, config: Any, fn: Any, census: CensusContext) -> None:
        for layout in census.decomposition.kinds:
            dims = (layout.d_in, *config.hidden_dims, layout.C)
            for i, (a, c) in enumerate(itertools.pairwise(dims)):
                census.acc.mm(census.tokens, a, c, dx=i > 0, dw=True, term="ci_fn", part="ci_fn",
                              kind=layout.kind, times=len(layout.layers))  # fmt: skip


register_ci_type(SharedMLPCIType())
