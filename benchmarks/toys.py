"""The SPD paper's toys, decomposed with pd's built-in recipes and judged by the reference's
metrics, beside the paper's values; then the K-step programs against one step per call.

    .venv/bin/python benchmarks/toys.py [--toys tms_5_2 tms_5_2_fast ...] [--seeds 0 1]
        [--rate-toys tms_5_2 ...] [--rate-steps 2000] [--rate-arms both|k] [--eval-every N]
        [--save-ci DIR] [--ynn-fusions TYPES] [--malloc-default] [--devices N]
        [--set pd.FIELD=VALUE ...]

One table per toy: a row per seed (steps, batch, wall s including compile, this process's CPU
s, steps/s and samples/s of the whole run, MMCS / ML2R of linear1 for TMS, IdentityCIError and
DenseCIError totals, alive components per site, reproduced) and a row with the paper's values
and settings. "Reproduced": IdentityCIError 0 and DenseCIError 0 (the reference's tolerance
0.1), and MMCS ≥ 0.99 for TMS, on every seed. Then

    toys: N of 7 reproduced (paper settings for S of 7)
    toy step: K-step programs R.Rx the steps/s of one step per call at tms_5_2

where a toy counts as reproduced by its paper recipe or, failing that, its ``*_fast`` one, and
S counts the toys reproduced at the paper's own settings. The step rate is measured after the
first call (no compile): the steps finished between the first and the last stamp of
``CallTimes`` (each taken when a call's program has finished) over their wall time and this
process's CPU time, at K = 1 and at the toy's K, for each toy in ``--rate-toys``. Both arms run
with ``keep_freed_memory()`` as ``pd-train run`` of a toy does (glibc keeps the programs'
freed temporaries instead of unmapping them: without it one step per call at batch 4096 pays
~14 ms of page faults a call); ``--malloc-default`` leaves glibc's thresholds as they are. The machine is shared: the
wall times depend on what else runs; CPU s is this process's.

The toy programs compile without XLA:CPU's YNNPACK fusions (``toy_compiler_options``: as YNN
fusions the CI MLPs' multiply-reduce fusions over [B, 1, C, d_gate] were the step's largest
cost; a TMS 5-2 step at batch 4096 cost 93 ms CPU with them, 45 ms without; docs/toys.md).
``--ynn-fusions TYPES`` puts ``--xla_cpu_experimental_ynn_fusion_type=TYPES`` in XLA_FLAGS
before JAX starts (e.g. ``dot,reduce``), which the toy programs then leave to XLA.

``--rate-arms k`` times only the toy's own K (no one-step-per-call arm): a probe of what a
recipe's steps cost on a new machine. ``--eval-every N`` prints the reference's metrics every N
steps of a toy run (a trajectory; N a multiple of the toy's K), so a run stopped early still
says where it was. ``--save-ci DIR`` writes each run's one-hot CI per site and its metrics to
``DIR/{toy}_seed{seed}.npz`` (keys ``ci/{site}`` [features, C] and ``metrics``, a JSON string):
what a failed criterion is made of can then be read off a run on another machine. The header
names the backend and device, and ``JAX_DEFAULT_MATMUL_PRECISION`` (on an accelerator
``highest`` keeps float32 products as a CPU computes them, where the default may round their
inputs to bfloat16).

``--set pd.FIELD=VALUE`` (repeatable) changes the recipe of every toy run and rate arm as
``pd-train run --set`` does (e.g. ``--set 'pd.loss_metrics[1].pnorm_end=1.0'``, a paper
recipe's importance term; its first is faithfulness); each toy's
changed recipe is checked by field path before anything runs, the table says it was changed,
and the count line then says so and counts no toy at the paper's settings.

``--devices N`` (default 1) runs every toy run and both rate arms data-parallel over N devices
(``run_toy(devices=N)``; on the CPU the process gets N simulated host devices, set in XLA_FLAGS
before JAX starts: one core each; docs/toys.md "Both cores").
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

PAPER = ("tms_5_2", "tms_40_10", "tms_5_2_id", "tms_40_10_id", "resid_mlp1", "resid_mlp2",
         "resid_mlp3")  # fmt: skip
YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type"


def _cell(metrics: dict[str, float], key: str, fmt: str = "{:.3f}") -> str:
    return fmt.format(metrics[key]) if key in metrics else "—"


#: ``--devices``: the toy runs' data-parallel devices.
DEVICES = 1
#: ``--eval-every``: the toy runs' trajectory cadence (0: none).
EVAL_EVERY = 0
#: ``--save-ci``: where each run's one-hot CI goes (None: nowhere).
SAVE_CI: Path | None = None
#: ``--set``: recipe overrides applied to every toy run (empty: the built-in recipes).
OVERRIDES: list[str] = []


def _print_eval(name: str, seed: int, start: float) -> Callable[[int, dict[str, float]], None]:
    def on_eval(n: int, m: dict[str, float]) -> None:
        print(
            f"  {name} seed {seed} step {n}: {time.perf_counter() - start:.0f} s, "
            f"MMCS {_cell(m, 'gt/mmcs')}, ML2R {_cell(m, 'gt/ml2r')}, "
            f"IdentityCIError {_cell(m, 'gt/identity_ci_error', '{:.0f}')}, "
            f"DenseCIError {_cell(m, 'gt/dense_ci_error', '{:.0f}')}",
            flush=True,
        )

    return on_eval


def recipe(name: str) -> Any:
    """``name``'s decomposition recipe with this invocation's ``--set`` overrides applied."""
    from pd_train.cli.toy import load_toy_config, toy_pd_config

    return toy_pd_config(load_toy_config(f"builtin:{name}", OVERRIDES))


def run_table(name: str, seeds: list[int]) -> bool:
    """Decompose ``name`` on each seed, print its table; whether every seed reproduced."""
    from pd_train.targets.toys import TOYS, run_toy, toy_config

    toy = toy_config(name)
    pd = recipe(name)
    print(f"\n### {name}" + (f" ({toy.deviation})" if toy.deviation else ""))
    if OVERRIDES:
        print(f"recipe changed by --set {' --set '.join(OVERRIDES)}")
    print(
        "| seed | steps | batch | K | wall s | CPU s | steps/s | samples/s | MMCS | ML2R "
        "| IdentityCIError | DenseCIError | alive (one-hot) | reproduced |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for seed in seeds:
        cpu = time.process_time()
        on_eval = _print_eval(name, seed, time.perf_counter()) if EVAL_EVERY else None
        m, ci, _ = run_toy(
            name, seed=seed, pd=pd, devices=DEVICES, eval_every=EVAL_EVERY, on_eval=on_eval
        )
        cpu = time.process_time() - cpu
        if SAVE_CI is not None:
            arrays = {f"ci/{site}": np.asarray(v) for site, v in ci.items()}
            np.savez(SAVE_CI / f"{name}_seed{seed}.npz", metrics=json.dumps(m), **arrays)
        alive = ", ".join(f"{s.split('.', 1)[1]} {m[f'gt/alive_one_hot/{s}']:.0f}" for s in ci)
        ok &= m["reproduced"] == 1.0
        print(
            f"| {seed} | {pd.steps} | {pd.batch_size} | {toy.steps_per_call} "
            f"| {m['time_s']:.0f} | {cpu:.0f} | {m['steps_per_s']:.0f} | {m['samples_per_s']:.3g} "
            f"| {_cell(m, 'gt/mmcs')} | {_cell(m, 'gt/ml2r')} "
            f"| {_cell(m, 'gt/identity_ci_error', '{:.0f}')} "
            f"| {_cell(m, 'gt/dense_ci_error', '{:.0f}')} | {alive} "
            f"| {'yes' if m['reproduced'] else 'no'} |",
            flush=True,
        )
    paper = TOYS[name.removesuffix("_fast")]
    mmcs, ml2r = paper.paper.get("mmcs"), paper.paper.get("ml2r")
    print(
        f"| paper | {paper.pd.steps} | {paper.pd.batch_size} | | | | | "
        f"| {'—' if mmcs is None else f'{mmcs:.3f}'} | {'—' if ml2r is None else f'{ml2r:.3f}'} "
        "| 0 | 0 | | |"
    )
    return ok


def step_rate(name: str, k: int, steps: int) -> tuple[float, float, float]:
    """(steps/s, samples/s, steps per CPU s of this process) of ``steps`` steps at K = ``k``,
    the first call (compile) excluded: :class:`~pd_train.targets.toys.CallTimes` stamps the
    steps finished when a call's program has finished, every ``log_every`` steps and at the
    end, and the rate counts the steps between the first stamp and the last over their time.
    (Before 2026-12-02 the rate was taken from the loss records' step indices, which name the
    first step of a call but were stamped when that call ended: at K = 100 over 300 steps that
    counted 199 steps over the time of one call, twice the true rate.)"""
    import attrs

    from pd_train.targets.toys import CallTimes, make_target, run_toy, toy_config, toy_trainer

    toy = toy_config(name)
    pd = attrs.evolve(recipe(name), steps=steps)
    log_every = max(k, (steps // 10) // k * k)
    times = CallTimes(log_every)
    run_toy(
        name, pd=pd, steps_per_call=k, log_every=log_every, hooks=(times,),
        trainer=toy_trainer(make_target(toy), pd), devices=DEVICES,
    )  # fmt: skip
    _, rate, per_cpu = times.rate()
    return rate, rate * pd.batch_size, per_cpu


def _toy_names() -> list[str]:
    """The built-in toys' names, read without starting JAX (the XLA flags are set first)."""
    fast = [f"{n}_fast" for n in PAPER]
    return sorted([*PAPER, *fast])


def main() -> None:
    parser = argparse.ArgumentParser()
    names = _toy_names()
    parser.add_argument("--toys", nargs="*", default=list(PAPER), choices=names)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--rate-steps", type=int, default=2000)
    parser.add_argument(
        "--rate-toys", nargs="*", default=["tms_5_2", "tms_5_2_fast"], choices=names
    )
    parser.add_argument(
        "--rate-arms", choices=("both", "k"), default="both",
        help="k: time only each rate toy's own K (no one-step-per-call arm)",
    )  # fmt: skip
    parser.add_argument("--eval-every", type=int, default=0, help="print metrics every N steps")
    parser.add_argument("--save-ci", type=Path, default=None, metavar="DIR")
    parser.add_argument("--ynn-fusions", default=None, metavar="TYPES")
    parser.add_argument(
        "--malloc-default", action="store_true",
        help="leave glibc's malloc thresholds as they are (no keep_freed_memory)",
    )  # fmt: skip
    parser.add_argument("--devices", type=int, default=1, help="data-parallel devices")
    parser.add_argument(
        "--set", action="append", default=[], metavar="pd.FIELD=VALUE", dest="overrides",
        help="change every run toy's recipe as pd-train run --set does (pd. fields only); "
        "a changed recipe does not count as the paper's",
    )  # fmt: skip
    args = parser.parse_args()
    global DEVICES, EVAL_EVERY, SAVE_CI, OVERRIDES
    OVERRIDES = args.overrides
    bad_set = [o for o in OVERRIDES if not o.startswith("pd.")]
    if bad_set:
        parser.error(f"--set: got {bad_set[0]!r}; only pd.<field>=<value> (the recipe) is allowed")
    DEVICES = args.devices
    EVAL_EVERY = args.eval_every
    SAVE_CI = args.save_ci
    if args.devices > 1:
        flag = f"--xla_force_host_platform_device_count={args.devices}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    if args.ynn_fusions is not None:
        flag = f"{YNN_FLAG}={args.ynn_fusions}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    from pd_train.targets.toys import TOYS, keep_freed_memory, toy_config

    # Refused before any run: a cadence no toy's K divides, a --save-ci that is no directory.
    if args.eval_every < 0:
        parser.error(f"--eval-every: got {args.eval_every}; must be >= 0 (0: no trajectory)")
    bad = [f"{n} K {toy_config(n).steps_per_call}" for n in args.toys
           if args.eval_every % toy_config(n).steps_per_call]  # fmt: skip
    if bad:
        parser.error(
            f"--eval-every: got {args.eval_every}; must be a multiple of ({', '.join(bad)})"
        )
    from pd_train.config.io import ConfigError

    for n in {*args.toys, *args.rate_toys}:
        try:
            recipe(n)
        except ConfigError as exc:
            parser.error(f"--set on {n}: {exc}")
    if SAVE_CI is not None:
        try:
            SAVE_CI.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            parser.error(f"--save-ci: cannot make the directory {str(SAVE_CI)!r} ({exc})")

    if not args.malloc_default:
        keep_freed_memory()  # as pd-train run of a toy does

    assert set(names) == set(TOYS), sorted(set(names) ^ set(TOYS))
    ynn = "off (the toy programs' default)" if args.ynn_fusions is None else args.ynn_fusions
    print(f"XLA:CPU YNN fusions {ynn}; XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    malloc = "glibc default" if args.malloc_default else "keep_freed_memory()"
    print(f"malloc: {malloc}; devices {DEVICES}; load average {os.getloadavg()[0]:.1f}")
    import jax

    precision = os.environ.get("JAX_DEFAULT_MATMUL_PRECISION", "default")
    print(
        f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}); matmul precision {precision}"
    )
    ok = {name: run_table(name, args.seeds) for name in args.toys}
    print(
        "\n| toy | K | steps/s K=1 | samples/s K=1 | steps/CPU s K=1 | steps/s K | samples/s K "
        "| steps/CPU s K | ratio (wall) | ratio (CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = {}
    for name in args.rate_toys:
        k = toy_config(name).steps_per_call
        if args.rate_arms == "k":
            many, many_s, many_c = step_rate(name, k, args.rate_steps)
            print(
                f"| {name} | {k} | | | | {many:.1f} | {many_s:.3g} | {many_c:.1f} | | |",
                flush=True,
            )
            continue
        one, one_s, one_c = step_rate(name, 1, args.rate_steps)
        many, many_s, many_c = step_rate(name, k, args.rate_steps)
        ratios[name] = many / one
        print(
            f"| {name} | {k} | {one:.0f} | {one_s:.3g} | {one_c:.0f} | {many:.0f} "
            f"| {many_s:.3g} | {many_c:.0f} | {many / one:.1f}x | {many_c / one_c:.1f}x |",
            flush=True,
        )
    reproduced = sum(ok.get(n, False) or ok.get(f"{n}_fast", False) for n in PAPER)
    at_paper = sum(ok.get(n, False) for n in PAPER)
    changed = " with the recipes changed by --set" if OVERRIDES else ""
    if OVERRIDES:
        at_paper = 0  # a changed recipe is not the paper's
    print(f"\ntoys: {reproduced} of 7 reproduced{changed} (paper settings for {at_paper} of 7)")
    for name in ("tms_5_2", "tms_5_2_fast"):
        if name in ratios:
            print(
                f"toy step: K-step programs {ratios[name]:.1f}x the steps/s of one step per "
                f"call at {name}"
            )
            break


if __name__ == "__main__":
    main()
