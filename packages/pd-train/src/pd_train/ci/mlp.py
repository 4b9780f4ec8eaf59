"""``pd.ci.type: mlp`` — per site and component, a scalar MLP on (x@V)_c."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import jax
import jax.numpy as jnp

import pd_init
from pd_train.ci._base import ParamSpec, SiteCIFunction, gelu, he, lecun
from pd_train.decomposition import KindLayout

__all__ = ["MLPCIFunction", "component_mlp_rest", "component_mlp_specs"]


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

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        return component_mlp_specs(layout.C, self.hidden_dims, w0_in=(), w0_fan_in=1)

    def site_apply(self, params: Mapping[str, jax.Array], inner: jax.Array) -> jax.Array:
        """inner = x@V [B, T, C] -> CI pre-activations [B, T, C] (fp32)."""
        dt = inner.dtype
        h = gelu(inner[..., None] * params["w0"].astype(dt) + params["b0"].astype(dt))
        return component_mlp_rest(params, h, len(self.hidden_dims))

    def site_fn(self, params: Mapping[str, jax.Array], x: jax.Array, V: jax.Array) -> jax.Array:
        return self.site_apply(params, x @ V)
