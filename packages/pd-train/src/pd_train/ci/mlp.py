"""``pd.ci.type: mlp`` — per site and component, a scalar MLP on (x@V)_c."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import pd_init
from pd_train._row_shards import row_shard_axis
from pd_train.ci._base import ParamSpec, SiteCIFunction, gelu, he, lecun, site_inner
from pd_train.ci._registry import CIType, register_ci_type
from pd_train.config.pd import MLPCI
from pd_train.decomposition import KindLayout

if TYPE_CHECKING:
    from pd_train.census import CensusContext

__all__ = [
    "MLPCIFunction",
    "MLPCIType",
    "blocked_over_rows",
    "component_mlp_flops",
    "component_mlp_rest",
    "component_mlp_specs",
    "one_layer_forward",
    "one_layer_pullback",
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


Pullback = Callable[[Any, jax.Array, jax.Array], tuple[Any, jax.Array]]


def blocked_over_rows(
    fn: Callable[[Any, jax.Array], jax.Array], block: int, pullback: Pullback | None = None
) -> Callable[[Any, jax.Array], jax.Array]:
    """``fn(params, inner [B, T, C]) -> [B, T, C]``, row-local (each of the B·T rows' output
    depends on that row and ``params`` only), run over blocks of ``block`` rows.

    The forward maps ``fn`` over the blocks; the backward (a custom VJP) recomputes each block's
    forward and pulls its cotangent back, summing the parameters' gradients over the blocks, so
    a block's intermediates ([block, C, h] per layer) are all that is live at once and stay in
    cache instead of ~8 [B·T, C, h] arrays. The rows are flattened B·T; a last block of fewer
    rows (B·T not a multiple of ``block``) runs on its own. The values are ``fn``'s up to float
    rounding (a parameter's gradient is summed per block, then over the blocks).
    """

    def split(a: jax.Array) -> tuple[jax.Array, jax.Array]:
        """[B, T, ...] -> full blocks [n, block, 1, ...] and the rest [r, 1, ...]."""
        rows = a.reshape(-1, 1, *a.shape[2:])
        full = rows.shape[0] // block * block
        return rows[:full].reshape(-1, block, *rows.shape[1:]), rows[full:]

    def join(full: jax.Array, rest: jax.Array, like: jax.Array) -> jax.Array:
        rows = jnp.concatenate([full.reshape(-1, *full.shape[2:]), rest], axis=0)
        return rows.reshape(*like.shape[:2], *rows.shape[2:])

    def local_forward(params: Any, inner: jax.Array) -> jax.Array:
        blocks, rest = split(inner)
        out = jax.lax.map(functools.partial(fn, params), blocks)
        return join(out, fn(params, rest), inner)

    def autodiff(params: Any, inner: jax.Array, g: jax.Array) -> tuple[Any, jax.Array]:
        _, vjp = jax.vjp(fn, params, inner)
        return vjp(g)

    pull = pullback or autodiff

    def local_backward(params: Any, inner: jax.Array, g: jax.Array) -> tuple[Any, jax.Array]:
        (x_blocks, x_rest), (g_blocks, g_rest) = split(inner), split(g)

        def body(acc: Any, xg: tuple[jax.Array, jax.Array]) -> tuple[Any, jax.Array]:
            d_params, d_inner = pull(params, *xg)
            return jax.tree.map(jnp.add, acc, d_params), d_inner

        zeros = jax.tree.map(jnp.zeros_like, params)
        acc, d_blocks = jax.lax.scan(body, zeros, (x_blocks, g_blocks))
        d_params, d_rest = pull(params, x_rest, g_rest)
        return jax.tree.map(jnp.add, acc, d_params), join(d_blocks, d_rest, inner)

    def forward(params: Any, inner: jax.Array) -> jax.Array:
        axis = row_shard_axis(inner.shape[0])
        if axis is None:
            return local_forward(params, inner)
        return jax.shard_map(
            local_forward, in_specs=(P(), P(axis)), out_specs=P(axis), check_vma=False
        )(params, inner)

    def backward(params: Any, inner: jax.Array, g: jax.Array) -> tuple[Any, jax.Array]:
        axis = row_shard_axis(inner.shape[0])
        if axis is None:
            return local_backward(params, inner, g)

        def shard(params: Any, inner: jax.Array, g: jax.Array) -> tuple[Any, jax.Array]:
            d_params, d_inner = local_backward(params, inner, g)
            return jax.lax.psum(d_params, axis), d_inner

        return jax.shard_map(
            shard, in_specs=(P(), P(axis), P(axis)), out_specs=(P(), P(axis)), check_vma=False
        )(params, inner, g)

    @jax.custom_vjp
    def blocked(params: Any, inner: jax.Array) -> jax.Array:
        return forward(params, inner)

    def blocked_fwd(params: Any, inner: jax.Array) -> tuple[jax.Array, Any]:
        return forward(params, inner), (params, inner)

    def blocked_bwd(res: Any, g: jax.Array) -> tuple[Any, jax.Array]:
        params, inner = res
        return backward(params, inner, g)

    blocked.defvjp(blocked_fwd, blocked_bwd)
    return blocked


_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def _normal_cdf(h: jax.Array, erf_form: bool) -> jax.Array:
    """Φ(h): ``(1 + erf(h/√2))/2`` (torch's exact-GELU formula) or jax's ``erfc(-h/√2)/2``."""
    if erf_form:
        return 0.5 * (1.0 + jax.lax.erf(h * _INV_SQRT2))
    return 0.5 * jax.lax.erfc(-h * _INV_SQRT2)


def one_layer_forward(
    params: Mapping[str, jax.Array], inner: jax.Array, *, erf_form: bool = True
) -> jax.Array:
    """One hidden layer's C MLPs written out: inner [n, T, C] -> Σ_H w_out·gelu(inner·w0 + b0)
    + b_out [n, T, C] (fp32): the same function as :meth:`MLPCIFunction.site_apply` (Φ in the
    erf form, the output layer a product and a sum over H: equal up to rounding)."""
    dt = inner.dtype
    w0, b0, w_out = (params[k].astype(dt) for k in ("w0", "b0", "w_out"))
    h = inner[..., None] * w0 + b0
    out = jnp.sum((h * _normal_cdf(h, erf_form)) * w_out, axis=-1)
    return out.astype(jnp.float32) + params["b_out"]


def one_layer_pullback(
    params: Mapping[str, jax.Array], inner: jax.Array, g: jax.Array, *, erf_form: bool = True
) -> tuple[dict[str, jax.Array], jax.Array]:
    """The VJP of one hidden layer's C MLPs, written out: inner [n, T, C], g [n, T, C] (the
    cotangent of the CI pre-activations) -> (grads of w0, b0, w_out, b_out; d inner [n, T, C]).

    With h = inner·w0 + b0 [n, T, C, H], Φ(h) the normal CDF and φ(h) its density:
    gelu(h) = h·Φ(h), gelu'(h) = Φ(h) + h·φ(h); dh = g·w_out·gelu'(h); dw_out = Σ_n g·gelu(h),
    db_out = Σ_n g, dw0 = Σ_n dh·inner, db0 = Σ_n dh, d inner = Σ_H dh·w0. ``erf_form``:
    Φ(h) = (1 + erf(h/√2))/2 (half the cost of jax's erfc form, equal up to rounding).
    """
    dt = inner.dtype
    w0, b0, w_out = (params[k].astype(dt) for k in ("w0", "b0", "w_out"))
    h = inner[..., None] * w0 + b0
    cdf = _normal_cdf(h, erf_form)
    pdf = jnp.exp(-0.5 * h * h) * _INV_SQRT_2PI
    g = g.astype(dt)
    dh = (g[..., None] * w_out) * (cdf + h * pdf)
    rows = tuple(range(inner.ndim - 1))
    grads = {
        "w0": jnp.sum(dh * inner[..., None], axis=rows),
        "b0": jnp.sum(dh, axis=rows),
        "w_out": jnp.sum(g[..., None] * (h * cdf), axis=rows),
        "b_out": jnp.sum(g, axis=rows),
    }
    grads = {k: v.astype(params[k].dtype) for k, v in grads.items()}
    return grads, jnp.sum(dh * w0, axis=-1).astype(dt)


@attrs.frozen(kw_only=True)
class MLPCIFunction(SiteCIFunction):
    """Per component c, a scalar MLP on (x@V)_c: 1 -> hidden_dims -> 1, exact GELU between.

    Params per site: ``w0`` [C, h0], ``b0`` [C, h0], ``w{i}`` [C, h_{i-1}, h_i], ``b{i}`` [C, h_i],
    ``w_out`` [C, h_last], ``b_out`` [C].

    ``batch_block``: None runs each site on all B·T rows at once; an int runs it in blocks of
    that many rows (:func:`blocked_over_rows`: the same values up to rounding, each block's
    intermediates in cache; ``remat`` is then moot, the backward recomputes per block).
    """

    hidden_dims: tuple[int, ...]
    remat: bool = False
    batch_block: int | None = None
    reads_inner_only: ClassVar[bool] = True

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        return component_mlp_specs(layout.C, self.hidden_dims, w0_in=(), w0_fan_in=1)

    def site_apply(self, params: Mapping[str, jax.Array], inner: jax.Array) -> jax.Array:
        """inner = x@V [B, T, C] -> CI pre-activations [B, T, C] (fp32)."""
        dt = inner.dtype
        h = gelu(inner[..., None] * params["w0"].astype(dt) + params["b0"].astype(dt))
        return component_mlp_rest(params, h, len(self.hidden_dims))

    def site_fn(self, params: Mapping[str, jax.Array], x: jax.Array, V: jax.Array) -> jax.Array:
        inner = site_inner(x, V)
        if self.batch_block is None:
            return self.site_apply(params, inner)
        return self.blocked(self.batch_block)(dict(params), inner)

    def blocked(self, block: int) -> Callable[[Any, jax.Array], jax.Array]:
        """``site_apply`` over blocks of ``block`` rows (:func:`blocked_over_rows`); with one
        hidden layer, the forward and VJP written out (:func:`one_layer_forward`,
        :func:`one_layer_pullback`, Φ in the erf form), else JAX's VJP of each block."""
        if len(self.hidden_dims) == 1:
            return blocked_over_rows(one_layer_forward, block, one_layer_pullback)
        return blocked_over_rows(self.site_apply, block)


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
        return MLPCIFunction(
            hidden_dims=tuple(config.hidden_dims), remat=remat, batch_block=config.batch_block
        )

    def flops(self, config: Any, fn: Any, census: CensusContext) -> None:
        for layout in census.decomposition.kinds:
            component_mlp_flops(layout, tuple(config.hidden_dims), census, on_x=False)


register_ci_type(MLPCIType())
