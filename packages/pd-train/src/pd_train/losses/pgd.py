"""Adversarial reconstruction: fresh PGD and persistent PGD sources.

Both replace the random sources of the recon masks (m = ci_lower + (1 − ci_lower)·s[:C],
δ = s[C]) by sources chosen to make the recon KL *worse*, within [0, 1].

**Fresh PGD** (:class:`FreshPGD`, the ``pgd_recon`` term and the ``eval/kl_pgd`` metric): per
recon forward, sources start ``random`` | ``ones`` | ``zeros``, take ``n_steps`` sign-gradient
ascents ``s ← clip(s + step_size·sign(∂KL/∂s), 0, 1)`` (a ``lax.fori_loop``: the compile does
not grow with ``n_steps``) with the components and CI detached, and the loss is the KL of the
final sources, which carry no gradient. Shapes per kind ``[n_k, B, T, C + 1]``
(``unique_per_datapoint``) or ``[n_k, 1, 1, C + 1]`` (``shared_across_batch``). Random starts
draw from the forward's source key folded with a number derived from the kind's name (CRC-32),
so any target's kinds get keys and adding a kind leaves the others' draws unchanged.

**Persistent PGD** (:class:`PersistentPGD`, the ``persistent_pgd_recon`` term): sources per kind
``[n_k, B | 1, T, C + 1]`` (scope ``bsc`` | ``sc``) live in ``TrainState.adversary`` with their
optimizer state, initialized U[0, 1) by pd-init (one stacked output per kind, keys from the
names ``{site}.ppgd_source``). Each step: ``n_warmup_steps`` ascents on the route-all KL with
params and CI detached (:meth:`PersistentPGD.warmup`), the term's value under the warmed
sources (which enter the main loss through a zero offset, so the main backward yields their
gradient), and one final ascent along that gradient divided by the term's coeff — the same
gradient a second backward of the term alone would give, without running one.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import jax
import jax.numpy as jnp

import pd_init
from pd_train.config.pd import OptimizerConfig, PersistentPGDRecon, PGDEval, PGDRecon
from pd_train.decomposition import Decomposition, site_name
from pd_train.optim import schedule_hyperparams, scheduled_lr

__all__ = [
    "FreshPGD",
    "PersistentPGD",
    "adam_ascent",
    "persistent_pgd_hyperparams",
    "sign_ascent",
]

Sources = dict[str, jax.Array]


def sign_ascent(sources: Mapping[str, jax.Array], grads: Any, step_size: Any) -> Sources:
    """``clip(s + step_size·sign(g), 0, 1)`` per kind."""
    return {
        k: jnp.clip(s + step_size * jnp.sign(grads[k]).astype(s.dtype), 0.0, 1.0)
        for k, s in sources.items()
    }


def adam_ascent(
    sources: Mapping[str, jax.Array],
    state: Mapping[str, Any],
    grads: Any,
    lr: Any,
    *,
    b1: float,
    b2: float,
    eps: float,
) -> tuple[Sources, dict[str, Any]]:
    """One Adam ascent, then the clamp: with t = count + 1, m = b1·m + (1 − b1)·g,
    v = b2·v + (1 − b2)·g², ``s ← clip(s + lr·(m/(1 − b1^t)) / (sqrt(v/(1 − b2^t)) + eps), 0, 1)``.

    state: ``{"count": int32 [], "m": {kind: like s}, "v": {kind: like s}}``.
    """
    count = state["count"] + 1
    t = count.astype(jnp.float32)
    bc1, bc2 = 1 - b1**t, 1 - b2**t
    m = {k: b1 * state["m"][k] + (1 - b1) * grads[k] for k in sources}
    v = {k: b2 * state["v"][k] + (1 - b2) * grads[k] * grads[k] for k in sources}
    new = {
        k: jnp.clip(s + lr * (m[k] / bc1) / (jnp.sqrt(v[k] / bc2) + eps), 0.0, 1.0)
        for k, s in sources.items()
    }
    return new, {"count": count, "m": m, "v": v}


def _name_number(name: str) -> int:
    """A stable 31-bit number from a name, to fold into a key (keys from names, not positions)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


@attrs.frozen(kw_only=True)
class FreshPGD:
    """Fresh PGD settings (from a ``pgd_recon`` term or ``pd.eval_pgd``)."""

    init: str = "random"
    n_steps: int = 20
    #: A float, or an f32 [] array (a step's hyperparameter argument).
    step_size: Any = 0.1
    mask_scope: str = "unique_per_datapoint"

    @classmethod
    def of(cls, config: PGDRecon | PGDEval, step_size: Any = None) -> FreshPGD:
        """The settings of ``config``, with ``step_size`` (e.g. an array) in place of its own."""
        return cls(
            init=config.init,
            n_steps=config.n_steps,
            step_size=config.step_size if step_size is None else step_size,
            mask_scope=config.mask_scope,
        )

    def init_sources(
        self, ci_lower: Mapping[str, jax.Array], batch_shape: tuple[int, ...], *, key: jax.Array
    ) -> Sources:
        """Starting sources per kind: ci_lower[kind] [n_k, B, T, C] -> [n_k, B, T, C + 1]
        (``unique_per_datapoint``) or [n_k, 1, 1, C + 1] (``shared_across_batch``), fp32."""
        out = {}
        for kind, ci in ci_lower.items():
            lead = (
                batch_shape
                if self.mask_scope == "unique_per_datapoint"
                else (1,) * len(batch_shape)
            )
            shape = (ci.shape[0], *lead, ci.shape[-1] + 1)
            if self.init == "random":
                kind_key = jax.random.fold_in(key, _name_number(kind))
                out[kind] = jax.random.uniform(kind_key, shape, jnp.float32)
            elif self.init == "ones":
                out[kind] = jnp.ones(shape, jnp.float32)
            else:
                out[kind] = jnp.zeros(shape, jnp.float32)
        return out

    def ascend(self, objective: Callable[[Sources], jax.Array], sources: Sources) -> Sources:
        """``n_steps`` sign ascents of ``objective`` (whose other inputs must already be
        detached), as a ``lax.fori_loop``; the result carries no gradient."""

        def body(_: Any, s: Sources) -> Sources:
            return sign_ascent(s, jax.grad(objective)(s), self.step_size)

        return jax.lax.stop_gradient(jax.lax.fori_loop(0, self.n_steps, body, sources))


def persistent_pgd_hyperparams(term: PersistentPGDRecon, total_steps: int) -> dict[str, Any]:
    """The sources' optimizer scalars as data: the lr schedule's (warmup over
    ``warmup_frac``·total_steps, then cosine to ``final_val_frac``·lr;
    :func:`pd_train.optim.schedule_hyperparams`), b1, b2 and eps."""
    opt = term.optimizer
    schedule = OptimizerConfig(
        lr=opt.lr,
        warmup_steps=round(opt.warmup_frac * total_steps),
        final_val_frac=opt.final_val_frac,
    )
    return {
        "schedule": schedule_hyperparams(schedule, total_steps),
        "b1": float(opt.b1),
        "b2": float(opt.b2),
        "eps": float(opt.eps),
    }


class PersistentPGD:
    """The persistent sources of one ``persistent_pgd_recon`` term: their specs, shapes,
    shardings, optimizer and ascents.

    Args:
        term: the loss term.
        decomposition: the sites.
        batch_size, seq_len: B and T of the train batches (``bsc`` sources are [B, T, C + 1]
            per site, ``sc`` [1, T, C + 1]).
        total_steps: pd.steps (for the lr schedule).
        layout: a pd-sharding Zero1Layout or None: ``bsc`` stacks shard B over the data axes,
            ``sc`` stacks are replicated.
    """

    def __init__(
        self,
        term: PersistentPGDRecon,
        decomposition: Decomposition,
        *,
        batch_size: int,
        seq_len: int,
        total_steps: int,
        layout: Any = None,
    ) -> None:
        self.term = term
        self.decomposition = decomposition
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.layout = layout
        self._hp = persistent_pgd_hyperparams(term, total_steps)
        self._plan: pd_init.InitPlan | None = None

    # ---------------------------------------------------------------- shapes and layout
    def lead(self) -> tuple[int, int]:
        return (self.batch_size if self.term.scope == "bsc" else 1, self.seq_len)

    def source_shardings(self) -> dict[str, Any] | None:
        """{kind: sharding of the [n_k, B | 1, T, C + 1] stack}, or None without a layout."""
        if self.layout is None:
            return None
        from jax.sharding import PartitionSpec as P

        out = {}
        for layout in self.decomposition.kinds:
            shape = (len(layout.layers), *self.lead(), layout.C + 1)
            spec = P(None, self.layout.data) if self.term.scope == "bsc" else P()
            out[layout.kind] = self.layout.named(shape, spec, name=f"ppgd.{layout.kind}")
        return out

    def abstract_sources(self) -> dict[str, jax.ShapeDtypeStruct]:
        shardings = self.source_shardings() or {}
        return {
            layout.kind: jax.ShapeDtypeStruct(
                (len(layout.layers), *self.lead(), layout.C + 1),
                jnp.float32,
                sharding=shardings.get(layout.kind),
            )
            for layout in self.decomposition.kinds
        }

    def abstract_state(self) -> dict[str, Any]:
        """``{"sources": {kind: ...}, "opt_state": ...}`` as ShapeDtypeStructs (with shardings)."""
        sources = self.abstract_sources()
        count_sharding = self.layout.replicated() if self.layout is not None else None
        opt: dict[str, Any] = {
            "count": jax.ShapeDtypeStruct((), jnp.int32, sharding=count_sharding)
        }
        if self.term.optimizer.type == "adam":
            opt["m"] = dict(sources)
            opt["v"] = dict(sources)
        return {"sources": sources, "opt_state": opt}

    def shardings(self) -> Any:
        """The shardings of :meth:`abstract_state` (None without a layout)."""
        if self.layout is None:
            return None
        return jax.tree.map(lambda a: a.sharding, self.abstract_state())

    # ---------------------------------------------------------------- init
    def specs(self) -> list[pd_init.ArraySpec]:
        """One pd-init spec per site, ``{site}.ppgd_source``, grouped ``ppgd.{kind}`` (layer
        order), U[0, 1)."""
        return [
            pd_init.ArraySpec(
                name=f"{site_name(layer, layout.kind)}.ppgd_source",
                shape=(*self.lead(), layout.C + 1),
                init=pd_init.Uniform(low=0.0, high=1.0),
                group=f"ppgd.{layout.kind}",
            )
            for layout in self.decomposition.kinds
            for layer in layout.layers
        ]

    def init_plan(self) -> pd_init.InitPlan:
        if self._plan is None:
            shardings = self.source_shardings()
            group_shardings = (
                None if shardings is None else {f"ppgd.{k}": s for k, s in shardings.items()}
            )
            # "counter": each kind's stack is one fused kernel (no loop, no temporary) with the
            # per-array reference's values.
            self._plan = pd_init.InitPlan(
                self.specs(), group_shardings=group_shardings, draw="counter"
            )
        return self._plan

    def init_sources(self, *, key: jax.Array) -> Sources:
        """The sources, stacked per kind by pd-init's stacked jit, in their shardings."""
        return self.sources_from_stacks(self.init_plan().init_stacked(key=key).stacks)

    def sources_from_stacks(self, stacks: Mapping[str, jax.Array]) -> Sources:
        """The sources per kind from the stacks of :meth:`init_plan` (named ``ppgd.<kind>``)."""
        return {layout.kind: stacks[f"ppgd.{layout.kind}"] for layout in self.decomposition.kinds}

    def init_opt_state(self, sources: Mapping[str, jax.Array]) -> dict[str, Any]:
        """Zero moments (adam) and ascent count 0 (traceable)."""
        opt: dict[str, Any] = {"count": jnp.zeros((), jnp.int32)}
        if self.term.optimizer.type == "adam":
            opt["m"] = {k: jnp.zeros_like(s) for k, s in sources.items()}
            opt["v"] = {k: jnp.zeros_like(s) for k, s in sources.items()}
        return opt

    # ---------------------------------------------------------------- ascents
    def hyperparams(self) -> dict[str, Any]:
        """The sources' optimizer scalars as data: the lr schedule's
        (:func:`pd_train.optim.schedule_hyperparams`), b1, b2 and eps. The methods below take
        them as ``hp`` (e.g. arrays of the jitted step's argument); None: these values."""
        return {**self._hp, "schedule": dict(self._hp["schedule"])}

    def lr(self, step: Any, hp: Mapping[str, Any] | None = None) -> jax.Array:
        return scheduled_lr((self._hp if hp is None else hp)["schedule"], step)

    def ascend(
        self,
        sources: Mapping[str, jax.Array],
        opt_state: Mapping[str, Any],
        grads: Any,
        lr: Any,
        hp: Mapping[str, Any] | None = None,
    ) -> tuple[Sources, dict[str, Any]]:
        """One projected ascent with the term's optimizer."""
        hp = self._hp if hp is None else hp
        if self.term.optimizer.type == "sign":
            new = sign_ascent(sources, grads, lr)
            return new, {"count": opt_state["count"] + 1}
        return adam_ascent(sources, opt_state, grads, lr, b1=hp["b1"], b2=hp["b2"], eps=hp["eps"])

    def warmup(
        self,
        objective: Callable[[Sources], jax.Array],
        sources: Sources,
        opt_state: dict[str, Any],
        lr: Any,
        hp: Mapping[str, Any] | None = None,
    ) -> tuple[Sources, dict[str, Any]]:
        """``n_warmup_steps`` ascents on ``objective`` (its other inputs already detached), as a
        ``lax.fori_loop``; the sources come out without gradient history."""
        if self.term.n_warmup_steps == 0:
            return sources, opt_state

        def body(_: Any, carry: tuple[Sources, dict[str, Any]]) -> tuple[Sources, dict[str, Any]]:
            s, o = carry
            return self.ascend(s, o, jax.grad(objective)(s), lr, hp)

        out = jax.lax.fori_loop(0, self.term.n_warmup_steps, body, (sources, opt_state))
        return jax.lax.stop_gradient(out)
