"""Time to first step after a one-field change of the default config, from a warm cache.

Launches ``pd-train run --max-steps 1`` as fresh processes on one compile cache (as
benchmarks/time_to_first_step.py does: the embedded default, shortened to no eval and a
3-step faithfulness warmup): once into the empty cache (cold), once again (warm), then once per
single-field change of the base config (seed, steps, each loss coefficient, the lrs, the p
anneal, a warmup, the persistent-PGD lr; and the structural batch size, C and seq_len). Each
change is made from the base config, into the cache the earlier launches filled. Per launch the
table gives the time to the end of step 0, whether the field is a *value* or *structural*
(:mod:`pd_train.config.hyperparameters`), and which jits missed the persistent compile cache (from
the run's compile.json; the train step counts as a hit when it loaded from the executable
cache). Prints last:

    config change: V of V value changes hit the cache, warm TTFS/cold R.RR

(the value changes whose every jit hit, of all value changes; the slowest value change's time
to first step over the cold launch's), after a line with the value changes' median wall and CPU
ratios (on a shared machine the slowest of the wall times is mostly the other load's). Value fields must hit (issue 27, DESIGN decision 9);
structural ones miss, as they must.

    nice -n 10 python benchmarks/config_change.py [--only seed,pd.steps] [--pycache-prefix DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from time_to_first_step import (
    bytecode_state,
    cache_bytecode_in,
    first_step_seconds,
    python_loop_seconds,
)

#: (label, override) of each single-field change of the default config.
CHANGES: tuple[tuple[str, str], ...] = (
    ("seed", "seed=7"),
    ("steps", "pd.steps=600"),
    ("faithfulness coeff", "pd.loss_metrics[0].coeff=2000.0"),
    ("importance coeff", "pd.loss_metrics[1].coeff=0.001"),
    ("stochastic recon coeff", "pd.loss_metrics[2].coeff=2.0"),
    ("subset recon coeff", "pd.loss_metrics[3].coeff=2.0"),
    ("persistent PGD coeff", "pd.loss_metrics[4].coeff=1.0"),
    ("components lr", "pd.components.lr=0.004"),
    ("CI fn lr", "pd.ci_fn.lr=0.004"),
    ("p anneal end", "pd.loss_metrics[1].anneal_end_frac=0.7"),
    ("components warmup", "pd.components.warmup_steps=40"),
    ("persistent PGD lr", "pd.loss_metrics[4].optimizer.lr=0.02"),
    ("batch size", "pd.batch_size=16"),
    ("C (mlp sites)", "pd.decomposition_targets[1].C=96"),
    ("seq_len", "data.seq_len=32"),
)
#: benchmarks/time_to_first_step.py's shortening of the default.
BASE = ["cadence.eval_every=0", "cadence.save_every=0", "pd.faithfulness_warmup.steps=3"]


def field_kind(config: str, override: str) -> str:
    from pd_train.cli import config_source
    from pd_train.config import hyperparameters
    from pd_train.config.io import unstructure
    from pd_train.config.run import load_config

    loaded, _ = load_config(config_source(config), BASE)
    path = override.split("=", 1)[0]
    return hyperparameters.leaf_class(path, unstructure(loaded)).kind


def missed_jits(run_dir: Path) -> list[str]:
    """The jits of a run that compiled instead of loading from a cache (compile.json)."""
    record = json.loads((run_dir / "compile.json").read_text())
    missed = []
    for name, entry in record["jits"].items():
        if any(c["cache"] == "miss" for c in entry["compiles"]):
            missed.append(name)
    return missed


def launch(
    config: str, cache: Path, out: Path, overrides: list[str]
) -> tuple[float, float, list[str]]:
    """(wall seconds to the end of step 0, the launch's CPU seconds by then, missed jits)."""
    before = set(out.iterdir())
    wall, cpu, _ = first_step_seconds(config, cache, out, overrides)
    (run_dir,) = set(out.iterdir()) - before
    return wall, float("nan") if cpu is None else cpu, missed_jits(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="builtin:default")
    parser.add_argument("--only", help="comma-separated labels or paths of CHANGES to run")
    parser.add_argument(
        "--pycache-prefix",
        type=Path,
        help="launch with Python's bytecode cached in this directory (PYTHONPYCACHEPREFIX; "
        "where PYTHONDONTWRITEBYTECODE is set, every launch compiles pd's modules otherwise)",
    )
    args = parser.parse_args()
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.pycache_prefix is not None:
        cache_bytecode_in(args.pycache_prefix)
    print(
        f"machine speed: a pure-Python loop of 30 M additions takes {python_loop_seconds():.2f} "
        f"CPU s; Python imports: jax {bytecode_state()}, pd_train {bytecode_state('pd_train')}"
    )
    changes = list(CHANGES)
    if args.only:
        wanted = set(args.only.split(","))
        changes = [c for c in changes if c[0] in wanted or c[1].split("=")[0] in wanted]
    rows: list[tuple[str, str, str, float, float, list[str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "runs"
        out.mkdir()
        cold, cold_cpu, cold_missed = launch(args.config, cache, out, BASE)
        rows.append(("cold (empty cache)", "-", "-", cold, cold_cpu, cold_missed))
        warm, warm_cpu, warm_missed = launch(args.config, cache, out, BASE)
        rows.append(("warm (same config)", "-", "-", warm, warm_cpu, warm_missed))
        for label, override in changes:
            kind = field_kind(args.config, override)
            wall, cpu, missed = launch(args.config, cache, out, [*BASE, override])
            rows.append((label, override, kind, wall, cpu, missed))
            print(f"{label}: {wall:.1f} s, missed {missed or 'nothing'}", file=sys.stderr)
    print(
        "| change | override | field | time to step 0 | /cold | CPU s to step 0 | /cold "
        "| jits that missed the cache |"
    )
    print("|---|---|---|---:|---:|---:|---:|---|")
    for label, override, kind, wall, cpu, missed in rows:
        shown = ", ".join(missed) if missed else "none (all hit)"
        print(
            f"| {label} | `{override}` | {kind} | {wall:.1f} s | {wall / cold:.2f} | "
            f"{cpu:.1f} | {cpu / cold_cpu:.2f} | {shown} |"
        )
    values: list[tuple[Any, ...]] = [r for r in rows if r[2] == "value"]
    hit = sum(not r[5] for r in values)
    worst = max((r[3] for r in values), default=float("nan"))
    worst_cpu = max((r[4] for r in values), default=float("nan"))
    structural = [r for r in rows if r[2] == "structural"]
    print(
        f"\nstructural changes that missed: {sum(bool(r[5]) for r in structural)} of "
        f"{len(structural)}; warm (same config) {warm / cold:.2f} of cold; the slowest value "
        f"change's CPU s to step 0 over the cold launch's: {worst_cpu / cold_cpu:.2f}"
    )
    # On a shared machine the slowest of V wall times is mostly the other load's; the median
    # and the CPU seconds are what the launch itself costs.
    median_wall = statistics.median(r[3] for r in values) if values else float("nan")
    median_cpu = statistics.median(r[4] for r in values) if values else float("nan")
    print(
        f"value changes, median of {len(values)}: time to step 0 {median_wall / cold:.2f} of "
        f"cold, CPU s to step 0 {median_cpu / cold_cpu:.2f} of cold ({median_cpu:.1f} of "
        f"{cold_cpu:.1f} CPU s)"
    )
    print(
        f"config change: {hit} of {len(values)} value changes hit the cache, "
        f"warm TTFS/cold {worst / cold:.2f}"
    )


if __name__ == "__main__":
    main()
