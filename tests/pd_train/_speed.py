"""Every recon path the default run takes, on the tiny Llama, for the step's speed tests."""

from __future__ import annotations

from pd_train.config.pd import (
    MLPCI,
    ChunkwiseSubsetRecon,
    DecompositionTarget,
    Faithfulness,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    PersistentPGDRecon,
    PGDOptimizer,
    StochasticRecon,
)

B, T = 4, 8

#: Every recon path the default run takes: route-all, chunkwise subset (chunks that cut a
#: layer, so copy / frozen / live layers all occur) and persistent PGD with warm-up ascents.
PD = PDConfig(
    steps=10,
    batch_size=B,
    decomposition_targets=(DecompositionTarget(module_pattern="layers.*", C=4),),
    ci=MLPCI(hidden_dims=(4,)),
    loss_metrics=(
        Faithfulness(coeff=100.0),
        ImportanceMinimality(coeff=1e-3),
        StochasticRecon(coeff=1.0),
        ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=5),
        PersistentPGDRecon(
            coeff=0.5,
            scope="bsc",
            n_warmup_steps=2,
            optimizer=PGDOptimizer(type="adam", lr=0.05, b1=0.5, b2=0.99),
        ),
    ),
    components=OptimizerConfig(lr=1e-3),
    ci_fn=OptimizerConfig(lr=1e-3),
)
