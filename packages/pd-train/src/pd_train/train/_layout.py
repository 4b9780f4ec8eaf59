"""Parameters, optimizer state and train state of a :class:`pd_train.train.Trainer`: their
pd-init specs and init jits, abstract shapes, and ZeRO-1 / FSDP / batch shardings."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

import pd_init
import pd_sharding
from pd_train.config.pd import (
    RuntimeConfig,
)
from pd_train.decomposition import Decomposition, site_name
from pd_train.losses import (
    PersistentPGD,
)
from pd_train.models.llama_config import LlamaConfig
from pd_train.targets import Target, as_target
from pd_train.targets.tied import tie_components
from pd_train.train.state import GROUPS, TrainState, group_name


def _with_shardings(tree: Any, shardings: Any) -> Any:
    """``tree``'s ShapeDtypeStructs carrying ``shardings`` (a matching tree), or ``tree`` as it
    is when ``shardings`` is None (no mesh)."""
    if shardings is None:
        return tree
    return jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings
    )


class TrainerState:
    """The state half of the Trainer (mixed into it): everything about the arrays the step
    reads and updates, nothing about the step itself. Reads the attributes the Trainer sets."""

    model: LlamaConfig | Target
    runtime: RuntimeConfig
    decomposition: Decomposition
    layout: Any
    ci_fn: Any
    tx: dict[str, optax.GradientTransformation]
    ppgd: PersistentPGD | None
    term_state_specs: dict[str, Any]
    _init_plan: pd_init.InitPlan | None
    _init_stack_jit: Any
    _opt_init_jit: Any
    ties: Any

    def _run(self, name: str, jit: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _jit(self, fn: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def param_specs(self) -> list[pd_init.ArraySpec]:
        """One pd-init spec per array: ``{site}.V`` and ``{site}.U`` grouped
        ``components.{kind}.V|U`` (one stack per kind in layer order), then the CI function's
        arrays (:meth:`pd_train.ci.CIFunction.arrays`: names like ``{site}.ci_fn.{param}``,
        grouped ``ci_fn.{path}``, e.g. ``ci_fn.{kind}.{param}`` or ``ci_fn.blocks.wq``)."""
        specs = []
        for layout in self.decomposition.kinds:
            for layer in layout.layers:
                site = site_name(layer, layout.kind)
                specs.append(
                    pd_init.ArraySpec(
                        name=f"{site}.V",
                        shape=(layout.d_in, layout.C),
                        init=pd_init.Normal(std=layout.d_in**-0.5),
                        group=f"components.{layout.kind}.V",
                    )
                )
                specs.append(
                    pd_init.ArraySpec(
                        name=f"{site}.U",
                        shape=(layout.C, layout.d_out),
                        init=pd_init.Normal(std=layout.C**-0.5),
                        group=f"components.{layout.kind}.U",
                    )
                )
        for a in self.ci_fn.arrays(self.decomposition):
            specs.append(pd_init.ArraySpec(name=a.name, shape=a.shape, init=a.init, group=a.group))
        return specs

    def _abstract_ci_params(self) -> dict[str, Any]:
        """The CI function's stacks as a nested dict by path: ``[n_members, *shape]`` fp32."""
        counts: dict[tuple[str, ...], int] = {}
        shapes: dict[tuple[str, ...], tuple[int, ...]] = {}
        for a in self.ci_fn.arrays(self.decomposition):
            counts[a.path] = counts.get(a.path, 0) + 1
            shapes[a.path] = a.shape
        tree: dict[str, Any] = {}
        for path, n in counts.items():
            node = tree
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = jax.ShapeDtypeStruct((n, *shapes[path]), jnp.float32)
        return tree

    def abstract_params(self) -> dict[str, Any]:
        """ShapeDtypeStructs of the params (fp32), with shardings when there is a mesh."""
        comps: dict[str, Any] = {}
        for layout in self.decomposition.kinds:
            n = len(layout.layers)
            comps[layout.kind] = {
                "V": jax.ShapeDtypeStruct((n, layout.d_in, layout.C), jnp.float32),
                "U": jax.ShapeDtypeStruct((n, layout.C, layout.d_out), jnp.float32),
            }
        params = {"components": comps, "ci_fn": self._abstract_ci_params()}
        shardings = self.param_shardings(params)
        return _with_shardings(params, shardings)

    def param_shardings(self, params: Any) -> Any:
        """ZeRO-1 shardings of a params tree (arrays or ShapeDtypeStructs), or None."""
        if self.layout is None:
            return None
        lay = self.layout
        comps = {
            kind: {
                "V": lay.v(f["V"].shape, name=f"components.{kind}.V"),
                "U": lay.u(f["U"].shape, name=f"components.{kind}.U"),
            }
            for kind, f in params["components"].items()
        }
        rules = self.ci_fn.sharding_rules(self.decomposition)
        ci = lay.ci_params(params["ci_fn"], name="ci_fn", rules=rules)
        return {"components": comps, "ci_fn": ci}

    def init_plan(self) -> pd_init.InitPlan:
        """The pd-init plan of :meth:`param_specs`, with each stack's ZeRO-1 sharding (built
        once; its jit compiles on first use; ``.stacked_fn.lower(key=...)`` lowers it)."""
        if self._init_plan is None:
            group_shardings = None
            if self.layout is not None:
                group_shardings = {
                    group_name(path): a.sharding
                    for path, a in jax.tree_util.tree_leaves_with_path(self.abstract_params())
                }
            # ``counter``: every random group is one elementwise kernel (no loop; the same
            # values as ``map``, bit for bit), the zero groups a broadcast: the default config's
            # params init compiles in about half the CPU seconds of ``map``'s 60 loops.
            self._init_plan = pd_init.InitPlan(
                self.param_specs(), group_shardings=group_shardings, draw="counter"
            )
        return self._init_plan

    def init_params(self, *, key: jax.Array) -> dict[str, Any]:
        """V/U and CI params from pd-init (keys from names; one stacked output per kind and
        array), placed in their ZeRO-1 shardings. ``runtime.init`` chooses the jit: stacked, or
        per-array then stacked (bit-identical values)."""
        abstract = self.abstract_params()
        plan = self.init_plan()
        if self.runtime.init == "per_array":
            arrays = self._run("init_params", plan.reference_fn, key=key)
            stacks = self._run("init_stack", self._init_stack_fn(), arrays)
        else:
            stacks = self._run("init_params", plan.stacked_fn, key=key)
        # The pd-init group of each leaf is its dotted path: ``components.q_proj.V``,
        # ``ci_fn.q_proj.w0``, ``ci_fn.blocks.wq``.
        params = jax.tree_util.tree_map_with_path(lambda p, _: stacks[group_name(p)], abstract)
        if self.ties:
            params["components"] = tie_components(params["components"], self.ties)
        return params

    def _init_stack_fn(self) -> Any:
        """``runtime.init = per_array``: a jit ``{array name: [*shape]} -> {group: [n, *shape]}``
        stacking the per-array outputs in each group's member order and sharding."""
        if self._init_stack_jit is None:
            groups = self.init_plan().groups

            def init_stack(arrays: dict[str, jax.Array]) -> dict[str, jax.Array]:
                return {g.name: jnp.stack([arrays[m] for m in g.members]) for g in groups}

            kwargs = {}
            if self.layout is not None:
                kwargs["out_shardings"] = {g.name: g.sharding for g in groups}
            self._init_stack_jit = self._jit(init_stack, **kwargs)
        return self._init_stack_jit

    def init_lowerings(self, *, key: Any) -> list[tuple[str, Any]]:
        """``[(jit name, lower)]`` of the init jits of ``runtime.init``, in call order; each
        ``lower()`` lowers on abstract inputs (allocates nothing). ``stacked``: ``init_params``
        (pd-init's stacked jit). ``per_array``: ``init_params`` (pd-init's per-array reference
        jit, one output per array) and ``init_stack``. With a ``persistent_pgd_recon`` term, then
        ``init_sources`` (pd-init's stacked jit of the sources, the one :meth:`init_state` calls)
        and ``init_sources_opt`` (their zeroed optimizer state)."""
        plan = self.init_plan()
        if self.runtime.init != "per_array":
            lowerings = [("init_params", lambda: plan.stacked_fn.lower(key=key))]
        else:
            arrays = {
                name: jax.ShapeDtypeStruct(g.shape, g.dtype, sharding=g.member_shardings[i])
                for g in plan.groups
                for i, name in enumerate(g.members)
            }
            lowerings = [
                ("init_params", lambda: plan.reference_fn.lower(key=key)),
                ("init_stack", lambda: self._init_stack_fn().lower(arrays)),
            ]
        if self.ppgd is not None:
            ppgd = self.ppgd
            shardings = ppgd.shardings()
            kwargs = {} if shardings is None else {"out_shardings": shardings["opt_state"]}
            sources = ppgd.abstract_sources()
            lowerings += [
                ("init_sources", lambda: ppgd.init_plan().stacked_fn.lower(key=key)),
                (
                    "init_sources_opt",
                    lambda: self._jit(ppgd.init_opt_state, **kwargs).lower(sources),
                ),
            ]
        return lowerings

    def _opt_init(self, params: Any) -> dict[str, Any]:
        return {g: self.tx[g].init(params[g]) for g in GROUPS}

    def opt_state_shardings(self, params: Any) -> Any:
        if self.layout is None:
            return None
        shardings = self.param_shardings(params)
        # Per group, so a moment's path (``mu.q_proj.V``) ends with its parameter's path.
        return {
            g: pd_sharding.opt_state_shardings(
                self.tx[g].init, params[g], shardings[g], mesh=self.layout.mesh
            )
            for g in GROUPS
        }

    def state_shardings(self) -> Any:
        """A TrainState of shardings (None without a mesh)."""
        if self.layout is None:
            return None
        abstract = self.abstract_params()
        return TrainState(
            step=self.layout.replicated(),
            params=self.param_shardings(abstract),
            opt_state=self.opt_state_shardings(abstract),
            adversary=self.ppgd.shardings() if self.ppgd is not None else {},
            term_state=jax.tree.map(lambda _: self.layout.replicated(), self.term_state_specs),
        )

    def init_state(self, *, key: jax.Array) -> TrainState:
        """Fresh params (:meth:`init_params`), zeroed optimizer state, step 0; with persistent
        PGD its sources (pd-init, stacked, from the same key: their names differ) and zeroed
        source optimizer state, all in their shardings."""
        params = self.init_params(key=key)
        opt_state = self._run("opt_init", self._opt_init_fn(), params)
        step = jnp.zeros((), jnp.int32)
        if self.layout is not None:
            step = jax.device_put(step, self.layout.replicated())
        adversary: dict[str, Any] = {}
        if self.ppgd is not None:
            # ``PersistentPGD.init_sources``'s stacked jit, through :meth:`_program`.
            stacks = self._run("init_sources", self.ppgd.init_plan().stacked_fn, key=key)
            sources = self.ppgd.sources_from_stacks(stacks)
            shardings = self.ppgd.shardings()
            kwargs = {} if shardings is None else {"out_shardings": shardings["opt_state"]}
            init_opt = self._jit(self.ppgd.init_opt_state, **kwargs)
            adversary = {
                "sources": sources,
                "opt_state": self._run("init_sources_opt", init_opt, sources),
            }
        term_state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), self.term_state_specs)
        if self.layout is not None:
            term_state = jax.device_put(term_state, self.layout.replicated())
        return TrainState(
            step=step,
            params=params,
            opt_state=opt_state,
            adversary=adversary,
            term_state=term_state,
        )

    def _opt_init_fn(self) -> Any:
        if self._opt_init_jit is None:
            shardings = self.opt_state_shardings(self.abstract_params())
            kwargs = {} if shardings is None else {"out_shardings": shardings}
            self._opt_init_jit = self._jit(self._opt_init, **kwargs)
        return self._opt_init_jit

    def lower_opt_init(self) -> Any:
        """Lower the optimizer-state init on abstract params (allocates nothing)."""
        return self._opt_init_fn().lower(self.abstract_params())

    def abstract_state(self) -> TrainState:
        """The TrainState as ShapeDtypeStructs with shardings: lower the step without arrays."""
        params = self.abstract_params()
        opt = jax.eval_shape(self._opt_init, params)
        shardings = self.state_shardings()
        adversary = self.ppgd.abstract_state() if self.ppgd is not None else {}
        state = TrainState(
            step=jax.ShapeDtypeStruct((), jnp.int32),
            params=params,
            opt_state=opt,
            adversary=adversary,
            term_state=dict(self.term_state_specs),
        )
        return _with_shardings(state, shardings)

    def target_shardings(self, target: Any) -> Any:
        """FSDP shardings for a target params tree (arrays or ShapeDtypeStructs), or None."""
        if self.layout is None:
            return None
        from pd_train.targets import kind_of

        kind = kind_of(self.model)
        if kind is None:
            msg = f"FSDP shardings are defined for registered target kinds only, not {self.model!r}"
            raise NotImplementedError(msg)
        return kind.shardings(self.model, self.layout, target)

    def abstract_target(self, dtype: Any = jnp.bfloat16) -> Any:
        """The target's ShapeDtypeStructs (with shardings when there is a mesh)."""
        target = jax.eval_shape(
            functools.partial(as_target(self.model).init_params, dtype=dtype),
            key=jax.random.key(0),
        )
        shardings = self.target_shardings(target)
        return _with_shardings(target, shardings)

    def gather_head(self, target: Any) -> Any:
        """The target with its LM head gathered once (replicated), for every forward of a jit to
        share: left FSDP-sharded, each unembed gathered its own copy, and XLA kept the copies of
        the clean forward, the PGD ascents, the recon scans and their backward live at once
        (six 2 GiB copies per device at Llama-3-8B on 64 devices, docs/findings.md section 8).
        Values are unchanged; without a mesh, or with tied embeddings, the target as given."""
        if self.layout is None or "lm_head" not in target:
            return target
        head = jax.lax.with_sharding_constraint(target["lm_head"], self.layout.replicated())
        return {**target, "lm_head": head}

    def batch_sharding(self, shape: tuple[int, ...]) -> Any:
        return None if self.layout is None else self.layout.batch(shape, name="batch")
