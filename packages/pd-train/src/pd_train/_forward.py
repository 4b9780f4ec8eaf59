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

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from pd_train.decomposition import GLOBAL_KINDS, Decomposition, Segment
from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig
from pd_train.sources import masks, sample_source
from pd_train.squash import unit_clip
from pd_train.targets.base import Target, as_target

Tree = Any

#: The ``checkpoint_name`` of a drawn source [B, T, C + 1] in :func:`live_site_output`. With
#: ``remat_layers`` and static liveness a layer's backward recomputes everything but these:
#: saving them costs one [B, T, C + 1] buffer per live site and spares drawing them again
#: (XLA:CPU lowers each threefry draw as a loop): 5 % fewer HLO lines in the default step, the
#: same values, its CPU per step within noise (docs/findings.md section 10).
SOURCE_NAME = "pd.source"
_SAVE_SOURCES = jax.checkpoint_policies.save_only_these_names(SOURCE_NAME)


@attrs.frozen(kw_only=True)
class ForwardSpec:
    """Static settings of the forwards. ``model``: the target (a :class:`Target`, or a
    ``LlamaConfig`` for the Llama target)."""

    model: LlamaConfig | Target
    decomposition: Decomposition
    compute_dtype: Any = jnp.float32
    sampling: str = "continuous"
    #: How the sources' uniforms are computed (``pd.recon.random_draws``; the same bits).
    random_draws: str = "jax"
    layer_unroll: bool = False
    remat_layers: bool = False
    #: With ``remat_layers``: a rematerialized layer whose liveness is static keeps its drawn
    #: sources for its backward (:func:`_remat_policy`); False draws them again there.
    save_sources: bool = True
    #: False: live sites output ((x@V)·m)@U (no delta component, no delta channel drawn).
    use_delta: bool = True
    #: Whether the masked forward runs a target's ``reduced_stream`` (:mod:`pd_train.targets.base`)
    #: instead of its own stream: ``"auto"`` where the target offers it and finds it cheaper,
    #: ``"always"`` wherever it offers it, ``"never"``. The clean forward (the CI's inputs) always
    #: runs the target itself.
    reduce_stream: Literal["auto", "always", "never"] = "auto"
    #: ``constrain(x [B, ...]) -> x`` keeps activations batch-sharded (identity without a mesh).
    constrain: Callable[[jax.Array], jax.Array] = attrs.field(default=lambda x: x, eq=False)

    @property
    def target(self) -> Target:
        """The model as a :class:`Target` (its layer body, kinds and output)."""
        return as_target(self.model)


def site_id(layer: int, kind: str, kinds: Sequence[str] = llama.KINDS) -> int:
    """A site's number for folding its source key: independent of which sites are decomposed.
    ``kinds``: the target's kinds (default Llama's). A site outside the layer stack
    (``embed_tokens``, ``lm_head``) has a number of its own, past any layer site's."""
    if kind in GLOBAL_KINDS:
        return GLOBAL_SITE_IDS + GLOBAL_KINDS.index(kind)
    return layer * len(kinds) + tuple(kinds).index(kind)


#: The first :func:`site_id` of the sites outside the layer stack (beyond any model's layers).
GLOBAL_SITE_IDS = 2**30


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
    spec: ForwardSpec, ctx: Any, *, collect: bool = False
) -> Callable[[jax.Array, Tree], tuple[jax.Array, Any]]:
    """The plain layer; ``collect``: also emit its input (the residual stream) as ``ys``."""
    arch = spec.target

    def body(h: jax.Array, layer: Tree) -> tuple[jax.Array, Any]:
        out = spec.constrain(arch.layer(h, layer, ctx))
        return out, (h if collect else None)

    return body


def _start(
    spec: ForwardSpec, target: Tree, tokens: jax.Array, lookup: Any = None
) -> tuple[jax.Array, Any]:
    if lookup is None:
        h, ctx = spec.target.start(target, tokens, spec.compute_dtype)
    else:
        h, ctx = spec.target.start(  # type: ignore[call-arg]
            target, tokens, spec.compute_dtype, lookup
        )
    return spec.constrain(h), ctx


def _finish(spec: ForwardSpec, target: Tree, h: jax.Array, linear: Any = None) -> jax.Array:
    if linear is None:
        return spec.target.finish(target, h)
    return spec.target.finish(target, h, linear)  # type: ignore[call-arg]


def _first(tree: Tree) -> Tree:
    """The one member of a global kind's stack: ``a[0]`` of every leaf."""
    return jax.tree_util.tree_map(lambda a: a[0], tree)


def _lookup_rows(tokens: jax.Array, table: jax.Array) -> jax.Array:
    return jnp.take(table, tokens, axis=0)


@jax.tree_util.register_pytree_node_class
class StreamCoefficients:
    """A site input on a reduced stream, as the CI sees it: x = coeffs·basis, never formed.
    ``x @ w`` is ``coeffs @ (basis @ w)``; ``dtype`` and ``shape`` are x's. coeffs [B, T, R],
    basis [R, d_in]. Only what a CI function that reads ``x @ V`` uses is defined."""

    def __init__(self, coeffs: jax.Array, basis: jax.Array) -> None:
        self.coeffs, self.basis = coeffs, basis

    @property
    def dtype(self) -> Any:
        return self.coeffs.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.coeffs.shape[:-1], self.basis.shape[-1])

    def __matmul__(self, w: jax.Array) -> jax.Array:
        return self.coeffs @ (self.basis @ w.astype(self.basis.dtype))

    def tree_flatten(self) -> tuple[tuple[jax.Array, jax.Array], None]:
        return (self.coeffs, self.basis), None

    @classmethod
    def tree_unflatten(cls, aux: None, leaves: Any) -> StreamCoefficients:
        del aux
        return cls(*leaves)


class CleanRunner:
    """The frozen target on one batch, as :class:`pd_train.ci.CleanRun`.

    After :meth:`run`, ``stream`` holds the clean residual stream [L + 1, B, T, hidden]: the
    input of every layer, then the last layer's output. Masked forwards reuse it: up to their
    first live layer they equal the clean forward, so they copy it instead of recomputing.

    ``ci_reads_inner``: the CI function reads a site only as ``x @ V`` (its
    ``reads_inner_only``). Then a target with a ``reduced_stream`` (``spec.reduce_stream``) runs
    on its reduced stream and ``site_fn`` gets the stream sites' inputs as
    :class:`StreamCoefficients` (the same x@V up to rounding); ``stream`` is formed from the
    coefficients (under jit, only if something reads it).
    """

    def __init__(
        self, spec: ForwardSpec, target: Tree, tokens: jax.Array, *, ci_reads_inner: bool = False
    ) -> None:
        self.spec, self.target, self.tokens = spec, target, tokens
        self.ci_reads_inner = ci_reads_inner
        self.stream: jax.Array | None = None

    def run(
        self, site_fn: Callable[[str, jax.Array, Any], Any], site_xs: Mapping[str, Any]
    ) -> tuple[jax.Array, dict[str, Any]]:
        reduced = _reduced(self.spec, self.target, None) if self.ci_reads_inner else None
        if reduced is None:
            return self._run(self.spec, self.target, site_fn, site_xs)
        spec, target, _ = reduced
        basis = target["basis"]
        stream_kinds = spec.target.stream_kinds  # type: ignore[attr-defined]

        def reduced_site_fn(kind: str, x: jax.Array, xs: Any) -> Any:
            if kind in stream_kinds:
                x = StreamCoefficients(x, jax.lax.stop_gradient(basis))  # type: ignore[assignment]
            return site_fn(kind, x, xs)

        logits, outputs = self._run(spec, target, reduced_site_fn, site_xs)
        assert self.stream is not None
        self.stream = self.stream @ jax.lax.stop_gradient(basis)
        return logits, outputs

    def _run(
        self,
        spec: ForwardSpec,
        target: Tree,
        site_fn: Callable[[str, jax.Array, Any], Any],
        site_xs: Mapping[str, Any],
    ) -> tuple[jax.Array, dict[str, Any]]:
        arch = spec.target
        outputs: dict[str, list[Any]] = {k: [] for k in site_xs}
        lookup = None
        if "embed_tokens" in site_xs:

            def lookup(kind: str, tokens: jax.Array, table: jax.Array) -> jax.Array:
                outputs[kind].append(_stack1(site_fn(kind, tokens, _first(site_xs[kind]))))
                return _lookup_rows(tokens, table)

        h, ctx = _start(spec, target, self.tokens, lookup)
        stream: list[jax.Array] = []
        for seg in spec.decomposition.segments:
            layers = _slice(target["layers"], seg.start, seg.size)
            kinds = [k for k in seg.kinds if k in site_xs]
            if not kinds:
                body = _frozen_body(spec, ctx, collect=True)
                h, inputs = loop(body, h, layers, unroll=spec.layer_unroll)
                stream.append(inputs)
                continue
            offsets = dict(zip(seg.kinds, seg.offsets, strict=True))
            sites = {k: _slice(site_xs[k], offsets[k], seg.size) for k in kinds}

            def site_body(h: jax.Array, xs: Tree) -> tuple[jax.Array, Any]:
                ys: dict[str, Any] = {}

                def linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
                    if kind in xs["sites"]:
                        ys[kind] = site_fn(kind, jax.lax.stop_gradient(x), xs["sites"][kind])
                    return x @ w.astype(x.dtype)

                out = arch.layer(h, xs["layer"], ctx, linear)
                return spec.constrain(out), (ys, h)

            xs = {"layer": layers, "sites": sites}
            h, (ys, inputs) = loop(site_body, h, xs, unroll=spec.layer_unroll)
            stream.append(inputs)
            for k in kinds:
                outputs[k].append(ys[k])
        self.stream = jax.lax.stop_gradient(jnp.concatenate([*stream, h[None]], axis=0))
        head = None
        if "lm_head" in site_xs:

            def head(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
                x = jax.lax.stop_gradient(x)
                outputs[kind].append(_stack1(site_fn(kind, x, _first(site_xs[kind]))))
                return x @ w.astype(x.dtype)

        logits = _finish(spec, target, h, head)
        joined = {
            k: jax.tree_util.tree_map(lambda *a: jnp.concatenate(a, axis=0), *v)
            for k, v in outputs.items()
        }
        return jax.lax.stop_gradient(logits), joined


def _stack1(tree: Tree) -> Tree:
    return jax.tree_util.tree_map(lambda a: a[None], tree)


def masked_forward(
    spec: ForwardSpec,
    *,
    target: Tree,
    tokens: jax.Array,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    live: jax.Array | np.ndarray,
    routed: jax.Array | None,
    key: jax.Array,
    clean_stream: jax.Array | None = None,
    source_scale: jax.Array | None = None,
    sources: Mapping[str, jax.Array] | None = None,
    ci_first: jax.Array | None = None,
) -> jax.Array:
    """Logits [B, T, vocab] of the target with live sites on their component path.

    components[kind]: {"V": [n_k, d_in, C], "U": [n_k, C, d_out]} (compute dtype);
    ci_lower[kind]: [n_k, B, T, C]; live: [L, K] bool over (layer, decomposed kind);
    routed: [L, K, B, T] bool (positions that take the component path) or None for every
    position of a live site; key: this draw's source key (folded per site by ``site_id``);
    clean_stream: [L + 1, B, T, hidden] from :class:`CleanRunner`, or None. With it, layers
    before the first live layer copy the clean stream (no compute, no backward) instead of
    recomputing what the clean forward already did. source_scale: a scalar (may be traced)
    multiplying every drawn source: 0 gives m = ci_lower, δ = 0 and 1 the sampled masks, so one
    traced forward serves both (evaluation scans its mask modes this way); None: no scaling.
    sources: given sources instead of drawn ones (PGD): sources[kind] [n_k, B | 1, T | 1, C + 1],
    broadcast over the batch and positions; ``key`` is then unused.
    ci_first: None, or a layer number (may be traced) when ``ci_lower`` holds a window of layers:
    ci_lower[kind] [n, B, T, C] for layers [ci_first, ci_first + n), every kind decomposed at
    every layer, and every live layer inside the window (a layer-aligned recon chunk's own CI,
    so the backward accumulates only the window's gradient); needs a traced ``live``.

    ``live`` as a traced array: each layer picks copy, frozen or live with ``lax.switch`` (one
    body for any liveness: what the chunk scan needs). ``live`` as a numpy array: the forward is
    specialized at trace time — it starts at the first live layer, runs of frozen layers scan the
    plain layer, live layers scan a body with their live kinds wired in, no branches (what an
    unrolled chunk loop traces).

    A target with a ``reduced_stream`` (the residual MLP; ``spec.reduce_stream``) runs on its
    reduced stream instead, from layer 0 (``clean_stream`` unused): the same output, the same
    sites' values, CI and sources, up to float rounding.
    """
    reduced = _reduced(spec, target, components)
    if reduced is not None:  # the same function on a narrower stream, from layer 0
        spec, target, components = reduced
        clean_stream = None
    m = _MaskedInputs(
        spec=spec,
        target=target,
        components=components,
        ci_lower=ci_lower,
        live=live,
        routed=routed,
        key=key,
        clean_stream=clean_stream,
        source_scale=source_scale,
        sources=sources,
        ci_first=ci_first,
    )
    hook = functools.partial(
        _global_site,
        spec,
        components=components,
        ci_lower=ci_lower,
        live=live,
        routed=routed,
        key=key,
        source_scale=source_scale,
        sources=sources,
    )
    lookup = hook if _global_live(spec, live, "embed_tokens") else None
    head = hook if _global_live(spec, live, "lm_head") else None
    names = spec.decomposition.kind_names
    h, ctx = _start(spec, target, tokens, lookup)
    h, first = _resume_point(m, h, embed_live=lookup is not None)
    for seg in spec.decomposition.segments:
        cols = np.array([names.index(k) for k in seg.kinds], dtype=np.int32)
        seg_live = live[seg.start : seg.stop][:, cols]  # [seg.size, len(seg.kinds)]
        for run in _layer_runs(m, seg, seg_live, first):
            h = _masked_run(m, seg, (cols, seg_live), run, h, ctx, first)
    return _finish(spec, target, h, head)


def _reduced(
    spec: ForwardSpec, target: Tree, components: Mapping[str, Mapping[str, jax.Array]] | None
) -> tuple[ForwardSpec, Tree, Any] | None:
    """(spec, target params, components) of the target's ``reduced_stream`` where
    ``spec.reduce_stream`` asks for it and the target offers it, else None. ``components``
    None: the frozen model's (the clean forward's; components None)."""
    reduce = getattr(spec.target, "reduced_stream", None)
    if spec.reduce_stream == "never" or reduce is None:
        return None
    out = reduce(target, components, force=spec.reduce_stream == "always")
    if out is None:
        return None
    model, params, comps = out
    return attrs.evolve(spec, model=model, reduce_stream="never"), params, comps


@attrs.frozen(kw_only=True, eq=False)
class _MaskedInputs:
    """The arguments of one :func:`masked_forward` call that its pieces read."""

    spec: ForwardSpec
    target: Tree
    components: Mapping[str, Mapping[str, jax.Array]]
    ci_lower: Mapping[str, jax.Array]
    live: jax.Array | np.ndarray
    routed: jax.Array | None
    key: jax.Array
    clean_stream: jax.Array | None
    source_scale: jax.Array | None
    sources: Mapping[str, jax.Array] | None
    ci_first: jax.Array | None

    @property
    def static(self) -> bool:
        """Whether liveness is known at trace time (a numpy ``live``)."""
        return isinstance(self.live, np.ndarray)


#: A run of consecutive layers [start, stop) of one segment and their static live kinds (one
#: flag per kind of the segment), or None where liveness is traced.
_Run = tuple[int, int, tuple[bool, ...] | None]


def _resume_point(m: _MaskedInputs, h: jax.Array, *, embed_live: bool) -> tuple[jax.Array, Any]:
    """(the residual stream the layers start from, the first layer that runs).

    Without a clean stream: the embedding's output and layer 0. With one, static: the clean
    stream at the first live layer (L if none; the embedding's own output when the embedding is
    live and that layer is 0). Traced: ``h`` unchanged and the first live layer as a traced
    number (the layers before it copy the clean stream, :func:`_masked_body`)."""
    n_layers = m.spec.decomposition.n_layers
    if m.clean_stream is None:
        return h, 0
    # (the embedding's row is layer 0, the LM head's the last layer)
    if m.static:
        live_layers = np.flatnonzero(np.asarray(m.live).any(axis=1))
        first = int(live_layers[0]) if live_layers.size else n_layers
        if not embed_live or first > 0:
            h = m.clean_stream[first]
        return h, first
    any_live = jnp.any(m.live, axis=1)
    return h, jnp.where(jnp.any(any_live), jnp.argmax(any_live), n_layers)


def _layer_runs(m: _MaskedInputs, seg: Segment, seg_live: Any, first: Any) -> list[_Run]:
    """The runs of ``seg``'s layers the forward scans: with traced liveness the whole segment
    as one run; static, the maximal runs of equal live kinds (``seg_live``) from ``first`` on."""
    if not m.static:
        return [(seg.start, seg.stop, None)]
    return [
        (max(a, first), b, f)
        for a, b, f in _static_runs(seg.start, np.asarray(seg_live))
        if b > first
    ]


def _masked_run(
    m: _MaskedInputs,
    seg: Segment,
    columns: tuple[np.ndarray, Any],
    run: _Run,
    h: jax.Array,
    ctx: Any,
    first: Any,
) -> jax.Array:
    """``h`` through the layers of one run: the plain layer's scan for a static frozen run, else
    a scan of :func:`_masked_body` over the run's per-layer inputs (:func:`_run_xs`).
    ``columns``: (the columns of ``seg``'s kinds in ``live``/``routed``, ``live``'s rows of the
    segment at those columns)."""
    spec = m.spec
    start, stop, flags = run
    frozen = not seg.kinds or (flags is not None and not any(flags))
    if frozen and flags is not None:  # static and frozen: the plain layer
        layers = _slice(m.target["layers"], start, stop - start)
        h, _ = loop(_frozen_body(spec, ctx), h, layers, unroll=spec.layer_unroll)
        return h
    xs = _run_xs(m, seg, columns, run, first, frozen=frozen)
    body = _masked_body(
        spec,
        seg,
        ctx,
        m.key,
        flags,
        frozen=frozen,
        source_scale=m.source_scale,
        ci_window=m.ci_lower if m.ci_first is not None else None,
    )
    if spec.remat_layers:
        body = jax.checkpoint(body, policy=_remat_policy(spec, static=m.static))
    h, _ = loop(body, h, xs, unroll=spec.layer_unroll)
    return h


def _run_xs(
    m: _MaskedInputs,
    seg: Segment,
    columns: tuple[np.ndarray, Any],
    run: _Run,
    first: Any,
    *,
    frozen: bool,
) -> Tree:
    """The per-layer inputs of a run that :func:`_masked_body` scans: the layer weights (and,
    unless ``frozen``, the sites' stacks, :func:`_layer_xs`); with traced liveness each layer's
    ``live`` kinds, whether it ``copy``-s the clean stream and that stream's ``clean_out``;
    the ``routed`` positions of its kinds."""
    start, stop, flags = run
    cols, seg_live = columns
    xs: dict[str, Any]
    if frozen:
        xs = {"layer": _slice(m.target["layers"], start, stop - start)}
    else:
        xs = _layer_xs(
            m.spec,
            seg,
            start,
            stop,
            m.target,
            m.components,
            m.ci_lower,
            m.sources,
            m.ci_first,
        )
    if flags is None:  # dynamic: which branch each layer takes is data
        xs["live"] = seg_live
        xs["copy"] = jnp.arange(start, stop) < first
        if m.clean_stream is not None:
            xs["clean_out"] = m.clean_stream[start + 1 : stop + 1]
    if m.routed is not None and not frozen:
        xs["routed"] = m.routed[start:stop][:, cols]
    return xs


def _remat_policy(spec: ForwardSpec, *, static: bool) -> Any:
    """The ``jax.checkpoint`` policy of a rematerialized masked-forward layer: keep the drawn
    sources (``SOURCE_NAME``) where liveness is static and ``spec.save_sources``, else none
    (everything recomputed, the sources drawn again: the same values). In the switched
    (scanned) forward saved sources would become a stacked [layers, B, T, C + 1] residual per
    chunk (+1.7 GiB per device at production; docs/findings.md section 8)."""
    return _SAVE_SOURCES if static and spec.save_sources else None


def _global_live(spec: ForwardSpec, live: jax.Array | np.ndarray, kind: str) -> bool:
    """Whether the masked forward wires in the global site ``kind``: decomposed, and (with a
    static ``live``) live; a traced ``live`` decides per call, inside the site."""
    names = spec.decomposition.kind_names
    if kind not in names:
        return False
    row = _global_row(spec, kind)
    return not isinstance(live, np.ndarray) or bool(live[row, names.index(kind)])


def _global_row(spec: ForwardSpec, kind: str) -> int:
    """The row of a global site in ``live``/``routed`` [L, K, ...]: 0 for the embedding, the
    last layer for the LM head (as :attr:`Decomposition.sites` places them)."""
    return 0 if kind == "embed_tokens" else spec.decomposition.n_layers - 1


def _global_site(
    spec: ForwardSpec,
    kind: str,
    x: jax.Array,
    w: jax.Array,
    *,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    live: jax.Array | np.ndarray,
    routed: jax.Array | None,
    key: jax.Array,
    source_scale: jax.Array | None,
    sources: Mapping[str, jax.Array] | None,
) -> jax.Array:
    """The embedding's lookup or the LM head's matmul on the component path (a global site is
    its kind's one member: row 0 of ``ci_lower``). ``embed_tokens``: x is
    tokens [B, T] int and w the table [vocab, d]: ``inner = V[tokens]``, ``xw = W[tokens]``
    (its ``live``/``routed`` row: :func:`_global_row`);
    ``lm_head``: x [B, T, d] and w [d, vocab]."""
    names = spec.decomposition.kind_names
    j = names.index(kind)
    V, U = components[kind]["V"][0], components[kind]["U"][0]
    if kind == "embed_tokens":
        xw = _lookup_rows(x, w).astype(V.dtype)
        inner = _lookup_rows(x, V)
    else:
        xw = x @ w.astype(x.dtype)
        inner = x @ V
    out = component_output(
        spec,
        inner,
        xw,
        U,
        ci_lower[kind][0],
        source=None if sources is None else sources[kind][0],
        key=jax.random.fold_in(key, site_id(0, kind)),
        source_scale=source_scale,
    )
    row = _global_row(spec, kind)
    route = jnp.asarray(live[row, j])
    if routed is not None:
        route = route & routed[row, j]
    return jnp.where(jnp.broadcast_to(route, inner.shape[:-1])[..., None], out, xw)


def _static_runs(first: int, seg_live: np.ndarray) -> list[tuple[int, int, tuple[bool, ...]]]:
    """Maximal runs of consecutive layers with the same live kinds: (start, stop, flags)."""
    runs: list[tuple[int, int, tuple[bool, ...]]] = []
    for i, row in enumerate(seg_live):
        flags = tuple(bool(v) for v in row)
        if runs and runs[-1][2] == flags:
            runs[-1] = (runs[-1][0], first + i + 1, flags)
        else:
            runs.append((first + i, first + i + 1, flags))
    return runs


def _layer_xs(
    spec: ForwardSpec,
    seg: Segment,
    start: int,
    stop: int,
    target: Tree,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    sources: Mapping[str, jax.Array] | None = None,
    ci_first: jax.Array | None = None,
) -> dict[str, Any]:
    """Per-layer inputs of layers [start, stop) of ``seg``: static slices of every stack (with
    ``ci_first``, the CI window's row of each layer, ``ci_index``, instead of CI slices)."""
    size = stop - start
    kinds = spec.target.kinds
    offsets = [(k, o + start - seg.start) for k, o in zip(seg.kinds, seg.offsets, strict=True)]
    xs: dict[str, Any] = {
        "layer": _slice(target["layers"], start, size),
        "site_id": jnp.asarray(
            [[site_id(layer, k, kinds) for k in seg.kinds] for layer in range(start, stop)],
            dtype=jnp.uint32,
        ),
        "V": {k: _slice(components[k]["V"], o, size) for k, o in offsets},
        "U": {k: _slice(components[k]["U"], o, size) for k, o in offsets},
    }
    if ci_first is None:
        xs["ci"] = {k: _slice(ci_lower[k], o, size) for k, o in offsets}
    else:
        window = next(iter(ci_lower.values())).shape[0]
        xs["ci_index"] = jnp.clip(jnp.arange(start, stop) - ci_first, 0, window - 1)
    if sources is not None:
        xs["source"] = {k: _slice(sources[k], o, size) for k, o in offsets}
    return xs


def live_site_output(
    spec: ForwardSpec,
    xs: Tree,
    kind: str,
    j: int,
    x: jax.Array,
    xw: jax.Array,
    key: jax.Array,
    source_scale: jax.Array | None,
) -> jax.Array:
    """One live site's output ``((x@V)·(m − δ))@U + δ·(x@W)`` [B, T, d_out] at every position.

    xs: one layer's slice of :func:`_layer_xs` (``V``, ``U``, ``ci``, ``site_id``, optionally
    ``source``); j: the kind's column in the segment; x [B, T, d_in]; xw = x@W [B, T, d_out];
    key, source_scale: as :func:`masked_forward`'s."""
    source = xs["source"][kind] if "source" in xs else None
    return component_output(
        spec,
        x @ xs["V"][kind],
        xw,
        xs["U"][kind],
        xs["ci"][kind],
        source=source,
        key=jax.random.fold_in(key, xs["site_id"][j]),
        source_scale=source_scale,
    )


def component_output(
    spec: ForwardSpec,
    inner: jax.Array,
    xw: jax.Array,
    U: jax.Array,
    ci: jax.Array,
    *,
    source: jax.Array | None,
    key: jax.Array,
    source_scale: jax.Array | None,
) -> jax.Array:
    """``(inner·(m − δ))@U + δ·xw`` [B, T, d_out] from the component activations inner [B, T, C]
    (``x@V``, or ``V[tokens]`` at a lookup site), ci [B, T, C] and a given source (or one drawn
    from ``key``, the site's own). Without the delta component (``spec.use_delta`` false):
    ``(inner·m)@U`` with sources of C channels (a given source's delta channel is unused)."""
    n_channels = ci.shape[-1] + (1 if spec.use_delta else 0)
    if source is not None:
        source = source[..., :n_channels]
    else:
        shape = (*inner.shape[:-1], n_channels)
        source = sample_source(spec.sampling, shape, key=key, draws=spec.random_draws)
        # Kept for the backward of a rematerialized layer (not drawn a second time there).
        source = checkpoint_name(source, SOURCE_NAME)
    if source_scale is not None:
        source = source * jnp.asarray(source_scale, source.dtype)
    if not spec.use_delta:  # m = ci + (1 − ci)·r over C channels, no delta term
        clipped = unit_clip(ci)
        m = clipped + (1 - clipped) * source.astype(clipped.dtype)
        return (inner * m.astype(inner.dtype)) @ U
    m, delta = masks(ci, source)
    inner = inner * (m - delta[..., None]).astype(inner.dtype)
    return inner @ U + delta[..., None].astype(inner.dtype) * xw


def _masked_body(
    spec: ForwardSpec,
    seg: Segment,
    ctx: Any,
    key: jax.Array,
    flags: tuple[bool, ...] | None,
    *,
    frozen: bool = False,
    source_scale: jax.Array | None = None,
    ci_window: Mapping[str, jax.Array] | None = None,
) -> Callable[[jax.Array, Tree], tuple[jax.Array, None]]:
    """The layer body. ``flags``: static live kinds (no branches). None: per layer, copy the
    clean stream (``xs["copy"]``, before the first live layer), else run the live layer if
    ``xs["live"]`` has a live kind, else the frozen one (``frozen``: no live branch at all)."""
    arch = spec.target

    def body(h: jax.Array, xs: Tree) -> tuple[jax.Array, None]:
        if "ci_index" in xs:  # this layer's row of the CI window
            assert ci_window is not None
            row = {
                k: jax.lax.dynamic_index_in_dim(ci_window[k], xs["ci_index"], keepdims=False)
                for k in seg.kinds
            }
            xs = {**xs, "ci": row}

        def live_layer(h: jax.Array) -> jax.Array:
            def linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
                xw = x @ w.astype(x.dtype)
                if kind not in seg.kinds:
                    return xw
                j = seg.kinds.index(kind)
                if flags is not None and not flags[j]:
                    return xw
                out = live_site_output(spec, xs, kind, j, x, xw, key, source_scale)
                route = jnp.ones(x.shape[:-1], bool) if flags is not None else xs["live"][j]
                if "routed" in xs:
                    route = route & xs["routed"][j]
                return jnp.where(route[..., None], out, xw)

            return arch.layer(h, xs["layer"], ctx, linear)

        def frozen_layer(h: jax.Array) -> jax.Array:
            return arch.layer(h, xs["layer"], ctx)

        if flags is not None:
            return spec.constrain(live_layer(h)), None
        if "clean_out" in xs:
            branches = [lambda h: xs["clean_out"], frozen_layer]
            index = jnp.where(xs["copy"], 0, 1)
        else:
            branches, index = [frozen_layer], jnp.int32(0)
        if not frozen:
            branches.append(live_layer)
            index = jnp.where(jnp.any(xs["live"]) & ~xs["copy"], len(branches) - 1, index)
        h = jax.lax.switch(index, branches, h) if len(branches) > 1 else frozen_layer(h)
        return spec.constrain(h), None

    return body
