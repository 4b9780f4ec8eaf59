"""Built-in toy decompositions: wall time, steps per second and the identity-CI error reached.

    .venv/bin/python benchmarks/toys.py [--seeds 0 1] [--toys tms_5_2]

Each toy is decomposed from its shipped pretrained weights with its built-in recipe
(:data:`pd_train.targets.toys.TOYS`); the wall time includes the train step's compile. One row
per (toy, seed); the table is what pd-train's README shows.
"""

from __future__ import annotations

import argparse
import time

from pd_train.targets.toys import TOYS, run_toy


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--toys", nargs="+", default=sorted(TOYS), choices=sorted(TOYS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    args = parser.parse_args()
    print(
        "| toy | seed | steps | wall s (incl. compile) | CPU s | steps/s | identity-CI error per matrix | recovered |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.toys:
        for seed in args.seeds:
            cpu = time.process_time()
            metrics, _ = run_toy(name, seed=seed)
            cpu = time.process_time() - cpu
            errors = {k.split("/", 2)[2]: v for k, v in metrics.items() if "identity_ci_error" in k}
            recovered = all(v == 1.0 for k, v in metrics.items() if k.startswith("gt/recovered/"))
            err = ", ".join(f"{site} {value:.3f}" for site, value in errors.items())
            steps = TOYS[name].pd.steps
            print(
                f"| {name} | {seed} | {steps} | {metrics['time_s']:.1f} | {cpu:.1f} | "
                f"{metrics['steps_per_s']:.0f} | {err} | {'yes' if recovered else 'no'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
