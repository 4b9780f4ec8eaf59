"""The small `pd-train probe` config the probe tests share."""

from __future__ import annotations

# A Llama small enough that an arm compiles in seconds: one layer, three decomposed MLP sites,
# two recon chunks. The tokens are the tiny corpus that ships with pd-train (vocab 384).
SMALL = {
    "run_name": "probe-small",
    "target": {
        "architecture": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "vocab_size": 384,
            "max_position_embeddings": 64,
        }
    },
    "data": {"path": "builtin:tiny_corpus", "seq_len": 16},
    "pd": {
        "steps": 10,
        "batch_size": 8,
        "decomposition_targets": [{"module_pattern": "layers.*.mlp.*", "C": 8}],
        "ci": {"type": "mlp", "hidden_dims": [4]},
        "loss_metrics": [
            {"type": "faithfulness", "coeff": 1.0},
            {"type": "chunkwise_subset_recon", "coeff": 1.0, "sites_per_chunk": 2},
        ],
        "components": {"lr": 0.001},
        "ci_fn": {"lr": 0.001},
    },
    "cadence": {"train_log_every": 1},
}
