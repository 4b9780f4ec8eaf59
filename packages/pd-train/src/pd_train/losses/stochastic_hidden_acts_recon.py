"""``stochastic_hidden_acts_recon``: the MSE of every decomposed site's output between the masked
model and the clean target, as a training term.

What the references define (spd's ``StochasticHiddenActsReconLoss``, spd dev since Feb 2026,
and param-decomp's ``hidden_acts_eval``): every site live at every position (all-layers
routing), masks from the CI and drawn sources (m = ci + (1 − ci)·r[:C], δ = r[C], the delta
component when ``pd.use_delta_component``), and per site the output ``y`` of its matmul —
``x @ W`` in the clean target, the component path in the masked model, *each inside its own
model* (a masked site reads the masked model's input, so earlier sites' errors propagate).
The value is ``Σ_draws Σ_sites Σ_elements (y_masked − y_clean)²`` divided once by
``n_samples · Σ_sites numel(y_clean)`` (torch's ``F.mse_loss(reduction="sum")`` per site,
then Σ sum / Σ count); numel(y) = B·T·d_out, so sites with wider outputs weigh more. The
clean side carries no gradient. (spd's main branch before Feb 2026 compared the sites'
*inputs* under the same name; both references now compare outputs.) A bias that a target adds
after a site's matmul is the same on both sides and cancels in the difference.

The embedding (a lookup site) contributes its looked-up rows, the LM head its logits, as the
other sites their matmul outputs.

The forward: one paired pass from the first decomposed layer — the scan's carry holds the
clean stream and one masked stream per draw; each layer runs clean once (its site outputs
kept for the layer only) and masked once per draw, and emits the layer's summed squared error.
Only one layer's site outputs are alive at a time. The masked site math is
:func:`pd_train._forward.live_site_output` (the training forwards'), with the sources of
``stochastic_recon``'s draws: under the same term key, draw d's masks here are draw d's there
(chunk 0, draw d, folded per site by ``site_id``). The LM head runs only when it is a site.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from pd_train._forward import (
    ForwardSpec,
    _finish,
    _frozen_body,
    _global_site,
    _layer_xs,
    _lookup_rows,
    _slice,
    _start,
    live_site_output,
    loop,
)
from pd_train.config.pd import StochasticHiddenActsRecon
from pd_train.decomposition import GLOBAL_KINDS, Decomposition
from pd_train.losses._term import Hyperparams, LossTerm, TermInputs, register_loss_term
from pd_train.losses.plan import ReconPlan, all_sites_plan
from pd_train.losses.recon import site_grid

__all__ = ["StochasticHiddenActsReconTerm", "hidden_acts_recon", "hidden_acts_source_keys"]


def hidden_acts_source_keys(key: jax.Array, n_samples: int) -> list[jax.Array]:
    """The source key of each draw: ``fold_in(fold_in(fold_in(key, 0), d), 0)`` (chunk 0, draw
    d, sources), as :func:`pd_train.losses.recon_loss` folds them."""
    chunk = jax.random.fold_in(key, 0)
    return [jax.random.fold_in(jax.random.fold_in(chunk, d), 0) for d in range(n_samples)]


def _sq(masked: jax.Array, clean: jax.Array) -> jax.Array:
    """Σ (masked − clean)² in fp32; the clean side carries no gradient."""
    clean32 = jax.lax.stop_gradient(clean.astype(jnp.float32))
    return jnp.sum(jnp.square(masked.astype(jnp.float32) - clean32))


#: A site hook: ``(kind, x, w) -> y``.
Linear = Callable[[str, jax.Array, jax.Array], jax.Array]


def _scored(site: Linear, clean_of: Callable[..., jax.Array | None], errors: list) -> Linear:
    """``site`` that also appends Σ (y − clean)² to ``errors`` where ``clean_of(kind, x, w)``
    gives the clean output of that site (None: not a decomposed site)."""

    def linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
        y = site(kind, x, w)
        clean = clean_of(kind, x, w)
        if clean is not None:
            errors.append(_sq(y, clean))
        return y

    return linear


def hidden_acts_recon(
    spec: ForwardSpec,
    *,
    target: Any,
    tokens: jax.Array,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    key: jax.Array,
    n_samples: int = 1,
    clean_stream: jax.Array | None = None,
    sources: Mapping[str, jax.Array] | None = None,
) -> jax.Array:
    """The term's value (fp32 []): Σ over draws, sites and output elements of (y_masked −
    y_clean)², divided by n_samples · Σ_sites B·T·d_out (see the module docstring).

    tokens [B, T] (or a toy target's inputs); components[kind]: {"V": [n_k, d_in, C], "U":
    [n_k, C, d_out]}; ci_lower[kind]: [n_k, B, T, C]; key: the term key (draw d's sources from
    :func:`hidden_acts_source_keys`); clean_stream: the clean residual stream [L + 1, B, T,
    hidden] of :class:`pd_train._forward.CleanRunner` (the pass starts from its entry at the
    first decomposed layer) or None (the layers before it run frozen); sources: given sources
    {kind: [n_k, B | 1, T | 1, C + 1]} for every draw instead of drawn ones.
    """
    decomposition = spec.decomposition
    keys = hidden_acts_source_keys(key, n_samples)
    live = site_grid(decomposition) >= 0  # numpy: every decomposed site, every position
    hooks: list[Linear] = [
        functools.partial(
            _global_site,
            spec,
            components=components,
            ci_lower=ci_lower,
            live=live,
            routed=None,
            key=k,
            source_scale=None,
            sources=sources,
        )
        for k in keys
    ]
    errors: list[jax.Array] = []
    h, ctx = _start(spec, target, tokens)
    positions = math.prod(h.shape[:-1])
    first, carry = _paired_start(spec, target, tokens, h, ctx, hooks, clean_stream, errors)
    for seg in decomposition.segments:
        start = max(seg.start, first)
        if start >= seg.stop:
            continue
        if seg.kinds:
            xs = _layer_xs(spec, seg, start, seg.stop, target, components, ci_lower, sources)
        else:
            xs = {"layer": _slice(target["layers"], start, seg.stop - start)}
        body = _paired_body(spec, seg.kinds, ctx, keys)
        if spec.remat_layers:
            body = jax.checkpoint(body)
        carry, per_layer = loop(body, carry, xs, unroll=spec.layer_unroll)
        errors.append(jnp.sum(per_layer))
    if decomposition.has("lm_head"):
        errors.append(_head_sq(spec, target, carry, hooks))
    d_out = sum(decomposition.kind(site.kind).d_out for site in decomposition.sites)
    total = sum(errors, jnp.zeros((), jnp.float32))
    return total / (n_samples * positions * d_out)


def _paired_start(
    spec: ForwardSpec,
    target: Any,
    tokens: jax.Array,
    h: jax.Array,
    ctx: Any,
    hooks: list[Linear],
    clean_stream: jax.Array | None,
    errors: list[jax.Array],
) -> tuple[int, tuple[jax.Array, tuple[jax.Array, ...]]]:
    """(The first layer of the paired pass, its carry: the clean stream and one masked stream
    per draw entering that layer). With a decomposed embedding the pass starts at layer 0 from
    each draw's masked lookup (its error appended to ``errors``); else at the first decomposed
    layer, where every stream is still the clean one (``h``: the stream entering layer 0)."""
    decomposition = spec.decomposition
    if decomposition.has("embed_tokens"):
        h_clean = h if clean_stream is None else clean_stream[0]
        masked = []
        for hook in hooks:
            lookup = _scored(hook, lambda kind, x, w: _lookup_rows(x, w), errors)
            masked.append(_start(spec, target, tokens, lookup)[0])
        return 0, (h_clean, tuple(masked))
    in_stack = [s.layer for s in decomposition.sites if s.kind not in GLOBAL_KINDS]
    first = min(in_stack, default=decomposition.n_layers)
    if clean_stream is not None:
        h = clean_stream[first]
    elif first:
        frozen = _slice(target["layers"], 0, first)
        h, _ = loop(_frozen_body(spec, ctx), h, frozen, unroll=spec.layer_unroll)
    return first, (h, (h,) * len(hooks))


def _paired_body(
    spec: ForwardSpec, kinds: tuple[str, ...], ctx: Any, keys: list[jax.Array]
) -> Callable[[Any, Any], tuple[Any, jax.Array]]:
    """The layer body over (clean stream, masked streams): runs the clean layer once, keeping
    its site outputs, then the masked layer per draw; emits Σ (y_masked − y_clean)² [] over the
    layer's sites and draws."""
    arch = spec.target

    def body(carry: Any, xs: Any) -> tuple[Any, jax.Array]:
        h_clean, masked = carry
        clean_out: dict[str, jax.Array] = {}

        def clean_linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
            y = x @ w.astype(x.dtype)
            if kind in kinds:
                clean_out[kind] = y
            return y

        def site(draw_key: jax.Array) -> Linear:
            def linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
                y = x @ w.astype(x.dtype)
                if kind not in kinds:
                    return y
                return live_site_output(spec, xs, kind, kinds.index(kind), x, y, draw_key, None)

            return linear

        h_clean = spec.constrain(arch.layer(h_clean, xs["layer"], ctx, clean_linear))
        errors: list[jax.Array] = []
        out = []
        for draw_key, h in zip(keys, masked, strict=True):
            linear = _scored(site(draw_key), lambda kind, x, w: clean_out.get(kind), errors)
            out.append(spec.constrain(arch.layer(h, xs["layer"], ctx, linear)))
        return (h_clean, tuple(out)), sum(errors, jnp.zeros((), jnp.float32))

    return body


def _head_sq(spec: ForwardSpec, target: Any, carry: Any, hooks: list[Linear]) -> jax.Array:
    """Σ over draws of Σ (logits_masked − logits_clean)² at the LM head site."""
    h_clean, masked = carry
    clean: list[jax.Array] = []

    def clean_head(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
        clean.append(x @ w.astype(x.dtype))
        return clean[0]

    _finish(spec, target, h_clean, clean_head)
    errors: list[jax.Array] = []
    for hook, h in zip(hooks, masked, strict=True):
        _finish(spec, target, h, _scored(hook, lambda kind, x, w: clean[0], errors))
    return sum(errors, jnp.zeros((), jnp.float32))


class StochasticHiddenActsReconTerm(LossTerm):
    """Route-all plan (for the census), drawn sources, site outputs compared by MSE.
    Structural: ``n_samples``."""

    config_cls = StochasticHiddenActsRecon

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan:
        return all_sites_plan(decomposition)

    def value(
        self,
        config: Any,
        inputs: TermInputs,
        *,
        plan: ReconPlan | None,
        hp: Hyperparams,
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        assert inputs.ci_lower is not None
        value = hidden_acts_recon(
            inputs.spec,
            target=inputs.target,
            tokens=inputs.tokens,
            components=inputs.components,
            ci_lower=inputs.ci_lower,
            key=key,
            n_samples=config.n_samples,
            clean_stream=inputs.clean_stream,
            sources=None,
        )
        return value, {}

    def flops(self, config: Any, census: Any, *, plan: ReconPlan | None) -> None:
        """One masked forward and backward per draw from the first live site, without the LM
        head unless it is a site (the clean site outputs are the clean forward's, counted once;
        recomputing them beside the masked pass shows in the compiled / useful ratio)."""
        assert plan is not None
        census.recon_forwards(config.type, plan, samples=config.n_samples, logits=False)


register_loss_term(StochasticHiddenActsReconTerm())
