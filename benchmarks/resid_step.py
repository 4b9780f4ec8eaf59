"""A residual-MLP decomposition step with the masked forwards on the target's 1000-wide stream
against the reduced stream (``ForwardSpec.reduce_stream``, :meth:`ResidMLPTarget.reduced_stream`).

Each arm is the toy's built-in recipe (its C, CI MLPs, loss terms; no faithfulness warmup) at
``--batch``, run as the toys' K-step programs (:class:`pd_train.targets.toys.KStepPrograms`, K =
``--k`` steps per call) from the same state on the same batches. After one compile-and-warm call
per arm the arms alternate for ``--rounds`` calls each; the process's CPU ms (user + system, all
threads) and the wall ms per step are reported as the median over the rounds, with the reduced
arm's ratio to the stream arm. The machine may be shared: compare CPU ms and ratios.
Arms: ``never`` (the stream, what pd ran before), ``auto`` (the default: reduced where the
target finds it cheaper, i.e. R ≤ d_embed / 2), ``always`` (reduced wherever possible).

    python benchmarks/resid_step.py [--cases resid_mlp1:2048 resid_mlp2:512 resid_mlp2:2048]
        [--arms never auto] [--k 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import attrs
import jax
import jax.numpy as jnp

from pd_train.config.pd import FaithfulnessWarmup
from pd_train.targets.toys import (
    KStepPrograms,
    make_target,
    sparse_features,
    toy_config,
    toy_trainer,
    toy_weights,
)


def _program(name: str, batch: int, arm: str, k: int) -> tuple[object, object, object]:
    toy = toy_config(name)
    pd = attrs.evolve(toy.pd, batch_size=batch, faithfulness_warmup=FaithfulnessWarmup(steps=0))
    target = make_target(toy)
    trainer = toy_trainer(target, pd)
    trainer.forward_spec = attrs.evolve(trainer.forward_spec, reduce_stream=arm)
    run_key = jax.random.key(0)
    state = trainer.init_state(key=jax.random.fold_in(run_key, 0))
    programs = KStepPrograms(
        trainer=trainer,
        draw=sparse_features,
        data_key=jax.random.fold_in(run_key, 1),
        train_key=jax.random.fold_in(run_key, 2),
        batch_size=batch,
        n_features=target.config.n_features,
        feature_probability=toy.feature_probability,
    )
    weights = jax.tree_util.tree_map(jnp.asarray, toy_weights(name))
    return functools.partial(programs.program(k), values=programs.values()), state, weights


def _timed(program: object, state: object, weights: object) -> tuple[object, float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    state, metrics = program(state, weights)  # type: ignore[operator]
    jax.block_until_ready((state, metrics))
    return state, time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cases", nargs="+", default=["resid_mlp1:2048", "resid_mlp2:512", "resid_mlp2:2048"]
    )
    parser.add_argument("--arms", nargs="+", default=["never", "auto"])
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, K {args.k}, rounds {args.rounds}")
    print("case | arm | compile+warm CPU s | CPU ms/step | wall ms/step | CPU ratio to never")
    for case in args.cases:
        name, batch = case.split(":")
        runs = {}
        for arm in args.arms:
            program, state, weights = _program(name, int(batch), arm, args.k)
            state, cpu, _ = _timed(program, state, weights)
            runs[arm] = {"p": program, "s": state, "w": weights, "warm": cpu, "cpu": [], "wall": []}
        for _ in range(args.rounds):
            for r in runs.values():
                r["s"], cpu, wall = _timed(r["p"], r["s"], r["w"])
                r["cpu"].append(1e3 * cpu / args.k)
                r["wall"].append(1e3 * wall / args.k)
        base = statistics.median(runs[args.arms[0]]["cpu"])
        for arm, r in runs.items():
            cpu = statistics.median(r["cpu"])
            print(
                f"{case} | {arm} | {r['warm']:.1f} | {cpu:.0f} | "
                f"{statistics.median(r['wall']):.0f} | {cpu / base:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
