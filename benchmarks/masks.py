"""The masks' uniform draws, ``pd.recon.random_draws: jax`` against ``blocked`` (the same bits):
one draw alone, then a toy's K-step program at the paper's batch.

    python benchmarks/masks.py [--toys tms_5_2 tms_40_10] [--k 50] [--calls 2] [--repeats 2]

``draw``: one ``uniform`` of a site's source shape ([4096, 1, C + 1]), 200 draws in one jitted
``lax.scan`` (each draw's key folded from the step, the draws summed so none is dropped), CPU
ms a draw of the process. ``step``: the toy's K-step program (its recipe, ``random_draws`` set
per arm, its data drawn the same way), after a compile-and-warm call, CPU ms (user + system) a
step over ``--calls`` calls, best of ``--repeats`` with the arms alternating, and the wall ms
beside it. The machine may be shared: read the CPU and the ratios. Both arms compute the same
bits (tests/pd_train/test_random_draws.py), so the two arms' losses are printed equal.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import attrs
import jax
import jax.numpy as jnp
from _arms import time_alternating

from pd_train.sources import uniform
from pd_train.targets import toys as T

ARMS = ("jax", "blocked")


def draw_ms(shape: tuple[int, ...], draws: str, n: int = 200) -> float:
    """CPU ms a draw of ``shape`` (best of 3 calls of ``n`` draws in a scan)."""

    def run(key: jax.Array) -> jax.Array:
        def body(acc: jax.Array, i: jax.Array) -> tuple[jax.Array, None]:
            return acc + uniform(jax.random.fold_in(key, i), shape, draws=draws), None

        return jax.lax.scan(body, jnp.zeros(shape), jnp.arange(n))[0]

    f = jax.jit(run)
    key = jax.random.key(0)
    f(key).block_until_ready()
    best = float("inf")
    for _ in range(3):
        cpu = time.process_time()
        f(key).block_until_ready()
        best = min(best, (time.process_time() - cpu) / n * 1e3)
    return best


def step_program(name: str, draws: str, k: int) -> tuple[object, object, object]:
    """(program, state, target weights) of ``name``'s K-step program with ``random_draws``."""
    toy = T.toy_config(name)
    pd = attrs.evolve(toy.pd, recon=attrs.evolve(toy.pd.recon, random_draws=draws))
    toy = attrs.evolve(toy, pd=pd)
    target = T.make_target(toy)
    trainer = T.toy_trainer(target, pd)
    run_key = jax.random.key(0)
    programs = T.KStepPrograms(
        trainer=trainer, draw=T.toy_data(toy), data_key=jax.random.fold_in(run_key, 1),
        train_key=jax.random.fold_in(run_key, 2), batch_size=pd.batch_size,
        n_features=target.config.n_features, feature_probability=toy.feature_probability,
    )  # fmt: skip
    state = trainer.init_state(key=jax.random.fold_in(run_key, 0))
    weights = jax.tree_util.tree_map(jnp.asarray, T.toy_weights(name))
    program = functools.partial(programs.program(k), values=programs.values())
    state, metrics = program(state, weights)
    jax.block_until_ready(metrics)
    return program, state, weights


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--toys", nargs="+", default=["tms_5_2", "tms_40_10"])
    parser.add_argument("--k", type=int, default=None, help="K (default 50 at C 20, else 10)")
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    T.keep_freed_memory()
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("\n| draw shape | jax CPU ms | blocked CPU ms | ratio |\n|---|---|---|---|")
    for c in (20, 200):
        shape = (4096, 1, c + 1)
        a, b = (draw_ms(shape, d) for d in ARMS)
        print(f"| {list(shape)} | {a:.3f} | {b:.3f} | {a / b:.2f}x |", flush=True)
    print("\n| toy (batch 4096) | K | arm | CPU ms a step | wall ms a step | loss/total |")
    print("|---|---|---|---|---|---|")
    for name in args.toys:
        big = T.toy_config(name).pd.decomposition_targets[0].C > 20
        k = args.k or (10 if big else 50)
        built = {d: step_program(name, d, k) for d in ARMS}
        best, loss = time_alternating(
            built, k=k, calls=args.calls, repeats=args.repeats, best_by="cpu"
        )
        for d in ARMS:
            print(f"| {name} | {k} | {d} | {best[d][1]:.1f} | {best[d][0]:.1f} | {loss[d]:.6g} |")
        ratio = best["jax"][1] / best["blocked"][1]
        print(f"{name}: blocked draws {ratio:.2f}x the CPU of jax's a step", flush=True)


if __name__ == "__main__":
    main()
