"""Why unrolled identical work compiles cheaply on XLA:CPU: identical fused kernels are reused.

One jit sums ``n`` independent copies of a small block (six matmul + elementwise stages on
[64, 64]). In the ``identical`` arm every copy is the same computation (same constants) on its
own input; in the ``distinct`` arm each copy scales by its own constant, so no two copies'
kernels are equal. Compile only, CPU seconds. If the backend compiled every kernel afresh, both arms would cost the
same; the gap is what kernel reuse saves. It is why the step benchmark's unrolled chunks cost
little on CPU (each unrolled chunk repeats the layers of the others) and why its unroll/scan
ratio at 8 layers x 8 chunks is far below the original system's.

    python benchmarks/xla_cpu_dedup.py

Last line: ``xla:cpu kernel reuse: 32 copies, distinct/identical Rx``.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time

import jax
import jax.numpy as jnp


def block(x: jax.Array, scale: float) -> jax.Array:
    for i in range(6):
        x = jnp.tanh(x @ x.T * scale + i) * jnp.sin(x) + jnp.exp(-x * x)
    return x


def compile_cpu_seconds(n: int, *, distinct: bool) -> float:
    def f(xs: jax.Array) -> jax.Array:
        return sum(
            (jnp.sum(block(xs[i], 1.37 + 0.01 * i if distinct else 1.37)) for i in range(n)),
            start=jnp.zeros(()),
        )

    lowered = jax.jit(f).lower(jax.ShapeDtypeStruct((n, 64, 64), jnp.float32))
    start = time.process_time()
    lowered.compile()
    return time.process_time() - start


def main() -> None:
    print(f"{'copies':>6} | {'identical':>9} {'distinct':>9} | {'ratio':>5}")
    ratio = float("nan")
    for n in (1, 8, 32):
        same = compile_cpu_seconds(n, distinct=False)
        other = compile_cpu_seconds(n, distinct=True)
        ratio = other / same
        print(f"{n:>6} | {same:>9.2f} {other:>9.2f} | {ratio:>4.1f}x", flush=True)
    print(f"xla:cpu kernel reuse: 32 copies, distinct/identical {ratio:.1f}x")


if __name__ == "__main__":
    main()
