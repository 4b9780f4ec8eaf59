"""The recon loss: masked forwards over chunks of live sites.

A plan (:mod:`pd_train.losses.plan`, re-exported here) is the static list of chunks of one recon
term. Per chunk the loop body gets only small per-chunk data — which sites are live (a [S] mask
over the decomposition's sites in canonical order), how many, the chunk and draw numbers — and
rebuilds everything else from them, so every chunk has the same body and the chunk loop is one
``lax.scan`` (``chunk_loop="scan"``). Because liveness is data and not structure, this holds for
non-uniform plans too (a smaller last chunk, chunks that cut a layer); ``is_uniform`` is reported
for information. ``chunk_loop="unroll"`` traces each chunk separately with its liveness static (the
structure of a Python-unrolled plan: n_chunks specialized masked forwards in one graph), for A/B;
both give the same loss and gradients.

Keys: the term key is folded with the chunk number, then with the draw number; the draw key is
folded with 0 for the sources (then per site, :func:`pd_train._forward.site_id`) and with 1 for
routing (then 0 for the per-position k, 1 for the per-position subsets). Fresh PGD sources
start from the draw's source key (see :mod:`pd_train.losses.pgd`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pd_train._forward import ForwardSpec, masked_forward, site_id
from pd_train.decomposition import Decomposition
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs
from pd_train.losses.chunk_vjp import late_vjp, windowed_chunk_sum
from pd_train.losses.plan import ReconPlan, all_sites_plan, all_sites_subset_plan, chunkwise_plan
from pd_train.sources import sample_source, uniform

__all__ = [
    "ReconPlan",
    "SampledReconTerm",
    "all_sites_plan",
    "all_sites_subset_plan",
    "chunkwise_plan",
    "kl_clean_masked",
    "layer_windows",
    "mse_clean_masked",
    "output_divergence",
    "paired_all_sites_loss",
    "recon_loss",
    "recon_term_value",
    "routing_masks",
    "site_grid",
    "site_ranks",
]


def kl_clean_masked(clean_logits: jax.Array, masked_logits: jax.Array) -> jax.Array:
    """KL(softmax(clean) ‖ softmax(masked)), summed over vocab, mean over positions; fp32.

    Both [B, T, vocab]; the clean side carries no gradient.
    """
    clean = jax.lax.stop_gradient(clean_logits.astype(jnp.float32))
    log_p = jax.nn.log_softmax(clean, axis=-1)
    log_q = jax.nn.log_softmax(masked_logits.astype(jnp.float32), axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1))


def mse_clean_masked(clean: jax.Array, masked: jax.Array) -> jax.Array:
    """Mean squared error over every element, fp32; the clean side carries no gradient."""
    clean32 = jax.lax.stop_gradient(clean.astype(jnp.float32))
    return jnp.mean(jnp.square(masked.astype(jnp.float32) - clean32))


def output_divergence(spec: ForwardSpec, clean: jax.Array, masked: jax.Array) -> jax.Array:
    """How the target's masked output differs from its clean one: KL on logits or MSE on
    activations, as the target's ``output_loss`` says."""
    if spec.target.output_loss == "mse":
        return mse_clean_masked(clean, masked)
    return kl_clean_masked(clean, masked)


def site_grid(decomposition: Decomposition) -> np.ndarray:
    """[L, K] int32: the canonical index of the site at (layer, decomposed kind), or -1."""
    names = decomposition.kind_names
    grid = np.full((decomposition.n_layers, len(names)), -1, dtype=np.int32)
    for i, site in enumerate(decomposition.sites):
        grid[site.layer, names.index(site.kind)] = i
    return grid


def layer_windows(decomposition: Decomposition, plan: ReconPlan) -> int | None:
    """Layers per chunk when chunk i is exactly the sites of layers [i·n, (i + 1)·n) (every
    kind decomposed at every layer, every chunk n whole layers), else None."""
    grid = site_grid(decomposition)
    if (grid < 0).any() or decomposition.n_layers % plan.n_chunks:
        return None
    n = decomposition.n_layers // plan.n_chunks
    for i, chunk in enumerate(plan.chunks):
        if sorted(chunk) != sorted(grid[i * n : (i + 1) * n].ravel().tolist()):
            return None
    return n


def routing_masks(
    site_mask: jax.Array,
    n_live: jax.Array,
    batch_shape: tuple[int, ...],
    *,
    key: jax.Array,
    draws: str = "jax",
) -> jax.Array:
    """[*batch_shape, S] bool: at each position independently, k ~ U{1..n_live}, then a uniformly
    random k-subset of the live sites (``site_mask`` [S] bool, ``n_live`` its count).

    The subset is the k live sites with the smallest of S uniform draws; dead sites draw 2.0,
    so they sort last and are never among the first k ≤ n_live. ``draws``: how the uniforms
    are computed (:func:`pd_train.sources.uniform`, the same bits).
    """
    k = jax.random.randint(jax.random.fold_in(key, 0), batch_shape, 1, n_live + 1)
    shape = (*batch_shape, site_mask.shape[0])
    u = uniform(jax.random.fold_in(key, 1), shape, draws=draws)
    u = jnp.where(site_mask, u, 2.0)
    return site_ranks(u) < k[..., None]


#: Up to this many sites :func:`site_ranks` counts comparisons ([..., S, S] in one fused
#: reduction: on XLA:CPU two sorts of S = 28 cost ~2 % of the default step); above it, sorts.
RANK_BY_COUNT_MAX_SITES = 64


def site_ranks(u: jax.Array) -> jax.Array:
    """The rank of each of ``u``'s last-axis entries in ascending order, ties by position: what
    ``argsort(argsort(u))`` (stable) gives. rank_i = #{j: u_j < u_i} + #{j < i: u_j = u_i}."""
    n = u.shape[-1]
    if n > RANK_BY_COUNT_MAX_SITES:
        return jnp.argsort(jnp.argsort(u, axis=-1), axis=-1)
    ui, uj = u[..., :, None], u[..., None, :]
    before = np.arange(n)[None, :] < np.arange(n)[:, None]  # [i, j]: j < i
    ahead = (uj < ui) | ((uj == ui) & before)
    return jnp.sum(ahead, axis=-1, dtype=jnp.int32)


#: The name the tests and older callers use.
_routing = routing_masks


def recon_loss(
    spec: ForwardSpec,
    plan: ReconPlan,
    *,
    n_samples: int,
    target: Any,
    tokens: jax.Array,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    clean_logits: jax.Array,
    key: jax.Array,
    clean_stream: jax.Array | None = None,
    unroll: bool = False,
    remat: bool = False,
    pgd: Any = None,
    sources: Mapping[str, jax.Array] | None = None,
    route_probability: jax.Array | float | None = None,
) -> jax.Array:
    """Mean over chunks × draws of KL(clean ‖ masked); fp32 scalar.

    tokens [B, T]; clean_logits [B, T, vocab]; components/ci_lower as in
    :func:`pd_train._forward.masked_forward`; key: this term's key; clean_stream:
    [L + 1, B, T, hidden] (optional) lets each forward skip the layers before its first live one.

    The masks' sources: drawn per (chunk, draw) from the draw key (default); ``sources``
    ({kind: [n_k, B | 1, T | 1, C + 1]}, e.g. persistent PGD's) for every forward; or ``pgd``
    (a :class:`pd_train.losses.pgd.FreshPGD`): per (chunk, draw) fresh sources ascended
    ``n_steps`` times on that forward's KL with this draw's routing fixed, then the loss of the
    final sources (no gradient). The pairs are summed by :func:`_sum_over_draws`.
    ``route_probability``: p of a ``static_probability`` plan.
    """
    if plan.routing == "static_probability" and route_probability is None:
        msg = "recon_loss: a static_probability plan needs route_probability"
        raise ValueError(msg)
    chunk_kl = _chunk_kl_fn(
        spec,
        plan,
        target=target,
        tokens=tokens,
        components=components,
        ci_lower=ci_lower,
        clean_logits=clean_logits,
        key=key,
        clean_stream=clean_stream,
        pgd=pgd,
        sources=sources,
        route_probability=route_probability,
    )
    total = _sum_over_draws(
        chunk_kl,
        _draw_table(plan, n_samples),
        window=layer_windows(spec.decomposition, plan),
        n_chunks=plan.n_chunks,
        n_samples=n_samples,
        components=components,
        ci_lower=ci_lower,
        sources=sources,
        remat=remat,
        unroll=unroll,
        fresh_pgd=pgd is not None,
    )
    return total / (plan.n_chunks * n_samples)


def _draw_table(plan: ReconPlan, n_samples: int) -> dict[str, np.ndarray]:
    """The (chunk, draw) pairs of :func:`recon_loss`, chunk-major: per pair its ``chunk``,
    ``draw``, ``site_mask`` [S] (the chunk's live sites) and ``n_live`` (numpy)."""
    chunk_ids = np.repeat(np.arange(plan.n_chunks, dtype=np.int32), n_samples)
    draw_ids = np.tile(np.arange(n_samples, dtype=np.int32), plan.n_chunks)
    return {
        "chunk": chunk_ids,
        "draw": draw_ids,
        "site_mask": plan.site_masks()[chunk_ids],
        "n_live": plan.n_live()[chunk_ids],
    }


def _chunk_kl_fn(
    spec: ForwardSpec,
    plan: ReconPlan,
    *,
    target: Any,
    tokens: jax.Array,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    clean_logits: jax.Array,
    key: jax.Array,
    clean_stream: jax.Array | None,
    pgd: Any,
    sources: Mapping[str, jax.Array] | None,
    route_probability: jax.Array | float | None,
) -> Any:
    """``chunk_kl(chunk, draw, site_mask, live_count, comps, ci, ci_first, sources)``: the KL
    of one (chunk, draw) of :func:`recon_loss` (the arguments as :func:`_sum_over_draws` passes
    them)."""
    grid = site_grid(spec.decomposition)
    has_site, grid_idx = grid >= 0, np.maximum(grid, 0)
    batch_shape = tuple(tokens.shape[:2])  # [B, T]: tokens, or a toy target's [B, T, features]

    def chunk_kl(
        chunk: Any,
        draw: Any,
        site_mask: Any,
        live_count: Any,
        comps_in: Any = components,
        ci_in: Mapping[str, jax.Array] = ci_lower,
        ci_first: Any = None,
        sources_in: Mapping[str, jax.Array] | None = sources,
    ) -> jax.Array:
        """KL of one (chunk, draw) (numpy arguments: a forward specialized to them); ci_first:
        None, or the first layer of the window ``ci_in`` holds (layer-aligned chunks)."""
        xp = np if isinstance(site_mask, np.ndarray) else jnp
        draw_key = jax.random.fold_in(jax.random.fold_in(key, chunk), draw)
        live = xp.asarray(has_site) & site_mask[grid_idx]  # [L, K]
        routed = _chunk_routing(
            plan,
            site_mask,
            live_count,
            batch_shape,
            grid,
            draw_key,
            route_probability,
            spec.random_draws,
        )
        source_key = jax.random.fold_in(draw_key, 0)

        def forward_kl(comps: Any, ci: Any, given: Mapping[str, jax.Array] | None) -> jax.Array:
            logits = masked_forward(
                spec,
                target=target,
                tokens=tokens,
                components=comps,
                ci_lower=ci,
                live=live,
                routed=routed,
                key=source_key,
                clean_stream=clean_stream,
                sources=given,
                ci_first=ci_first,
            )
            return output_divergence(spec, clean_logits, logits)

        given = sources_in
        if pgd is not None:
            given = pgd.ascend(
                functools.partial(
                    forward_kl,
                    jax.lax.stop_gradient(components),
                    jax.lax.stop_gradient(ci_lower),
                ),
                pgd.init_sources(ci_lower, batch_shape, key=source_key),
            )
        return forward_kl(comps_in, ci_in, given)

    return chunk_kl


def _chunk_routing(
    plan: ReconPlan,
    site_mask: Any,
    live_count: Any,
    batch_shape: tuple[int, ...],
    grid: np.ndarray,
    draw_key: Any,
    route_probability: Any,
    draws: str = "jax",
) -> jax.Array | None:
    """The per-position routing of one (chunk, draw) [L, K, B, T] bool, or None (``all``);
    ``draws``: how its uniforms are computed (the same bits)."""
    if plan.routing == "subset":
        return _subset_routing(site_mask, live_count, batch_shape, grid, draw_key, draws)
    if plan.routing == "static_probability":
        return _static_routing(site_mask, route_probability, batch_shape, grid, draw_key, draws)
    return None


def _subset_routing(
    site_mask: Any,
    live_count: Any,
    batch_shape: tuple[int, ...],
    grid: np.ndarray,
    key: Any,
    draws: str = "jax",
) -> jax.Array:
    """Per-position uniform-k routing of a chunk's live sites (:func:`routing_masks`, key
    folded with 1), laid out on the site grid: [L, K, B, T] bool."""
    has_site = grid >= 0
    per_site = routing_masks(
        jnp.asarray(site_mask), live_count, batch_shape, key=jax.random.fold_in(key, 1), draws=draws
    )  # [B, T, S]
    return jnp.moveaxis(per_site[..., np.maximum(grid, 0)] & has_site, (-2, -1), (0, 1))


def _static_routing(
    site_mask: Any,
    p: Any,
    batch_shape: tuple[int, ...],
    grid: np.ndarray,
    key: Any,
    draws: str = "jax",
) -> jax.Array:
    """Each live site at each position routed with probability p (u < p, u ~ U[0, 1) per site
    and position from ``key`` folded with 1), on the site grid: [L, K, B, T] bool."""
    has_site = grid >= 0
    u = uniform(jax.random.fold_in(key, 1), (*batch_shape, len(site_mask)), draws=draws)
    per_site = (u < p) & jnp.asarray(site_mask)  # [B, T, S]
    return jnp.moveaxis(per_site[..., np.maximum(grid, 0)] & has_site, (-2, -1), (0, 1))


def _sum_over_draws(
    chunk_kl: Any,
    draws: Mapping[str, np.ndarray],
    *,
    window: int | None,
    n_chunks: int,
    n_samples: int,
    components: Any,
    ci_lower: Mapping[str, jax.Array],
    sources: Mapping[str, jax.Array] | None,
    remat: bool,
    unroll: bool,
    fresh_pgd: bool,
) -> jax.Array:
    """Σ over the (chunk, draw) pairs of :func:`recon_loss` of ``chunk_kl``, by the cheapest
    strategy that gives the same values: a windowed chunk loop with a written-out backward,
    one specialized forward, a Python-unrolled loop, or one ``lax.scan``. ``draws``: per pair
    its ``chunk``, ``draw``, ``site_mask`` [S] and ``n_live`` (numpy).

    ``unroll=False``: one ``lax.scan`` over (chunk, draw) pairs whose per-chunk data are arrays;
    each layer picks live or frozen with ``lax.cond``. ``unroll=True``: a Python loop that traces
    every (chunk, draw) separately with its liveness static, so each chunk's forward is
    specialized (frozen layers plain, no ``cond``) — the structure of an unrolled recon plan.
    A plan of one (chunk, draw) is always traced the ``unroll=True`` way (same values).
    Layer-aligned plans (:func:`layer_windows`) with ``remat``, one draw and drawn sources run
    :func:`pd_train.losses.chunk_vjp.windowed_chunk_sum`: each chunk gets only its window of
    ``ci_lower`` and the chunk loop's backward is written out (same values and gradients).
    """
    # Layer-aligned chunks (the production plan), one draw, drawn sources, rematerialized:
    # each chunk reads only its own window of the CI, and the backward is chunk_vjp's.
    windowed = (
        remat
        and not unroll
        and len(draws["chunk"]) > 1
        and n_samples == 1
        and not fresh_pgd
        and sources is None
        and window is not None
    )
    if windowed:
        assert window is not None

        def window_kl(x: Mapping[str, jax.Array], comps: Any, ci: Any) -> jax.Array:
            return chunk_kl(
                x["chunk"], x["draw"], x["site_mask"], x["n_live"], comps, ci, x["chunk"] * window
            )

        data = {k: jnp.asarray(v) for k, v in draws.items()}
        windows = {k: v.reshape(n_chunks, window, *v.shape[1:]) for k, v in ci_lower.items()}
        total = windowed_chunk_sum(window_kl, data, components, windows)
    # One (chunk, draw) (route-all terms, persistent PGD): its liveness is known at trace time,
    # so it is traced specialized (no scan of one, no per-layer copy/frozen/live switch): 10 %
    # fewer HLO lines and a quarter fewer copies in the default step, same values.
    # Rematerialized and without a fresh-PGD ascent, its backward is chunk_vjp.late_vjp's.
    elif len(draws["chunk"]) == 1 and remat and not fresh_pgd:

        def one_kl(comps: Any, ci: Any, given: Any) -> jax.Array:
            chunk, draw, count = (
                int(draws["chunk"][0]),
                int(draws["draw"][0]),
                int(draws["n_live"][0]),
            )
            return chunk_kl(chunk, draw, draws["site_mask"][0], count, comps, ci, None, given)

        total = late_vjp(one_kl, components, ci_lower, sources)
    elif unroll or len(draws["chunk"]) == 1:
        total = jnp.zeros((), jnp.float32)
        for i in range(len(draws["chunk"])):
            fn = functools.partial(
                chunk_kl,
                int(draws["chunk"][i]),
                int(draws["draw"][i]),
                draws["site_mask"][i],
                int(draws["n_live"][i]),
            )
            total = total + (jax.checkpoint(fn) if remat else fn)()
    else:

        def body(acc: jax.Array, x: Mapping[str, jax.Array]) -> tuple[jax.Array, None]:
            return acc + chunk_kl(x["chunk"], x["draw"], x["site_mask"], x["n_live"]), None

        if remat:
            body = jax.checkpoint(body)
        xs = {k: jnp.asarray(v) for k, v in draws.items()}
        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), xs)
    return total


def paired_all_sites_loss(
    spec: ForwardSpec,
    *,
    target: Any,
    tokens: jax.Array,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    clean_logits: jax.Array,
    clean_stream: jax.Array | None,
    key: jax.Array,
    sources: Mapping[str, jax.Array],
) -> tuple[jax.Array, jax.Array]:
    """Two route-all recon terms as one masked forward of 2B rows: (the term of ``key`` with
    drawn sources, the term with the given ``sources``), each as :func:`recon_loss` with
    :func:`all_sites_plan` and one draw gives it — a stochastic recon term and the persistent-PGD
    term.

    Each term's B rows see exactly what its own forward would: the drawn sources are
    :func:`recon_loss`'s (chunk 0, draw 0, folded per site by ``site_id``), the given ones
    ``sources[kind]`` [n_k, B | 1, T | 1, C + 1]. Rows are interleaved (row 2b is the drawn
    term's b, row 2b + 1 the given term's), so a batch-sharded device keeps its own rows. One
    forward of 2B rows runs half the ops of two of B rows, the same FLOPs: on a CPU, where the
    step's small ops cost more than their FLOPs, the default step takes 0.95x the CPU seconds
    with it (the two terms' ~24 % of the step, ~1/5 cheaper; docs/findings.md section 10). Its
    activations are twice one forward's, so the train step uses it only without
    ``runtime.remat.recon`` (which production-scale configs set for memory).
    """
    batch_shape = tuple(tokens.shape[:2])
    source_key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, 0), 0), 0)
    kinds = spec.target.kinds

    def interleave(a: jax.Array, b: jax.Array, axis: int) -> jax.Array:
        pair = jnp.stack([a, b], axis=axis + 1)
        return pair.reshape(*a.shape[:axis], 2 * a.shape[axis], *a.shape[axis + 1 :])

    paired_sources = {}
    for layout in spec.decomposition.kinds:
        kind = layout.kind
        shape = (*batch_shape, layout.C + 1)
        ids = jnp.asarray([site_id(layer, kind, kinds) for layer in layout.layers], jnp.uint32)
        keys = jax.vmap(lambda i: jax.random.fold_in(source_key, i))(ids)
        drawn = jax.vmap(
            lambda k, s=shape: sample_source(spec.sampling, s, key=k, draws=spec.random_draws)
        )(keys)
        given = jnp.broadcast_to(sources[kind], drawn.shape).astype(drawn.dtype)
        paired_sources[kind] = interleave(drawn, given, 1)
    live = site_grid(spec.decomposition) >= 0
    stream = None
    if clean_stream is not None:  # the forward reads the stream at its first live layer only
        first = int(np.flatnonzero(live.any(axis=1))[0])
        stream = jnp.repeat(clean_stream[: first + 1], 2, axis=1)
    logits = masked_forward(
        spec,
        target=target,
        tokens=jnp.repeat(tokens, 2, axis=0),
        components=components,
        ci_lower={k: jnp.repeat(v, 2, axis=1) for k, v in ci_lower.items()},
        live=live,
        routed=None,
        key=source_key,
        clean_stream=stream,
        sources=paired_sources,
    )
    pairs = logits.reshape(batch_shape[0], 2, *logits.shape[1:])
    return (
        output_divergence(spec, clean_logits, pairs[:, 0]),
        output_divergence(spec, clean_logits, pairs[:, 1]),
    )


def recon_term_value(
    inputs: TermInputs,
    plan: ReconPlan,
    *,
    n_samples: int,
    key: jax.Array,
    pgd: Any = None,
    sources: Mapping[str, jax.Array] | None = None,
    route_probability: jax.Array | float | None = None,
) -> jax.Array:
    """:func:`recon_loss` of a term over the step's :class:`TermInputs` (masks from the CI and
    drawn sources, or ``pgd``'s, or the given ``sources``)."""
    assert inputs.ci_lower is not None and inputs.clean_logits is not None
    return recon_loss(
        inputs.spec,
        plan,
        n_samples=n_samples,
        target=inputs.target,
        tokens=inputs.tokens,
        components=inputs.components,
        ci_lower=inputs.ci_lower,
        clean_logits=inputs.clean_logits,
        clean_stream=inputs.clean_stream,
        key=key,
        unroll=inputs.chunk_unroll,
        remat=inputs.remat,
        pgd=pgd,
        sources=sources,
        route_probability=route_probability,
    )


class SampledReconTerm(LossTerm):
    """A recon term whose value is :func:`recon_term_value` over its plan with
    ``config.n_samples`` draws (masks from the CI and drawn sources). A subclass gives the
    :meth:`plan`, and the term's own options of the recon (a routing probability, a PGD) by
    :meth:`recon_options`."""

    def recon_options(self, config: Any, hp: Hyperparams) -> dict[str, Any]:
        """Keyword arguments of :func:`recon_term_value` beyond the draws (default none)."""
        del config, hp
        return {}

    def value(
        self,
        config: Any,
        inputs: TermInputs,
        *,
        plan: ReconPlan | None,
        hp: Hyperparams,
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        assert plan is not None
        options = self.recon_options(config, hp)
        return recon_term_value(inputs, plan, n_samples=config.n_samples, key=key, **options), {}
