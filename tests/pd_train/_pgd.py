"""Persistent PGD on the tiny Llama: a `PDConfig` with every other loss term plus persistent PGD
(`_pd(scope, optimizer, n_warmup)`), its trainer, and the same term as YAML for CLI runs (`PPGD`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.config.pd import (
    MLPCI,
    DecompositionTarget,
    Faithfulness,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    PersistentPGDRecon,
    PGDOptimizer,
    StochasticRecon,
)
from pd_train.models import llama
from pd_train.train import Trainer

from ._tiny import FAST, TINY

B, T = 8, 8


def _pd(scope: str = "bsc", optimizer: str = "adam", n_warmup: int = 2) -> PDConfig:
    return PDConfig(
        steps=20,
        batch_size=B,
        decomposition_targets=(
            DecompositionTarget(module_pattern="layers.*.self_attn.q_proj", C=4),
            DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=8),
        ),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=(
            Faithfulness(coeff=100.0),
            ImportanceMinimality(coeff=1e-3),
            StochasticRecon(coeff=1.0),
            PersistentPGDRecon(
                coeff=0.5,
                scope=scope,  # type: ignore[arg-type]
                n_warmup_steps=n_warmup,
                optimizer=PGDOptimizer(
                    type=optimizer,  # type: ignore[arg-type]
                    lr=0.05,
                    b1=0.5,
                    b2=0.99,
                    warmup_frac=0.1,
                ),
            ),
        ),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
    )


@functools.cache
def _target() -> dict:
    return llama.init_params(TINY, key=jax.random.key(0))


def _tokens() -> jax.Array:
    return jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (B, T)), jnp.int32)


@functools.cache
def _trainer() -> Trainer:
    return Trainer(TINY, _pd(), compiler_options=FAST, seq_len=T)


PPGD = {
    "type": "persistent_pgd_recon",
    "coeff": 0.5,
    "scope": "bsc",
    "n_warmup_steps": 2,
    "optimizer": {"type": "adam", "lr": 0.05, "b1": 0.5, "b2": 0.99, "warmup_frac": 0.25},
}
