"""What the useful-FLOP census of a step is counted into (:func:`pd_train.flops.step_census`).

Each loss term (:meth:`pd_train.losses.LossTerm.flops`) and each CI type
(:meth:`pd_train.ci.CIType.flops`) counts its own work into a :class:`CensusContext`: matmuls,
attention and flat counts on its :class:`FlopAccumulator`, masked forwards over a recon plan's
chunks (:meth:`CensusContext.recon_forwards`), optimizer updates. The entries
(:class:`FlopEntry`) sum into a :class:`Census`. What counts and why is in
:mod:`pd_train.flops`; this module sits below the terms and CI types (they import it), the
census itself above them (it asks their registries).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import attrs

from pd_train.decomposition import GLOBAL_KINDS, Decomposition

__all__ = [
    "ADAM_FLOPS_PER_PARAM",
    "Census",
    "CensusContext",
    "FlopAccumulator",
    "FlopEntry",
]

#: FLOPs per trained number per step for AdamW with global-norm clipping: the norm (2), both
#: moments (3 + 4), bias corrections and sqrt/divide (3), weight decay and the update (2).
ADAM_FLOPS_PER_PARAM = 14

#: Kinds in canonical order with the stage of the layer they belong to: q/k/v read the
#: attention input (0), o the attention output (1), gate/up the MLP input (2), down (3).
_STAGES = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 2, "up_proj": 2,
           "down_proj": 3}  # fmt: skip


@attrs.frozen(kw_only=True)
class FlopEntry:
    """FLOPs of one piece of the step. ``term``: ``clean``, ``ci_fn``, ``optimizer`` or a loss
    term's type; ``part``: ``live``/``frozen``/``attention``/``lm_head`` (target forwards),
    ``ci_fn``, ``faithfulness``, ``optimizer``; ``phase``: ``step`` or ``pgd_ascent``;
    ``kind``: the site kind (or None)."""

    term: str
    part: str
    phase: str
    kind: str | None
    forward: float
    backward: float

    @property
    def total(self) -> float:
        return self.forward + self.backward


@attrs.frozen(kw_only=True)
class Census:
    """Every :class:`FlopEntry` of one step; ``tokens`` = B·T."""

    entries: tuple[FlopEntry, ...]
    tokens: int

    @property
    def total(self) -> float:
        return sum(e.total for e in self.entries)

    @property
    def matmul(self) -> float:
        """Everything but the optimizer's elementwise work: what compiled matmul FLOPs
        (:func:`hlo_matmul_flops`) compare to."""
        return sum(e.total for e in self.entries if e.part != "optimizer")

    @property
    def forward(self) -> float:
        return sum(e.forward for e in self.entries)

    @property
    def backward(self) -> float:
        return sum(e.backward for e in self.entries)

    def by(self, field: str) -> dict[Any, float]:
        """Total FLOPs grouped by an entry field (``term``, ``part``, ``phase``, ``kind``)."""
        out: dict[Any, float] = defaultdict(float)
        for e in self.entries:
            out[getattr(e, field)] += e.total
        return dict(out)

    def table(self) -> str:
        """A markdown table: GFLOPs per term and part (forward, backward, total)."""
        rows: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for e in self.entries:
            r = rows[(e.term, e.phase, e.part)]
            r[0] += e.forward
            r[1] += e.backward
        lines = ["| term | phase | part | fwd GFLOP | bwd GFLOP | total GFLOP |",
                 "|---|---|---|---:|---:|---:|"]  # fmt: skip
        for (term, phase, part), (f, b) in rows.items():
            lines.append(f"| {term} | {phase} | {part} | {f / 1e9:.3f} | {b / 1e9:.3f} | "
                         f"{(f + b) / 1e9:.3f} |")  # fmt: skip
        t = self.total
        lines.append(f"| **total** | | | {self.forward / 1e9:.3f} | {self.backward / 1e9:.3f} | "
                     f"{t / 1e9:.3f} |")  # fmt: skip
        return "\n".join(lines)


class FlopAccumulator:
    """The FLOP entries of one count (:attr:`CensusContext.acc`): matmuls, attention, flat
    counts."""

    def __init__(self) -> None:
        self.entries: list[FlopEntry] = []

    def mm(
        self,
        m: float,
        k: float,
        n: float,
        *,
        term: str,
        part: str,
        kind: str | None = None,
        dx: bool,
        dw: bool,
        phase: str = "step",
        times: float = 1.0,
    ) -> None:
        """``[m, k] @ [k, n]``, ``times`` over; backward: dx and/or dw (one forward each)."""
        f = 2.0 * m * k * n * times
        self.entries.append(
            FlopEntry(
                term=term, part=part, phase=phase, kind=kind, forward=f, backward=f * (dx + dw)
            )
        )

    def attention(
        self, b: int, t: int, heads: int, head_dim: int, *, term: str, part: str, grad: bool,
        phase: str = "step", times: float = 1.0,
    ) -> None:  # fmt: skip
        """``q·kᵀ`` and ``p·v`` over all T keys; backward: 2× (both operands carry gradient)."""
        f = 2 * 2.0 * b * heads * t * t * head_dim * times
        self.entries.append(
            FlopEntry(
                term=term,
                part=part,
                phase=phase,
                kind=None,
                forward=f,
                backward=2 * f if grad else 0.0,
            )
        )

    def flat(self, flops: float, *, term: str, part: str, kind: str | None = None) -> None:
        self.entries.append(
            FlopEntry(term=term, part=part, phase="step", kind=kind, forward=flops, backward=0.0)
        )


def _site_dims(model: Any) -> dict[str, tuple[int, int]]:
    """``(d_in, d_out)`` of each of the target's kinds, in canonical order."""
    from pd_train.targets.base import as_target

    return as_target(model).site_shapes()


def _head_dim(model: Any) -> int:
    return _site_dims(model)["q_proj"][1] // model.num_attention_heads


def _clean_forward(acc: FlopAccumulator, model: Any, b: int, t: int) -> None:
    dims = _site_dims(model)
    n, L = b * t, model.num_hidden_layers
    hd = _head_dim(model)
    for kind in dims:
        d_in, d_out = dims[kind]
        acc.mm(n, d_in, d_out, term="clean", part="frozen", kind=kind, dx=False, dw=False, times=L)
    acc.attention(b, t, model.num_attention_heads, hd, term="clean", part="attention", grad=False,
                  times=L)  # fmt: skip
    acc.mm(n, model.hidden_size, model.vocab_size, term="clean", part="lm_head", dx=False, dw=False)


def _masked_forward(
    acc: FlopAccumulator,
    model: Any,
    decomposition: Decomposition,
    live: set[tuple[int, str]],
    b: int,
    t: int,
    *,
    term: str,
    train: bool,
    phase: str,
    times: float,
    logits: bool = True,
) -> None:
    """One masked forward + backward with ``live`` (layer, kind) sites on their component path.
    ``train``: the backward also reaches V/U (else only the masks' sources: a PGD ascent).
    ``logits``: it ends in the LM head (False: a term that reads only site outputs, whose
    forward runs the LM head only when it is a live site)."""
    if not live or times == 0:
        return
    dims = _site_dims(model)
    n = b * t
    hd = _head_dim(model)
    kw0: dict[str, Any] = {"term": term, "phase": phase, "times": times}
    grad = False  # whether the residual stream carries a gradient at this point
    live_kinds = {k for _, k in live}
    in_stack = [(layer, k) for layer, k in live if k not in GLOBAL_KINDS]
    if "embed_tokens" in live_kinds:
        # V[tokens] is a row lookup (no matmul); (V[tokens]·m) @ U: fwd, d(inner), dU. Every
        # layer after it is recomputed and carries a gradient.
        c = decomposition.kind("embed_tokens").C
        acc.mm(n, c, model.hidden_size, part="live", kind="embed_tokens", dx=True, dw=train, **kw0)
        first, first_stage, grad = 0, 0, True
    else:
        # The LM head's row is the last layer: the masked forward starts there at the latest.
        starts = [(layer, _STAGES[k]) for layer, k in in_stack]
        if "lm_head" in live_kinds:
            starts.append((model.num_hidden_layers - 1, 0))
        first, first_stage = min(starts)
    for layer in range(first, model.num_hidden_layers):
        for stage in range(4):
            if layer == first and stage < first_stage:
                continue  # equal to the clean forward up to the first live site
            kinds = [k for k in dims if _STAGES[k] == stage]
            any_live = False
            for kind in kinds:
                d_in, d_out = dims[kind]
                kw: dict[str, Any] = {"term": term, "kind": kind, "phase": phase, "times": times}
                # x@W at the first live site's stage reads the clean input: the clean forward
                # computed it already.
                clean_xw = layer == first and stage == first_stage and not grad
                if (layer, kind) in live:
                    any_live = True
                    c = decomposition.kind(kind).C
                    if not clean_xw:
                        acc.mm(n, d_in, d_out, part="live", dx=grad, dw=False, **kw)
                    acc.mm(n, d_in, c, part="live", dx=grad, dw=train, **kw)
                    acc.mm(n, c, d_out, part="live", dx=True, dw=train, **kw)
                elif not clean_xw:
                    acc.mm(n, d_in, d_out, part="frozen", dx=grad, dw=False, **kw)
            grad = grad or any_live
            if stage == 0:
                acc.attention(b, t, model.num_attention_heads, hd, term=term, part="attention",
                              grad=grad, phase=phase, times=times)  # fmt: skip
    d, v = model.hidden_size, model.vocab_size
    if logits or "lm_head" in live_kinds:
        acc.mm(n, d, v, term=term, part="lm_head", dx=grad, dw=False, phase=phase, times=times)
    if "lm_head" in live_kinds:
        c = decomposition.kind("lm_head").C
        acc.mm(n, d, c, part="live", kind="lm_head", dx=grad, dw=train, **kw0)
        acc.mm(n, c, v, part="live", kind="lm_head", dx=True, dw=train, **kw0)


def _live_sets(
    decomposition: Decomposition, chunks: Iterable[Iterable[int]]
) -> list[set[tuple[int, str]]]:
    sites = decomposition.sites
    return [{(sites[i].layer, sites[i].kind) for i in chunk} for chunk in chunks]


@attrs.define(kw_only=True)
class CensusContext:
    """What a loss term's or a CI type's FLOP count adds to (:func:`step_census`): ``acc``
    takes matmuls (``acc.mm(m, k, n, term=, part=, kind=, dx=, dw=, times=)``), attention and
    flat counts; batches are [batch_size, seq_len]; ``model`` is the target (None when only the
    CI function is counted)."""

    acc: FlopAccumulator
    decomposition: Decomposition
    batch_size: int
    seq_len: int
    model: Any = None

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len

    def clean_forward(self) -> None:
        """The frozen target's clean forward over the batch (every layer, the LM head)."""
        assert self.model is not None
        _clean_forward(self.acc, self.model, self.batch_size, self.seq_len)

    def recon_forwards(
        self, term: str, plan: Any, *, samples: int, ascents: int = 0, logits: bool = True
    ) -> None:
        """Per chunk of ``plan``: ``samples`` masked forwards with backward, and ``ascents``
        masked forwards with backward (the PGD ascents, phase ``pgd_ascent``). ``logits``:
        the forwards end in the LM head (False: it runs only as a live site, e.g.
        ``stochastic_hidden_acts_recon``, which compares site outputs)."""
        assert self.model is not None
        b, t = self.batch_size, self.seq_len
        for live in _live_sets(self.decomposition, plan.chunks):
            _masked_forward(self.acc, self.model, self.decomposition, live, b, t, term=term,
                            train=True, phase="step", times=samples, logits=logits)  # fmt: skip
            _masked_forward(self.acc, self.model, self.decomposition, live, b, t, term=term,
                            train=False, phase="pgd_ascent", times=ascents)  # fmt: skip

    def optimizer(self, numel: float, *, term: str, kind: str | None = None) -> None:
        """An Adam update of ``numel`` elements (``ADAM_FLOPS_PER_PARAM`` each)."""
        self.acc.flat(ADAM_FLOPS_PER_PARAM * numel, term=term, part="optimizer", kind=kind)
