"""The transformer-CI tests' setup: a 4-layer tiny Llama (intermediate 24, unlike `_tiny.TINY`),
a chunkwise transformer CI, its trainer and params with random taps (`_setup`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.ci import TransformerCIFunction
from pd_train.config.pd import (
    ChunkwiseTransformerCI,
    DecompositionTarget,
    Faithfulness,
    OptimizerConfig,
    PDConfig,
    RuntimeConfig,
    StochasticRecon,
)
from pd_train.models.llama_config import LlamaConfig
from pd_train.train import Trainer

MODEL = LlamaConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
)
ALL = (DecompositionTarget(module_pattern="layers.*", C=4),)
B, T = 2, 5
# Same HLO as the default, compiled with less LLVM optimization: faster on CPU.
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def _pd(ci: object, targets: tuple = ALL) -> PDConfig:
    return PDConfig(
        steps=10,
        decomposition_targets=targets,
        ci=ci,  # type: ignore[arg-type]
        loss_metrics=(Faithfulness(coeff=1.0), StochasticRecon(coeff=1.0)),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
    )


CHUNKWISE = ChunkwiseTransformerCI(
    blocks_per_chunk=2, d_model=16, n_blocks=2, n_heads=4, n_kv_heads=2, mlp_hidden=24
)


@functools.cache
def _trainer(ci: object = CHUNKWISE, init: str = "stacked", targets: tuple = ALL) -> Trainer:
    return Trainer(MODEL, _pd(ci, targets), RuntimeConfig(init=init))  # type: ignore[arg-type]


@functools.cache
def _setup(ci: object = CHUNKWISE) -> tuple:
    """The CI function, its params (from pd-init, made non-trivial) and random taps."""
    trainer = _trainer(ci)
    fn = trainer.ci_fn
    assert isinstance(fn, TransformerCIFunction)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(
        lambda a: a + jnp.asarray(0.1 * rng.standard_normal(a.shape), jnp.float32),
        trainer.init_params(key=jax.random.key(0))["ci_fn"],
    )
    dec = trainer.decomposition
    inputs = {
        k: jnp.asarray(
            rng.standard_normal((len(dec.kind(k).layers), B, T, dec.kind(k).d_in)), jnp.float32
        )
        for k in fn.tap_kinds()
    }
    return fn, params, inputs
