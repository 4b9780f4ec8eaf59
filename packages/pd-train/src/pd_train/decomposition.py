"""Which sites are decomposed, how they stack by kind, and how the layer loop splits.

A site is named ``layers.{i}.self_attn.{q,k,v,o}_proj`` or ``layers.{i}.mlp.{gate,up,down}_proj``.
Patterns are fnmatch-style (``*``, ``?``, ``[4-9]``) over those names. Canonical order is layer
ascending, then q, k, v, o, gate, up, down.

Each decomposed kind stacks its V/U over the layers it covers, in layer order. The layer loop runs
as a few *segments*: maximal runs of consecutive layers that the same set of kinds covers. Inside a
segment every covered kind covers every layer, so the segment reads contiguous static slices of
each kind's stack; layers no kind covers form segments that run the plain frozen layer.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

import attrs

from pd_train._config_io import ConfigError
from pd_train.config import DecompositionTarget
from pd_train.models.llama_config import LlamaConfig
from pd_train.targets.base import Target, as_target

__all__ = [
    "Decomposition",
    "KindLayout",
    "Segment",
    "Site",
    "build_decomposition",
    "site_name",
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


def site_name(layer: int, kind: str) -> str:
    """``site_name(3, "down_proj") == "layers.3.mlp.down_proj"``; a kind that is not Llama's
    (a toy target's) is named ``layers.{layer}.{kind}``: ``site_name(0, "W") == "layers.0.W"``."""
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
    def sites(self) -> tuple[Site, ...]:
        """Every decomposed site in canonical order."""
        out = []
        for layer in range(self.n_layers):
            for layout in self.kinds:
                if layer in layout.layers:
                    out.append(
                        Site(
                            name=site_name(layer, layout.kind),
                            layer=layer,
                            kind=layout.kind,
                            index=layout.slot(layer),
                        )
                    )
        return tuple(out)

    @property
    def segments(self) -> tuple[Segment, ...]:
        segments: list[Segment] = []
        for layer in range(self.n_layers):
            covered = tuple(k.kind for k in self.kinds if layer in k.layers)
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
    names = [
        (layer, kind, site_name(layer, kind)) for layer in range(n_layers) for kind in arch.kinds
    ]
    owner: dict[str, int] = {}
    problems: list[tuple[str, str]] = []
    for i, target in enumerate(targets):
        where = f"{path}[{i}].module_pattern"
        hits = [name for _, _, name in names if fnmatch.fnmatchcase(name, target.module_pattern)]
        if not hits:
            first, last = arch.kinds[0], arch.kinds[-1]
            msg = (
                f"{target.module_pattern!r} matches no site; sites are named like "
                f"{site_name(0, first)!r} or {site_name(n_layers - 1, last)!r}"
                f" (layers 0..{n_layers - 1})"
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

    shapes = arch.site_shapes()
    kinds: list[KindLayout] = []
    for kind in arch.kinds:
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
