"""One site's ``pd.ci.type: mlp`` CI function, forward and backward, whole against blocked over
the batch (``pd.ci.batch_block``).

Each arm runs ``--steps`` fwd+bwd steps of one site's CI MLP ([B, 1, C] -> hidden 16 -> 1,
exact GELU) inside one jitted ``lax.scan`` (as the toys' K-step programs run them: a step's
parameters are the previous step's minus a small multiple of their gradient, so nothing is
hoisted out of the loop), after a compile-and-warm call. It reports per step the CPU ms of the
process (user + system) and the wall ms, the best of ``--repeats``, and each blocked arm's ratio
to the whole one (CPU and wall). Shapes: TMS 40-10 (B 4096, C 200), TMS 5-2 (B 4096, C 20),
resid_mlp1 (B 2048, C 100). It starts with the machine's speed (a pure-Python loop of 30 M
additions, as ``benchmarks/time_to_first_step.py`` prints it): the machine may be shared, so
compare the ratios, not the absolute figures, across runs. The blocked arms are listed at
``PULLBACKS`` (``written`` is what ``pd.ci.batch_block`` runs); a block of all the rows (4096)
is the written-out program without blocking.

    python benchmarks/ci_mlp.py [--blocks 64 128 256 4096] [--pullbacks autodiff written]
        [--shapes tms_40_10 tms_5_2 resid_mlp1] [--steps 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp

from pd_train.ci.mlp import MLPCIFunction, blocked_over_rows, one_layer_forward, one_layer_pullback
from pd_train.decomposition import KindLayout

SHAPES = {"tms_40_10": (4096, 200), "tms_5_2": (4096, 20), "resid_mlp1": (2048, 100)}
HIDDEN = (16,)
#: The toy programs' compiler options (YNN fusions off, as pd_train.targets.toys sets per jit).
OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def _params(c: int, key: jax.Array) -> dict[str, jax.Array]:
    fn = MLPCIFunction(hidden_dims=HIDDEN)
    layout = KindLayout(kind="linear1", layers=(0,), d_in=1, d_out=1, C=c)
    specs = fn.param_specs(layout)
    keys = jax.random.split(key, len(specs))
    return {
        name: 0.5 * jax.random.normal(k, spec.shape, jnp.float32)
        for k, (name, spec) in zip(keys, specs.items(), strict=True)
    }


#: The blocked arms (``backward`` column): ``autodiff``, today's forward (``site_apply``) and
#: JAX's VJP of each block's recomputed forward; ``written_vjp`` / ``written_vjp_erfc``, today's
#: forward and the one-layer VJP written out (Φ in the erf / erfc form); ``written``, the forward
#: and the VJP written out, Φ in the erf form: what ``pd.ci.batch_block`` runs at one hidden layer.
PULLBACKS = {
    "autodiff": None,
    "written_vjp": one_layer_pullback,
    "written_vjp_erfc": functools.partial(one_layer_pullback, erf_form=False),
    "written": one_layer_pullback,
}


def program(block: int | None, pullback: str, steps: int):
    """A jitted ``(params, inner, g) -> (params, inner)`` running ``steps`` fwd+bwd steps."""
    fn = MLPCIFunction(hidden_dims=HIDDEN)

    def site(params, inner):
        if block is None:
            return fn.site_apply(params, inner)
        fwd = one_layer_forward if pullback == "written" else fn.site_apply
        return blocked_over_rows(fwd, block, PULLBACKS[pullback])(params, inner)

    def step(carry, _):
        params, inner, g = carry
        out, vjp = jax.vjp(site, params, inner)
        d_params, d_inner = vjp(g * jnp.tanh(out))
        params = jax.tree.map(lambda p, d: p - 1e-6 * d, params, d_params)
        return (params, inner - 1e-6 * d_inner, g), None

    def run(params, inner, g):
        (params, inner, _), _ = jax.lax.scan(step, (params, inner, g), None, length=steps)
        return params, inner

    return jax.jit(run, compiler_options=OPTIONS)


def measure(
    block: int | None, pullback: str, b: int, c: int, steps: int, repeats: int
) -> tuple[float, float]:
    """Best (CPU ms, wall ms) per step over ``repeats`` calls, after a warm call."""
    key = jax.random.key(0)
    params = _params(c, key)
    inner = jax.random.normal(jax.random.fold_in(key, 1), (b, 1, c))
    g = jax.random.normal(jax.random.fold_in(key, 2), (b, 1, c))
    run = program(block, pullback, steps)
    jax.block_until_ready(run(params, inner, g))
    cpu, wall = [], []
    for _ in range(repeats):
        t_cpu, t_wall = time.process_time(), time.perf_counter()
        jax.block_until_ready(run(params, inner, g))
        cpu.append((time.process_time() - t_cpu) / steps * 1e3)
        wall.append((time.perf_counter() - t_wall) / steps * 1e3)
    return min(cpu), min(wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--blocks", type=int, nargs="+", default=[64, 128, 256, 4096])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument(
        "--pullbacks", nargs="+", default=["autodiff", "written"], choices=list(PULLBACKS)
    )
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import importlib.util
    import pathlib

    here = pathlib.Path(__file__).parent / "time_to_first_step.py"
    spec = importlib.util.spec_from_file_location("_ttfs", here)
    assert spec is not None and spec.loader is not None
    ttfs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ttfs)
    loop_s = ttfs.python_loop_seconds()
    print(f"machine speed: a pure-Python loop of 30 M additions takes {loop_s:.2f} CPU s")
    print(
        f"load average: {os.getloadavg()[0]:.1f}; {args.steps} steps a call, best of {args.repeats}"
    )
    print()
    print(
        "| shape | B | C | batch_block | backward | CPU ms / step | wall ms / step | CPU / wall "
        "| whole / this (CPU) | whole / this (wall) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.shapes:
        b, c = SHAPES[name]
        base_cpu, base_wall = measure(None, "autodiff", b, c, args.steps, args.repeats)
        rows = [(None, "autodiff", base_cpu, base_wall)]
        for block in args.blocks:
            for pb in args.pullbacks:
                rows.append((block, pb, *measure(block, pb, b, c, args.steps, args.repeats)))
        for block, pb, cpu, wall in rows:
            print(
                f"| {name} | {b} | {c} | {block if block else 'None (whole)'} | {pb} | {cpu:.2f} "
                f"| {wall:.2f} | {cpu / wall:.2f} | {base_cpu / cpu:.2f}x | {base_wall / wall:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
