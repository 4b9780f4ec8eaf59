"""Which sites are decomposed, how they stack by kind, and how the layer loop splits.

A site is named ``layers.{i}.self_attn.{q,k,v,o}_proj`` or ``layers.{i}.mlp.{gate,up,down}_proj``.
Patterns are fnmatch-style (``*``, ``?``, ``[4-9]``) over those names. Canonical order is layer
ascending, then q, k, v, o, gate, up, down.

Language-model targets also have two sites outside the layer stack (:data:`GLOBAL_KINDS`):
``embed_tokens`` (the token embedding [vocab, d], decomposed as a lookup into V's rows: a token's
component activations are ``V[token]``, as spd decomposes an ``nn.Embedding``) and ``lm_head``
(the unembedding [d, vocab]; with tied embeddings the transposed table). Each is named by its kind
alone, is the one member of its own kind (a stack of one, ``layers == (0,)``), and covers no
segment: the forwards apply it before and after the layer loop. Canonical order puts
``embed_tokens`` first and ``lm_head`` last.

Each decomposed kind stacks its V/U over the layers it covers, in layer order. The layer loop runs
as a few *segments*: maximal runs of consecutive layers that the same set of kinds covers. Inside a
segment every covered kind covers every layer, so the segment reads contiguous static slices of
each kind's stack; layers no kind covers form segments that run the plain frozen layer.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

import attrs

from pd_train.config.io import ConfigError
from pd_train.config.pd import DecompositionTarget
from pd_train.models.llama_config import LlamaConfig
from pd_train.targets.base import Target, as_target

__all__ = [
    "GLOBAL_KINDS",
    "Decomposition",
    "KindLayout",
    "Segment",
    "Site",
    "build_decomposition",
    "global_site_shapes",
    "site_name",
    "site_weights",
]

_MODULE = {
    "q_proj": "self_attn",
    "k_proj": "self_attn",
    "v_proj": "self_attn",
    "o_proj": "self_attn",
    "gate_proj": "mlp",
    "up_proj": "mlp",
    "down_proj": "mlp",
}


#: Sites outside the layer stack: the token embedding (a lookup, applied before layer 0) and the
#: LM head (a matmul after the final norm), each one member of its own kind.
GLOBAL_KINDS = ("embed_tokens", "lm_head")


def site_name(layer: int, kind: str) -> str:
    """``site_name(0, "embed_tokens") == "embed_tokens"`` (a global kind: named by its kind);
    ``site_name(3, "down_proj") == "layers.3.mlp.down_proj"``; a kind that is not Llama's
    (a toy target's) is named ``layers.{layer}.{kind}``: ``site_name(0, "W") == "layers.0.W"``."""
    if kind in GLOBAL_KINDS:
        return kind
    if kind not in _MODULE:
        return f"layers.{layer}.{kind}"
    return f"layers.{layer}.{_MODULE[kind]}.{kind}"


@attrs.frozen(kw_only=True)
class Site:
    """One decomposed weight: its name, layer, kind, and its row in the kind's stack."""

    name: str
    layer: int
    kind: str
    index: int


@attrs.frozen(kw_only=True)
class KindLayout:
    """The stack of one kind: V [len(layers), d_in, C], U [len(layers), C, d_out]."""

    kind: str
    layers: tuple[int, ...]
    C: int
    d_in: int
    d_out: int

    def slot(self, layer: int) -> int:
        return self.layers.index(layer)


@attrs.frozen(kw_only=True)
class Segment:
    """Layers [start, stop) covered by exactly ``kinds``; ``offsets[j]`` is where this segment's
    layers start in the stack of ``kinds[j]``."""

    start: int
    stop: int
    kinds: tuple[str, ...]
    offsets: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.stop - self.start


@attrs.frozen(kw_only=True)
class Decomposition:
    """Static description of a decomposition (hashable, usable as a jit static argument)."""

    n_layers: int
    kinds: tuple[KindLayout, ...]

    @property
    def kind_names(self) -> tuple[str, ...]:
        return tuple(k.kind for k in self.kinds)

    def kind(self, name: str) -> KindLayout:
        for layout in self.kinds:
            if layout.kind == name:
                return layout
        msg = f"kind {name!r} is not decomposed; decomposed kinds: {self.kind_names}"
        raise KeyError(msg)

    @property
    def layer_kinds(self) -> tuple[KindLayout, ...]:
        """The kinds inside the layer stack (every kind but :data:`GLOBAL_KINDS`)."""
        return tuple(k for k in self.kinds if k.kind not in GLOBAL_KINDS)

    def has(self, kind: str) -> bool:
        return kind in self.kind_names

    @property
    def sites(self) -> tuple[Site, ...]:
        """Every decomposed site in canonical order (``embed_tokens`` first, ``lm_head`` last).
        A global site's ``layer`` is the row it takes in per-layer tables such as a forward's
        ``live`` [L, K]: 0 for ``embed_tokens`` (it acts before layer 0), L − 1 for ``lm_head``
        (after the last layer); its ``index`` in its stack is 0."""

        def one(kind: str, layer: int) -> Site:
            index = 0 if kind in GLOBAL_KINDS else self.kind(kind).slot(layer)
            return Site(name=site_name(layer, kind), layer=layer, kind=kind, index=index)

        out = [one("embed_tokens", 0)] if self.has("embed_tokens") else []
        for layer in range(self.n_layers):
            out += [one(k.kind, layer) for k in self.layer_kinds if layer in k.layers]
        if self.has("lm_head"):
            out.append(one("lm_head", self.n_layers - 1))
        return tuple(out)

    @property
    def segments(self) -> tuple[Segment, ...]:
        segments: list[Segment] = []
        for layer in range(self.n_layers):
            covered = tuple(
                k.kind for k in self.kinds if k.kind not in GLOBAL_KINDS and layer in k.layers
            )
            if segments and segments[-1].kinds == covered and segments[-1].stop == layer:
                last = segments[-1]
                segments[-1] = attrs.evolve(last, stop=layer + 1)
            else:
                offsets = tuple(self.kind(k).slot(layer) for k in covered)
                segments.append(
                    Segment(start=layer, stop=layer + 1, kinds=covered, offsets=offsets)
                )
        return tuple(segments)


def build_decomposition(
    model: LlamaConfig | Target,
    targets: Sequence[DecompositionTarget],
    *,
    path: str = "pd.decomposition_targets",
) -> Decomposition:
    """Match ``targets`` against the model's sites.

    Raises ConfigError (naming ``{path}[i].module_pattern``) when a pattern matches no site, a
    site matches two patterns, or one kind would get two different C (a kind's sites share C
    because they are stacked). ``model``: the target (a LlamaConfig for the Llama target).
    """
    arch = as_target(model)
    n_layers = arch.n_layers
    shapes = arch.site_shapes()
    globals_ = global_site_shapes(arch)
    shapes.update(globals_)
    names = [
        (layer, kind, site_name(layer, kind)) for layer in range(n_layers) for kind in arch.kinds
    ]
    if "embed_tokens" in globals_:
        names.insert(0, (0, "embed_tokens", "embed_tokens"))
    if "lm_head" in globals_:
        names.append((0, "lm_head", "lm_head"))
    owner: dict[str, int] = {}
    problems: list[tuple[str, str]] = []
    for i, target in enumerate(targets):
        where = f"{path}[{i}].module_pattern"
        hits = [name for _, _, name in names if fnmatch.fnmatchcase(name, target.module_pattern)]
        if not hits:
            first, last = arch.kinds[0], arch.kinds[-1]
            extra = "".join(f", {k!r}" for k in globals_)
            msg = (
                f"{target.module_pattern!r} matches no site; sites are named like "
                f"{site_name(0, first)!r} or {site_name(n_layers - 1, last)!r}"
                f" (layers 0..{n_layers - 1}){extra}"
            )
            problems.append((where, msg))
        for name in hits:
            if name in owner:
                msg = (
                    f"{target.module_pattern!r} matches site {name!r}, which "
                    f"{path}[{owner[name]}].module_pattern "
                    f"{targets[owner[name]].module_pattern!r} already matches; each site may "
                    "match one pattern"
                )
                problems.append((where, msg))
            else:
                owner[name] = i
    if problems:
        raise ConfigError(problems)

    kinds: list[KindLayout] = []
    for kind in (*[k for k in globals_ if k == "embed_tokens"], *arch.kinds,
                 *[k for k in globals_ if k == "lm_head"]):  # fmt: skip
        matched = [(layer, owner[name]) for layer, k, name in names if k == kind and name in owner]
        if not matched:
            continue
        cs = {targets[i].C: i for _, i in matched}
        if len(cs) > 1:
            (c0, i0), (c1, i1) = list(cs.items())[:2]
            msg = (
                f"gives {kind} sites C={c1} while {path}[{i0}] gives other {kind} sites C={c0}; "
                f"sites of one kind are stacked and must share C"
            )
            raise ConfigError([(f"{path}[{i1}].C", msg)])
        d_in, d_out = shapes[kind]
        kinds.append(
            KindLayout(
                kind=kind,
                layers=tuple(layer for layer, _ in matched),
                C=targets[matched[0][1]].C,
                d_in=d_in,
                d_out=d_out,
            )
        )
    return Decomposition(n_layers=n_layers, kinds=tuple(kinds))


def global_site_shapes(target: Target) -> dict[str, tuple[int, int]]:
    """``(d_in, d_out)`` of the target's sites outside the layer stack (``{}`` for a target
    without them, e.g. a toy's): ``embed_tokens`` (vocab, d) and ``lm_head`` (d, vocab)."""
    fn = getattr(target, "global_site_shapes", None)
    return dict(fn()) if fn is not None else {}


def site_weights(target: Target, params: Any, decomposition: Decomposition) -> dict[str, Any]:
    """The frozen weight stacks the components approximate, by kind: ``params["layers"][k]``
    [L, d_in, d_out] for a layer kind and ``[1, d_in, d_out]`` for a global one (the
    embedding table; the LM head, which with tied embeddings is the table transposed, the same
    frozen array read twice). What faithfulness compares V@U with."""
    out = dict(params["layers"])
    if any(k.kind in GLOBAL_KINDS for k in decomposition.kinds):
        for kind, w in target.global_weights(params).items():  # type: ignore[attr-defined]
            if decomposition.has(kind):
                out[kind] = w[None]
    return out
