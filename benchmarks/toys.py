"""Built-in toy decompositions: wall time, steps per second and the identity-CI error reached.

    .venv/bin/python benchmarks/toys.py [--seeds 0 1] [--toys tms_5_2]

Each toy is decomposed from its shipped pretrained weights with its built-in recipe
(:data:`pd_train.targets.toys.TOYS`); the wall time includes the train step's compile. One row
per (toy, seed); the table is what pd-train's README shows. ``CPU s`` is this process's CPU
time (the wall time depends on what else runs on the machine). "recovered": every feature of
every identity matrix has its own component (a residual MLP's ``mlp_out`` is dense: its alive
components are reported, about d_mlp are expected).
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
        "| toy | seed | steps | wall s (incl. compile) | CPU s | steps/s "
        "| per matrix: features recovered, identity-CI error (dense: alive components) "
        "| recovered |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.toys:
        for seed in args.seeds:
            cpu = time.process_time()
            metrics, ci, _ = run_toy(name, seed=seed)
            cpu = time.process_time() - cpu
            cells, recovered = [], True
            for site in ci:
                if f"gt/recovered/{site}" in metrics:
                    frac = metrics[f"gt/features_recovered/{site}"]
                    err = metrics[f"gt/identity_ci_error/{site}"]
                    cells.append(f"{site} {frac:.0%}, {err:.3f}")
                    recovered &= metrics[f"gt/recovered/{site}"] == 1.0
                else:
                    cells.append(f"{site} dense: {metrics[f'gt/alive/{site}']:.0f} alive")
            steps = TOYS[name].pd.steps
            print(
                f"| {name} | {seed} | {steps} | {metrics['time_s']:.1f} | {cpu:.1f} | "
                f"{metrics['steps_per_s']:.0f} | {'; '.join(cells)} | "
                f"{'yes' if recovered else 'no'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
