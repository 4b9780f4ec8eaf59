"""prepare() runs the CI function's decomposition checks, and a run loads its target through one
loader that honours ``target.strict`` (the run and ``pd-train analyze`` share it)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.cli import main
from pd_train.config.io import ConfigError
from pd_train.models.hf import CheckpointError
from pd_train.run import load_target, prepare

from ._cli import tiny_config, write_config
from ._hf import config_v4, hf_tensors, write_checkpoint

_BAD_CHUNKS = {
    "type": "chunkwise_transformer",
    "blocks_per_chunk": 3,
    "d_model": 16,
    "n_blocks": 1,
    "n_heads": 2,
    "mlp_hidden": 8,
}


def test_prepare_checks_ci_chunks_without_a_trainer(tmp_path) -> None:
    config = write_config(tmp_path, tiny_config(tmp_path, tmp_path / "cache", ci=_BAD_CHUNKS))
    with pytest.raises(ConfigError, match=r"pd\.ci\.blocks_per_chunk: got 3"):
        prepare(config, for_run=False)


def test_pd_train_config_refuses_ci_chunks_that_do_not_divide_the_layers(tmp_path, capsys) -> None:
    config = write_config(tmp_path, tiny_config(tmp_path, tmp_path / "cache", ci=_BAD_CHUNKS))
    assert main(["config", str(config)]) == 2
    assert "pd.ci.blocks_per_chunk" in capsys.readouterr().err


def _deeper_checkpoint(tmp_path, *, strict: bool):
    tensors = hf_tensors({**config_v4(), "num_hidden_layers": 4}, np.float32)
    root = write_checkpoint(tmp_path / "ckpt", {**config_v4(), "num_hidden_layers": 2}, tensors)
    raw = tiny_config(tmp_path, tmp_path / "cache")
    raw["target"] = {"checkpoint": str(root), "strict": strict}
    raw["data"]["seq_len"] = 8
    return prepare(write_config(tmp_path, raw), for_run=False)


def test_a_run_refuses_a_deeper_checkpoint_by_default(tmp_path) -> None:
    prepared = _deeper_checkpoint(tmp_path, strict=True)
    with pytest.raises(CheckpointError, match="does not account for"):
        load_target(prepared, shardings=None, dtype=jnp.float32)


def test_a_run_with_target_strict_false_loads_the_prefix(tmp_path) -> None:
    prepared = _deeper_checkpoint(tmp_path, strict=False)
    target = load_target(prepared, shardings=None, dtype=jnp.float32)
    assert prepared.model.num_hidden_layers == 2
    stacked = [leaf for leaf in _leaves(target) if leaf.ndim >= 2 and leaf.shape[0] == 2]
    assert stacked, "the loaded layers are stacked over the 2 layers config.json describes"


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)
