"""``pd.ci.type: mlp`` — per site and component, a scalar MLP on (x@V)_c."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import jax
import jax.numpy as jnp

import pd_init
from pd_train.ci._base import ParamSpec, SiteCIFunction, gelu, he, lecun, site_inner
from pd_train.ci._registry import CIType, register_ci_type
from pd_train.config.pd import MLPCI
from pd_train.decomposition import KindLayout

if TYPE_CHECKING:
    from pd_train.census import CensusContext

__all__ = [
    "MLPCIFunction",
    "MLPCIType",
    "component_mlp_flops",
    "component_mlp_rest",
    "component_mlp_specs",
]


def component_mlp_specs(
    c: int, dims: tuple[int, ...], *, w0_in: tuple[int, ...], w0_fan_in: int
) -> dict[str, ParamSpec]:
    """C independent MLPs ``-> hidden dims -> 1``: ``w0`` [C, *w0_in, h0], ``b0`` [C, h0],
    ``w{i}`` [C, h_{i-1}, h_i], ``b{i}`` [C, h_i], ``w_out`` [C, h_last], ``b_out`` [C]."""
    specs = {
        "w0": ParamSpec(shape=(c, *w0_in, dims[0]), init=he(w0_fan_in)),
        "b0": ParamSpec(shape=(c, dims[0]), init=pd_init.Zeros()),
    }
    for i in range(1, len(dims)):
        specs[f"w{i}"] = ParamSpec(shape=(c, dims[i - 1], dims[i]), init=he(dims[i - 1]))
        specs[f"b{i}"] = ParamSpec(shape=(c, dims[i]), init=pd_init.Zeros())
    specs["w_out"] = ParamSpec(shape=(c, dims[-1]), init=lecun(dims[-1]))
    specs["b_out"] = ParamSpec(shape=(c,), init=pd_init.Zeros())
    return specs


def component_mlp_rest(params: Mapping[str, jax.Array], h: jax.Array, n_hidden: int) -> jax.Array:
    """The C MLPs after their first layer: h [B, T, C, h0] (the first layer's activations) ->
    CI pre-activations [B, T, C] (fp32)."""
    dt = h.dtype
    for i in range(1, n_hidden):
        w, b = params[f"w{i}"].astype(dt), params[f"b{i}"].astype(dt)
        h = gelu(jnp.einsum("btch,chk->btck", h, w) + b)
    out = jnp.einsum("btch,ch->btc", h, params["w_out"].astype(dt))
    return out.astype(jnp.float32) + params["b_out"]


@attrs.frozen(kw_only=True)
class MLPCIFunction(SiteCIFunction):
    """Per component c, a scalar MLP on (x@V)_c: 1 -> hidden_dims -> 1, exact GELU between.

    Params per site: ``w0`` [C, h0], ``b0`` [C, h0], ``w{i}`` [C, h_{i-1}, h_i], ``b{i}`` [C, h_i],
    ``w_out`` [C, h_last], ``b_out`` [C].
    """

    hidden_dims: tuple[int, ...]
    remat: bool = False
    reads_inner_only: ClassVar[bool] = True

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        return component_mlp_specs(layout.C, self.hidden_dims, w0_in=(), w0_fan_in=1)

    def site_apply(self, params: Mapping[str, jax.Array], inner: jax.Array) -> jax.Array:
        """inner = x@V [B, T, C] -> CI pre-activations [B, T, C] (fp32)."""
        dt = inner.dtype
        h = gelu(inner[..., None] * params["w0"].astype(dt) + params["b0"].astype(dt))
        return component_mlp_rest(params, h, len(self.hidden_dims))

    def site_fn(self, params: Mapping[str, jax.Array], x: jax.Array, V: jax.Array) -> jax.Array:
        return self.site_apply(params, site_inner(x, V))


def component_mlp_flops(
    layout: KindLayout, hidden: tuple[int, ...], census: CensusContext, *, on_x: bool
) -> None:
    """C per-component MLPs on n positions: the first layer (on x@V, elementwise, or on x),
    the hidden layers, the output; dx where the input carries gradient."""
    n = census.tokens
    kw: dict[str, Any] = {
        "term": "ci_fn",
        "part": "ci_fn",
        "kind": layout.kind,
        "times": len(layout.layers),
    }
    acc = census.acc
    if on_x:  # per component d_in -> h0 on x
        acc.mm(n * layout.C, layout.d_in, hidden[0], dx=False, dw=True, **kw)
    else:  # x@V (a row lookup at embed_tokens: no matmul), then per component 1 -> h0
        if layout.kind != "embed_tokens":
            acc.mm(n, layout.d_in, layout.C, dx=False, dw=True, **kw)
        acc.mm(n * layout.C, 1, hidden[0], dx=True, dw=True, **kw)
    for a, c in itertools.pairwise(hidden):
        acc.mm(n * layout.C, a, c, dx=True, dw=True, **kw)
    acc.mm(n * layout.C, hidden[-1], 1, dx=True, dw=True, **kw)


class MLPCIType(CIType):
    """``mlp``: params per kind (:class:`MLPCIFunction`)."""

    config_cls = MLPCI

    def build(
        self, config: Any, *, decomposition: Any, remat: bool, constrain: Any
    ) -> MLPCIFunction:
        return MLPCIFunction(hidden_dims=tuple(config.hidden_dims), remat=remat)

    def flops(self, config: Any, fn: Any, census: CensusContext) -> None:
        for layout in census.decomposition.kinds:
            component_mlp_flops(layout, tuple(config.hidden_dims), census, on_x=False)


register_ci_type(MLPCIType())
