"""Tied components: a target whose second matrix is the first's transpose (a tied TMS:
W₂ = W₁ᵀ) is decomposed with one set of components for both, as the reference does for a tied
TMS: U₂ = V₁ᵀ, V₂ = U₁ᵀ.

A target declares its ties as ``tied_kinds``: pairs ``(source kind, tied kind)`` with
``W_tied = W_sourceᵀ`` (absent: none). :func:`decomposition_ties` keeps the pairs whose two
kinds are both decomposed; :func:`tie_components` overwrites each tied kind's V/U with the
source's transposes. The Trainer applies it inside the loss (so the tied kind's own leaves get
zero gradient and the source gets the gradient of both uses, summed) and to the parameters after
every update and at init (so a stored state always holds the tied values and every reader of
the parameters sees them). Each site keeps its own CI function.

pd's tie differs from the reference in one detail: the reference shares the tensors' storage
between two parameters, each with its own Adam state, so a step applies two Adam updates to the
shared values; pd has one parameter and one Adam update of the summed gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

from pd_train.config.io import ConfigError

__all__ = ["Ties", "decomposition_ties", "tie_components"]

#: ``((source kind, tied kind), ...)``: the tied kind's V, U are the source's Uᵀ, Vᵀ.
Ties = tuple[tuple[str, str], ...]


def decomposition_ties(model: Any, decomposition: Any) -> Ties:
    """The model's ``tied_kinds`` whose two kinds are both decomposed in ``decomposition`` (a
    :class:`~pd_train.decomposition.Decomposition`). Their stacks must match transposed (same
    layers and C; ConfigError at ``pd.decomposition_targets`` otherwise)."""
    ties: Ties = tuple(getattr(model, "tied_kinds", ()))
    if not ties:
        return ()
    layouts = {k.kind: k for k in decomposition.kinds}
    kept = []
    for source, tied in ties:
        if source not in layouts or tied not in layouts:
            continue
        a, b = layouts[source], layouts[tied]
        if (a.layers, a.C, a.d_in, a.d_out) != (b.layers, b.C, b.d_out, b.d_in):
            msg = (
                f"{tied!r} is tied to {source!r} (its weight is {source!r}'s transpose), so its "
                f"components are {source!r}'s transposed: both need the same C and layers; got "
                f"C {a.C} on layers {list(a.layers)} and C {b.C} on layers {list(b.layers)}"
            )
            raise ConfigError([("pd.decomposition_targets", msg)])
        kept.append((source, tied))
    return tuple(kept)


def tie_components(components: Mapping[str, Any], ties: Ties) -> dict[str, Any]:
    """``components`` ({kind: {"V": [n, d_in, C], "U": [n, C, d_out]}}) with each tied kind's
    ``V = swap(U_source)`` [n, d_out_source, C] and ``U = swap(V_source)`` [n, C, d_in_source]
    (``swap``: the last two axes). Without ties, ``components`` unchanged (as a dict)."""
    out = dict(components)
    for source, tied in ties:
        src = components[source]
        out[tied] = {
            **components[tied],
            "V": jnp.swapaxes(src["U"], -1, -2),
            "U": jnp.swapaxes(src["V"], -1, -2),
        }
    return out
