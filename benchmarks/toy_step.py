"""A TMS toy step at the paper's batch (4096) on one device against data-parallel over two host
devices (``decompose(devices=2)``, the toy config's ``devices``), side by side in one process.

    python benchmarks/toy_step.py [--toys tms_5_2 tms_5_2_id tms_40_10] [--k 50] [--calls 2]
        [--repeats 2] [--devices 1 2]

The process starts with ``--xla_force_host_platform_device_count`` = the largest of
``--devices`` (set here, before JAX starts). Per toy and arm: the toy's K-step program (its
recipe as shipped, the state and target placed as :func:`pd_train.targets.toys.decompose` places
them), after a compile-and-warm call; over ``--calls`` calls, best of ``--repeats`` (by wall)
with the arms alternating: wall ms a step, steps/s, and CPU ms a step of the process (user +
system). Both arms start from the same state and draw the same batches; their losses after the
timed calls are printed (equal up to float rounding). What two devices buy is wall time on two
free cores (their CPU per step is one device's): on a shared machine the wall figures are the
load's (printed beside them); run it alone for the rate.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--toys", nargs="+", default=["tms_5_2", "tms_5_2_id", "tms_40_10"])
    parser.add_argument("--k", type=int, default=None, help="K (default 50 at C 20, else 5)")
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2])
    return parser.parse_args()


ARGS = _parse() if __name__ == "__main__" else None
if ARGS is not None:
    flag = f"--xla_force_host_platform_device_count={max(ARGS.devices)}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _arms import time_alternating  # noqa: E402

from pd_train.targets import toys as T  # noqa: E402


def step_program(name: str, devices: int, k: int) -> tuple[object, object, object]:
    """(program, state, target) of ``name``'s K-step program over ``devices`` devices."""
    toy = T.toy_config(name)
    target = T.make_target(toy)
    trainer = T.toy_trainer(target, toy.pd)
    run_key = jax.random.key(0)
    programs = T.KStepPrograms(
        trainer=trainer, draw=T.toy_data(toy), data_key=jax.random.fold_in(run_key, 1),
        train_key=jax.random.fold_in(run_key, 2), batch_size=toy.pd.batch_size,
        n_features=target.config.n_features, feature_probability=toy.feature_probability,
        mesh=T.toy_mesh(devices, batch_size=toy.pd.batch_size),
    )  # fmt: skip
    state = trainer.init_state(key=jax.random.fold_in(run_key, 0))
    weights = jax.tree_util.tree_map(jnp.asarray, T.toy_weights(name))
    state, weights = programs.place((state, weights))
    program = functools.partial(programs.program(k), values=programs.values())
    state, metrics = program(state, weights)
    jax.block_until_ready(metrics)
    return program, state, weights


def main() -> None:
    assert ARGS is not None
    T.keep_freed_memory()
    print(f"load average {os.getloadavg()[0]:.1f}, {jax.device_count()} devices", flush=True)
    print("\n| toy (batch 4096) | K | devices | wall ms a step | steps/s | CPU ms a step |")
    print("|---|---|---|---|---|---|")
    for name in ARGS.toys:
        big = T.toy_config(name).pd.decomposition_targets[0].C > 20
        k = ARGS.k or (5 if big else 50)
        built = {n: step_program(name, n, k) for n in ARGS.devices}
        best, loss = time_alternating(
            built, k=k, calls=ARGS.calls, repeats=ARGS.repeats, best_by="wall"
        )
        for n in ARGS.devices:
            wall_ms, cpu_ms = best[n]
            rate = 1e3 / wall_ms
            print(f"| {name} | {k} | {n} | {wall_ms:.1f} | {rate:.0f} | {cpu_ms:.1f} |")
        one, many = ARGS.devices[0], ARGS.devices[-1]
        print(
            f"{name}: {many} devices {best[one][0] / best[many][0]:.2f}x the steps/s of {one} "
            f"(CPU a step {best[many][1] / best[one][1]:.2f}x; load {os.getloadavg()[0]:.1f}); "
            "loss/total after the calls " + ", ".join(f"{n}: {loss[n]:.7g}" for n in ARGS.devices),
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
