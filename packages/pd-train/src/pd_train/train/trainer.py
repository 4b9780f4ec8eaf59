"""The train state, the jitted train step, the faithfulness warmup and the AOT compile path.

Keys, the parameters' layout and the two optimizer groups: :mod:`pd_train.train.state`.

The state (params, optimizer state, shardings, init) is :mod:`pd_train.train._layout`, the
faithfulness warm-up :mod:`pd_train.train._warmup`; this module is the loss and the step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

import pd_init
import pd_sharding
from pd_train._forward import CleanRunner, ForwardSpec
from pd_train.ci import make_ci_function
from pd_train.config.pd import (
    ConfigError,
    LossMetric,
    PDConfig,
    RuntimeConfig,
    check_pd_config,
)
from pd_train.decomposition import Decomposition, build_decomposition
from pd_train.losses import (
    LossTerm,
    PersistentPGD,
    ReconPlan,
    TermInputs,
    l0,
    loss_term,
    paired_all_sites_loss,
    recon_loss,
)
from pd_train.models.llama_config import LlamaConfig
from pd_train.optim import lr_schedule, make_optimizer, optimizer_hyperparams, scheduled_lr
from pd_train.sources import JITTER_FOLD, jitter_lower_ci
from pd_train.squash import lower_leaky_hard_deferred, unit_clip, upper_leaky_hard
from pd_train.targets import Target
from pd_train.targets.tied import decomposition_ties, tie_components
from pd_train.train._layout import TrainerState
from pd_train.train._programs import (
    _CompiledStep,
    _WithHyperparams,
    scalar_array,
    scalar_dtype,
)
from pd_train.train._warmup import TrainerWarmup
from pd_train.train.state import GROUPS, TrainState

__all__ = ["Trainer"]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _site_map(fn: Callable[[jax.Array], jax.Array], stacks: Mapping[str, jax.Array]) -> Any:
    """``{kind: lax.map(fn, stack)}``: ``fn`` gets one site's [1, B, T, C] at a time and returns
    [1] (or [1, ...]); out [n_k] (or [n_k, ...]).

    Memory: L0's compare over every site's CI at once made XLA:CPU materialize a CI-sized fp32
    buffer (B·T·ΣC·4 bytes: 4.75 GiB per device at Llama-3-8B on 64 devices), alive at the train
    step's peak; per site, only one site's slice is (docs/findings.md section 8)."""
    return {k: jax.lax.map(lambda x: fn(x[None])[0], v) for k, v in stacks.items()}


class Trainer(TrainerState, TrainerWarmup):
    """The decomposition of one target and its jitted functions (not the training loop).

    Args:
        model: the target's architecture (a LlamaConfig, or any :class:`pd_train.targets.Target`).
        pd: the decomposition and its losses and optimizers.
        runtime: compute dtype and remat switches.
        mesh: a pd-sharding mesh (axes replicate, data, tensor) for the ZeRO-1 layout, or None
            to let JAX place everything (one device).
        seq_len: T of the train batches; needed (only) by a ``persistent_pgd_recon`` term,
            whose sources live in the train state with shape [B | 1, T, C + 1] per site.
        compiler_options: XLA options for every jit of the trainer (``jax.jit``'s
            ``compiler_options``), e.g. ``{"xla_backend_optimization_level": 0}``.

    Raises ConfigError (with field paths) for bad patterns or loss lists before anything
    compiles.
    """

    def __init__(
        self,
        model: LlamaConfig | Target,
        pd: PDConfig,
        runtime: RuntimeConfig | None = None,
        *,
        mesh: Mesh | None = None,
        compiler_options: Mapping[str, Any] | None = None,
        seq_len: int | None = None,
    ) -> None:
        check_pd_config(pd)
        self.model = model
        self.pd = pd
        self.runtime = runtime or RuntimeConfig()
        self.mesh = mesh
        self.decomposition: Decomposition = build_decomposition(model, pd.decomposition_targets)
        #: Tied kinds (pd_train.targets.tied): applied in the loss, after updates and at init.
        self.ties = decomposition_ties(model, self.decomposition)
        self.layout = pd_sharding.Zero1Layout(mesh) if mesh is not None else None
        self.compute_dtype = _DTYPES[self.runtime.compute_dtype]
        self.ci_fn = make_ci_function(
            pd.ci,
            decomposition=self.decomposition,
            remat=self.runtime.remat.ci_fn,
            constrain=self.layout.constrain_batch if self.layout is not None else (lambda x: x),
        )
        self.ci_fn.check(self.decomposition)
        self.tx = {
            "components": make_optimizer(pd.components, pd.steps),
            "ci_fn": make_optimizer(pd.ci_fn, pd.steps),
        }
        self.schedules = {
            "components": lr_schedule(pd.components, pd.steps),
            "ci_fn": lr_schedule(pd.ci_fn, pd.steps),
        }
        #: (config, registered term) per ``pd.loss_metrics`` entry, in order.
        self.terms: list[tuple[LossMetric, LossTerm]] = [
            (config, loss_term(config)) for config in pd.loss_metrics
        ]
        self.needs_ci = any(term.needs_ci for _, term in self.terms)
        self.plans: dict[int, ReconPlan] = {}
        for i, (config, term) in enumerate(self.terms):
            plan = term.plan(config, self.decomposition)
            if plan is not None:
                self.plans[i] = plan
        #: Per term with state across steps, ``{str(index): its state's ShapeDtypeStructs}``.
        self.term_state_specs: dict[str, Any] = {}
        for i, (config, term) in enumerate(self.terms):
            spec = term.state(config, self.decomposition)
            if spec is not None:
                self.term_state_specs[str(i)] = spec
        self.seq_len = seq_len
        self._hp_arrays: dict[str, Any] | None = None
        self.ppgd, self.ppgd_index = self._persistent_pgd(seq_len)
        constrain = self.layout.constrain_batch if self.layout is not None else (lambda x: x)
        self.forward_spec = ForwardSpec(
            model=model,
            decomposition=self.decomposition,
            compute_dtype=self.compute_dtype,
            sampling=pd.sampling,
            random_draws=pd.recon.random_draws,
            use_delta=pd.use_delta_component,
            layer_unroll=pd.recon.layer_loop == "unroll",
            remat_layers=self.runtime.remat.recon or self.runtime.remat.recon_layers,
            save_sources=self.runtime.remat.save_sources,
            constrain=constrain,
        )
        self.compiler_options = dict(compiler_options or {})
        self._train_step = self._build_train_step()
        self._warmup_tx = self._warmup_optimizer(
            pd.faithfulness_warmup.lr, pd.faithfulness_warmup.weight_decay
        )
        self._warmup_step = self._jit(self._warmup, donate_argnums=(0, 1))
        shardings = self._warmup_opt_shardings()
        kwargs = {} if shardings is None else {"out_shardings": shardings}
        self._warmup_init = self._jit(self._warmup_tx.init, **kwargs)
        self._init_plan: pd_init.InitPlan | None = None
        self._init_stack_jit: Any = None
        self._opt_init_jit: Any = None
        #: Where the init and warm-up jits (params, optimizer state, PGD sources and their
        #: state, warm-up init and step) get their programs: ``programs(name, jit, args,
        #: kwargs)`` returns a callable like ``jit`` for those arguments (``pd-train run`` serves
        #: them from its executable cache). None: the jits themselves.
        self.programs: Callable[[str, Any, tuple[Any, ...], dict[str, Any]], Any] | None = None

    def _program(self, name: str, jit: Any, *args: Any, **kwargs: Any) -> Any:
        """``jit``, or the program :attr:`programs` gives for these arguments."""
        if self.programs is None:
            return jit
        return self.programs(name, jit, args, kwargs)

    def _run(self, name: str, jit: Any, *args: Any, **kwargs: Any) -> Any:
        """``jit(*args, **kwargs)`` through :meth:`_program`."""
        return self._program(name, jit, *args, **kwargs)(*args, **kwargs)

    def _jit(self, fn: Any, **kwargs: Any) -> Any:
        return jax.jit(fn, compiler_options=self.compiler_options or None, **kwargs)

    def _persistent_pgd(self, seq_len: int | None) -> tuple[PersistentPGD | None, int | None]:
        """The adversarial term's persistent state (:meth:`LossTerm.adversary`) and its index,
        or (None, None); at most one term may keep one."""
        found = []
        for i, (config, term) in enumerate(self.terms):
            adversary = term.adversary(
                config,
                self.decomposition,
                batch_size=self.pd.batch_size,
                seq_len=seq_len,
                total_steps=self.pd.steps,
                layout=self.layout,
                where=f"pd.loss_metrics[{i}]",
            )
            if adversary is not None:
                found.append((adversary, i))
        if len(found) > 1:
            where = ", ".join(f"pd.loss_metrics[{i}]" for _, i in found)
            msg = f"terms {where} each keep persistent sources; at most one may"
            raise ConfigError([("pd.loss_metrics", msg)])
        return found[0] if found else (None, None)

    def hyperparams(self) -> dict[str, Any]:
        """Every scalar hyperparameter the step reads, as Python numbers: ``{"l0_threshold":
        the ``l0`` metric's, "terms": [per term, :meth:`LossTerm.hyperparams`], "optim":
        {group: :func:`pd_train.optim.optimizer_hyperparams`}}``. The jitted step takes them
        as an argument (:meth:`hyperparam_arrays`), so configs that differ only in these values
        compile to the same program (docs/hyperparameters.md lists the fields)."""
        return {
            "l0_threshold": float(self.pd.l0_threshold),
            "terms": [term.hyperparams(config, self.pd) for config, term in self.terms],
            "optim": {
                "components": optimizer_hyperparams(self.pd.components, self.pd.steps),
                "ci_fn": optimizer_hyperparams(self.pd.ci_fn, self.pd.steps),
            },
        }

    def hyperparam_arrays(self) -> dict[str, Any]:
        """:meth:`hyperparams` as f32 [] (floats) and i32 [] (ints) arrays, replicated over
        the mesh (built once)."""
        if self._hp_arrays is None:
            arrays = jax.tree.map(scalar_array, self.hyperparams())
            if self.layout is not None:
                arrays = jax.device_put(arrays, self.layout.replicated())
            self._hp_arrays = arrays
        return self._hp_arrays

    def abstract_hyperparams(self) -> dict[str, Any]:
        """ShapeDtypeStructs of :meth:`hyperparam_arrays` (replicated with a mesh)."""
        sharding = self.layout.replicated() if self.layout is not None else None
        return jax.tree.map(
            lambda v: jax.ShapeDtypeStruct((), scalar_dtype(v), sharding=sharding),
            self.hyperparams(),
        )

    def loss(
        self,
        params: Mapping[str, Any],
        target: Any,
        tokens: jax.Array,
        step: jax.Array,
        key: jax.Array,
        adversary: Mapping[str, Any] | None = None,
        source_offset: Mapping[str, jax.Array] | None = None,
        hp: Mapping[str, Any] | None = None,
        term_state: Mapping[str, Any] | None = None,
    ) -> tuple[jax.Array, dict[str, Any]]:
        """Σ coeff·term and ``{"terms": {type: value}, "l0": {kind: [n_k]}, ...}`` (plus each
        term's extra metrics, e.g. ``"pnorm"``; ``"pnorm/<name>"`` for a term with a ``name``).

        tokens [B, T] int; step: int []; key: the step key. With a ``persistent_pgd_recon``
        term: ``adversary`` is ``TrainState.adversary``; its sources first take
        ``n_warmup_steps`` ascents (params and CI detached), then the term uses them plus
        ``source_offset`` (zeros of the sources' shapes: its gradient is the sources'
        gradient); aux gets ``"adversary"``, the warmed sources and optimizer state. ``hp``:
        :meth:`hyperparams`' tree (arrays, or None for the config's values as constants).
        ``term_state``: ``TrainState.term_state`` (None: terms with state run without it, e.g.
        the frequency EMA falls back to this batch's frequencies); aux gets ``"term_state"``,
        the new state of each term that has one.
        """
        hp = self.hyperparams() if hp is None else hp
        params = {**params, "components": tie_components(params["components"], self.ties)}
        comps = jax.tree_util.tree_map(lambda a: a.astype(self.compute_dtype), params["components"])
        inputs = TermInputs(
            spec=self.forward_spec,
            target=self.gather_head(target),
            tokens=tokens,
            params=params,
            components=comps,
            step=step,
            chunk_unroll=self.pd.recon.chunk_loop == "unroll",
            remat=self.runtime.remat.recon,
        )
        aux: dict[str, Any] = {"terms": {}, "term_state": {}}
        if self.needs_ci:
            inputs, aux["l0"] = self._clean_and_ci(inputs, hp["l0_threshold"], key)
        if self.ppgd is not None:
            inputs, aux["adversary"] = self._warm_sources(inputs, adversary, source_offset, key, hp)
        paired = self._paired_values(inputs, key)
        total = jnp.zeros((), jnp.float32)
        for i, (config, term) in enumerate(self.terms):
            term_hp = hp["terms"][i]
            with jax.named_scope(f"pd.term.{config.type}"):
                extra: dict[str, jax.Array] = {}
                if i in paired:
                    value = paired[i]
                elif term_state and str(i) in term_state:
                    value, extra, aux["term_state"][str(i)] = term.stateful_value(
                        config,
                        inputs,
                        term_state[str(i)],
                        plan=self.plans.get(i),
                        hp=term_hp,
                        key=jax.random.fold_in(key, i),
                    )
                else:
                    value, extra = term.value(
                        config,
                        inputs,
                        plan=self.plans.get(i),
                        hp=term_hp,
                        key=jax.random.fold_in(key, i),
                    )
            name = getattr(config, "name", None)
            aux["terms"][name or config.type] = value
            weight = term_hp["coeff"]
            multiplier = term.coeff_multiplier(config, term_hp, inputs.step)
            if multiplier is not None:  # a scheduled coefficient (importance penalties)
                weight = weight * multiplier
                extra = {**extra, "coeff_multiplier": multiplier}
            # A named term's extras under ``<metric>/<name>``: two importance terms would
            # otherwise both report ``pnorm``, the later one hiding the first.
            aux.update(extra if name is None else {f"{k}/{name}": v for k, v in extra.items()})
            total = total + weight * value
        return total, aux

    def _clean_and_ci(
        self, inputs: TermInputs, threshold: Any, key: jax.Array
    ) -> tuple[TermInputs, dict[str, jax.Array]]:
        """The clean forward, the CI and its squashes into ``inputs``; and the L0 per site.
        Under ``binomial`` sampling the lower squash reads jittered pre-activations
        (:func:`pd_train.sources.jitter_lower_ci`, from ``fold_in(key, JITTER_FOLD)``)."""
        params = inputs.params
        # Named scopes label the compiled step's ops by phase (profiles, HLO dumps).
        with jax.named_scope("pd.clean_ci"):
            clean = CleanRunner(
                self.forward_spec,
                inputs.target,
                inputs.tokens,
                ci_reads_inner=getattr(self.ci_fn, "reads_inner_only", False),
            )
            clean_logits, pre = self.ci_fn.causal_importance(
                params["ci_fn"], inputs.components, clean
            )
            # Unclipped: every use clips (sources.masks), so no clipped copy of the
            # all-site CI is materialized next to pre (pd_train.squash's docstring).
            lower_pre = pre
            if self.pd.sampling == "binomial":
                lower_pre = jitter_lower_ci(pre, key=jax.random.fold_in(key, JITTER_FOLD))
            ci_lower = {k: lower_leaky_hard_deferred(v) for k, v in lower_pre.items()}
            ci_upper = {k: upper_leaky_hard(v) for k, v in pre.items()}
        with jax.named_scope("pd.l0"):
            l0_sites = _site_map(lambda c: l0({"s": unit_clip(c)}, threshold)["s"], ci_lower)
        inputs = dataclasses.replace(
            inputs,
            ci_lower=ci_lower,
            ci_upper=ci_upper,
            clean_logits=clean_logits,
            clean_stream=clean.stream,
        )
        return inputs, l0_sites

    def _warm_sources(
        self,
        inputs: TermInputs,
        adversary: Mapping[str, Any] | None,
        source_offset: Mapping[str, jax.Array] | None,
        key: jax.Array,
        hp: Mapping[str, Any],
    ) -> tuple[TermInputs, dict[str, Any]]:
        """The persistent sources after their ``n_warmup_steps`` ascents (params and CI
        detached) into ``inputs.sources`` (plus ``source_offset``); and the warmed state."""
        assert self.ppgd is not None and self.ppgd_index is not None
        if not adversary:
            msg = "a persistent_pgd_recon term needs the train state's adversary"
            raise ValueError(msg)
        i = self.ppgd_index
        term_hp = hp["terms"][i]
        comps_d, ci_d = jax.lax.stop_gradient((inputs.components, inputs.ci_lower))
        assert ci_d is not None and inputs.clean_logits is not None

        def objective(sources: dict[str, jax.Array]) -> jax.Array:
            return recon_loss(
                self.forward_spec,
                self.plans[i],
                n_samples=1,
                target=inputs.target,
                tokens=inputs.tokens,
                components=comps_d,
                ci_lower=ci_d,
                clean_logits=inputs.clean_logits,  # type: ignore[arg-type]
                clean_stream=inputs.clean_stream,
                key=jax.random.fold_in(key, i),
                sources=sources,
            )

        with jax.named_scope("pd.ppgd_warmup"):
            warmed, warmed_opt = self.ppgd.warmup(
                objective,
                adversary["sources"],
                adversary["opt_state"],
                self.ppgd.lr(inputs.step, term_hp),
                term_hp,
            )
        sources = warmed
        if source_offset is not None:
            sources = {k: v + source_offset[k] for k, v in warmed.items()}
        return dataclasses.replace(inputs, sources=sources), {
            "sources": warmed,
            "opt_state": warmed_opt,
        }

    def _paired_values(self, inputs: TermInputs, key: jax.Array) -> dict[int, jax.Array]:
        """{term index: value} of the terms :meth:`_all_site_pair` runs as one forward."""
        pair = self._all_site_pair()
        if pair is None or inputs.sources is None:
            return {}
        assert inputs.ci_lower is not None and inputs.clean_logits is not None
        stochastic, adversarial = pair
        with jax.named_scope("pd.term.all_sites_pair"):
            values = paired_all_sites_loss(
                self.forward_spec,
                target=inputs.target,
                tokens=inputs.tokens,
                components=inputs.components,
                ci_lower=inputs.ci_lower,
                clean_logits=inputs.clean_logits,
                clean_stream=inputs.clean_stream,
                key=jax.random.fold_in(key, stochastic),
                sources=inputs.sources,
            )
        return {stochastic: values[0], adversarial: values[1]}

    def _all_site_pair(self) -> tuple[int, int] | None:
        """(index of a term that :meth:`LossTerm.pairs_with_sources` (a one-draw stochastic
        recon), index of the persistent-PGD term) when :func:`pd_train.losses.paired_all_sites_loss`
        runs them as one forward, else None: both present, ``pd.recon.pair_terms`` and no
        ``runtime.remat.recon`` (the pair's forward holds twice one forward's activations)."""
        if not self.pd.recon.pair_terms or self.runtime.remat.recon or self.ppgd_index is None:
            return None
        for i, (config, term) in enumerate(self.terms):
            if i != self.ppgd_index and term.pairs_with_sources(config):
                return i, self.ppgd_index
        return None

    def step(
        self,
        state: TrainState,
        target: Any,
        tokens: jax.Array,
        key: jax.Array,
        hp: Mapping[str, Any] | None = None,
    ) -> tuple[TrainState, dict[str, Any]]:
        """One step, pure and unjitted (compose it, e.g. in ``lax.scan`` for K-step
        programs): the new state and the metrics (see :meth:`train_step`). ``hp``:
        :meth:`hyperparam_arrays` (pass them, as an argument of your jit, to keep the values
        out of the program), or None for the config's values as constants."""
        hp = self.hyperparams() if hp is None else hp
        adversary: dict[str, Any] = {}
        metrics: dict[str, Any] = {}
        if self.ppgd is None:
            (total, aux), grads = jax.value_and_grad(self.loss, has_aux=True)(
                state.params, target, tokens, state.step, key, None, None, hp, state.term_state
            )
        else:
            # One backward: the zero offset's gradient is the warmed sources' gradient, which
            # the final ascent uses unscaled (divided by the term's coeff). XLA folds the zero
            # add away (no zero buffer, no second copy of the sources: measured).
            offset = jax.tree_util.tree_map(jnp.zeros_like, state.adversary["sources"])
            (total, aux), (grads, source_grads) = jax.value_and_grad(
                self.loss, argnums=(0, 6), has_aux=True
            )(
                state.params,
                target,
                tokens,
                state.step,
                key,
                state.adversary,
                offset,
                hp,
                state.term_state,
            )
            adversary, metrics["lr/ppgd"] = self._final_ascent(aux, source_grads, state.step, hp)
        metrics.update({f"loss/{k}": v for k, v in aux["terms"].items()})
        metrics["loss/total"] = total
        params, opt_state = self._apply_updates(state, grads, hp, metrics)
        extras = [name for name in aux if name not in ("terms", "adversary", "l0", "term_state")]
        for name in [*extras, "l0"] if "l0" in aux else extras:
            metrics[name] = aux[name]
        new = TrainState(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            adversary=adversary,
            term_state=aux["term_state"],
        )
        return new, metrics

    #: The step under its former private name (tests and tools trace it).
    _step = step

    def _final_ascent(
        self, aux: Mapping[str, Any], source_grads: Any, step: jax.Array, hp: Mapping[str, Any]
    ) -> tuple[dict[str, Any], jax.Array]:
        """The persistent sources' ascent along the main backward's gradient / coeff; returns
        the new adversary state and the lr."""
        assert self.ppgd is not None and self.ppgd_index is not None
        term_hp = hp["terms"][self.ppgd_index]
        lr = self.ppgd.lr(step, term_hp)
        with jax.named_scope("pd.ppgd_ascent"):
            sources, source_opt = self.ppgd.ascend(
                aux["adversary"]["sources"],
                aux["adversary"]["opt_state"],
                {k: g / term_hp["coeff"] for k, g in source_grads.items()},
                lr,
                term_hp,
            )
        return {"sources": sources, "opt_state": source_opt}, lr

    def _apply_updates(
        self, state: TrainState, grads: Any, hp: Mapping[str, Any], metrics: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Both groups' optimizer updates (their scalars from ``hp["optim"]``); adds
        ``grad_norm/{g}`` and ``lr/{g}`` to ``metrics``."""
        params, opt_state = {}, {}
        configs = {"components": self.pd.components, "ci_fn": self.pd.ci_fn}
        for g in GROUPS:
            tx = make_optimizer(configs[g], self.pd.steps, hp["optim"][g])
            with jax.named_scope(f"pd.optimizer.{g}"):
                updates, opt_state[g] = tx.update(grads[g], state.opt_state[g], state.params[g])
                params[g] = optax.apply_updates(state.params[g], updates)
                metrics[f"grad_norm/{g}"] = optax.tree.norm(grads[g])
            metrics[f"lr/{g}"] = scheduled_lr(hp["optim"][g]["schedule"], state.step)
        params["components"] = tie_components(params["components"], self.ties)
        return params, opt_state

    def _build_train_step(self) -> Any:
        # The jit takes its name from the function: ``jit(train_step)`` in compile logs, HLO
        # dumps (runtime.launch_env.profile.hlo_dump filters on it) and compile.json.
        def train_step(
            state: TrainState, target: Any, tokens: jax.Array, key: jax.Array, hp: Any
        ) -> tuple[TrainState, dict[str, Any]]:
            return self.step(state, target, tokens, key, hp)

        if self.layout is None:
            jit = self._jit(train_step, donate_argnums=0)
        else:
            jit = self._jit(
                train_step,
                donate_argnums=0,
                out_shardings=(self.state_shardings(), self.layout.replicated()),
            )
        return _WithHyperparams(jit, self)

    def train_step(
        self, state: TrainState, target: Any, tokens: jax.Array, key: jax.Array
    ) -> tuple[TrainState, dict[str, Any]]:
        """One step (jitted; ``state`` is donated): returns the new state and the metrics.

        tokens [B, T] int32 (batch-sharded with a mesh); key: :func:`step_key` of the step.
        Metrics: ``loss/{name}`` per loss term (its ``name``, default its ``type``), ``loss/total``, ``grad_norm/{group}``,
        ``lr/{group}``, ``pnorm`` (with importance minimality), ``coeff_multiplier`` (with an
        importance penalty: its coefficient's schedule), ``l0`` ({kind: [n_k]}; see
        :meth:`metrics_to_host` for per-site names).
        """
        return self._train_step(state, target, tokens, key)  # type: ignore[no-any-return]

    def lower_step(self, *, batch_size: int, seq_len: int, target_dtype: Any = jnp.bfloat16) -> Any:
        """Lower the train step on abstract state, target, batch and key (allocates nothing)."""
        if self.ppgd is not None and (batch_size, seq_len) != (self.pd.batch_size, self.seq_len):
            msg = (
                f"lower_step(batch_size={batch_size}, seq_len={seq_len}): the persistent PGD "
                f"sources were built for pd.batch_size {self.pd.batch_size} and seq_len "
                f"{self.seq_len}"
            )
            raise ValueError(msg)
        shape = (batch_size, seq_len)
        tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=self.batch_sharding(shape))
        key = jax.eval_shape(lambda: jax.random.key(0))
        if self.layout is not None:
            key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=self.layout.replicated())
        return self._train_step.lower(
            self.abstract_state(), self.abstract_target(target_dtype), tokens, key
        )

    def bind_step_program(self, compiled: Any) -> Any:
        """A compiled five-argument train step (e.g. one an executable cache deserialized from
        :meth:`compile_step`'s ``.compiled``) as the four-argument program :meth:`compile_step`
        returns; None stays None."""
        if compiled is None or isinstance(compiled, _CompiledStep):
            return compiled
        return _CompiledStep(compiled, self)

    def compile_step(
        self, *, batch_size: int, seq_len: int, target_dtype: Any = jnp.bfloat16
    ) -> Any:
        """AOT: :meth:`lower_step` then ``.compile()``; returns the ``jax.stages.Compiled``
        (``.memory_analysis()`` gives XLA's per-device memory)."""
        return self.lower_step(
            batch_size=batch_size, seq_len=seq_len, target_dtype=target_dtype
        ).compile()

    def metrics_to_host(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Flat ``{name: float}``; ``l0`` becomes ``l0/{site}`` per site (canonical order)."""
        host = jax.device_get(dict(metrics))
        out = {k: float(v) for k, v in host.items() if k != "l0"}
        for site in self.decomposition.sites:
            if "l0" in host:
                out[f"l0/{site.name}"] = float(np.asarray(host["l0"][site.kind])[site.index])
        return out
