"""The shipped tiny Llama and its corpus: present, loadable, and a model that learned the corpus."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.assets import tiny_corpus_path, tiny_llama_path, tiny_vocab
from pd_train.models.hf import load_llama_checkpoint
from pd_train.models.llama import forward
from pd_train.run.data import Batches, TokenDataset


def test_assets_are_small_and_complete():
    root = tiny_llama_path()
    files = {p.name: p.stat().st_size for p in root.iterdir()}
    assert {"config.json", "model.safetensors", "vocab.json"} <= set(files)
    total = sum(files.values()) + sum(tiny_corpus_path(s).stat().st_size for s in ("train", "val"))
    assert total < 4 * 2**20  # "a few MB at most"
    vocab = tiny_vocab()
    assert len(vocab) == 384 and vocab[0] == "<bos>"
    with pytest.raises(ValueError, match="split is 'test'"):
        tiny_corpus_path("test")


def test_tiny_llama_loads_and_its_config_is_llama3_style():
    config, params = load_llama_checkpoint(tiny_llama_path())
    assert config.vocab_size == 384 and config.num_hidden_layers == 4
    assert config.num_attention_heads == 4 and config.num_key_value_heads == 2
    assert config.rope_scaling is not None and not config.tie_word_embeddings
    assert params["layers"]["gate_proj"].shape == (4, 64, 256)
    assert params["lm_head"].dtype == jnp.float32


def test_tiny_llama_predicts_held_out_text_far_better_than_chance():
    """The pd forward on the shipped weights reaches a held-out loss far below both the uniform
    (ln 384 = 5.95) and the unigram baseline (about 4.9): the model learned the language."""
    config, params = load_llama_checkpoint(tiny_llama_path())
    data = TokenDataset(tiny_corpus_path("val"), seq_len=65, vocab_size=config.vocab_size)
    batch = Batches(data, batch_size=32, seed=0, process_index=0, process_count=1).batch(0)
    logits = jax.jit(forward, static_argnums=2)(params, batch[:, :-1], config)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -np.take_along_axis(np.asarray(logp), batch[:, 1:, None], axis=-1).mean()
    assert nll < 3.0, nll
