"""Causal-importance (CI) functions.

A CI function maps what the clean (frozen) forward sees at each decomposed site to CI
pre-activations [B, T, C] per site; :mod:`pd_train.squash` turns those into ``ci_lower`` and
``ci_upper``. The step calls only :meth:`CIFunction.causal_importance`, which receives a
:class:`CleanRun` — a handle that runs the clean forward and hands the CI function every site's
input. Site-local functions (``mlp``, ``shared_mlp``) compute their output inside the clean layer
scan through ``clean.run(site_fn)``. A function that needs all sites at once (e.g. a chunkwise
transformer over the clean forward's per-site inputs) would call ``clean.run`` to collect inputs
and then run its own stage, returning the same ``{kind: [n_k, B, T, C]}``: the step is unchanged.

Parameters are stacked per kind with a leading layer axis, exactly like V/U, and named per site for
pd-init (``layers.3.mlp.down_proj.ci_fn.w0``) so their keys derive from names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs
import jax
import jax.numpy as jnp

import pd_init
from pd_train.config import MLPCI, CIConfig, SharedMLPCI
from pd_train.decomposition import Decomposition, KindLayout

__all__ = [
    "CIFunction",
    "CleanRun",
    "MLPCIFunction",
    "ParamSpec",
    "SharedMLPCIFunction",
    "SiteFn",
    "make_ci_function",
]

#: ``site_fn(kind, x [B, T, d_in], site_xs) -> y``: called on every decomposed site of the clean
#: forward; ``site_xs`` is that site's slice of the ``site_xs`` tree passed to ``CleanRun.run``.
SiteFn = Callable[[str, jax.Array, Any], Any]


class CleanRun(Protocol):
    """Runs the frozen target once (the step builds it)."""

    def run(self, site_fn: SiteFn, site_xs: Mapping[str, Any]) -> tuple[jax.Array, dict[str, Any]]:
        """Clean logits [B, T, vocab] and ``{kind: stacked site_fn outputs [n_k, ...]}``.

        ``site_xs[kind]`` is a tree of arrays with leading axis n_k (the kind's stack); the
        site inputs given to ``site_fn`` carry no gradient (the target is frozen).
        """
        ...


@attrs.frozen(kw_only=True)
class ParamSpec:
    """One per-site parameter: its shape without the layer axis and its initializer."""

    shape: tuple[int, ...]
    init: pd_init.Initializer


class CIFunction(Protocol):
    """The interface the step relies on."""

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        """Per-site parameters of one kind (stacked to ``[n_k, *shape]`` by the caller)."""
        ...

    def causal_importance(
        self,
        params: Mapping[str, Any],
        components: Mapping[str, Mapping[str, jax.Array]],
        clean: CleanRun,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Clean logits [B, T, vocab] and CI pre-activations ``{kind: [n_k, B, T, C]}``.

        ``params[kind]``: stacked CI params; ``components[kind]``: {"V": [n_k, d_in, C],
        "U": [n_k, C, d_out]} in the compute dtype.
        """
        ...


def _he(fan_in: int) -> pd_init.Normal:
    return pd_init.Normal(std=(2.0 / fan_in) ** 0.5)


def _lecun(fan_in: int) -> pd_init.Normal:
    return pd_init.Normal(std=(1.0 / fan_in) ** 0.5)


@attrs.frozen(kw_only=True)
class MLPCIFunction:
    """Per component c, a scalar MLP on (x@V)_c: 1 -> hidden_dims -> 1, GELU between layers.

    Params per site: ``w0`` [C, h0], ``b0`` [C, h0], ``w{i}`` [C, h_{i-1}, h_i], ``b{i}`` [C, h_i],
    ``w_out`` [C, h_last], ``b_out`` [C].
    """

    hidden_dims: tuple[int, ...]
    remat: bool = False

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        c, dims = layout.C, self.hidden_dims
        specs = {
            "w0": ParamSpec(shape=(c, dims[0]), init=_he(1)),
            "b0": ParamSpec(shape=(c, dims[0]), init=pd_init.Zeros()),
        }
        for i in range(1, len(dims)):
            specs[f"w{i}"] = ParamSpec(shape=(c, dims[i - 1], dims[i]), init=_he(dims[i - 1]))
            specs[f"b{i}"] = ParamSpec(shape=(c, dims[i]), init=pd_init.Zeros())
        specs["w_out"] = ParamSpec(shape=(c, dims[-1]), init=_lecun(dims[-1]))
        specs["b_out"] = ParamSpec(shape=(c,), init=pd_init.Zeros())
        return specs

    def site_apply(self, params: Mapping[str, jax.Array], inner: jax.Array) -> jax.Array:
        """inner = x@V [B, T, C] -> CI pre-activations [B, T, C] (fp32)."""
        dt = inner.dtype
        h = jax.nn.gelu(inner[..., None] * params["w0"].astype(dt) + params["b0"].astype(dt))
        for i in range(1, len(self.hidden_dims)):
            w, b = params[f"w{i}"].astype(dt), params[f"b{i}"].astype(dt)
            h = jax.nn.gelu(jnp.einsum("btch,chk->btck", h, w) + b)
        out = jnp.einsum("btch,ch->btc", h, params["w_out"].astype(dt))
        return out.astype(jnp.float32) + params["b_out"]

    def causal_importance(
        self,
        params: Mapping[str, Any],
        components: Mapping[str, Mapping[str, jax.Array]],
        clean: CleanRun,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        apply = jax.checkpoint(self.site_apply) if self.remat else self.site_apply

        def site_fn(kind: str, x: jax.Array, xs: Any) -> jax.Array:
            del kind
            return apply(xs["params"], x @ xs["V"])

        site_xs = {k: {"params": params[k], "V": components[k]["V"]} for k in params}
        return clean.run(site_fn, site_xs)


@attrs.frozen(kw_only=True)
class SharedMLPCIFunction:
    """Per site, one MLP on the site input x: d_in -> hidden_dims -> C, GELU between layers.

    Params per site: ``w{i}`` [d_{i}, d_{i+1}], ``b{i}`` [d_{i+1}] with d = (d_in, *hidden, C).
    """

    hidden_dims: tuple[int, ...]
    remat: bool = False

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        dims = (layout.d_in, *self.hidden_dims, layout.C)
        specs = {}
        last = len(dims) - 2
        for i in range(len(dims) - 1):
            init = _lecun(dims[i]) if i == last else _he(dims[i])
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
                h = jax.nn.gelu(h)
        return h.astype(jnp.float32)

    def causal_importance(
        self,
        params: Mapping[str, Any],
        components: Mapping[str, Mapping[str, jax.Array]],
        clean: CleanRun,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        del components
        apply = jax.checkpoint(self.site_apply) if self.remat else self.site_apply

        def site_fn(kind: str, x: jax.Array, xs: Any) -> jax.Array:
            del kind
            return apply(xs, x)

        return clean.run(site_fn, dict(params))


def make_ci_function(config: CIConfig, *, remat: bool = False) -> CIFunction:
    """The CI function a config names."""
    if isinstance(config, MLPCI):
        return MLPCIFunction(hidden_dims=tuple(config.hidden_dims), remat=remat)
    if isinstance(config, SharedMLPCI):
        return SharedMLPCIFunction(hidden_dims=tuple(config.hidden_dims), remat=remat)
    msg = f"pd.ci.type: unknown CI function {config!r}; allowed: 'mlp', 'shared_mlp'"
    raise ValueError(msg)


def ci_param_specs(
    ci_fn: CIFunction, decomposition: Decomposition
) -> dict[str, dict[str, ParamSpec]]:
    """``{kind: {param: ParamSpec}}`` for every decomposed kind."""
    return {layout.kind: ci_fn.param_specs(layout) for layout in decomposition.kinds}
