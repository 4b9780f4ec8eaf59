"""The tiny Llama every step test trains, and the one `PDConfig` and `Trainer` most of them share.

`TINY` is the two-layer random-weights Llama (vocab 32, width 16); `_pd()` the config under which
it really decomposes, so one compile of `_trainer()` serves most step tests; `_run` trains a few
steps and returns the host metrics. Other tiny models of the suite differ on purpose.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.config.pd import (
    MLPCI,
    ChunkwiseSubsetRecon,
    DecompositionTarget,
    Faithfulness,
    FaithfulnessWarmup,
    FrequencyPenalty,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    StochasticRecon,
)
from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig
from pd_train.train import Trainer, step_key

TINY = LlamaConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
)
# Same HLO as the default, compiled with less LLVM optimization: about 2x faster on CPU.
FAST = {"xla_backend_optimization_level": 0}
B, T = 8, 16


def _pd(**overrides: object) -> PDConfig:
    """One config for every step test, so one compile serves most of them: it is also the
    config under which the tiny Llama really decomposes."""
    config = dict(
        steps=250,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*", C=16),),
        ci=MLPCI(hidden_dims=(8,)),
        loss_metrics=(
            Faithfulness(coeff=1e4),
            ImportanceMinimality(
                coeff=1e-3,
                pnorm_start=2.0,
                pnorm_end=1.0,
                eps=1e-6,
                frequency=FrequencyPenalty(coeff=1e-5),
            ),
            StochasticRecon(coeff=1.0),
            ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=7),
        ),
        components=OptimizerConfig(lr=3e-3, warmup_steps=10, final_val_frac=0.1, clip=1.0),
        ci_fn=OptimizerConfig(lr=3e-3, warmup_steps=10, final_val_frac=0.1, weight_decay=0.01),
        faithfulness_warmup=FaithfulnessWarmup(steps=200, lr=1e-2),
    )
    config.update(overrides)
    return PDConfig(**config)  # type: ignore[arg-type]


@functools.cache
def _target() -> dict:
    return llama.init_params(TINY, key=jax.random.key(0))


def _tokens() -> jax.Array:
    return jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (B, T)), jnp.int32)


@functools.cache
def _trainer() -> Trainer:
    return Trainer(TINY, _pd(), compiler_options=FAST)


def _run(trainer: Trainer, steps: int, *, target: dict, tokens: jax.Array, step_fn=None) -> list:
    state = trainer.init_state(key=jax.random.key(1))
    run_key = jax.random.key(2)
    step_fn = step_fn or trainer.train_step
    out = []
    for i in range(steps):
        state, metrics = step_fn(state, target, tokens, step_key(run_key, i))
        out.append(trainer.metrics_to_host(metrics))
    return out
