"""A small jax program standing in for ``pd-train compile``: reads a toy config, compiles an
init jit and a train-step jit ahead of time on abstract inputs, inside the pd-probe recorder.

Usage: jax_arm.py CONFIG (record path and arm name come from the runner's environment).
"""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

from pd_probe import Recorder

config = json.loads(Path(sys.argv[1]).read_text())
width = config["model"]["width"]
layers = config["decomposition"]["layers"]
sites = 7 * len(layers)
chunks = sites // config["recon"]["sites_per_chunk"]


def init(scale):
    """V of every site, stacked: [sites, width, width] (deterministic; RNG compiles slowly)."""
    return jnp.sin(jnp.arange(sites * width * width, dtype=jnp.float32) * scale).reshape(
        sites, width, width
    ) / jnp.sqrt(width)


def step(v, x):
    """A loss over ``chunks`` forwards (unrolled), each scanning its own slice of sites."""
    loss = 0.0
    per_chunk = sites // chunks
    for c in range(chunks):
        live = v[c * per_chunk : (c + 1) * per_chunk]
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, live)
        loss = loss + jnp.mean(h**2)
    return loss / chunks


with Recorder.from_env() as rec:
    scale = jax.ShapeDtypeStruct((), jnp.float32)
    with rec.phase("init"):
        compiled = jax.jit(init).lower(scale).compile()
    rec.memory("init", compiled)
    v = jax.ShapeDtypeStruct((sites, width, width), jnp.float32)
    x = jax.ShapeDtypeStruct((8, width), jnp.float32)
    with rec.phase("step"):
        compiled = jax.jit(jax.value_and_grad(step)).lower(v, x).compile()
    rec.memory("step", compiled)
    rec.note(sites=sites, chunks=chunks)
