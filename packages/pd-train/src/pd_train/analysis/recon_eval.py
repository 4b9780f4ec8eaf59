"""Slow-eval recon metrics: hidden-activation recon per site and attention-pattern recon per layer.

Both compare the *clean* target with the target whose every decomposed site takes its component
path, under two masks (the eval's ``ci`` and ``stochastic``, see :mod:`pd_train.evaluate`):

* **hidden-activation recon** of a site: the mean over batch, positions and outputs of
  ``(y_masked − y_clean)²``, where ``y`` is the site's output ``x @ W`` (clean) or its component
  path (masked) *inside each model*: a masked site sees the masked model's input, so errors of
  earlier sites propagate, as in spd's ``StochasticHiddenActsReconLoss``;
* **attention-pattern recon** of a layer (Llama targets): ``KL(P_clean ‖ P_masked)`` over the
  keys of each causal attention distribution ``P`` [B, heads, T_query, T_key], mean over batch,
  heads and query positions.

One paired forward computes both: a layer scan whose carry holds the clean and the masked
residual streams; each layer runs clean and masked, and emits per decomposed kind the mean
squared error of its output and the layer's attention KL as the scan's stacked outputs. Only one
layer's activations (and attention probabilities) are alive at a time, never all sites' at once.
The masks are data (a source scale of 0 or 1, as the eval's), so ``lax.map`` runs one traced
paired forward per mask. The masked site math is :func:`pd_train._forward.live_site_output`,
the one the training and eval forwards use, with the same per-site source keys: under the same
key the stochastic mask here is the eval's ``stochastic`` mask.

These metrics cost about three forwards per mask, so they run on the slow-eval cadence
(``cadence.slow_eval_every``, a multiple of ``cadence.eval_every``) through a second eval jit;
the regular eval jit does not contain them. Record keys: ``hidden_mse_{mask}/<site>``,
``attn_kl_{mask}/layers.{i}`` and the totals ``eval/hidden_mse_{mask}`` (over all sites'
elements) and ``eval/attn_kl_{mask}`` (mean over the layers reported).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pd_train._forward import (
    ForwardSpec,
    _frozen_body,
    _layer_xs,
    _slice,
    _start,
    live_site_output,
    loop,
)
from pd_train.models import llama
from pd_train.targets.llama import LlamaTarget

__all__ = [
    "RECON_MASKS",
    "ReconStats",
    "attention_kl",
    "recon_batch_metrics",
    "recon_layers",
    "slow_eval_due",
    "slow_eval_problems",
]

#: The masks the slow eval compares (source scale 0: m = ci_lower, δ = 0; 1: training sources).
RECON_MASKS = ("ci", "stochastic")


def attention_kl(clean: jax.Array, masked: jax.Array) -> jax.Array:
    """KL(clean ‖ masked) over the last axis, mean over all others (fp32 scalar).

    clean, masked: attention probabilities [..., T_key]; entries where ``clean`` is 0 (future
    keys) contribute 0; ``masked`` is floored at the smallest normal fp32 before its log."""
    p = clean.astype(jnp.float32)
    q = jnp.maximum(masked.astype(jnp.float32), jnp.finfo(jnp.float32).tiny)
    terms = jnp.where(p > 0, p * (jnp.log(jnp.where(p > 0, p, 1.0)) - jnp.log(q)), 0.0)
    return jnp.mean(jnp.sum(terms, axis=-1))


def recon_layers(spec: ForwardSpec) -> tuple[int, ...]:
    """The layers whose attention KL is reported: from the first decomposed layer on (before it
    the two models are the same)."""
    first = min(site.layer for site in spec.decomposition.sites)
    return tuple(range(first, spec.decomposition.n_layers))


def recon_batch_metrics(
    spec: ForwardSpec,
    *,
    target: Any,
    tokens: jax.Array,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    key: jax.Array,
    clean_stream: jax.Array | None = None,
) -> dict[str, Any]:
    """One batch's recon metrics under each of :data:`RECON_MASKS` (traceable).

    Returns ``{"hidden_mse": {kind: [n_masks, n_k]}}`` (mean squared error of each site's
    output, fp32), plus ``"attn_kl": [n_masks, len(recon_layers(spec))]`` for a Llama target.
    components[kind]: {"V": [n_k, d_in, C], "U": [n_k, C, d_out]}; ci_lower[kind]:
    [n_k, B, T, C]; key: the batch's eval key (the stochastic mask folds it per site as the
    eval's masked forward does); clean_stream: the clean residual stream [L + 1, B, T, hidden]
    of :class:`pd_train._forward.CleanRunner` (the paired scan starts from its entry to the first
    decomposed layer) or None (the layers before it run frozen from the embedding first).
    """

    def under_mask(mode: jax.Array) -> dict[str, Any]:
        return _paired_forward(
            spec,
            target=target,
            tokens=tokens,
            components=components,
            ci_lower=ci_lower,
            key=key,
            source_scale=mode.astype(jnp.float32),
            clean_stream=clean_stream,
        )

    modes = jnp.asarray([RECON_MASKS.index("ci"), RECON_MASKS.index("stochastic")], jnp.int32)
    out: dict[str, Any] = jax.lax.map(under_mask, modes)
    return out


def _paired_forward(
    spec: ForwardSpec,
    *,
    target: Any,
    tokens: jax.Array,
    components: Mapping[str, Mapping[str, jax.Array]],
    ci_lower: Mapping[str, jax.Array],
    key: jax.Array,
    source_scale: jax.Array,
    clean_stream: jax.Array | None,
) -> dict[str, Any]:
    """The clean and the masked model side by side, layer by layer (see the module docstring)."""
    arch = spec.target
    llama_config = arch.config if isinstance(arch, LlamaTarget) else None
    h, ctx = _start(spec, target, tokens)
    first = recon_layers(spec)[0]
    if clean_stream is not None:
        h = clean_stream[first]
    elif first:
        frozen = _slice(target["layers"], 0, first)
        h, _ = loop(_frozen_body(spec, ctx), h, frozen, unroll=spec.layer_unroll)
    carry = (h, h)
    sq: dict[str, list[jax.Array]] = {k: [] for k in spec.decomposition.kind_names}
    kls: list[jax.Array] = []
    for seg in spec.decomposition.segments:
        start = max(seg.start, first)
        if start >= seg.stop:
            continue
        if seg.kinds:
            xs = _layer_xs(spec, seg, start, seg.stop, target, components, ci_lower)
        else:
            xs = {"layer": _slice(target["layers"], start, seg.stop - start)}

        def body(carry: Any, xs: Any, seg: Any = seg) -> tuple[Any, Any]:
            h_clean, h_masked = carry
            clean_out: dict[str, jax.Array] = {}
            masked_out: dict[str, jax.Array] = {}

            def clean_linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
                y = x @ w.astype(x.dtype)
                if kind in seg.kinds:
                    clean_out[kind] = y
                return y

            def masked_linear(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
                y = x @ w.astype(x.dtype)
                if kind in seg.kinds:
                    j = seg.kinds.index(kind)
                    y = live_site_output(spec, xs, kind, j, x, y, key, source_scale)
                    masked_out[kind] = y
                return y

            ys: dict[str, Any] = {}
            if llama_config is not None:
                cos, sin = ctx
                h_clean, p_clean = llama.decoder_layer_with_attention(
                    h_clean, xs["layer"], cos, sin, llama_config, clean_linear
                )
                h_masked, p_masked = llama.decoder_layer_with_attention(
                    h_masked, xs["layer"], cos, sin, llama_config, masked_linear
                )
                ys["attn_kl"] = attention_kl(p_clean, p_masked)
            else:
                h_clean = arch.layer(h_clean, xs["layer"], ctx, clean_linear)
                h_masked = arch.layer(h_masked, xs["layer"], ctx, masked_linear)
            ys["sq"] = {
                k: jnp.mean(
                    jnp.square(masked_out[k].astype(jnp.float32) - clean_out[k].astype(jnp.float32))
                )
                for k in seg.kinds
            }
            return (spec.constrain(h_clean), spec.constrain(h_masked)), ys

        carry, ys = loop(body, carry, xs, unroll=spec.layer_unroll)
        for k in seg.kinds:
            sq[k].append(ys["sq"][k])
        if llama_config is not None:
            kls.append(ys["attn_kl"])
    out: dict[str, Any] = {
        "hidden_mse": {k: jnp.concatenate(v) for k, v in sq.items() if v},
    }
    if llama_config is not None:
        out["attn_kl"] = jnp.concatenate(kls)
    return out


def slow_eval_problems(cadence: Any) -> list[tuple[str, str]]:
    """Field-path problems of ``cadence.slow_eval_every`` (a :class:`~pd_train.config.run.
    CadenceConfig`): it must be 0, or a multiple of a nonzero ``cadence.eval_every``."""
    every, eval_every = cadence.slow_eval_every, cadence.eval_every
    if not every:
        return []
    if not eval_every:
        msg = f"got {every}, but cadence.eval_every is 0 (no eval); set eval_every or use 0 (off)"
        return [("cadence.slow_eval_every", msg)]
    if every % eval_every:
        msg = (
            f"got {every}, not a multiple of cadence.eval_every ({eval_every}); "
            f"use a multiple such as {eval_every * max(1, round(every / eval_every))}, or 0 (off)"
        )
        return [("cadence.slow_eval_every", msg)]
    return []


def slow_eval_due(slow_eval_every: int, step: int, steps: int) -> bool:
    """Whether the eval after ``step`` finished steps (1-based, as ``pd-train run`` counts) also
    runs the slow metrics: every ``slow_eval_every`` steps and at the last step (0: never)."""
    return bool(slow_eval_every) and (step % slow_eval_every == 0 or step == steps)


class ReconStats:
    """Sums :func:`recon_batch_metrics` over eval batches on the host; :meth:`record` gives the
    eval record's entries (means over the batches):

    * ``hidden_mse_{mask}/<site>`` per site and ``eval/hidden_mse_{mask}``: Σ over sites of
      (site MSE × d_out) / Σ d_out, the MSE over all sites' output elements;
    * ``attn_kl_{mask}/layers.{i}`` per layer of :func:`recon_layers` and ``eval/attn_kl_{mask}``
      (their mean), for a Llama target.
    """

    def __init__(self, spec: ForwardSpec) -> None:
        self.sites = list(spec.decomposition.sites)
        self.d_out = {k: spec.decomposition.kind(k).d_out for k in spec.decomposition.kind_names}
        self.layers = recon_layers(spec)
        self.sums: dict[str, Any] = {}
        self.n_batches = 0

    def add(self, metrics: Mapping[str, Any]) -> None:
        """metrics: one batch's :func:`recon_batch_metrics` (on the host)."""
        flat = {f"hidden_mse.{k}": v for k, v in metrics["hidden_mse"].items()}
        if "attn_kl" in metrics:
            flat["attn_kl"] = metrics["attn_kl"]
        for name, value in flat.items():
            value = np.asarray(value, np.float64)
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.n_batches += 1

    def record(self) -> dict[str, Any]:
        if not self.n_batches:
            return {}
        out: dict[str, Any] = {}
        for i, mask in enumerate(RECON_MASKS):
            weighted, elements = 0.0, 0
            for site in self.sites:
                mse = float(self.sums[f"hidden_mse.{site.kind}"][i, site.index]) / self.n_batches
                out[f"hidden_mse_{mask}/{site.name}"] = mse
                weighted += mse * self.d_out[site.kind]
                elements += self.d_out[site.kind]
            out[f"eval/hidden_mse_{mask}"] = weighted / elements
            if "attn_kl" in self.sums:
                kl = self.sums["attn_kl"][i] / self.n_batches
                for layer, value in zip(self.layers, kl, strict=True):
                    out[f"attn_kl_{mask}/layers.{layer}"] = float(value)
                out[f"eval/attn_kl_{mask}"] = float(np.mean(kl))
        return out
