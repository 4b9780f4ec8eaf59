"""Decomposing toy targets whose mechanism is known, and the ground-truth metrics.

:func:`one_hot_ci`: per decomposed matrix, ci_lower of every component on each one-hot feature
input [n_features, C]. From it: :func:`alive_components` (components some feature activates
above a threshold), :func:`identity_ci_error` (how far the best feature→component assignment is
from one component per feature) and :func:`recovers_identity` (each feature activates exactly
one component above ``on`` and no other above ``off``, a different one per feature).

:func:`decompose` trains a decomposition of a toy target (TMS or residual MLP) with
sparse-feature batches drawn on device from the run key, with the same
:class:`~pd_train.step.Trainer` (and so the same step, scans and init) as a Llama target.
:data:`TOYS` holds the built-in toys (``tms_5_2``, ``tms_40_10``, ``resid_mlp1``): target,
pretraining, recipe and which matrices should come out one component per feature;
:func:`run_toy` decomposes one from its shipped weights.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import linear_sum_assignment

from pd_train._config_io import ConfigError
from pd_train._forward import CleanRunner
from pd_train.config import (
    MLPCI,
    ChunkwiseSubsetRecon,
    CIConfig,
    DecompositionTarget,
    FaithfulnessWarmup,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    StochasticRecon,
    VectorMLPCI,
)
from pd_train.squash import lower_leaky_hard
from pd_train.step import Trainer, TrainState, step_key
from pd_train.targets.resid_mlp import (
    ResidMLPConfig,
    ResidMLPTarget,
    pretrain_resid_mlp,
    resid_mlp_features,
)
from pd_train.targets.tms import DataMode, TMSConfig, TMSTarget, pretrain, sparse_features

__all__ = [
    "TOYS",
    "ToyConfig",
    "alive_components",
    "decompose",
    "features_recovered",
    "flat_weights",
    "ground_truth_metrics",
    "identity_ci_error",
    "load_weights",
    "make_target",
    "one_hot_ci",
    "permuted_ci",
    "plot_permuted_ci",
    "plot_tms_directions",
    "pretrain_toy",
    "recovers_identity",
    "run_toy",
    "save_weights",
    "toy_config",
    "toy_data",
    "toy_weights",
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

    ``magnitude`` < 1 (spd's choice too): at the largest feature value a TMS target's
    interference from a neighbouring feature can survive the output ReLU, and then the
    neighbour's component is truly needed on that input."""
    x = magnitude * jnp.eye(n_features, dtype=jnp.float32)[:, None, :]  # [F, 1, F]
    comps = jax.tree_util.tree_map(lambda a: a.astype(trainer.compute_dtype), params["components"])
    clean = CleanRunner(trainer.forward_spec, target_params, x)
    _, pre = trainer.ci_fn.causal_importance(params["ci_fn"], comps, clean)
    out = {}
    for site in trainer.decomposition.sites:
        ci = lower_leaky_hard(pre[site.kind])[site.index][:, 0, :]  # [F, C]
        out[site.name] = np.asarray(ci, dtype=np.float64)
    return out


def alive_components(ci: np.ndarray, threshold: float = 0.1) -> int:
    """Components that some one-hot input activates above ``threshold``; ci [F, C]."""
    return int(np.sum(ci.max(axis=0) > threshold))


def identity_ci_error(ci: np.ndarray) -> float:
    """Mean over features of the L1 distance between a feature's CI row [C] and the one-hot row
    of its component, under the feature→component assignment (Hungarian, distinct components)
    that maximizes the assigned CI. 0: one component per feature, fully on, all others off."""
    rows, cols = linear_sum_assignment(-ci)
    ideal = np.zeros_like(ci)
    ideal[rows, cols] = 1.0
    return float(np.abs(ci - ideal).sum() / ci.shape[0])


def recovers_identity(ci: np.ndarray, *, on: float = 0.5, off: float = 0.1) -> bool:
    """Each feature activates exactly one component above ``on``, none other above ``off``, and
    no two features share their component; ci [F, C]."""
    top = ci.argmax(axis=1)
    rest = ci.copy()
    rest[np.arange(ci.shape[0]), top] = 0.0
    return bool(
        (ci.max(axis=1) > on).all()
        and (rest <= off).all()
        and len(set(top.tolist())) == ci.shape[0]
    )


def features_recovered(ci: np.ndarray, *, on: float = 0.5, off: float = 0.1) -> np.ndarray:
    """[F] bool: feature i activates exactly one component above ``on`` and no other above
    ``off``, and no other feature's top component is the same one; ci [F, C]."""
    top = ci.argmax(axis=1)
    rest = ci.copy()
    rest[np.arange(ci.shape[0]), top] = 0.0
    shared = np.bincount(top, minlength=ci.shape[1])[top] > 1
    return (ci.max(axis=1) > on) & (rest <= off).all(axis=1) & ~shared


def ground_truth_metrics(
    ci_by_site: dict[str, np.ndarray], identity_sites: tuple[str, ...] | None = None
) -> dict[str, float]:
    """``gt/alive/{site}`` for every site; for the sites whose known mechanism is one component
    per feature (``identity_sites``, default all): ``gt/identity_ci_error/{site}``,
    ``gt/features_recovered/{site}`` (fraction of features, :func:`features_recovered`) and
    ``gt/recovered/{site}`` (0/1, every feature)."""
    out: dict[str, float] = {}
    for name, ci in ci_by_site.items():
        out[f"gt/alive/{name}"] = float(alive_components(ci))
        if identity_sites is not None and name not in identity_sites:
            continue
        out[f"gt/identity_ci_error/{name}"] = identity_ci_error(ci)
        out[f"gt/features_recovered/{name}"] = float(features_recovered(ci).mean())
        out[f"gt/recovered/{name}"] = float(recovers_identity(ci))
    return out


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
) -> tuple[Trainer, TrainState]:
    """``pd.steps`` train steps on batches [pd.batch_size, 1, n_features] of sparse features.

    The run key is ``key(seed)``; params start from ``fold_in(run key, 0)``, batch ``i`` is drawn
    from ``fold_in(fold_in(run key, 1), i)`` and step ``i`` uses :func:`step_key` of
    ``fold_in(run key, 2)``. ``on_step(i, metrics)`` sees each step's (device) metrics.
    ``trainer``: reuse one built for the same target and ``pd`` (and its compiled step).
    ``data(key=, batch_size=, n_features=, feature_probability=)``: the batch source (default
    :func:`~pd_train.targets.tms.sparse_features` with ``mode``). ``max_steps``: stop after
    that many steps (the schedule stays that of ``pd.steps``). ``pd.faithfulness_warmup``
    steps (if any) run before step 0.
    """
    if trainer is None:
        trainer = Trainer(target, pd)
    elif trainer.pd != pd or trainer.model != target:
        msg = "decompose: the given trainer was built for another target or pd config"
        raise ValueError(msg)
    run_key = jax.random.key(seed)
    state = trainer.init_state(key=jax.random.fold_in(run_key, 0))
    data_key, train_key = jax.random.fold_in(run_key, 1), jax.random.fold_in(run_key, 2)
    n = target.config.n_features

    draw = data or functools.partial(sparse_features, mode=mode)

    @jax.jit
    def batch(i: jax.Array) -> jax.Array:
        return draw(
            key=jax.random.fold_in(data_key, i),
            batch_size=pd.batch_size,
            n_features=n,
            feature_probability=feature_probability,
        )

    target_params = jax.tree_util.tree_map(jnp.asarray, target_params)
    if pd.faithfulness_warmup.steps:
        state, _ = trainer.faithfulness_warmup(state, target_params)
    n_steps = pd.steps if max_steps is None else min(max_steps, pd.steps)
    for i in range(n_steps):
        state, metrics = trainer.train_step(
            state, target_params, batch(jnp.int32(i)), step_key(train_key, i)
        )
        if on_step is not None:
            on_step(i, metrics)
    return trainer, state


def permuted_ci(ci: np.ndarray, threshold: float = 0.1) -> tuple[np.ndarray, list[int]]:
    """ci [F, C] with its columns reordered: each feature's assigned component (the best
    assignment of :func:`identity_ci_error`) on the diagonal, then the other alive components,
    dead ones dropped. Returns the matrix and the component numbers of its columns."""
    rows, cols = linear_sum_assignment(-ci)
    order = [int(c) for _, c in sorted(zip(rows, cols, strict=True))]
    alive = [int(c) for c in np.flatnonzero(ci.max(axis=0) > threshold) if c not in order]
    keep = [c for c in order if ci[:, c].max() > threshold] + alive
    return ci[:, keep], keep


def plot_permuted_ci(ci_by_site: dict[str, np.ndarray], path: Path) -> Path:
    """One PNG: per site, the permuted one-hot CI matrix (features × alive components)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4 * len(ci_by_site), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(ci_by_site), squeeze=False)[0]
    for ax, (site, ci) in zip(axes, ci_by_site.items(), strict=True):
        matrix, comps = permuted_ci(ci)
        image = ax.imshow(matrix, vmin=0.0, vmax=1.0, cmap="Blues", aspect="auto")
        ax.set_title(f"{site}\nidentity-CI error {identity_ci_error(ci):.3f}", fontsize=9)
        ax.set_xlabel("component (permuted)")
        ax.set_ylabel("one-hot feature")
        ax.set_xticks(range(len(comps)), [str(c) for c in comps], fontsize=6)
        fig.colorbar(image, ax=ax, shrink=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


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
class ToyConfig:
    """A built-in toy: the target, how it was pretrained, and its decomposition recipe.

    ``identity_sites``: the sites whose known mechanism is one component per feature (None:
    every site). A residual MLP's ``mlp_out`` is not one of them: it reads the d_mlp neurons,
    so about d_mlp dense components are expected there, not one per feature."""

    name: str
    target: TMSConfig | ResidMLPConfig
    feature_probability: float
    mode: DataMode
    pretrain_seed: int
    pretrain_steps: int
    pretrain_batch_size: int
    pretrain_lr: float
    pd: PDConfig
    identity_sites: tuple[str, ...] | None = None

    @property
    def target_type(self) -> str:
        """``tms`` or ``resid_mlp``."""
        return "tms" if isinstance(self.target, TMSConfig) else "resid_mlp"


def _toy_pd(
    *,
    steps: int,
    batch_size: int,
    C: int,
    lr: float,
    im_coeff: float,
    pnorm: float = 1.0,
    pattern: str = "layers.0.*",
    final_lr_frac: float = 0.0,
    ci: CIConfig | None = None,
    pnorm_start: float | None = None,
    pnorm_anneal_end_frac: float = 1.0,
) -> PDConfig:
    """A toy recipe. ``ci``: the CI function (default ``mlp`` [16]). The importance-minimality
    p goes linearly from ``pnorm_start`` (default ``pnorm``: constant) to ``pnorm`` over the
    first ``pnorm_anneal_end_frac`` of the steps."""
    opt = OptimizerConfig(lr=lr, final_val_frac=final_lr_frac)
    im = ImportanceMinimality(
        coeff=im_coeff,
        pnorm_start=pnorm if pnorm_start is None else pnorm_start,
        pnorm_end=pnorm,
        anneal_end_frac=pnorm_anneal_end_frac,
    )
    return PDConfig(
        steps=steps,
        batch_size=batch_size,
        decomposition_targets=(DecompositionTarget(module_pattern=pattern, C=C),),
        ci=MLPCI(hidden_dims=(16,)) if ci is None else ci,
        loss_metrics=(
            im,
            StochasticRecon(coeff=1.0),
            # One site per chunk, routed at every position: layerwise stochastic recon.
            ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=1),
        ),
        components=opt,
        ci_fn=opt,
    )


TOYS: dict[str, ToyConfig] = {
    "tms_5_2": ToyConfig(
        name="tms_5_2",
        target=TMSConfig(n_features=5, n_hidden=2),
        feature_probability=0.05,
        mode="at_least_zero_active",
        pretrain_seed=0,
        pretrain_steps=3000,
        pretrain_batch_size=1024,
        pretrain_lr=5e-3,
        pd=_toy_pd(steps=2000, batch_size=256, C=20, lr=1e-2, im_coeff=3e-3),
    ),
    # 40 features in 10 hidden dims (tied weights, zero-initialised bias, as spd's 40-10).
    # Its features pair up (cosine -0.53 between neighbours): with C 80 and the scalar `mlp` CI,
    # one component writing w_i - w_j served both i and j (52 % / 20 % recovered). The
    # per-component `vector_mlp` CI (it sees the whole input), p annealed 2 -> 1 and C 400 (more
    # components to start from) give every feature its own linear2 component and 90 % linear1.
    "tms_40_10": ToyConfig(
        name="tms_40_10",
        target=TMSConfig(n_features=40, n_hidden=10),
        feature_probability=0.05,
        mode="at_least_zero_active",
        pretrain_seed=0,
        pretrain_steps=5000,
        pretrain_batch_size=2048,
        pretrain_lr=5e-3,
        pd=attrs.evolve(
            _toy_pd(
                steps=1500,
                batch_size=512,
                C=400,
                lr=5e-3,
                im_coeff=5e-4,
                pnorm_start=2.0,
                pnorm_anneal_end_frac=0.5,
                ci=VectorMLPCI(hidden_dims=(16,)),
            ),
            faithfulness_warmup=FaithfulnessWarmup(steps=200, lr=1e-2),
        ),
    ),
    # 100 ReLUs computed by 50 neurons in a 1000-dim residual stream. mlp_in reads the features:
    # one component per feature; mlp_out reads the neurons: about d_mlp dense components.
    "resid_mlp1": ToyConfig(
        name="resid_mlp1",
        target=ResidMLPConfig(n_features=100, d_embed=1000, d_mlp=50, n_layers=1),
        feature_probability=0.01,
        mode="at_least_zero_active",
        pretrain_seed=0,
        pretrain_steps=1000,
        pretrain_batch_size=2048,
        pretrain_lr=3e-3,
        pd=_toy_pd(
            steps=2000,
            batch_size=512,
            C=120,  # at C 100 (one per feature, no slack) two features shared one: 98 of 100
            lr=4e-3,
            im_coeff=1e-3,
            pnorm=2.0,
            pattern="layers.*",
        ),
        identity_sites=("layers.0.mlp_in",),
    ),
}


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
        return functools.partial(sparse_features, mode=toy.mode)
    return resid_mlp_features


def _weights_path(name: str) -> Path:
    return Path(__file__).parent / "assets" / f"{name}.npz"


def pretrain_toy(toy: ToyConfig) -> tuple[dict[str, Any], float]:
    """Reproduce the toy's shipped target weights (deterministic from ``pretrain_seed``)."""
    if isinstance(toy.target, TMSConfig):
        return pretrain(
            TMSTarget(config=toy.target),
            seed=toy.pretrain_seed,
            steps=toy.pretrain_steps,
            batch_size=toy.pretrain_batch_size,
            lr=toy.pretrain_lr,
            feature_probability=toy.feature_probability,
            mode=toy.mode,
        )
    return pretrain_resid_mlp(
        ResidMLPTarget(config=toy.target),
        seed=toy.pretrain_seed,
        steps=toy.pretrain_steps,
        batch_size=toy.pretrain_batch_size,
        lr=toy.pretrain_lr,
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
        np.savez(f, **flat_weights(params))  # type: ignore[arg-type]


def load_weights(path: Path) -> dict[str, Any]:
    """Target params saved by :func:`save_weights` (the shipped toy weights)."""
    with np.load(path) as f:
        params: dict[str, Any] = {k: f[k] for k in f.files if not k.startswith("layers.")}
        params["layers"] = {k.split(".", 1)[1]: f[k] for k in f.files if k.startswith("layers.")}
        return params


def toy_weights(name: str) -> dict[str, Any]:
    """The shipped pretrained weights of the built-in toy ``name``."""
    path = _weights_path(toy_config(name).name)
    if not path.exists():
        msg = f"toy weights {path} missing; run pd-train pretrain builtin:{name}"
        raise FileNotFoundError(msg)
    return load_weights(path)


def run_toy(
    name: str,
    *,
    seed: int = 0,
    steps: int | None = None,
    plots: Path | None = None,
    pd: PDConfig | None = None,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    max_steps: int | None = None,
) -> tuple[dict[str, float], dict[str, np.ndarray], Any]:
    """Decompose the built-in toy ``name`` from its shipped weights; returns the ground-truth
    metrics (plus ``time_s``, ``steps_per_s``, final losses), the one-hot CI per site and the
    trained decomposition params. ``pd``: another recipe (default the toy's; ``steps``
    replaces its step count). ``plots``: a directory for ``{name}_permuted_ci.png`` (and
    ``{name}_directions.png`` for a TMS target with 2 hidden dims)."""
    toy = toy_config(name)
    pd = pd or toy.pd
    pd = pd if steps is None else attrs.evolve(pd, steps=steps)
    target = make_target(toy)
    weights = toy_weights(name)
    last: dict[str, Any] = {}

    def keep(i: int, metrics: dict[str, Any]) -> None:
        last.update(metrics)
        if on_step is not None:
            on_step(i, metrics)

    start = time.perf_counter()
    trainer, state = decompose(
        target,
        weights,
        pd,
        seed=seed,
        feature_probability=toy.feature_probability,
        data=toy_data(toy),
        on_step=keep,
        max_steps=max_steps,
    )
    jax.block_until_ready(state.params)
    elapsed = time.perf_counter() - start
    n_steps = pd.steps if max_steps is None else min(max_steps, pd.steps)
    ci = one_hot_ci(trainer, state.params, weights, toy.target.n_features)
    metrics = ground_truth_metrics(ci, toy.identity_sites)
    metrics.update({k: float(v) for k, v in last.items() if k.startswith("loss/")})
    metrics["time_s"] = elapsed
    metrics["steps_per_s"] = n_steps / elapsed
    if plots is not None:
        plot_permuted_ci(ci, plots / f"{name}_permuted_ci.png")
        if isinstance(toy.target, TMSConfig) and toy.target.n_hidden == 2:
            comps = jax.device_get(state.params["components"])
            plot_tms_directions(weights, comps, ci, plots / f"{name}_directions.png")
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
        out = args.out or _weights_path(toy.name)
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
