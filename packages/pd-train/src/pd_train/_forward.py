"""The clean forward (with a hook at every decomposed site) and the masked forward.

Both walk the decomposition's segments (see :mod:`pd_train.decomposition`); each segment is one
``lax.scan`` over its layers (or a Python loop, for A/B), reading static slices of the target's
layer stack and of each covered kind's stacks.

Masked forward, at a decomposed site of a live layer, per position:
``y = where(route, ((x@V)·(m − δ))@U + δ·(x@W), x@W)``, which equals
``((x@V)·m)@U + δ·(x@Δ)`` with Δ = W − V@U but never forms Δ. A layer with no live site in the
current chunk takes the frozen path under ``lax.cond``, so it costs only its x@W matmuls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from pd_train.decomposition import Decomposition, Segment
from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig
from pd_train.sources import masks, sample_source

Tree = Any


@attrs.frozen(kw_only=True)
class ForwardSpec:
    """Static settings of the forwards."""

    model: LlamaConfig
    decomposition: Decomposition
    compute_dtype: Any = jnp.float32
    sampling: str = "continuous"
    layer_unroll: bool = False
    remat_layers: bool = False
    #: ``constrain(x [B, ...]) -> x`` keeps activations batch-sharded (identity without a mesh).
    constrain: Callable[[jax.Array], jax.Array] = attrs.field(default=lambda x: x, eq=False)


def site_id(layer: int, kind: str) -> int:
    """A site's number for folding its source key: independent of which sites are decomposed."""
    return layer * len(llama.KINDS) + llama.KINDS.index(kind)


def loop(
    body: Callable[[Any, Tree], tuple[Any, Tree]], carry: Any, xs: Tree, *, unroll: bool
) -> tuple[Any, Tree]:
    """``lax.scan(body, carry, xs)``, or the same as a Python loop over static slices."""
    if not unroll:
        return jax.lax.scan(body, carry, xs)
    n = jax.tree_util.tree_leaves(xs)[0].shape[0]
    ys = []
    for i in range(n):
        carry, y = body(carry, jax.tree_util.tree_map(lambda a, i=i: a[i], xs))
        ys.append(y)
    stacked = (
        jax.tree_util.tree_map(lambda *a: jnp.stack(a), *ys) if ys and ys[0] is not None else None
    )
    return carry, stacked


def _slice(tree: Tree, start: int, size: int) -> Tree:
    return jax.tree_util.tree_map(lambda a: jax.lax.slice_in_dim(a, start, start + size), tree)


def _frozen_body(
    spec: ForwardSpec, cos: jax.Array, sin: jax.Array
) -> Callable[[jax.Array, Tree], tuple[jax.Array, None]]:
    def body(h: jax.Array, layer: Tree) -> tuple[jax.Array, None]:
        return spec.constrain(llama.decoder_layer(h, layer, cos, sin, spec.model)), None

    return body


def _start(
    spec: ForwardSpec, target: Tree, tokens: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    h = spec.constrain(llama.embed(target, tokens, spec.compute_dtype))
    cos, sin = llama.rope_cos_sin(spec.model, tokens.shape[1], spec.compute_dtype)
    return h, cos, sin


class CleanRunner:
    """The frozen target on one batch, as :class:`pd_train.ci.CleanRun`."""

    def __init__(self, spec: ForwardSpec, target: Tree, tokens: jax.Array) -> None:
        self.spec, self.target, self.tokens = spec, target, tokens

    def run(
        self, site_fn: Callable[[str, jax.Array, Any], Any], site_xs: Mapping[str, Any]
    ) -> tuple[jax.Array, dict[str, Any]]:
        spec = self.spec
        h, cos, sin = _start(spec, self.target, self.tokens)
        outputs: dict[str, list[Any]] = {k: [] for k in site_xs}
        for seg in spec.decomposition.segments:
            layers = _slice(self.target["layers"], seg.start, seg.size)
            kinds = [k for k in seg.kinds if k in site_xs]
            if not kinds:
                h, _ = loop(_frozen_body(spec, cos, sin), h, layers, unroll=spec.layer_unroll)
                continue
            offsets = dict(zip(seg.kinds, seg.offsets, strict=True))
            sites = {k: _slice(site_xs[k], offsets[k], seg.size) for k in kinds}

            def body(h: jax.Array, xs: Tree) -> tuple[jax.Array, dict[str, Any]]:
                ys: dict[str, Any] = {}

                def linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
                    if kind in xs["sites"]:
                        ys[kind] = site_fn(kind, jax.lax.stop_gradient(x), xs["sites"][kind])
                    return x @ w.astype(x.dtype)

                h = llama.decoder_layer(h, xs["layer"], cos, sin, spec.model, linear)
                return spec.constrain(h), ys

            h, ys = loop(body, h, {"layer": layers, "sites": sites}, unroll=spec.layer_unroll)
            for k in kinds:
                outputs[k].append(ys[k])
        logits = llama.unembed(self.target, h, spec.model)
        joined = {
            k: jax.tree_util.tree_map(lambda *a: jnp.concatenate(a, axis=0), *v)
            for k, v in outputs.items()
        }
        return jax.lax.stop_gradient(logits), joined


def masked_forward(
    spec: ForwardSpec,
    *,
    target: Tree,
    tokens: jax.Array,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    live: jax.Array,
    routed: jax.Array | None,
    key: jax.Array,
) -> jax.Array:
    """Logits [B, T, vocab] of the target with live sites on their component path.

    components[kind]: {"V": [n_k, d_in, C], "U": [n_k, C, d_out]} (compute dtype);
    ci_lower[kind]: [n_k, B, T, C]; live: [L, K] bool over (layer, decomposed kind);
    routed: [L, K, B, T] bool (positions that take the component path) or None for every
    position of a live site; key: this draw's source key (folded per site by ``site_id``).
    """
    h, cos, sin = _start(spec, target, tokens)
    names = spec.decomposition.kind_names
    for seg in spec.decomposition.segments:
        layers = _slice(target["layers"], seg.start, seg.size)
        if not seg.kinds:
            h, _ = loop(_frozen_body(spec, cos, sin), h, layers, unroll=spec.layer_unroll)
            continue
        cols = np.array([names.index(k) for k in seg.kinds])
        xs: dict[str, Any] = {
            "layer": layers,
            "live": live[seg.start : seg.stop][:, cols],
            "site_id": jnp.asarray(
                [[site_id(layer, k) for k in seg.kinds] for layer in range(seg.start, seg.stop)],
                dtype=jnp.uint32,
            ),
            "V": {k: _slice(components[k]["V"], o, seg.size) for k, o in _kind_offsets(seg)},
            "U": {k: _slice(components[k]["U"], o, seg.size) for k, o in _kind_offsets(seg)},
            "ci": {k: _slice(ci_lower[k], o, seg.size) for k, o in _kind_offsets(seg)},
        }
        if routed is not None:
            xs["routed"] = routed[seg.start : seg.stop][:, cols]
        body = _masked_body(spec, seg, cos, sin, key)
        if spec.remat_layers:
            body = jax.checkpoint(body)
        h, _ = loop(body, h, xs, unroll=spec.layer_unroll)
    return llama.unembed(target, h, spec.model)


def _kind_offsets(seg: Segment) -> list[tuple[str, int]]:
    return list(zip(seg.kinds, seg.offsets, strict=True))


def _masked_body(
    spec: ForwardSpec, seg: Segment, cos: jax.Array, sin: jax.Array, key: jax.Array
) -> Callable[[jax.Array, Tree], tuple[jax.Array, None]]:
    model = spec.model

    def body(h: jax.Array, xs: Tree) -> tuple[jax.Array, None]:
        def live_layer(h: jax.Array) -> jax.Array:
            def linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
                xw = x @ w.astype(x.dtype)
                if kind not in seg.kinds:
                    return xw
                j = seg.kinds.index(kind)
                ci = xs["ci"][kind]
                c = ci.shape[-1]
                source = sample_source(
                    spec.sampling,
                    (*x.shape[:-1], c + 1),
                    key=jax.random.fold_in(key, xs["site_id"][j]),
                )
                m, delta = masks(ci, source)
                inner = (x @ xs["V"][kind]) * (m - delta[..., None]).astype(x.dtype)
                out = inner @ xs["U"][kind] + delta[..., None].astype(x.dtype) * xw
                route = xs["live"][j]
                if "routed" in xs:
                    route = route & xs["routed"][j]
                else:
                    route = jnp.broadcast_to(route, x.shape[:-1])
                return jnp.where(route[..., None], out, xw)

            return llama.decoder_layer(h, xs["layer"], cos, sin, model, linear)

        def frozen_layer(h: jax.Array) -> jax.Array:
            return llama.decoder_layer(h, xs["layer"], cos, sin, model)

        h = jax.lax.cond(jnp.any(xs["live"]), live_layer, frozen_layer, h)
        return spec.constrain(h), None

    return body
