"""Evaluation of a decomposition on held-out batches.

Per batch, the clean target gives logits and the CI function gives ``ci_lower`` per site. Then
the model with every decomposed site on its component path is run under four masks:

* ``ci``: m = ci_lower, δ = 0 (what the decomposition claims is needed);
* ``ones``: m = 1, δ = 0 (all components, no delta: the V@U model);
* ``stochastic``: the training sources (m = ci + (1 − ci)·r, δ from r);
* ``rounded``: m = [ci_lower > rounding_threshold (default l0_threshold)], δ = 0.

Adversarial masks, when configured: ``ppgd`` — the persistent PGD sources of the train state
(a ``persistent_pgd_recon`` term; no ascent at eval; ``bsc`` sources lend each eval row a
training row drawn at random among those of its own shard, :func:`eval_sources`); ``pgd`` —
fresh PGD sources ascended ``pd.eval_pgd.n_steps`` times on this batch's KL (``pd.eval_pgd``
set). Both route every site at every position.

Reported per mask: ``eval/ce_<mask>`` (next-token cross entropy) and ``eval/kl_<mask>``
(KL(clean ‖ masked), mean over positions); ``eval/ce_clean``; ``l0/<site>``; and per site a
histogram of ci_lower over [0, 1] (``ci_hist/<site>`` with ``edges`` and ``counts``). Values are
means over ``n_batches`` batches.

The four masks are data, not code: every mask is m = c + (1 − c)·s·r, δ = s·r[C] for a mask
ci ``c`` (ci_lower, ones or rounded) and a source scale ``s`` (1 for ``stochastic``, else 0),
so one masked forward is traced and ``lax.map`` runs it once per mask. The eval jit is then
about the size of one masked forward instead of four (``benchmarks/eval_compile.py``). The
stochastic mask draws its sources from the batch's eval key folded per site, as training does;
under ``binomial`` sampling the lower CI is jittered as in training (:mod:`pd_train.sources`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import pd_sharding
from pd_train._forward import CleanRunner, masked_forward
from pd_train.analysis.recon_eval import ReconStats, recon_batch_metrics
from pd_train.analysis.statistics import EvalComponentStats, component_counts
from pd_train.losses import FreshPGD, kl_clean_masked, l0, site_grid
from pd_train.sources import JITTER_FOLD, jitter_lower_ci
from pd_train.squash import lower_leaky_hard

log = logging.getLogger("pd_train")

MASKS = ("ci", "ones", "stochastic", "rounded")
HIST_BINS = 20


def cross_entropy(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Mean next-token cross entropy: logits [B, T, V] at t predict tokens [B, T] at t + 1."""
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return -jnp.mean(picked)


def batch_metrics(
    trainer: Any,
    params: Any,
    target: Any,
    tokens: jax.Array,
    key: jax.Array,
    adversary: Any = None,
    slow: bool = False,
    hp: Any = None,
) -> dict[str, Any]:
    """The metrics of one batch (traceable): ``eval/*`` scalars, ``l0`` {kind: [n_k]} and
    ``ci_hist`` {kind: [n_k, HIST_BINS]}; ``slow`` (static): also ``recon``, the hidden-activation
    and attention-pattern recon of :mod:`pd_train.analysis.recon_eval`.

    params: the train state's params; tokens [B, T] int32; key: this batch's eval key (the
    stochastic mask folds it per site, fresh PGD starts from it); adversary: the train state's
    (persistent PGD sources, [n_k, B | 1, T, C + 1] per kind), or None; hp:
    :func:`eval_hyperparams`' values as f32 [] arrays (data of the eval program), or None for
    the config's values as constants.
    """
    hp = eval_hyperparams(trainer) if hp is None else hp
    batch = _clean_and_ci(trainer, params, target, tokens, key)
    out: dict[str, Any] = {"eval/ce_clean": cross_entropy(batch.clean_logits, tokens)}
    out.update(_mask_metrics(batch, hp))
    for name, sources in _adversarial_sources(trainer, batch, adversary, hp).items():
        logits = batch.forward(batch.comps, batch.ci_lower, sources=sources)
        out[f"eval/ce_{name}"] = cross_entropy(logits, tokens)
        out[f"eval/kl_{name}"] = kl_clean_masked(batch.clean_logits, logits)
    threshold = hp["l0_threshold"]
    out["l0"] = l0(batch.ci_lower, threshold)
    out["ci_hist"] = {k: ci_histogram(v) for k, v in batch.ci_lower.items()}
    out["components"] = component_counts(batch.ci_lower, threshold)  # density, mean CI, L0 groups
    if slow:
        out["recon"] = recon_batch_metrics(
            batch.spec,
            target=batch.target,
            tokens=tokens,
            components=batch.comps,
            ci_lower=batch.ci_lower,
            key=key,
            clean_stream=batch.clean.stream,
        )
    return out


@dataclasses.dataclass(frozen=True)
class _EvalBatch:
    """One eval batch after the clean forward: the forward spec, the target (LM head gathered
    once), tokens [B, T], the eval key, V/U in the compute dtype, the clean run (its residual
    stream), clean logits [B, T, vocab] and ci_lower {kind: [n_k, B, T, C]}."""

    spec: Any
    target: Any
    tokens: jax.Array
    key: jax.Array
    comps: Any
    clean: CleanRunner
    clean_logits: jax.Array
    ci_lower: dict[str, jax.Array]

    def forward(self, comps: Any, ci: Any, **kw: Any) -> jax.Array:
        """Logits of the masked forward with every decomposed site live at every position (a
        numpy grid: the forward specializes to the decomposed sites at trace time, no per-layer
        branches); ``kw``: ``sources`` or ``source_scale``."""
        return masked_forward(
            self.spec,
            target=self.target,
            tokens=self.tokens,
            components=comps,
            ci_lower=ci,
            live=site_grid(self.spec.decomposition) >= 0,
            routed=None,
            key=self.key,
            clean_stream=self.clean.stream,
            **kw,
        )


def _clean_and_ci(
    trainer: Any, params: Any, target: Any, tokens: jax.Array, key: jax.Array
) -> _EvalBatch:
    """The clean forward and the CI; under ``binomial`` sampling the lower CI is jittered, as
    spd does at eval too."""
    spec = trainer.forward_spec
    target = trainer.gather_head(target)  # one gathered LM head for every forward below
    comps = jax.tree.map(lambda a: a.astype(trainer.compute_dtype), params["components"])
    clean = CleanRunner(spec, target, tokens)
    clean_logits, pre = trainer.ci_fn.causal_importance(params["ci_fn"], comps, clean)
    if trainer.pd.sampling == "binomial":
        pre = jitter_lower_ci(pre, key=jax.random.fold_in(key, JITTER_FOLD))
    ci_lower = {k: lower_leaky_hard(v) for k, v in pre.items()}
    return _EvalBatch(spec, target, tokens, key, comps, clean, clean_logits, ci_lower)


def _mask_metrics(batch: _EvalBatch, hp: Any) -> dict[str, jax.Array]:
    """``eval/ce_<mask>`` and ``eval/kl_<mask>`` of the four :data:`MASKS`: one traced masked
    forward, ``lax.map``-ped over the mask number (see the module docstring)."""
    rounding = hp.get("rounding_threshold", hp["l0_threshold"])
    rounded = {k: (v > rounding).astype(v.dtype) for k, v in batch.ci_lower.items()}
    ones, stochastic, rounded_mode = (MASKS.index(m) for m in ("ones", "stochastic", "rounded"))

    def under_mask(mode: jax.Array) -> tuple[jax.Array, jax.Array]:
        ci = {
            k: jnp.where(mode == rounded_mode, rounded[k], jnp.where(mode == ones, 1.0, v))
            for k, v in batch.ci_lower.items()
        }
        scale = (mode == stochastic).astype(jnp.float32)
        logits = batch.forward(batch.comps, ci, source_scale=scale)
        return cross_entropy(logits, batch.tokens), kl_clean_masked(batch.clean_logits, logits)

    ce, kl = jax.lax.map(under_mask, jnp.arange(len(MASKS)))
    out = {}
    for i, mask in enumerate(MASKS):
        out[f"eval/ce_{mask}"] = ce[i]
        out[f"eval/kl_{mask}"] = kl[i]
    return out


def _adversarial_sources(
    trainer: Any, batch: _EvalBatch, adversary: Any, hp: Any
) -> dict[str, Any]:
    """{name: sources {kind: [n_k, B | 1, T | 1, C + 1]}} of the adversarial masks configured:
    ``ppgd`` (the train state's persistent sources) and ``pgd`` (fresh sources ascended on this
    batch's KL with components and CI detached)."""
    out: dict[str, Any] = {}
    if adversary and getattr(trainer, "ppgd", None) is not None:
        rows_key = jax.random.fold_in(batch.key, EVAL_ROWS_FOLD)
        out["ppgd"] = eval_sources(
            adversary["sources"], batch.tokens.shape[0], key=rows_key, layout=trainer.layout
        )
    if trainer.pd.eval_pgd is not None:
        comps_d, ci_d = jax.lax.stop_gradient((batch.comps, batch.ci_lower))
        pgd = FreshPGD.of(trainer.pd.eval_pgd, step_size=hp["eval_pgd_step_size"])

        def objective(sources: Any) -> jax.Array:
            logits = batch.forward(comps_d, ci_d, sources=sources)
            return kl_clean_masked(batch.clean_logits, logits)

        start = pgd.init_sources(
            batch.ci_lower, tuple(batch.tokens.shape), key=jax.random.fold_in(batch.key, 1)
        )
        out["pgd"] = pgd.ascend(objective, start)
    return out


#: Folded into an eval batch key for the training rows that persistent ``bsc`` sources lend.
EVAL_ROWS_FOLD = 0x5EED_0B5C


def eval_sources(
    sources: Mapping[str, jax.Array], batch_size: int, *, key: jax.Array, layout: Any = None
) -> dict[str, jax.Array]:
    """Persistent-PGD sources for an eval batch of ``batch_size`` rows.

    Per-datapoint (``bsc``) sources [n_k, B_train, T, C + 1] lend each eval row a training row
    drawn uniformly with replacement, one draw shared by every kind (as param-decomp's eval
    draws a training source row per eval row) -> [n_k, batch_size, T, C + 1]; shared (``sc``)
    sources [n_k, 1, T, C + 1] pass unchanged. ``key``: the draw key (from the eval key).

    The draw is shard-local. With ``layout`` (the trainer's, its data axes cutting both the
    sources' batch axis and the eval rows into D shards), each device draws, for each of its
    own batch_size / D eval rows, one of the B_train / D training rows it holds: the row
    numbers are ``randint(key, [batch_size], 0, B_train / D)`` (sharded like the eval rows,
    drawn where they live) and a ``shard_map`` gathers within each shard, so no device ever
    holds another's sources (a global gather all-gathered them: 319 GiB of temporaries per
    device at Llama-3-8B on 64 devices). Without a layout, D = 1: the global draw.

    How it differs from a global draw: an eval row of shard d draws only among shard d's
    training rows, so two eval rows of one shard never draw from different shards. It is
    equivalent in distribution when the shards are i.i.d.: the training rows of every shard
    are initialized alike and ascended on their own batch rows, which are i.i.d. draws from
    the data whichever shard they land on, so each eval row's source has the same marginal
    distribution as under a global draw, and the eval metrics (means over rows) have the same
    expectation.
    """
    first = next(iter(sources.values()))
    if first.shape[1] == 1:
        return dict(sources)
    shards = 1 if layout is None else layout.data_size
    rows = jax.random.randint(key, (batch_size,), 0, first.shape[1] // shards)
    if layout is None:
        return {k: jnp.take(v, rows, axis=1) for k, v in sources.items()}
    rows = jax.lax.with_sharding_constraint(rows, layout.batch((batch_size,), name="eval rows"))
    spec = P(None, layout.data)

    def local(shard: dict[str, jax.Array], shard_rows: jax.Array) -> dict[str, jax.Array]:
        return {k: jnp.take(v, shard_rows, axis=1) for k, v in shard.items()}

    specs = dict.fromkeys(sources, spec)
    gather = jax.shard_map(
        local, mesh=layout.mesh, in_specs=(specs, P(layout.data)), out_specs=specs
    )
    return gather(dict(sources), rows)  # type: ignore[no-any-return]


def ci_histogram(ci: jax.Array) -> jax.Array:
    """Per site, counts [n_k, HIST_BINS] (int32) of ci [n_k, B, T, C] clipped to [0, 1], in
    HIST_BINS equal bins; a bin holds [left, right), the last also 1.

    The bins of ``jnp.histogram`` with the same edges, counted as differences of "at least this
    edge" counts, where ``jnp.histogram``'s search and scatter cost about a tenth of the eval
    jit's compile time; int32, so counts stay exact past 2**24.

    Memory: a loop over sites, and in it over edges, so at most one site's [B·T·C] compare is
    live. The broadcast compare against all edges at once (``c[..., None] >= edges``) was
    materialized by XLA:CPU as int32 [n_k, B·T·C, HIST_BINS] — 20× the CI, ~100 GiB per device
    at Llama-3-8B's 224 sites on 64 devices (docs/findings.md section 8).
    """
    edges = jnp.linspace(0.0, 1.0, HIST_BINS + 1)[:-1]

    def site_counts(site_ci: jax.Array) -> jax.Array:  # [B, T, C] -> [HIST_BINS]
        c = jnp.clip(site_ci, 0.0, 1.0)
        return jax.lax.map(lambda edge: jnp.sum(c >= edge, dtype=jnp.int32), edges)

    at_least = jax.lax.map(site_counts, ci)  # [n_k, HIST_BINS]: counts >= each left edge
    return at_least - jnp.pad(at_least[:, 1:], ((0, 0), (0, 1)))


def eval_hyperparams(trainer: Any) -> dict[str, float]:
    """The eval program's scalar hyperparameters: ``l0_threshold`` (``pd.l0_threshold``),
    ``rounding_threshold`` when ``pd.rounding_threshold`` is set, and, with ``pd.eval_pgd``
    set, ``eval_pgd_step_size``. They enter the program as data
    (:func:`eval_hyperparam_arrays`), so changing one reuses the compiled eval."""
    out = {"l0_threshold": float(trainer.pd.l0_threshold)}
    if trainer.pd.rounding_threshold is not None:
        out["rounding_threshold"] = float(trainer.pd.rounding_threshold)
    if trainer.pd.eval_pgd is not None:
        out["eval_pgd_step_size"] = float(trainer.pd.eval_pgd.step_size)
    return out


def eval_hyperparam_arrays(trainer: Any, *, abstract: bool = False) -> dict[str, Any]:
    """:func:`eval_hyperparams` as f32 [] arrays (``abstract``: ShapeDtypeStructs), replicated
    over the trainer's mesh when it has one."""
    sharding = trainer.layout.replicated() if trainer.layout is not None else None
    values = eval_hyperparams(trainer)
    if abstract:
        return {k: jax.ShapeDtypeStruct((), jnp.float32, sharding=sharding) for k in values}
    # From numpy: jnp.asarray of a Python float would compile a convert program.
    return {k: jax.device_put(np.asarray(v, np.float32), sharding) for k, v in values.items()}


def eval_jit(trainer: Any, *, slow: bool = False) -> Any:
    """``jit(eval_metrics)(params, target, tokens, key, adversary, hp)``: :func:`batch_metrics`
    for ``trainer``, with the trainer's compiler options (``slow``: with the slow-eval metrics);
    ``hp``: :func:`eval_hyperparam_arrays` (None: the config's values as constants)."""

    def eval_metrics(
        params: Any,
        target: Any,
        tokens: jax.Array,
        key: jax.Array,
        adversary: Any = None,
        hp: Any = None,
    ) -> Any:
        return batch_metrics(trainer, params, target, tokens, key, adversary, slow=slow, hp=hp)

    return jax.jit(eval_metrics, compiler_options=trainer.compiler_options or None)


def lower_eval(
    trainer: Any,
    *,
    batch_size: int,
    seq_len: int,
    target_dtype: Any = jnp.bfloat16,
    slow: bool = False,
) -> Any:
    """Lower the eval jit (``slow``: the slow-eval one) on abstract params, target, batch and key
    (allocates nothing), as ``Trainer.lower_step`` does for the step."""
    shape = (batch_size, seq_len)
    tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=trainer.batch_sharding(shape))
    key = jax.eval_shape(lambda: jax.random.key(0))
    if trainer.layout is not None:
        key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=trainer.layout.replicated())
    state = trainer.abstract_state()
    return eval_jit(trainer, slow=slow).lower(
        state.params,
        trainer.abstract_target(target_dtype),
        tokens,
        key,
        state.adversary or None,
        eval_hyperparam_arrays(trainer, abstract=True),
    )


class Evaluator:
    """``evaluator(state, target, key=...) -> {name: value}`` over ``n_batches`` eval batches.

    :meth:`compile_ahead` compiles the (fast) eval jit in a background thread, e.g. while the
    first training steps run, so that the first eval does not stop the run for its compile.
    """

    def __init__(self, trainer: Any, batches: Any, *, n_batches: int, mesh: Any) -> None:
        self.trainer = trainer
        self.batches = batches
        self.n_batches = n_batches
        self.mesh = mesh
        self._eval: Any = eval_jit(trainer)
        self._slow_eval: Any = None
        self._ahead: Any = None
        #: ``hit`` (loaded from the executable cache), ``hit (lowered)``, ``miss``, ``miss, not
        #: stored``, ``off`` (no cache given), ``failed``; None before :meth:`compile_ahead`.
        self.ahead_outcome: str | None = None

    def compile_ahead(
        self,
        *,
        target_dtype: Any,
        cache: Any = None,
        key: str | None = None,
        unchanged: Any = None,
        recorder: Any = None,
    ) -> None:
        """Start lowering and compiling the eval jit on the trainer's abstract params, target,
        batch and key (:func:`lower_eval`, the layout the train step leaves the state in) in a
        background thread. With ``cache`` (a :class:`pd_train.process_env.ExecutableCache`) and
        ``key`` the program is loaded from it, or stored in it after the compile
        (``unchanged()``: the traced source is as it was when the key was made). The first call
        waits for the thread; if it failed, or the program refuses the arguments, the jit
        compiles at that call as before (with a warning)."""
        import threading

        result: dict[str, Any] = {}

        def build() -> None:
            import contextlib

            phase = recorder.phase("eval") if recorder is not None else contextlib.nullcontext()
            try:
                with phase:
                    if cache is not None and key is not None:
                        result["compiled"] = cache.load(key)
                        if result["compiled"] is not None:
                            self.ahead_outcome = "hit"
                            return
                    lowered = lower_eval(
                        self.trainer,
                        batch_size=self.batches.batch_size,  # global, as the jit sees it
                        seq_len=self.batches.dataset.seq_len,
                        target_dtype=target_dtype,
                    )
                    if cache is not None and key is not None:
                        compiled, self.ahead_outcome = cache.obtain(
                            key, lowered, unchanged=unchanged
                        )
                    else:
                        compiled, self.ahead_outcome = lowered.compile(), "off"
                    result["compiled"] = compiled
            except Exception as exc:  # reported at the first eval, which uses the jit
                self.ahead_outcome = "failed"
                result["error"] = exc

        thread = threading.Thread(target=build, name="pd-train-eval", daemon=True)
        thread.start()
        self._ahead = (thread, result)

    def close(self) -> None:
        """Wait for an ahead-of-time compile still running (a run stopped before its first
        eval), so that no compile thread outlives the run."""
        if self._ahead is not None:
            self._ahead[0].join()

    def _take_ahead(self) -> None:
        """Swap in the program :meth:`compile_ahead` built (waiting for it), once."""
        if self._ahead is None:
            return
        thread, result = self._ahead
        self._ahead = None
        thread.join()
        if result.get("compiled") is not None:
            from pd_train.process_env import ProgramOrJit

            self._eval = ProgramOrJit("eval", result["compiled"], self._eval)
        else:
            log.warning(
                "eval: the ahead-of-time compile failed (%r); compiling at this call instead",
                result.get("error"),
            )

    def __call__(
        self, state: Any, target: Any, *, key: jax.Array, slow: bool = False
    ) -> dict[str, Any]:
        """``slow``: also the slow-eval recon metrics (a second jit, compiled on first use)."""
        if slow and self._slow_eval is None:
            self._slow_eval = eval_jit(self.trainer, slow=True)
        if not slow:
            self._take_ahead()
        run = self._slow_eval if slow else self._eval
        hp = eval_hyperparam_arrays(self.trainer)
        recon = ReconStats(self.trainer.forward_spec) if slow else None
        sums: dict[str, float] = {}
        hist: dict[str, np.ndarray] = {}
        l0_sum: dict[str, float] = {}
        components = EvalComponentStats(
            self.trainer.decomposition, getattr(self.trainer.pd, "l0_groups", None)
        )
        for i in range(self.n_batches):
            rows = self.batches.batch(i)
            tokens = pd_sharding.global_batch(rows.astype(np.int32), self.mesh)
            metrics = jax.device_get(
                run(
                    state.params,
                    target,
                    tokens,
                    jax.random.fold_in(key, i),
                    getattr(state, "adversary", None) or None,
                    hp,
                )
            )
            for name, value in metrics.items():
                if name.startswith("eval/"):
                    sums[name] = sums.get(name, 0.0) + float(value)
            for site in self.trainer.decomposition.sites:
                l0_value = float(np.asarray(metrics["l0"][site.kind])[site.index])
                l0_sum[site.name] = l0_sum.get(site.name, 0.0) + l0_value
                counts = np.asarray(metrics["ci_hist"][site.kind])[site.index]
                hist[site.name] = hist.get(site.name, 0) + counts
            components.add(metrics["components"], tokens.size)
            if recon is not None:
                recon.add(metrics["recon"])
        record: dict[str, Any] = {k: v / self.n_batches for k, v in sums.items()}
        for name, value in l0_sum.items():
            record[f"l0/{name}"] = value / self.n_batches
        edges = np.linspace(0.0, 1.0, HIST_BINS + 1).tolist()
        for name, counts in hist.items():
            record[f"ci_hist/{name}"] = {"edges": edges, "counts": np.asarray(counts).tolist()}
        record.update(components.record())
        if recon is not None:
            record.update(recon.record())
        return record
