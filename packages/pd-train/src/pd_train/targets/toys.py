"""Decomposing toy targets whose mechanism is known: the built-in toys, their runner and their
one-hot CI.

:data:`TOYS` holds the SPD paper's toys (``tms_5_2``, ``tms_40_10``, ``tms_5_2_id``,
``tms_40_10_id``, ``resid_mlp1``, ``resid_mlp2``, ``resid_mlp3``), each with the paper's
decomposition recipe, and a ``*_fast`` variant of each (a shorter recipe for CI): target,
pretraining (the paper's appendix), recipe, and which matrices have a known mechanism (one
component per feature: ``identity``; one dense block of k components: ``dense``), judged by the
reference's metrics (:mod:`pd_train.analysis.ground_truth`).

:func:`decompose` trains a decomposition with sparse-feature batches drawn on device from the
run key, through the same :class:`~pd_train.train.Trainer` step as a Llama target, ``K =
steps_per_call`` steps per dispatched program (a ``lax.scan`` over K steps, each drawing its
batch from the step number; at most two calls in flight). On XLA:CPU a call costs little beyond
its steps once malloc keeps the programs' temporaries (:func:`keep_freed_memory`); where a
dispatch costs more than a toy step (an accelerator) the K-step programs remove it. Logging,
eval and checkpoints keep their cadence (each a multiple of K); a run resumed from a
checkpoint at the same K is bit-exact. ``devices`` N > 1 runs the steps data-parallel over N
devices (:func:`toy_mesh`; on the CPU N simulated host devices, one core each): the same steps
up to float rounding.

:func:`one_hot_ci`: per decomposed matrix, ci_lower of every component on each one-hot
feature input at 0.75 [n_features, C] (the reference's ``input_magnitude``);
:func:`one_hot_output_norms`: the target's own output norm there [n_features], which
:func:`toy_identity_failures` ranks the features without a component of their own by
(:func:`one_hot_site_outputs`: the outputs themselves, at either sign, which it also reads
for the part of a site's output that is even in the feature's value).
pd's earlier, lenient metrics are kept under their own names: :func:`assignment_l1_distance`,
:func:`features_separated`, :func:`separates_every_feature` (they are *not* the reference's
IdentityCIError).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from pd_train._forward import CleanRunner
from pd_train._row_shards import ROW_SHARD_AXIS
from pd_train.analysis.ground_truth import (
    TOLERANCE,
    component_neuron_contributions,
    ground_truth_table,
    identity_failures_by_site,
    mmcs_ml2r,
    neuron_contributions,
    plot_neuron_contributions,
    plot_permuted_ci,
    plot_uv,
    sign_even_part,
)
from pd_train.config.io import ConfigError
from pd_train.config.pd import (
    MLPCI,
    ChunkwiseSubsetRecon,
    DecompositionTarget,
    Faithfulness,
    FaithfulnessWarmup,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    ReconConfig,
    SharedMLPCI,
    StochasticRecon,
)
from pd_train.decomposition import GLOBAL_KINDS, site_weights
from pd_train.run.hooks import Cadence, Hook, StepInfo
from pd_train.run.loop import run_loop
from pd_train.squash import lower_leaky_hard
from pd_train.targets.resid_mlp import (
    ResidMLPConfig,
    ResidMLPTarget,
    pretrain_resid_mlp,
    resid_mlp_features,
)
from pd_train.targets.tms import DataMode, TMSConfig, TMSTarget, pretrain, sparse_features
from pd_train.train import Trainer, TrainState, step_key

__all__ = [
    "ALIVE_WINDOW",
    "EVEN_PART_SHOWN",
    "TOYS",
    "TOY_DATA_AXIS",
    "CallTimes",
    "KStepPrograms",
    "Pretraining",
    "ToyConfig",
    "alive_window",
    "assignment_l1_distance",
    "decompose",
    "features_separated",
    "flat_weights",
    "ground_truth_metrics",
    "inputs_ci",
    "keep_freed_memory",
    "load_weights",
    "make_target",
    "one_hot_ci",
    "one_hot_output_norms",
    "one_hot_site_outputs",
    "plot_tms_directions",
    "pretrain_toy",
    "pure_step",
    "run_toy",
    "save_weights",
    "separates_every_feature",
    "toy_compiler_options",
    "toy_config",
    "toy_data",
    "toy_identity_failures",
    "toy_mesh",
    "toy_trainer",
    "toy_training_item",
    "toy_weights",
    "toy_weights_path",
]


def one_hot_ci(
    trainer: Trainer,
    params: Any,
    target_params: Any,
    n_features: int,
    *,
    magnitude: float = 0.75,
) -> dict[str, np.ndarray]:
    """``{site name: ci_lower [n_features, C]}`` on the inputs magnitude·e_0 .. e_{F-1}.

    ``magnitude`` < 1 (the reference's 0.75): at the largest feature value a TMS target's
    interference from a neighbouring feature can survive the output ReLU, and then the
    neighbour's component is truly needed on that input."""
    return inputs_ci(trainer, params, target_params, _one_hot_inputs(n_features, magnitude))


def _one_hot_inputs(n_features: int, magnitude: float = 0.75) -> jax.Array:
    """[F, 1, F]: the inputs magnitude·e_0 .. e_{F-1}."""
    return magnitude * jnp.eye(n_features, dtype=jnp.float32)[:, None, :]


def one_hot_site_outputs(
    trainer: Trainer, target_params: Any, n_features: int, *, magnitude: float = 0.75
) -> dict[str, np.ndarray]:
    """``{site name: [n_features, d_out]}``: each decomposed matrix's output in the target
    itself (``x @ W``, x the site's input) on the inputs magnitude·e_0 .. e_{F-1} (a negative
    magnitude gives the features' negative values)."""
    x = _one_hot_inputs(n_features, magnitude)
    run = _SITE_OUTPUTS.get(trainer)
    if run is None:  # the program holds what it reads of the trainer, not the trainer
        spec, decomposition = trainer.forward_spec, trainer.decomposition

        def site_outputs(target_params: Any, x: jax.Array) -> dict[str, jax.Array]:
            weights = site_weights(spec.target, target_params, decomposition)
            site_xs = {
                lay.kind: jnp.asarray(weights[lay.kind])[np.asarray(lay.layers)]
                if lay.kind not in GLOBAL_KINDS
                else jnp.asarray(weights[lay.kind])
                for lay in decomposition.kinds
            }

            def site_fn(kind: str, h: jax.Array, w: jax.Array) -> jax.Array:
                del kind
                return h.astype(jnp.float32) @ w.astype(jnp.float32)

            _, outs = CleanRunner(spec, target_params, x).run(site_fn, site_xs)
            return {site.name: outs[site.kind][site.index][:, 0] for site in decomposition.sites}

        options = {**toy_compiler_options(), **trainer.compiler_options}
        run = _SITE_OUTPUTS[trainer] = jax.jit(site_outputs, compiler_options=options or None)
    return {name: np.asarray(out, dtype=np.float64) for name, out in run(target_params, x).items()}


def one_hot_output_norms(
    trainer: Trainer, target_params: Any, n_features: int, *, magnitude: float = 0.75
) -> dict[str, np.ndarray]:
    """``{site name: [n_features]}``: the norm of each decomposed matrix's output in the target
    itself (``‖x @ W‖``, x the site's input) on the inputs magnitude·e_0 .. e_{F-1}, the ones
    :func:`one_hot_ci` reads: how much of each feature a site computes."""
    outs = one_hot_site_outputs(trainer, target_params, n_features, magnitude=magnitude)
    return {site: np.linalg.norm(out, axis=1) for site, out in outs.items()}


def inputs_ci(
    trainer: Trainer, params: Any, target_params: Any, x: jax.Array
) -> dict[str, np.ndarray]:
    """``{site name: ci_lower [N, C]}`` on the inputs x [N, 1, n_features].

    One program compiled with :func:`toy_compiler_options` (under the trainer's own options), as
    the toy's steps are: with XLA:CPU's YNN fusions (its default) jax 0.10.2 computed wrong CI
    for every component past the 256th of a site whose input is narrow (resid_mlp3's
    ``mlp_out``, d_in 17, at C 500 on the 102 one-hot inputs), so the toy's metrics counted
    stray entries the decomposition does not have (docs/toys.md, "A wrong CI on the CPU past
    component 256")."""
    run = _INPUTS_CI.get(trainer)
    if run is None:  # the program holds what it reads of the trainer, not the trainer
        dtype, spec, ci_fn = trainer.compute_dtype, trainer.forward_spec, trainer.ci_fn
        sites = trainer.decomposition.sites

        def ci_lower(params: Any, target_params: Any, x: jax.Array) -> dict[str, jax.Array]:
            comps = jax.tree_util.tree_map(lambda a: a.astype(dtype), params["components"])
            _, pre = ci_fn.causal_importance(
                params["ci_fn"], comps, CleanRunner(spec, target_params, x)
            )
            return {
                site.name: lower_leaky_hard(pre[site.kind])[site.index][:, 0, :]  # [N, C]
                for site in sites
            }

        options = {**toy_compiler_options(), **trainer.compiler_options}
        run = _INPUTS_CI[trainer] = jax.jit(ci_lower, compiler_options=options or None)
    out = run({k: params[k] for k in ("components", "ci_fn")}, target_params, x)
    return {name: np.asarray(ci, dtype=np.float64) for name, ci in out.items()}


#: :func:`toy_identity_failures` describes a site's even part (:func:`sign_even_part`) from this
#: median ‖even‖ / ‖odd‖ on (resid_mlp2's second layer and resid_mlp3's second and third:
#: 0.25-0.30; every first layer and TMS: 0).
EVEN_PART_SHOWN = 0.05

#: :func:`inputs_ci`'s program per trainer (compiled once per input shape, as a jit is).
_INPUTS_CI: weakref.WeakKeyDictionary[Trainer, Any] = weakref.WeakKeyDictionary()
#: :func:`one_hot_site_outputs`'s program per trainer: one compile for both signs (run eagerly,
#: its layer scan compiled anew at each call).
_SITE_OUTPUTS: weakref.WeakKeyDictionary[Trainer, Any] = weakref.WeakKeyDictionary()


# ---------------------------------------------------------------- pd's lenient metrics


def assignment_l1_distance(ci: np.ndarray) -> float:
    """pd's lenient measure (not the reference's IdentityCIError): mean over features of the L1
    distance between a feature's CI row [C] and the one-hot row of its component, under the
    Hungarian feature→component assignment maximizing the assigned CI; ci [F, C]."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(-ci)
    ideal = np.zeros_like(ci)
    ideal[rows, cols] = 1.0
    return float(np.abs(ci - ideal).sum() / ci.shape[0])


def features_separated(ci: np.ndarray, *, on: float = 0.5, off: float = 0.1) -> np.ndarray:
    """[F] bool, pd's lenient per-feature test: feature i activates exactly one component
    above ``on`` and no other above ``off``, and no other feature's top component is the same
    one; ci [F, C]. (The reference asks ≥ 0.9 on: :func:`identity_ci_error`.)"""
    top = ci.argmax(axis=1)
    rest = ci.copy()
    rest[np.arange(ci.shape[0]), top] = 0.0
    shared = np.bincount(top, minlength=ci.shape[1])[top] > 1
    return (ci.max(axis=1) > on) & (rest <= off).all(axis=1) & ~shared


def separates_every_feature(ci: np.ndarray, *, on: float = 0.5, off: float = 0.1) -> bool:
    """:func:`features_separated` holds for every feature."""
    return bool(features_separated(ci, on=on, off=off).all())


# ---------------------------------------------------------------- the toy runner


#: The XLA flag of XLA:CPU's YNNPACK fusions. As YNN fusions the CI MLPs' multiply-reduce
#: fusions over [B, T, C, d_gate] were most of a TMS step's cost (93 ms CPU a step at batch 4096
#: with them, 45 ms without; docs/toys.md), so the toy programs compile without them.
YNN_FUSIONS_FLAG = "xla_cpu_experimental_ynn_fusion_type"


def toy_compiler_options() -> dict[str, str]:
    """XLA options of a toy run's programs (the K-step programs and the trainer's jits, e.g.
    the faithfulness warmup): ``{YNN_FUSIONS_FLAG: ""}`` (YNN fusions off), or ``{}`` where the
    user chose: ``XLA_FLAGS`` names the flag (``--xla_cpu_experimental_ynn_fusion_type=...``),
    or the backend is not the CPU. A jit's own option, so unlike ``XLA_FLAGS`` it needs no
    setting before JAX starts and touches no other program of the process."""
    if YNN_FUSIONS_FLAG in os.environ.get("XLA_FLAGS", "") or jax.default_backend() != "cpu":
        return {}
    return {YNN_FUSIONS_FLAG: ""}


#: glibc's mallopt parameters (malloc.h): ``M_TRIM_THRESHOLD``, ``M_MMAP_THRESHOLD``.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Blocks up to this size come from malloc's heap (default: above 128 KiB-32 MiB, each its own
#: mmap), and freed memory up to it stays in the process.
KEEP_FREED_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Have glibc's malloc serve blocks up to :data:`KEEP_FREED_BYTES` from its heap and keep
    what is freed (``mallopt(M_MMAP_THRESHOLD)``, ``mallopt(M_TRIM_THRESHOLD)``), for the rest
    of the process. XLA:CPU allocates a program's temporaries on every call and frees them
    after; by default each large one is a fresh ``mmap``, whose pages fault in again on every
    call: one ``tms_5_2`` step per call at batch 4096 (~250 MB of temporaries) paid ~9500 page
    faults, 14 ms of system and ~5 ms of user CPU a call on top of a ~35 ms step
    (docs/toys.md). The process keeps its peak memory instead of returning it to the OS. Called
    by ``pd-train run`` of a toy and ``benchmarks/toys.py``; returns whether it applied (False
    off glibc)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # The mmap threshold first: setting it also stops glibc's own adjustment of both.
    return bool(
        mallopt(_M_MMAP_THRESHOLD, KEEP_FREED_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, 2 * KEEP_FREED_BYTES - 1)
    )


def toy_trainer(target: Any, pd: PDConfig) -> Trainer:
    """The :class:`~pd_train.train.Trainer` of a toy run: its jits take
    :func:`toy_compiler_options`."""
    return Trainer(target, pd, compiler_options=toy_compiler_options())


def pure_step(trainer: Trainer) -> Callable[..., tuple[TrainState, dict[str, Any]]]:
    """The Trainer's pure (unjitted) step ``(state, target, batch, key) -> (state, metrics)``
    that the K-step programs compose."""
    return trainer.step


@attrs.frozen(kw_only=True)
class KStepPrograms:
    """The K-step programs of one decomposition (cached per K): :func:`decompose` runs them.

    ``mesh``: None (one device's program) or a 1-D mesh over the axis ``data``
    (:func:`toy_mesh`): the batch split over its devices (the batch sharded, the step's
    programs partitioned by XLA, the CI MLPs' blocks per device (:func:`pd_train._row_shards.
    row_shard_axis`), the gradients summed over the devices); state and target replicated.
    The same steps up to float rounding (the batch sums' order)."""

    trainer: Trainer
    draw: Callable[..., jax.Array]
    data_key: jax.Array
    train_key: jax.Array
    batch_size: int
    n_features: int
    feature_probability: float
    mesh: Any = None
    cache: dict[int, Any] = attrs.field(factory=dict)

    def program(self, k: int) -> Any:
        """jit ``(state, target, values) -> (state, metrics stacked [k, ...])``: k steps, step
        i drawing batch ``fold_in(data_key, i)`` and key ``step_key(train_key, i)`` (i =
        state.step); ``values``: :meth:`values`, the keys and the scalar hyperparameters as
        data (a config that differs only in them, or in the seed, runs the same program: from
        the compile cache); compiled with :func:`toy_compiler_options` under the trainer's own
        options."""
        if k not in self.cache:
            step = pure_step(self.trainer)

            def run(state: TrainState, target: Any, values: Any) -> tuple[TrainState, Any]:
                def body(state: TrainState, _: None) -> tuple[TrainState, Any]:
                    i = state.step
                    x = self.draw(
                        key=jax.random.fold_in(values["data_key"], i),
                        batch_size=self.batch_size,
                        n_features=self.n_features,
                        feature_probability=self.feature_probability,
                    )
                    if self.mesh is not None:
                        x = jax.lax.with_sharding_constraint(x, self._batch_sharding())
                    key = step_key(values["train_key"], i)
                    return step(state, target, x, key, values["hp"])

                return jax.lax.scan(body, state, None, length=k)

            options = {**toy_compiler_options(), **self.trainer.compiler_options}
            if self.mesh is None:
                self.cache[k] = jax.jit(run, donate_argnums=0, compiler_options=options or None)
            else:
                rep = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
                jitted = jax.jit(
                    run,
                    donate_argnums=0,
                    compiler_options=options or None,
                    in_shardings=(rep, rep, rep),
                    out_shardings=rep,
                )

                def call(state: TrainState, target: Any, values: Any, jitted: Any = jitted) -> Any:
                    with jax.set_mesh(self.mesh):
                        return jitted(state, target, values)

                self.cache[k] = call
        return self.cache[k]

    def values(self) -> dict[str, Any]:
        """What :meth:`program` takes as data, placed as the programs take it: the two keys and
        the trainer's scalar hyperparameters (``hp``:
        :meth:`~pd_train.train.Trainer.hyperparam_arrays`)."""
        values = {"data_key": self.data_key, "train_key": self.train_key}
        return self.place({**values, "hp": self.trainer.hyperparam_arrays()})

    def _batch_sharding(self) -> Any:
        return jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(TOY_DATA_AXIS))

    def place(self, tree: Any) -> Any:
        """``tree`` replicated over the mesh (as it is without one)."""
        if self.mesh is None:
            return tree
        rep = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
        return jax.device_put(tree, rep)


#: The mesh axis of a data-parallel toy run (pd-sharding's data axis, the one
#: :func:`pd_train._row_shards.row_shard_axis` splits the CI MLPs' rows and the draws over).
TOY_DATA_AXIS = ROW_SHARD_AXIS


def toy_mesh(devices: int, *, batch_size: int, field: str = "devices") -> Any:
    """None for ``devices`` 1 (one device's program), else a 1-D mesh ``(data,)`` over the
    process's first ``devices`` devices (axis type Auto: XLA partitions the step). ConfigError
    naming ``field`` where ``devices`` is not an int >= 1, exceeds the process's devices (on the
    CPU: ``--simulate-devices N`` / ``XLA_FLAGS=--xla_force_host_platform_device_count=N``, set
    before JAX starts) or does not divide ``batch_size``."""
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ConfigError([(field, f"got {devices!r}; must be an int >= 1")])
    if devices == 1:
        return None
    have = jax.device_count()
    if devices > have:
        msg = (
            f"got {devices}, but the process has {have} device(s); on the CPU start it with "
            f"--simulate-devices {devices} (XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{devices}, set before JAX starts)"
        )
        raise ConfigError([(field, msg)])
    if batch_size % devices:
        msg = f"got {devices}; must divide pd.batch_size ({batch_size})"
        raise ConfigError([(field, msg)])
    from jax.sharding import AxisType, Mesh

    return Mesh(np.array(jax.devices()[:devices]), (TOY_DATA_AXIS,), axis_types=(AxisType.Auto,))


def _check_cadence(k: int, cadences: Mapping[str, int]) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError([("steps_per_call", f"got {k!r}; must be an int >= 1")])
    problems = [
        (name, f"got {every}; must be a multiple of steps_per_call ({k})")
        for name, every in cadences.items()
        if every and every % k
    ]
    if problems:
        raise ConfigError(problems)


def toy_training_item(state: TrainState) -> dict[str, Any]:
    item: dict[str, Any] = {"step": state.step, "opt_state": state.opt_state}
    if state.adversary:
        item["adversary"] = state.adversary
    if state.term_state:  # a smooth-L0 term's frequency EMA
        item["term_state"] = state.term_state
    return item


def decompose(
    target: Any,
    target_params: Any,
    pd: PDConfig,
    *,
    seed: int,
    feature_probability: float,
    mode: DataMode = "at_least_zero_active",
    data: Callable[..., jax.Array] | None = None,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    trainer: Trainer | None = None,
    max_steps: int | None = None,
    steps_per_call: int = 1,
    log_every: int = 1,
    eval_every: int = 0,
    on_eval: Callable[[int, TrainState], None] | None = None,
    checkpoints: Any = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    hooks: Sequence[Hook] = (),
    on_warmup: Callable[[int, float], None] | None = None,
    devices: int = 1,
) -> tuple[Trainer, TrainState]:
    """``pd.steps`` train steps on batches [pd.batch_size, 1, n_features] of sparse features,
    ``steps_per_call`` (K) steps per dispatched program.

    The run key is ``key(seed)``; params start from ``fold_in(run key, 0)``, batch ``i`` is drawn
    from ``fold_in(fold_in(run key, 1), i)`` and step ``i`` uses :func:`step_key` of
    ``fold_in(run key, 2)``. ``on_step(i, metrics)`` sees the (host) metrics of the steps i
    with ``i % log_every == 0`` and of the last step; ``on_eval(n, state)`` the state after n
    steps for n a multiple of ``eval_every`` (0: never). ``checkpoints``
    (:class:`~pd_train.run.checkpoints.Checkpoints`): saved every ``checkpoint_every`` steps and
    at the end; ``resume``: continue from its latest step (same seed, same K: bit-exact).
    ``log_every``, ``eval_every`` and ``checkpoint_every`` must be multiples of K (ConfigError
    naming the field); a last partial call of < K steps runs one step per call.
    ``trainer``: reuse one built for the same target and ``pd``. ``data(key=, batch_size=,
    n_features=, feature_probability=)``: the batch source (default
    :func:`~pd_train.targets.tms.sparse_features` with ``mode``). ``max_steps``: stop after that
    many steps (the schedule stays that of ``pd.steps``). ``pd.faithfulness_warmup`` steps (if
    any) run before step 0 (not again on resume), ``on_warmup(i, faithfulness)`` after each.
    The steps run in :func:`pd_train.run.run_loop` (K per call), the callbacks and checkpoints
    as its hooks, then ``hooks`` (e.g. a run's stop and progress hooks). ``devices``: the
    K-step programs data-parallel over that many devices (:func:`toy_mesh`; 1: one device's
    program): the same steps up to float rounding; the returned state is on the first device.
    """
    k = steps_per_call
    _check_cadence(
        k,
        {"log_every": log_every, "eval_every": eval_every, "checkpoint_every": checkpoint_every},
    )
    if trainer is None:
        trainer = toy_trainer(target, pd)
    elif trainer.pd != pd or trainer.model != target:
        msg = "decompose: the given trainer was built for another target or pd config"
        raise ValueError(msg)
    run_key = jax.random.key(seed)
    state = trainer.init_state(key=jax.random.fold_in(run_key, 0))
    programs = KStepPrograms(
        trainer=trainer,
        draw=data or functools.partial(sparse_features, mode=mode),
        data_key=jax.random.fold_in(run_key, 1),
        train_key=jax.random.fold_in(run_key, 2),
        batch_size=pd.batch_size,
        n_features=target.config.n_features,
        feature_probability=feature_probability,
        mesh=toy_mesh(devices, batch_size=pd.batch_size),
    )
    target_params = jax.tree_util.tree_map(jnp.asarray, target_params)
    if resume and checkpoints is not None and checkpoints.latest_step() is not None:
        from pd_train.run.checkpoints import abstract_like

        params, training, _ = checkpoints.restore(
            decomposition=abstract_like(state.params),
            training=abstract_like(toy_training_item(state)),
        )
        state = TrainState(
            step=training["step"],
            params=params,
            opt_state=training["opt_state"],
            adversary=training.get("adversary", {}),
            term_state=training.get("term_state", {}),
        )
    elif pd.faithfulness_warmup.steps:
        state, _ = trainer.faithfulness_warmup(state, target_params, on_step=on_warmup)
    n_steps = pd.steps if max_steps is None else min(max_steps, pd.steps)
    state, placed_target = programs.place((state, target_params))
    values = programs.values()

    def step_fn(state: TrainState, step: int, n: int = 1) -> tuple[TrainState, Any]:
        del step  # the programs read it from the state
        return programs.program(n)(state, placed_target, values)  # type: ignore[no-any-return]

    loop_hooks: list[Hook] = [_InFlight()]
    if on_step is not None:
        loop_hooks.append(_OnStep(on_step, log_every=log_every, n_steps=n_steps))
    if on_eval is not None and eval_every:
        loop_hooks.append(_OnEval(on_eval, every=eval_every))
    if checkpoints is not None:
        loop_hooks.append(_Save(checkpoints, every=checkpoint_every))
    loop_hooks.extend(hooks)
    info = run_loop(
        step_fn, loop_hooks, state=state, start=int(state.step), end=n_steps, steps_per_call=k
    )
    if programs.mesh is None:
        return trainer, info.state
    return trainer, jax.device_put(info.state, jax.devices()[0])


class _InFlight(Hook):
    """At most two calls in flight: after each call, waits until the call before it has finished
    (its metrics are ready). The device still never waits for the host (the next call is
    queued while one runs), but the loop and its hooks stay within a call of the device:
    without it the host queued every call up to the next loss record (log_every / K calls,
    2000 steps of the paper's TMS recipe) before its first wait, so a SIGTERM was acted on only
    that many steps of compute later (minutes on a loaded CPU), and the progress line's rate
    was the host's."""

    def __init__(self) -> None:
        self.previous: Any = None

    def __call__(self, info: StepInfo) -> None:
        if self.previous is not None:
            jax.block_until_ready(self.previous)
        self.previous = info.metrics


class _OnStep(Hook):
    """``on_step(j, metrics of step j)`` for the steps j of each call with ``j % log_every == 0``
    and the last step (the call's metrics are stacked [n, ...])."""

    def __init__(
        self, on_step: Callable[[int, dict[str, Any]], None], *, log_every: int, n_steps: int
    ) -> None:
        self.on_step = on_step
        self.log_every = log_every
        self.n_steps = n_steps

    def __call__(self, info: StepInfo) -> None:
        first = info.step - info.ran
        logged = [
            j for j in range(first, info.step) if j % self.log_every == 0 or j == self.n_steps - 1
        ]
        if logged:
            host = jax.device_get(info.metrics)
            for j in logged:
                self.on_step(j, jax.tree_util.tree_map(lambda a, at=j - first: a[at], host))


class _OnEval(Hook):
    """``on_eval(n, state)`` after every ``every`` steps."""

    def __init__(self, on_eval: Callable[[int, TrainState], None], *, every: int) -> None:
        self.on_eval = on_eval
        self.cadence = Cadence(every)

    def __call__(self, info: StepInfo) -> None:
        self.on_eval(info.step, info.state)


class CallTimes(Hook):
    """A run's step rate, its compile left out: at every ``every``-th step and after the last
    (``every`` a multiple of K), waits for the metrics of the call just made (the program that
    ran those steps has finished), then notes ``(steps finished, wall s, process CPU s)`` in
    :attr:`stamps`. Only at its cadence, so one step per call keeps its asynchronous dispatch
    between stamps."""

    def __init__(self, every: int) -> None:
        self.cadence = Cadence(every, last=True)
        self.stamps: list[tuple[int, float, float]] = []

    def __call__(self, info: StepInfo) -> None:
        jax.block_until_ready(info.metrics)
        self.stamps.append((info.step, time.perf_counter(), time.process_time()))

    def rate(self) -> tuple[int, float, float]:
        """(steps, steps/s, steps per CPU s) from the first stamp to the last: the steps finished
        between them (the first stamp's call, which compiles, left out) over their time."""
        if len(self.stamps) < 2:
            msg = f"CallTimes.rate needs two stamps, has {len(self.stamps)}: run more steps"
            raise ValueError(msg)
        (s0, t0, c0), (s1, t1, c1) = self.stamps[0], self.stamps[-1]
        return s1 - s0, (s1 - s0) / (t1 - t0), (s1 - s0) / max(c1 - c0, 1e-9)


class _FirstStep(Hook):
    """Notes the attempt's first step (a resumed run starts past 0)."""

    def __init__(self) -> None:
        self.step: int | None = None

    def before(self, step: int) -> None:
        if self.step is None:
            self.step = step


class _Save(Hook):
    """A checkpoint every ``every`` steps (0: none) and after the last step run (also a
    stopped run's)."""

    def __init__(self, checkpoints: Any, *, every: int) -> None:
        self.checkpoints = checkpoints
        self.cadence = Cadence(every)
        self.saved: int | None = None

    def __call__(self, info: StepInfo) -> None:
        self.checkpoints.save(
            info.step, decomposition=info.state.params, training=toy_training_item(info.state)
        )
        self.saved = info.step

    def close(self, info: StepInfo) -> None:
        if self.saved != info.step and info.step > info.start:
            self(info)


def plot_tms_directions(
    weights: Any, components: Any, ci_by_site: dict[str, np.ndarray], path: Path
) -> Path:
    """For a TMS target with 2 hidden dims: its feature directions (rows of W1) next to what each
    alive ``linear1`` component writes for its top feature (V[i, c]·U[c]), one PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w1 = np.asarray(weights["layers"]["linear1"][0])
    if w1.shape[1] != 2:
        msg = f"feature directions are plotted for 2 hidden dims, not {w1.shape[1]}"
        raise ValueError(msg)
    v = np.asarray(components["linear1"]["V"][0])  # [F, C]
    u = np.asarray(components["linear1"]["U"][0])  # [C, 2]
    ci = ci_by_site["layers.0.linear1"]
    fig = Figure(figsize=(8, 4), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    lim = 1.2 * float(np.abs(w1).max())
    for i, (x, y) in enumerate(w1):
        left.arrow(0, 0, x, y, color=f"C{i % 10}", width=0.01 * lim, length_includes_head=True)
        left.annotate(f"f{i}", (x, y))
    left.set_title("target: feature directions (W1 rows)")
    for c in np.flatnonzero(ci.max(axis=0) > 0.1):
        i = int(ci[:, c].argmax())
        x, y = v[i, c] * u[c]
        right.arrow(0, 0, x, y, color=f"C{i % 10}", width=0.01 * lim, length_includes_head=True)
        right.annotate(f"c{c} (f{i})", (x, y))
    right.set_title("alive linear1 components: V[f, c]·U[c]")
    for ax in (left, right):
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


# ---------------------------------------------------------------- built-in toy configs


@attrs.frozen(kw_only=True)
class Pretraining:
    """How a toy target was trained (the paper's appendix). TMS: AdamW (wd 0.01) at a constant
    lr; residual MLPs: AdamW (wd 0.01), cosine lr. ``zero_bias``: a TMS output bias starting
    at 0 (the reference's 40-10 models); ``fixed_identity_hidden``: the +ID models' hidden
    layer, the identity and not trained."""

    seed: int = 0
    steps: int
    batch_size: int
    lr: float
    weight_decay: float = 0.01
    schedule: Literal["constant", "cosine"] = "constant"
    zero_bias: bool = False
    fixed_identity_hidden: bool = False


@attrs.frozen(kw_only=True)
class ToyConfig:
    """A built-in toy: the target, how it was pretrained, its decomposition recipe and what
    its known mechanism is.

    ``weights``: the name of its shipped weights (a ``*_fast`` toy shares its toy's).
    ``identity``: fnmatch patterns of the sites with one component per feature (judged by
    IdentityCIError); ``dense``: ``{pattern: k}``, the sites that are one dense block of k
    components (DenseCIError; a residual MLP's ``mlp_out``: its neurons). ``steps_per_call``:
    K of :func:`decompose`. ``paper``: the paper's Table 1 values (``mmcs``, ``ml2r``) where it
    gives them; ``deviation``: how the recipe departs from the paper's settings ("" for none)."""

    name: str
    weights: str
    target: TMSConfig | ResidMLPConfig
    feature_probability: float
    mode: DataMode = "at_least_zero_active"
    pretraining: Pretraining
    pd: PDConfig
    identity: tuple[str, ...]
    dense: dict[str, int] = attrs.field(factory=dict)
    steps_per_call: int = 1
    paper: dict[str, float] = attrs.field(factory=dict)
    deviation: str = ""

    @property
    def target_type(self) -> str:
        """``tms`` or ``resid_mlp``."""
        return "tms" if isinstance(self.target, TMSConfig) else "resid_mlp"


def _recipe(
    *,
    steps: int,
    batch_size: int,
    C: int,
    lr: float,
    final_lr_frac: float,
    im_coeff: float,
    pnorm: float,
    d_gate: int = 16,
    delta_component: bool,
    warmup_steps: int = 200,
    pattern: str = "layers.*",
) -> PDConfig:
    """A paper-style recipe: Adam (lr, cosine to ``final_lr_frac``·lr; 1.0: constant) for the
    components and the CI MLPs (one per subcomponent, ``d_gate`` GELU units, over blocks of
    :data:`TOY_CI_BLOCK` rows), faithfulness at 1 (the paper's), importance minimality at
    p = ``pnorm``, stochastic and layerwise (one site per chunk) recon at 1
    (:data:`TOY_RECON`), the delta component on or off (``delta_component``; the paper's
    algorithm has none), and the reference's 200-step faithfulness warmup at lr 0.01 with
    weight decay 0.1."""
    opt = OptimizerConfig(lr=lr, final_val_frac=final_lr_frac)
    terms = (
        Faithfulness(coeff=1.0),
        ImportanceMinimality(coeff=im_coeff, pnorm_start=pnorm, pnorm_end=pnorm),
        StochasticRecon(coeff=1.0),
        ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=1),
    )
    return PDConfig(
        steps=steps,
        batch_size=batch_size,
        decomposition_targets=(DecompositionTarget(module_pattern=pattern, C=C),),
        ci=MLPCI(hidden_dims=(d_gate,), batch_block=TOY_CI_BLOCK),
        recon=TOY_RECON,
        loss_metrics=terms,
        components=opt,
        ci_fn=opt,
        faithfulness_warmup=FaithfulnessWarmup(steps=warmup_steps, lr=1e-2, weight_decay=0.1),
        use_delta_component=delta_component,
    )


#: The TMS 5-2 target's pretraining seed: with the paper's recipe (AdamW, wd 0.01, constant
#: 5e-3) seeds 0-12 leave 1 to 4 of the 5 features unrepresented (norm < 0.01); 13 is the
#: first whose target represents all five (norms 1.12-1.14).
TMS_5_2_SEED = 13

#: The toy recipes' recon chunk loop as a Python loop (the same values as one ``lax.scan``):
#: the layerwise term's two one-site chunks unrolled cost 34 ms CPU a ``tms_5_2`` step at batch
#: 4096 against 45 ms as a scan (its ``while`` and a ``cond`` per site), and the K-step program
#: compiles in about half the time (docs/toys.md). Their uniform draws (the masks' sources, the
#: routing, the data) ``blocked``: the same bits as ``jax.random.uniform``, ~2.6x cheaper a draw
#: on XLA:CPU (:mod:`pd_train.sources`; docs/toys.md). The residual MLPs' steps at batch 512:
#: 0.74x the CPU of the scan with JAX's draws at resid_mlp1, 0.54x at resid_mlp2, 0.82x at
#: resid_mlp3 (docs/toys.md, "The residual-MLP steps with the toys' recon").
TOY_RECON = ReconConfig(chunk_loop="unroll", random_draws="blocked")


#: The toy recipes' CI MLPs run over blocks of 128 rows (``pd.ci.batch_block``): with 16 GELU
#: units one site's forward and backward at batch 4096 cost ~50 ms CPU against ~260 at C 200
#: and ~5 against ~10 at C 20, and at resid_mlp1's 2048 x C 100 ~15 against ~60, the same values
#: up to rounding (docs/toys.md, benchmarks/ci_mlp.py); resid_mlp3's 128-unit ones at batch 512
#: x C 500 make its whole step 0.15x the CPU of the unblocked one (1.9 against 12.2 s).
TOY_CI_BLOCK = 128


#: The TMS recipes keep the current reference's delta component beside the paper's faithfulness
#: term, as they were measured (the paper's algorithm has no delta component). Without it,
#: ``tms_40_10_id``'s paper recipe ended with DenseCIError 5 on a TPU, with it 3 (docs/toys.md,
#: "The paper's algorithm: a faithfulness term and no delta component").
_TMS_DELTA = "the delta component on (the current reference's; the paper's algorithm has none)"

#: What the residual-MLP ``*_fast`` recipes keep from the current reference instead of the
#: paper's algorithm: they were measured that way (docs/toys.md, "The paper's algorithm: a
#: faithfulness term and no delta component").
_RESID_FAST_DELTA = "the delta component on and no faithfulness term (the current reference's)"


def _tms(name: str, f: int, h: int, *, hidden: bool) -> ToyConfig:
    five = f == 5
    recipe = _recipe(
        steps=40_000,
        batch_size=4096,
        C=20 if five else 200,
        lr=1e-3,
        final_lr_frac=0.0,
        im_coeff=3e-3 if five else 1e-4,
        pnorm=1.0 if five else 2.0,
        delta_component=True,
    )
    paper = {
        "tms_5_2": {"mmcs": 1.000, "ml2r": 0.993},
        "tms_40_10": {"mmcs": 1.000, "ml2r": 1.010},
        "tms_5_2_id": {"mmcs": 1.000, "ml2r": 0.992},
        "tms_40_10_id": {"mmcs": 1.000, "ml2r": 1.031},
    }[name]
    return ToyConfig(
        name=name,
        weights=name,
        target=TMSConfig(n_features=f, n_hidden=h, n_hidden_layers=int(hidden)),
        feature_probability=0.05,
        pretraining=Pretraining(
            seed=TMS_5_2_SEED if name == "tms_5_2" else 0,
            steps=10_000,
            batch_size=1024 if five else 8192,
            lr=5e-3,
            zero_bias=not five,
            fixed_identity_hidden=hidden,
        ),
        pd=recipe,
        identity=("layers.0.linear1", "layers.0.linear2"),
        dense={"layers.0.hidden_0": h} if hidden else {},
        steps_per_call=100,
        paper=paper,
        deviation=_TMS_DELTA,
    )


def _resid(name: str, n_layers: int) -> ToyConfig:
    f = 102 if n_layers == 3 else 100
    d_mlp = {1: 50, 2: 25, 3: 17}[n_layers]
    return ToyConfig(
        name=name,
        weights=name,
        target=ResidMLPConfig(n_features=f, d_embed=1000, d_mlp=d_mlp, n_layers=n_layers),
        feature_probability=0.01,
        pretraining=Pretraining(
            steps=10_000 if n_layers == 3 else 1000,
            batch_size=2048,
            lr=3e-3,
            schedule="cosine",
        ),
        pd=_recipe(
            steps={1: 30_000, 2: 50_000, 3: 200_000}[n_layers],
            batch_size=2048,
            C={1: 100, 2: 400, 3: 500}[n_layers],
            lr=2e-3 if n_layers == 1 else 1e-3,
            final_lr_frac=1.0,
            im_coeff=0.5e-5 if n_layers == 3 else 1e-5,
            pnorm=2.0,
            d_gate=128 if n_layers == 3 else 16,
            delta_component=False,
        ),
        identity=("layers.*.mlp_in",),
        dense={"layers.*.mlp_out": d_mlp},
        steps_per_call=50,
    )


def _fast(toy: ToyConfig, deviation: str, **pd: Any) -> ToyConfig:
    """A shorter recipe of ``toy`` for CI (same target and weights)."""
    k = pd.pop("steps_per_call", toy.steps_per_call)
    return attrs.evolve(
        toy,
        name=f"{toy.name}_fast",
        pd=attrs.evolve(toy.pd, **pd),
        steps_per_call=k,
        deviation="; ".join(d for d in (deviation, toy.deviation) if d),
    )


_TMS_FAST = (
    "2000 steps at batch 256, lr 1e-2 cosine, importance p annealed 2 -> 1 over the first half, "
    "no faithfulness term or warmup"
)


def _tms_fast_pd(pd: PDConfig) -> dict[str, Any]:
    """The TMS 5-2 ``*_fast`` recipe's changes (measured on tms_5_2, docs/toys.md: p annealed
    from 2 keeps a feature from being written by two components in linear1)."""
    opt = OptimizerConfig(lr=1e-2, final_val_frac=0.0)
    im = ImportanceMinimality(coeff=3e-3, pnorm_start=2.0, pnorm_end=1.0, anneal_end_frac=0.5)
    recon = tuple(
        t for t in pd.loss_metrics if not isinstance(t, Faithfulness | ImportanceMinimality)
    )
    return {
        "steps": 2000,
        "batch_size": 256,
        "components": opt,
        "ci_fn": opt,
        "loss_metrics": (im, *recon),
        "faithfulness_warmup": FaithfulnessWarmup(steps=0),
        "steps_per_call": 100,
    }


_TMS_5_2_ID_FAST = (
    "4000 steps at batch 256, lr 3e-3 cosine, importance p annealed 2 -> 1 over the first half, "
    "no faithfulness term or warmup"
)


def _tms_5_2_id_fast_pd(pd: PDConfig) -> dict[str, Any]:
    """The TMS 5-2+ID ``*_fast`` recipe: ``tms_5_2_fast``'s at lr 3e-3 for 4000 steps (at 1e-2
    seed 0 ends with two features on one linear1 component; at 3e-3 for 2000 steps linear2's CI
    is not yet sharp; docs/toys.md)."""
    opt = OptimizerConfig(lr=3e-3, final_val_frac=0.0)
    return {**_tms_fast_pd(pd), "steps": 4000, "components": opt, "ci_fn": opt}


_TMS_40_10_FAST = "6000 steps at batch 256, C 100, lr 5e-3 cosine"


def _tms_40_10_fast_pd(pd: PDConfig) -> dict[str, Any]:
    """The TMS 40-10 ``*_fast`` recipe's changes: the paper's loss terms and warmup, 1/107 of
    its samples; lr 5e-3 for 6000 steps (after 4000, IdentityCIError on seeds 0 / 1: 4 / 83 at
    3e-3, 0 / 2 at 5e-3, 0 / 51 at 1e-2), C 100 for 40 features (the step's cost is the CI
    MLPs', ∝ batch × C; docs/toys.md)."""
    opt = OptimizerConfig(lr=5e-3, final_val_frac=0.0)
    return {
        "steps": 6000,
        "batch_size": 256,
        "components": opt,
        "ci_fn": opt,
        "decomposition_targets": tuple(attrs.evolve(t, C=100) for t in pd.decomposition_targets),
    }


_TMS_40_10_ID_FAST = "6000 steps at batch 256, C 100, lr 3e-3 cosine"


def _tms_40_10_id_fast_pd(pd: PDConfig) -> dict[str, Any]:
    """The TMS 40-10+ID ``*_fast`` recipe: ``tms_40_10_fast``'s at lr 3e-3 (at 5e-3 seed 1
    ends with one feature without a component of its own, IdentityCIError 52; at 3e-3 both
    seeds are clean from step 5000 on; docs/toys.md)."""
    opt = OptimizerConfig(lr=3e-3, final_val_frac=0.0)
    return {**_tms_40_10_fast_pd(pd), "components": opt, "ci_fn": opt}


_RESID_MLP1_FAST = (
    "8000 steps at batch 512, lr 4e-3, C 120 on mlp_in and 51 on mlp_out, importance 2e-5 with "
    "p annealed 2 -> 1 over 50-70 % of the steps"
    "; " + _RESID_FAST_DELTA
)


def _resid_fast_pd(
    pd: PDConfig,
    *,
    lr: float,
    c_in: int,
    c_out: int,
    coeff: float = 2e-5,
    anneal: tuple[float, float] = (0.5, 0.7),
) -> dict[str, Any]:
    """What the residual-MLP ``*_fast`` recipes share: 8000 steps at a constant ``lr``, C
    ``c_in`` on ``mlp_in`` and ``c_out`` on ``mlp_out``, and the paper's importance term at
    ``coeff`` with p annealed 2 -> 1 over the fractions ``anneal`` of the steps (by default
    50-70 %, after ``mlp_out`` has merged into one block, docs/toys.md), and the current
    reference's delta component with no faithfulness term in place of the paper's algorithm
    (what they were measured with)."""
    opt = OptimizerConfig(lr=lr, final_val_frac=1.0)
    faithfulness, im, *recon = pd.loss_metrics
    assert isinstance(faithfulness, Faithfulness), faithfulness
    assert isinstance(im, ImportanceMinimality), im
    start, end = anneal
    im = attrs.evolve(im, coeff=coeff, pnorm_end=1.0, anneal_start_frac=start, anneal_end_frac=end)
    return {
        "steps": 8000,
        "components": opt,
        "ci_fn": opt,
        "loss_metrics": (im, *recon),
        "use_delta_component": True,
        "decomposition_targets": (
            DecompositionTarget(module_pattern="layers.*.mlp_in", C=c_in),
            DecompositionTarget(module_pattern="layers.*.mlp_out", C=c_out),
        ),
    }


def _resid_mlp1_fast_pd(pd: PDConfig) -> dict[str, Any]:
    """The ``resid_mlp1_fast`` recipe's changes (measured on seeds 0-2, docs/toys.md,
    "A resid_mlp1_fast that reproduces"): lr 4e-3 sorts ``mlp_in`` in ~2000 steps; its 20
    spare components keep p = 1 from taking the last component of a slow-sorting feature; C 51
    leaves ``mlp_out`` one column beside its rank-50 block instead of 50 (at C 52 a feature kept
    one of the two as its own on 2 of 6 seed and rounding pairs); importance 2e-5
    merges that block sooner; p annealed to 1 after the block has merged (from step 4000)
    removes the single-feature columns that p = 2 leaves at small CI."""
    return {**_resid_fast_pd(pd, lr=4e-3, c_in=120, c_out=51), "batch_size": 512}


_RESID_MLP2_FAST = (
    "24 000 steps, lr 2e-3, C 150 on mlp_in and 26 on mlp_out, one shared_mlp CI function [256] a "
    "site (the reference's current resid_mlp2 CI), importance 2e-5 with p annealed 2 -> 1 over "
    "50-70 % of the steps"
    "; " + _RESID_FAST_DELTA
)


def _resid_mlp2_fast_pd(pd: PDConfig) -> dict[str, Any]:
    """The ``resid_mlp2_fast`` recipe's changes (51 runs on a TPU and five on this CPU,
    docs/toys.md, "resid_mlp2 recipes on the TPU"): lr 2e-3 (at 4e-3 features split over two
    components in both layers); C 26 on ``mlp_out``, which is one rank-25 block a layer in every
    run; C 150 on ``mlp_in``; a ``shared_mlp`` CI function, without which one layer-1 component
    stays on for several features beside their own (it carries the part of layer 1's output
    that is even in a feature's value, which the per-component CI's components, on at both
    signs, cannot; with ``shared_mlp`` each is on for one sign only: docs/toys.md); batch 2048 (512 left twice the stray entries);
    p annealed to 1 late, as ``resid_mlp1_fast``'s; 24 000 steps, so that the anneal (steps
    12 000-16 800) comes after ``mlp_in`` has sorted (at 8000 steps 1 of 4 seeds ended exact,
    at 16 000 2 of 4, at 24 000 seeds 0, 1 and 3, all that ran)."""
    return {
        **_resid_fast_pd(pd, lr=2e-3, c_in=150, c_out=26),
        "steps": 24_000,
        "ci": SharedMLPCI(hidden_dims=(256,)),
    }


_RESID_MLP3_FAST = (
    "30 000 steps, C 150 on mlp_in and 18 on mlp_out, importance 1e-5 (the reference's current "
    "resid_mlp3 value) with p annealed 2 -> 1 over 70-90 % of the steps"
    "; " + _RESID_FAST_DELTA
)


def _resid_mlp3_fast_pd(pd: PDConfig) -> dict[str, Any]:
    """The ``resid_mlp3_fast`` recipe: the best of those measured on a TPU, which does not
    reproduce yet (docs/toys.md, "resid_mlp3_fast with the p anneal moved"): the paper's lr
    (1e-3), batch and per-component ``mlp`` [128] CI, the reference's current importance 1e-5,
    C 150 / 18 (the residual MLPs' ``mlp_out`` is one rank-17 block a layer from the first eval
    on), and p annealed 2 -> 1 late, over 70-90 % of the steps. It ends at IdentityCIError 37,
    69 and 66 on seeds 0-2 (with the other residual-MLP recipes' 50-70 %: 45, 74 and 87; over
    25-45 %, which reproduces ``resid_mlp2``'s paper recipe: 126 on seed 0; at 60 000 and
    95 000 steps, seed 0 ends at 24 and 25: docs/toys.md, "resid_mlp3_fast run longer"), with
    94-103 ``mlp_in`` components a layer alive for the 102 features: those left without a component
    of their own are mostly the features the target computes least in that layer. Other
    variants, all worse at the 50-70 % anneal on seed 0 (docs/toys.md, "resid_mlp3 at 60 000
    steps" onward): lr 2e-3 with importance 2e-5 merges layer 0's features for good (60-63);
    importance 5e-6, 305; the ``shared_mlp`` CI, 463, and every CI function that reads the
    whole input merges layer 0's features (163-463); the reference's C 500, 42 for 2.9x the
    cost of a step; p = 2 throughout, 56; the importance coefficient released to 5e-6, 48; the
    paper's algorithm (a faithfulness term at 1 and no delta component), 64 (59 at 70-90 %)."""
    return {
        **_resid_fast_pd(pd, lr=1e-3, c_in=150, c_out=18, coeff=1e-5, anneal=(0.7, 0.9)),
        "steps": 30_000,
    }


def _builtin() -> dict[str, ToyConfig]:
    paper = [
        _tms("tms_5_2", 5, 2, hidden=False),
        _tms("tms_40_10", 40, 10, hidden=False),
        _tms("tms_5_2_id", 5, 2, hidden=True),
        _tms("tms_40_10_id", 40, 10, hidden=True),
        _resid("resid_mlp1", 1),
        _resid("resid_mlp2", 2),
        _resid("resid_mlp3", 3),
    ]
    toys = {t.name: t for t in paper}
    fast = [
        _fast(toys["tms_5_2"], _TMS_FAST, **_tms_fast_pd(toys["tms_5_2"].pd)),
        _fast(toys["tms_5_2_id"], _TMS_5_2_ID_FAST, **_tms_5_2_id_fast_pd(toys["tms_5_2_id"].pd)),
        _fast(toys["tms_40_10"], _TMS_40_10_FAST, **_tms_40_10_fast_pd(toys["tms_40_10"].pd)),
        _fast(toys["tms_40_10_id"], _TMS_40_10_ID_FAST,
              **_tms_40_10_id_fast_pd(toys["tms_40_10_id"].pd)),
        _fast(toys["resid_mlp1"], _RESID_MLP1_FAST, **_resid_mlp1_fast_pd(toys["resid_mlp1"].pd)),
        _fast(toys["resid_mlp2"], _RESID_MLP2_FAST, **_resid_mlp2_fast_pd(toys["resid_mlp2"].pd)),
        _fast(toys["resid_mlp3"], _RESID_MLP3_FAST, **_resid_mlp3_fast_pd(toys["resid_mlp3"].pd)),
    ]  # fmt: skip
    toys.update({t.name: t for t in fast})
    return toys


TOYS: dict[str, ToyConfig] = _builtin()


def toy_config(name: str) -> ToyConfig:
    """The built-in toy ``name``; ConfigError naming ``toy`` for an unknown one."""
    if name not in TOYS:
        raise ConfigError([("toy", f"no built-in toy {name!r}; have {', '.join(TOYS)}")])
    return TOYS[name]


def make_target(toy: ToyConfig) -> TMSTarget | ResidMLPTarget:
    """The toy's :class:`~pd_train.targets.Target`."""
    if isinstance(toy.target, TMSConfig):
        return TMSTarget(config=toy.target)
    return ResidMLPTarget(config=toy.target)


def toy_data(toy: ToyConfig) -> Callable[..., jax.Array]:
    """The toy's batch source for :func:`decompose` (``data=``)."""
    if isinstance(toy.target, TMSConfig):
        return functools.partial(sparse_features, mode=toy.mode, draws=toy.pd.recon.random_draws)
    return resid_mlp_features


def toy_weights_path(name: str) -> Path:
    return Path(__file__).parent / "assets" / f"{name}.npz"


def pretrain_toy(toy: ToyConfig) -> tuple[dict[str, Any], float]:
    """Reproduce the toy's shipped target weights (deterministic from the pretraining seed)."""
    pre = toy.pretraining
    if isinstance(toy.target, TMSConfig):
        return pretrain(
            TMSTarget(config=toy.target),
            seed=pre.seed,
            steps=pre.steps,
            batch_size=pre.batch_size,
            lr=pre.lr,
            schedule=pre.schedule,
            weight_decay=pre.weight_decay,
            feature_probability=toy.feature_probability,
            mode=toy.mode,
            zero_bias=pre.zero_bias,
            fixed_identity_hidden=pre.fixed_identity_hidden,
        )
    return pretrain_resid_mlp(
        ResidMLPTarget(config=toy.target),
        seed=pre.seed,
        steps=pre.steps,
        batch_size=pre.batch_size,
        lr=pre.lr,
        weight_decay=pre.weight_decay,
        feature_probability=toy.feature_probability,
    )


def flat_weights(params: Any) -> dict[str, np.ndarray]:
    """Target params as ``{name: array}``: top-level arrays, then ``layers.{kind}``."""
    flat = {k: np.asarray(v) for k, v in params.items() if k != "layers"}
    flat.update({f"layers.{k}": np.asarray(v) for k, v in params["layers"].items()})
    return flat


def save_weights(params: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        np.savez_compressed(f, **flat_weights(params))  # type: ignore[arg-type]


def load_weights(path: Path) -> dict[str, Any]:
    """Target params saved by :func:`save_weights` (the shipped toy weights)."""
    with np.load(path) as f:
        params: dict[str, Any] = {k: f[k] for k in f.files if not k.startswith("layers.")}
        params["layers"] = {k.split(".", 1)[1]: f[k] for k in f.files if k.startswith("layers.")}
        return params


def toy_weights(name: str) -> dict[str, Any]:
    """The shipped pretrained weights of the built-in toy ``name``."""
    path = toy_weights_path(toy_config(name).weights)
    if not path.exists():
        msg = f"toy weights {path} missing; run pd-train pretrain builtin:{name}"
        raise FileNotFoundError(msg)
    return load_weights(path)


#: The examples of the window :func:`ground_truth_metrics` counts the alive components on
#: (the reference's ``n_examples_until_dead``; pd's choice for the toys: each feature of a
#: 100-feature toy at probability 0.01 is active in ~80 of them).
ALIVE_WINDOW = 8192
#: The window's data key: ``fold_in(key(0), ALIVE_WINDOW_KEY)``, the same for every run.
ALIVE_WINDOW_KEY = 0xA11E


def alive_window(toy: ToyConfig, n_examples: int = ALIVE_WINDOW) -> jax.Array:
    """[n_examples, 1, n_features]: a fixed draw of the toy's training distribution (one program,
    compiled once per toy data: drawn eagerly, its ops compiled anew at each eval)."""
    return _draw_window(
        jax.random.fold_in(jax.random.key(0), ALIVE_WINDOW_KEY),
        tms=isinstance(toy.target, TMSConfig),
        mode=toy.mode,
        draws=toy.pd.recon.random_draws,
        n_examples=n_examples,
        n_features=toy.target.n_features,
        feature_probability=toy.feature_probability,
    )


@functools.partial(
    jax.jit,
    static_argnames=("tms", "mode", "draws", "n_examples", "n_features", "feature_probability"),
)
def _draw_window(
    key: jax.Array,
    *,
    tms: bool,
    mode: DataMode,
    draws: str,
    n_examples: int,
    n_features: int,
    feature_probability: float,
) -> jax.Array:
    if tms:
        return sparse_features(
            key=key,
            batch_size=n_examples,
            n_features=n_features,
            feature_probability=feature_probability,
            mode=mode,
            draws=draws,
        )
    return resid_mlp_features(
        key=key,
        batch_size=n_examples,
        n_features=n_features,
        feature_probability=feature_probability,
    )


def ground_truth_metrics(
    toy: ToyConfig, trainer: Trainer, params: Any, weights: Any
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """The reference's metrics of a decomposition of ``toy``: :func:`ground_truth_table`'s
    (alive on :func:`alive_window`, pd's alive on the one-hot inputs, IdentityCIError and
    DenseCIError per site and in total) and for a TMS target ``gt/mmcs``, ``gt/ml2r`` (of
    ``linear1``, with their std over features). Returns them and the one-hot CI per site."""
    # One program for both input sets (its compile announced once, not once per shape).
    n = toy.target.n_features
    both = inputs_ci(
        trainer, params, weights, jnp.concatenate([_one_hot_inputs(n), alive_window(toy)])
    )
    ci = {site: rows[:n] for site, rows in both.items()}
    window = {site: rows[n:] for site, rows in both.items()}
    out = ground_truth_table(ci, identity=toy.identity, dense=toy.dense, window_ci=window)
    if isinstance(toy.target, TMSConfig):
        comps = jax.device_get(params["components"]["linear1"])
        w1 = np.asarray(weights["layers"]["linear1"][0])
        tms = mmcs_ml2r(w1, np.asarray(comps["V"][0]), np.asarray(comps["U"][0]))
        out.update({f"gt/{k}": v for k, v in tms.items()})
    return out, ci


def toy_identity_failures(
    toy: ToyConfig,
    trainer: Trainer,
    weights: Any,
    ci: Mapping[str, np.ndarray],
    params: Any = None,
) -> dict[str, dict[str, Any]]:
    """:func:`~pd_train.analysis.ground_truth.identity_failures_by_site` of the toy's identity
    sites, each feature without its own component ranked by the target's output there
    (:func:`one_hot_output_norms`). A site with components on for several features whose
    target output has a part even in the feature's value (:func:`sign_even_part` ≥
    :data:`EVEN_PART_SHOWN`, on the one-hot inputs at ±0.75) also gets ``even_part``: that
    measure, and with the decomposition's ``params`` each shared component's |cos| between its
    U and the even part's direction (``shared_alignment``) and ``two_sided``: ``[k, m]``, of
    the m features whose top component is ≥ 1 − tolerance at +0.75 (their own, as
    IdentityCIError reads it), the k whose own component is also on (above the tolerance) at
    −0.75. A component on at both signs is linear in the feature's value there, so it cannot
    carry the even part; one on for one sign only can (docs/toys.md, "How the exact
    resid_mlp2_fast carries the even part")."""
    if not toy.identity:
        return {}
    n = toy.target.n_features
    pos = one_hot_site_outputs(trainer, weights, n)
    strength = {site: np.linalg.norm(out, axis=1) for site, out in pos.items()}
    failures = identity_failures_by_site(ci, toy.identity, strength=strength)
    shared_sites = [site for site, f in failures.items() if f["shared"]]
    if not shared_sites:
        return failures
    neg = one_hot_site_outputs(trainer, weights, n, magnitude=-0.75)
    neg_ci = None if params is None else one_hot_ci(trainer, params, weights, n, magnitude=-0.75)
    by_name = {site.name: site for site in trainer.decomposition.sites}
    for name in shared_sites:
        even = sign_even_part(pos[name], neg[name])
        if even["even_to_odd"] < EVEN_PART_SHOWN:
            continue
        entry: dict[str, Any] = {
            "even_to_odd": round(even["even_to_odd"], 4),
            "top_share": round(even["top_share"], 4),
        }
        site = by_name[name]
        comps = {} if params is None else params["components"].get(site.kind, {})
        if "U" in comps:  # a tied site holds no U of its own
            u = np.asarray(comps["U"][site.index], np.float64)
            entry["shared_alignment"] = [
                [j, round(float(abs(u[j] @ even["direction"]) / np.linalg.norm(u[j])), 4)]
                for j, _ in failures[name]["shared"]
                if np.linalg.norm(u[j]) > 0
            ]
        if neg_ci is not None:
            entry["two_sided"] = _two_sided(ci[name], neg_ci[name])
        failures[name]["even_part"] = entry
    return failures


def _two_sided(ci_pos: np.ndarray, ci_neg: np.ndarray) -> list[int]:
    """``[k, m]``: of the m features (rows) whose top component is ≥ 1 − TOLERANCE in
    ``ci_pos`` [F, C], the k whose top component is above TOLERANCE in ``ci_neg`` too."""
    rows = np.arange(ci_pos.shape[0])
    top = ci_pos.argmax(axis=1)
    own = ci_pos[rows, top] >= 1 - TOLERANCE
    return [int((own & (ci_neg[rows, top] > TOLERANCE)).sum()), int(own.sum())]


def reproduced(toy: ToyConfig, metrics: Mapping[str, float]) -> bool:
    """The reference's criteria: IdentityCIError 0 and DenseCIError 0 in total, and for TMS
    MMCS ≥ 0.99."""
    ok = metrics.get("gt/identity_ci_error", 0.0) == 0 and metrics.get("gt/dense_ci_error", 0) == 0
    if "gt/mmcs" in metrics:
        ok = ok and metrics["gt/mmcs"] >= 0.99
    return bool(ok)


def write_plots(
    toy: ToyConfig,
    trainer: Trainer,
    params: Any,
    weights: Any,
    ci: dict[str, np.ndarray],
    plots: Path,
) -> list[Path]:
    """The toy's PNGs: ``{name}_permuted_ci.png``, ``{name}_uv.png`` (V and U per site, in the
    permuted-CI order), ``{name}_directions.png`` (TMS with 2 hidden dims) and
    ``{name}_neuron_contributions.png`` (residual MLPs)."""
    comps = jax.device_get(params["components"])
    perms = plot_permuted_ci(ci, plots / f"{toy.name}_permuted_ci.png", dense=toy.dense)
    uv = {
        site.name: (
            np.asarray(comps[site.kind]["V"][site.index]),
            np.asarray(comps[site.kind]["U"][site.index]),
        )
        for site in trainer.decomposition.sites
    }
    paths = [
        plots / f"{toy.name}_permuted_ci.png",
        plot_uv(uv, plots / f"{toy.name}_uv.png", perms),
    ]
    if isinstance(toy.target, TMSConfig) and toy.target.n_hidden == 2:
        paths.append(plot_tms_directions(weights, comps, ci, plots / f"{toy.name}_directions.png"))
    if isinstance(toy.target, ResidMLPConfig) and "mlp_in" in comps and "mlp_out" in comps:
        embed = np.asarray(weights["embed"])
        target = neuron_contributions(
            embed, np.asarray(weights["layers"]["mlp_in"]), np.asarray(weights["layers"]["mlp_out"])
        )
        w_out = np.einsum("ldc,lce->lde", comps["mlp_out"]["V"], comps["mlp_out"]["U"])
        best = component_neuron_contributions(
            embed, np.asarray(comps["mlp_in"]["V"]), np.asarray(comps["mlp_in"]["U"]), w_out
        )
        paths.append(
            plot_neuron_contributions(target, best, plots / f"{toy.name}_neuron_contributions.png")
        )
    return paths


def run_toy(
    name: str,
    *,
    seed: int = 0,
    steps: int | None = None,
    plots: Path | None = None,
    pd: PDConfig | None = None,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    max_steps: int | None = None,
    steps_per_call: int | None = None,
    log_every: int | None = None,
    eval_every: int = 0,
    on_eval: Callable[[int, dict[str, float]], None] | None = None,
    checkpoints: Any = None,
    checkpoint_every: int = 0,
    resume: bool = False,
    trainer: Trainer | None = None,
    hooks: Sequence[Hook] = (),
    on_warmup: Callable[[int, float], None] | None = None,
    devices: int = 1,
) -> tuple[dict[str, float], dict[str, np.ndarray], Any]:
    """Decompose the built-in toy ``name`` from its shipped weights; returns the ground-truth
    metrics (plus ``time_s``, ``steps_per_s``, ``samples_per_s``, final losses), the one-hot CI
    per site and the trained decomposition params. ``pd``: another recipe (default the toy's;
    ``steps`` replaces its step count). ``steps_per_call``: K (default the toy's); ``log_every``
    (default K) the cadence of ``on_step``; ``on_eval(n, metrics)``: the ground-truth metrics
    after every ``eval_every`` steps. ``plots``: a directory for :func:`write_plots`. ``hooks``,
    ``on_warmup``, ``checkpoints``, ``resume``, ``devices``: as :func:`decompose`'s. The metrics'
    ``steps``: the steps finished (fewer than asked when a hook stopped the run); the rates
    count this attempt's steps."""
    toy = toy_config(name)
    pd = pd or toy.pd
    pd = pd if steps is None else attrs.evolve(pd, steps=steps)
    k = toy.steps_per_call if steps_per_call is None else steps_per_call
    target = make_target(toy)
    weights = toy_weights(name)
    last: dict[str, Any] = {}
    first = _FirstStep()

    def keep(i: int, metrics: dict[str, Any]) -> None:
        last.update(metrics)
        if on_step is not None:
            on_step(i, metrics)

    def evaluate(n: int, state: TrainState) -> None:
        if on_eval is not None:
            on_eval(n, ground_truth_metrics(toy, trainer_, state.params, weights)[0])

    trainer_ = trainer if trainer is not None else toy_trainer(target, pd)
    start = time.perf_counter()
    trainer_, state = decompose(
        target,
        weights,
        pd,
        seed=seed,
        feature_probability=toy.feature_probability,
        data=toy_data(toy),
        on_step=keep,
        trainer=trainer_,
        max_steps=max_steps,
        steps_per_call=k,
        log_every=k if log_every is None else log_every,
        eval_every=eval_every,
        on_eval=evaluate,
        checkpoints=checkpoints,
        checkpoint_every=checkpoint_every,
        resume=resume,
        hooks=(first, *hooks),
        on_warmup=on_warmup,
        devices=devices,
    )
    jax.block_until_ready(state.params)
    elapsed = time.perf_counter() - start
    done = int(state.step)
    ran = done - (done if first.step is None else first.step)
    metrics, ci = ground_truth_metrics(toy, trainer_, state.params, weights)
    metrics.update({k: float(v) for k, v in last.items() if k.startswith("loss/")})
    metrics["time_s"] = elapsed
    metrics["steps"] = float(done)
    metrics["steps_per_s"] = ran / elapsed
    metrics["samples_per_s"] = ran * pd.batch_size / elapsed
    metrics["reproduced"] = float(reproduced(toy, metrics))
    if plots is not None:
        write_plots(toy, trainer_, state.params, weights, ci, plots)
    return metrics, ci, state.params


def main(argv: list[str] | None = None) -> int:
    """``python -m pd_train.targets.toys pretrain NAME [--out PATH]`` or ``run NAME [--seed N]
    [--steps N]`` (prints the ground-truth metrics as JSON)."""
    parser = argparse.ArgumentParser(prog="python -m pd_train.targets.toys")
    sub = parser.add_subparsers(dest="command", required=True)
    pre = sub.add_parser("pretrain", help="train a toy target; writes its weights (.npz)")
    pre.add_argument("name", choices=sorted(TOYS))
    pre.add_argument("--out", type=Path, default=None, help="default: the shipped weights' path")
    run = sub.add_parser("run", help="decompose a toy target; prints ground-truth metrics")
    run.add_argument("name", choices=sorted(TOYS))
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--steps", type=int, default=None)
    run.add_argument("--plots", type=Path, default=None, help="write the PNG plots here")
    args = parser.parse_args(argv)
    if args.command == "pretrain":
        toy = toy_config(args.name)
        params, loss = pretrain_toy(toy)
        out = args.out or toy_weights_path(toy.weights)
        save_weights(params, out)
        print(f"{toy.name}: final loss {loss:.6g}; wrote {out}")
        return 0
    metrics, ci, _ = run_toy(args.name, seed=args.seed, steps=args.steps, plots=args.plots)
    for site, values in ci.items():
        print(f"{site}: one-hot CI [features, alive components]")
        print(np.array2string(values[:, values.max(axis=0) > 0.1], precision=2))
    print(json.dumps(metrics, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
