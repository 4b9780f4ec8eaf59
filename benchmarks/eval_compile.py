"""Eval compile time: the four eval masks as one mapped masked forward vs four traced forwards.

AOT, compile only: for each shipped config, a :class:`pd_train.Trainer` on a mesh of simulated
CPU devices (8 by default), the eval jit lowered on abstract params/target/batch/key (nothing
allocated) and compiled, with ``jax.clear_caches()`` before each arm and no persistent cache.

Arms:

* ``loop``: session 1's evaluator, kept here as the reference: a Python loop over the masks
  ci/ones/stochastic/rounded traces ``masked_forward`` four times (sampling switched per mask,
  ``live`` a traced array, so every layer carries a frozen/live ``lax.switch``; CI histograms
  with ``jnp.histogram``).
* ``loop-static``: the same loop with the forward as the new evaluator builds it (``live`` a
  numpy grid, so the forward is specialized to the decomposed sites; clean stream passed): tells
  how much of the gain is the specialization rather than the map.
* ``map``: pd's evaluator (:func:`pd_train.evaluate.lower_eval`): one masked forward under
  ``lax.map`` over the four masks, each mask data (its mask ci and a source scale), and the
  histograms as differences of at-least-edge counts.

Where the time goes (measured while writing this, 1 device, default config): the clean forward,
CI function and histograms are about a third of the loop's compile, and the stochastic forward
(per-site threefry draws inside the layer body) costs more than the three deterministic forwards
together, so one mapped forward saves about a quarter, not three quarters.

Each arm is compiled ``--repeats`` times, interleaved; the table shows the fastest (CPU seconds
of this process and wall seconds). Then every arm runs on random params and the same batch, and
the metrics of ``loop`` and ``map`` are compared (same masks, same key folding), with the
fastest of ``--calls`` executions (execution is not what this benchmark is about, but the map
runs its four forwards one after another, so it is shown).

    python benchmarks/eval_compile.py
    python benchmarks/eval_compile.py --configs default --repeats 1

``llama8b-full32L`` (the production config, 8 simulated devices) is compiled only. The last
line is ``eval compile: map/loop R1x at default, R2x at cpu-example, R3x at llama8b-full32L
(...)`` (CPU seconds).
"""

from __future__ import annotations

import os

# Simulated devices must be configured before jax is imported.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import attrs
import jax
import jax.numpy as jnp
import numpy as np

import pd_sharding
from pd_train import evaluate
from pd_train._forward import CleanRunner, masked_forward
from pd_train.configs import builtin_config
from pd_train.losses import kl_clean_masked, l0
from pd_train.losses.recon import site_grid
from pd_train.models import llama
from pd_train.run import prepare, target_dtype
from pd_train.squash import lower_leaky_hard
from pd_train.train import Trainer


def loop_metrics(
    trainer: Any, params: Any, target: Any, tokens: jax.Array, key: jax.Array, *, static: bool
) -> dict[str, Any]:
    """Session 1's ``Evaluator._batch_metrics`` (``static=False``: verbatim in substance), or the
    same loop over the new evaluator's forward (``static=True``)."""
    spec = trainer.forward_spec
    comps = jax.tree.map(lambda a: a.astype(trainer.compute_dtype), params["components"])
    clean = CleanRunner(spec, target, tokens)
    clean_logits, pre = trainer.ci_fn.causal_importance(params["ci_fn"], comps, clean)
    ci_lower = {k: lower_leaky_hard(v) for k, v in pre.items()}
    threshold = trainer.pd.l0_threshold
    grid = site_grid(trainer.decomposition) >= 0
    live = grid if static else jnp.asarray(grid)
    out: dict[str, Any] = {"eval/ce_clean": evaluate.cross_entropy(clean_logits, tokens)}
    for mask in evaluate.MASKS:
        sampling = {"ci": "zeros", "rounded": "zeros", "ones": "components_ones"}.get(
            mask, spec.sampling
        )
        ci = ci_lower
        if mask == "rounded":
            ci = {k: (v > threshold).astype(v.dtype) for k, v in ci_lower.items()}
        logits = masked_forward(
            attrs.evolve(spec, sampling=sampling),
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            live=live,
            routed=None,
            key=key,
            clean_stream=clean.stream if static else None,
        )
        out[f"eval/ce_{mask}"] = evaluate.cross_entropy(logits, tokens)
        out[f"eval/kl_{mask}"] = kl_clean_masked(clean_logits, logits)
    out["l0"] = l0(ci_lower, threshold)
    edges = jnp.linspace(0.0, 1.0, evaluate.HIST_BINS + 1)
    out["ci_hist"] = {
        k: jax.vmap(lambda c: jnp.histogram(jnp.clip(c, 0.0, 1.0), bins=edges)[0])(v)
        for k, v in ci_lower.items()
    }
    return out


def arm_jit(trainer: Trainer, arm: str) -> Any:
    if arm == "map":
        return evaluate.eval_jit(trainer)

    def eval_metrics(params: Any, target: Any, tokens: jax.Array, key: jax.Array) -> Any:
        return loop_metrics(trainer, params, target, tokens, key, static=arm == "loop-static")

    return jax.jit(eval_metrics, compiler_options=trainer.compiler_options or None)


ARMS = ("loop", "loop-static", "map")


class Setup(NamedTuple):
    trainer: Trainer
    batch: int
    seq_len: int
    target_dtype: Any


def setup(name: str, mesh: jax.sharding.Mesh) -> Setup:
    prepared = prepare(builtin_config(name), for_run=False)
    config = prepared.config
    trainer = Trainer(
        prepared.model,
        config.pd,
        config.runtime,
        mesh=mesh,
        compiler_options=config.runtime.compiler_options,
    )
    return Setup(trainer, config.pd.batch_size, config.data.seq_len, target_dtype(config))


def abstract_inputs(s: Setup) -> tuple[Any, ...]:
    tr = s.trainer
    shape = (s.batch, s.seq_len)
    tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=tr.batch_sharding(shape))
    key = jax.eval_shape(lambda: jax.random.key(0))
    if tr.layout is not None:
        key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=tr.layout.replicated())
    return tr.abstract_state().params, tr.abstract_target(s.target_dtype), tokens, key


class Timing(NamedTuple):
    cpu: float
    wall: float


def compile_arm(s: Setup, arm: str) -> Timing:
    jax.clear_caches()
    wall, cpu = time.perf_counter(), time.process_time()
    arm_jit(s.trainer, arm).lower(*abstract_inputs(s)).compile()
    return Timing(time.process_time() - cpu, time.perf_counter() - wall)


def concrete_inputs(s: Setup) -> tuple[Any, ...]:
    """Random params (the shapes and shardings of the run's), a random target, one batch."""
    tr = s.trainer
    rng = np.random.default_rng(0)

    def draw(a: jax.ShapeDtypeStruct) -> jax.Array:
        return jax.device_put(0.3 * rng.standard_normal(a.shape).astype(a.dtype), a.sharding)

    params = jax.tree.map(draw, tr.abstract_state().params)
    target = llama.init_params(tr.model, key=jax.random.key(0), dtype=s.target_dtype)
    target = jax.device_put(target, tr.target_shardings(target))
    rows = rng.integers(0, tr.model.vocab_size, (s.batch, s.seq_len)).astype(np.int32)
    tokens = jax.device_put(rows, tr.batch_sharding(rows.shape))
    return params, target, tokens, jax.random.key(3)


def run_arm(s: Setup, arm: str, inputs: tuple[Any, ...], calls: int) -> tuple[float, dict]:
    fn: Callable[..., Any] = arm_jit(s.trainer, arm)
    out = jax.block_until_ready(fn(*inputs))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(*inputs))
        times.append(time.perf_counter() - start)
    return min(times), jax.device_get(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--configs", nargs="+", default=["default", "cpu-example", "llama8b-full32L"]
    )
    parser.add_argument("--repeats", type=int, default=2, help="compiles per arm (fastest kept)")
    parser.add_argument("--calls", type=int, default=5, help="timed executions per arm")
    parser.add_argument(
        "--compile-only",
        nargs="*",
        default=["llama8b-full32L"],
        metavar="CONFIG",
        help="configs among --configs that are only compiled, never run (too big to run here)",
    )
    args = parser.parse_args()

    mesh = pd_sharding.make_mesh()
    print(f"devices: {len(jax.devices())} x {jax.devices()[0].platform}; jax {jax.__version__}")
    ratios = []
    for name in args.configs:
        s = setup(name, mesh)
        tr = s.trainer
        print(
            f"\n## {name}: {tr.model.num_hidden_layers} layers, hidden {tr.model.hidden_size}, "
            f"{len(tr.decomposition.sites)} sites, batch {s.batch}x{s.seq_len}",
            flush=True,
        )
        best: dict[str, Timing] = {}
        for _ in range(args.repeats):
            for arm in ARMS:
                t = compile_arm(s, arm)
                if arm not in best or t.cpu < best[arm].cpu:
                    best[arm] = t
        run_s: dict[str, float] = {}
        outs: dict[str, dict] = {}
        if name not in args.compile_only:
            inputs = concrete_inputs(s)
            for arm in ARMS:
                run_s[arm], outs[arm] = run_arm(s, arm, inputs, args.calls)
        print("| arm | compile CPU s | compile wall s | CPU vs loop | eval call s |")
        print("|---|---:|---:|---:|---:|")
        for arm in ARMS:
            t = best[arm]
            call = f"{run_s[arm]:.4f}" if arm in run_s else "-"
            ratio = t.cpu / best["loop"].cpu
            print(f"| {arm} | {t.cpu:.2f} | {t.wall:.2f} | {ratio:.2f}x | {call} |")
        if outs:
            print(max_difference(outs))
        ratios.append((name, best["map"].cpu / best["loop"].cpu, best["loop"], best["map"]))
    parts = ", ".join(f"{r:.2f}x at {n}" for n, r, _, _ in ratios)
    detail = "; ".join(f"{n} loop {lo.cpu:.1f}s map {m.cpu:.1f}s CPU" for n, _, lo, m in ratios)
    print(f"\neval compile: map/loop {parts} ({detail})")


def max_difference(outs: dict[str, dict]) -> str:
    """The largest relative difference between the map's and the loop's eval metrics."""
    diffs = {
        k: abs(float(outs["map"][k]) - float(outs["loop"][k]))
        / max(abs(float(outs["loop"][k])), 1e-12)
        for k in outs["loop"]
        if k.startswith("eval/")
    }
    worst = max(diffs, key=diffs.__getitem__)
    kls = ", ".join(f"{m} {float(outs['map'][f'eval/kl_{m}']):.4g}" for m in evaluate.MASKS)
    return (
        f"metrics map vs loop: max relative difference {diffs[worst]:.1e} ({worst}); "
        f"KL per mask (map): {kls}"
    )


if __name__ == "__main__":
    main()
