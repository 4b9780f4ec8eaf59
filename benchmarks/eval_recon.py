"""What the slow-eval recon metrics cost, and that the train step does not pay for them.

1. **The train step is unchanged.** ``models/llama.py`` now computes a layer through
   ``_decoder_layer``, which also returns the attention probabilities (for the slow eval). The
   train step must neither compute nor keep them: its lowered HLO (source-location metadata
   stripped) is compared with the one lowered through the previous ``decoder_layer`` (copied
   below, verbatim from before the change) — identical, or the benchmark says so.
2. **Normal vs slow eval jit** at the default config (the shipped tiny Llama, 28 sites, batch
   8 × 64) on a mesh of simulated CPU devices (8 by default): compile CPU/wall seconds (fresh
   caches, no persistent cache), the fastest of ``--calls`` executions on one batch, and XLA's
   per-device temporary memory; ratios slow/normal.

3. ``--llama8b``: both eval jits of ``configs/llama8b-full32L.yaml`` (the production recipe)
   lowered on abstract inputs and compiled, nothing allocated: XLA's per-device argument and
   temporary memory, normal vs slow (use ``XLA_FLAGS=--xla_force_host_platform_device_count=64``
   for the production topology).

    python benchmarks/eval_recon.py
    python benchmarks/eval_recon.py --calls 3
    XLA_FLAGS=--xla_force_host_platform_device_count=64 python benchmarks/eval_recon.py --llama8b
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import pd_sharding
from pd_train import evaluate
from pd_train.configs import builtin_config
from pd_train.models import llama
from pd_train.run import prepare, start_runtime
from pd_train.run.data import Batches, TokenDataset
from pd_train.run.distributed import Placement

MiB = 2**20


def _previous_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """``llama.attention`` as it was before the attention probabilities were exposed."""
    b, t, heads, hd = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(b, t, kv_heads, heads // kv_heads, hd)
    scores = jnp.einsum("bqgrd,bkgd->bgrqk", q, k).astype(jnp.float32) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bgrqk,bkgd->bqgrd", probs, v)
    return out.reshape(b, t, heads, hd)


def _previous_decoder_layer(  # type: ignore[no-untyped-def]
    h, layer, cos, sin, config, linear=llama._frozen_linear
):
    """``llama.decoder_layer`` as it was before the attention probabilities were exposed."""
    b, t, _ = h.shape
    hd = config.resolved_head_dim
    x = llama.rms_norm(h, layer["input_layernorm"], config.rms_norm_eps)
    q = linear("q_proj", x, layer["q_proj"]).reshape(b, t, config.num_attention_heads, hd)
    k = linear("k_proj", x, layer["k_proj"]).reshape(b, t, config.num_key_value_heads, hd)
    v = linear("v_proj", x, layer["v_proj"]).reshape(b, t, config.num_key_value_heads, hd)
    attn = _previous_attention(llama.apply_rope(q, cos, sin), llama.apply_rope(k, cos, sin), v)
    h = h + linear("o_proj", attn.reshape(b, t, -1), layer["o_proj"])
    x = llama.rms_norm(h, layer["post_attention_layernorm"], config.rms_norm_eps)
    gated = jax.nn.silu(linear("gate_proj", x, layer["gate_proj"])) * linear(
        "up_proj", x, layer["up_proj"]
    )
    return h + linear("down_proj", gated, layer["down_proj"])


def _hlo(lowered: Any) -> str:
    return str(lowered.as_text(debug_info=False))


def step_hlo_unchanged(trainer: Any, batch: int, seq: int) -> bool:
    def lower() -> str:
        jax.clear_caches()
        return _hlo(trainer.lower_step(batch_size=batch, seq_len=seq, target_dtype=jnp.float32))

    new = lower()
    current = llama.decoder_layer
    llama.decoder_layer = _previous_decoder_layer  # type: ignore[assignment]
    try:
        old = lower()
    finally:
        llama.decoder_layer = current  # type: ignore[assignment]
    return new == old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--llama8b", action="store_true", help="only the llama8b compile arm")
    args = parser.parse_args()
    if args.llama8b:
        llama8b()
        return

    prepared = prepare(builtin_config("default"))
    config = prepared.config
    rt = start_runtime(prepared, Placement())
    trainer = rt.trainer
    batch, seq = config.pd.batch_size, config.data.seq_len
    same = step_hlo_unchanged(trainer, batch, seq)
    print(f"train step HLO with the previous decoder_layer: {'identical' if same else 'DIFFERS'}")

    from pd_train.analysis.components import _load_target

    target = _load_target(prepared, trainer)
    params = trainer.init_params(key=jax.random.key(0))
    data = TokenDataset(
        prepared.eval_path,  # type: ignore[arg-type]
        seq_len=seq,
        dtype=config.data.dtype,
        vocab_size=prepared.model.vocab_size,
    )
    rows = Batches(data, batch_size=batch, seed=1, process_index=0, process_count=1).batch(0)
    tokens = pd_sharding.global_batch(rows.astype(np.int32), rt.mesh)
    key = jax.random.key(0)
    if trainer.layout is not None:
        key = jax.device_put(key, trainer.layout.replicated())

    results = {}
    for arm, slow in (("normal", False), ("slow", True)):
        jax.clear_caches()
        c0, w0 = time.process_time(), time.perf_counter()
        compiled = (
            evaluate.lower_eval(
                trainer, batch_size=batch, seq_len=seq, target_dtype=jnp.float32, slow=slow
            )
        ).compile()
        compile_cpu, compile_wall = time.process_time() - c0, time.perf_counter() - w0
        memory = compiled.memory_analysis()
        temp = getattr(memory, "temp_size_in_bytes", 0) / MiB if memory is not None else 0.0
        run = evaluate.eval_jit(trainer, slow=slow)
        jax.block_until_ready(run(params, target, tokens, key))  # compiles (cached) + warms
        best = float("inf")
        for _ in range(args.calls):
            w0 = time.perf_counter()
            jax.block_until_ready(run(params, target, tokens, key))
            best = min(best, time.perf_counter() - w0)
        results[arm] = (compile_cpu, compile_wall, best, temp)

    print(
        f"default config ({len(trainer.decomposition.sites)} sites), {len(jax.devices())} "
        f"simulated devices, batch {batch}×{seq}; fresh caches per arm"
    )
    print(
        f"{'eval jit':>9} {'compile CPU s':>14} {'compile wall s':>15} {'call s':>8} {'temp MiB':>9}"
    )
    for arm, (cc, cw, call, temp) in results.items():
        print(f"{arm:>9} {cc:>14.1f} {cw:>15.1f} {call:>8.3f} {temp:>9.1f}")
    n, s = results["normal"], results["slow"]
    print(
        f"slow/normal: compile {s[0] / n[0]:.2f}x CPU, call {s[2] / n[2]:.2f}x, "
        f"temp {s[3] / max(n[3], 1e-9):.2f}x"
    )


def llama8b() -> None:
    prepared = prepare(builtin_config("llama8b-full32L"), for_run=False)
    rt = start_runtime(prepared, Placement())
    config = prepared.config
    print(f"llama8b-full32L, {len(jax.devices())} simulated devices, abstract compile only")
    print(
        f"{'eval jit':>9} {'compile CPU s':>14} {'compile wall s':>15} {'args GiB':>9} {'temp GiB':>9}"
    )
    for arm, slow in (("normal", False), ("slow", True)):
        jax.clear_caches()
        c0, w0 = time.process_time(), time.perf_counter()
        compiled = evaluate.lower_eval(
            rt.trainer,
            batch_size=config.pd.batch_size,
            seq_len=config.data.seq_len,
            target_dtype=jnp.bfloat16,
            slow=slow,
        ).compile()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        mem = compiled.memory_analysis()
        args_gib = getattr(mem, "argument_size_in_bytes", 0) / 2**30
        temp_gib = getattr(mem, "temp_size_in_bytes", 0) / 2**30
        print(f"{arm:>9} {cpu:>14.1f} {wall:>15.1f} {args_gib:>9.2f} {temp_gib:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
