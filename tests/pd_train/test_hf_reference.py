"""pd-train's Llama forward against transformers' LlamaForCausalLM on the same weights.

The fixtures under ``fixtures/`` (checkpoint in Hugging Face layout plus input ids and the logits
transformers computed, in fp32 and fp64) are written by ``scripts/make_hf_reference.py``; torch and
transformers are not needed here. See that script for what each case covers.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import jax
import numpy as np
import pytest

from pd_train.models.hf import load_llama_checkpoint, read_hf_config
from pd_train.models.llama import forward

FIXTURES = Path(__file__).parent / "fixtures"
CASES = ["llama3_gqa", "tied"]
ATOL = 1e-4


def load_case(name: str):
    config, params = load_llama_checkpoint(FIXTURES / name)
    ref = np.load(FIXTURES / name / "reference.npz")
    return config, params, ref["input_ids"], ref["logits"], ref["logits_fp64"]


@pytest.mark.parametrize("name", CASES)
def test_logits_match_transformers(name):
    config, params, ids, logits, logits64 = load_case(name)
    got = np.asarray(jax.jit(forward, static_argnums=2)(params, ids, config))
    assert got.shape == logits.shape
    err = np.abs(got - logits).max()
    err64 = np.abs(got - logits64).max()
    assert err < ATOL, f"{name}: max |pd - transformers fp32| = {err:.3e}"
    assert err64 < ATOL, f"{name}: max |pd - transformers fp64| = {err64:.3e}"


def test_fixtures_cover_what_they_claim():
    legacy = read_hf_config(FIXTURES / "llama3_gqa")
    assert "rope_scaling" in legacy and "rope_parameters" not in legacy  # Llama 3.x dialect
    modern = read_hf_config(FIXTURES / "tied")
    assert "rope_parameters" in modern and "rope_scaling" not in modern  # transformers 5 dialect
    config, params, *_ = load_case("llama3_gqa")
    assert config.rope_scaling is not None
    assert config.num_attention_heads != config.num_key_value_heads
    assert config.num_attention_heads * config.resolved_head_dim != config.hidden_size
    # Some RoPE wavelengths fall inside Llama-3's smoothing band, some on either side.
    hd, rs = config.resolved_head_dim, config.rope_scaling
    wavelen = 2 * np.pi * config.rope_theta ** (np.arange(0, hd, 2) / hd)
    high = rs.original_max_position_embeddings / rs.high_freq_factor
    low = rs.original_max_position_embeddings / rs.low_freq_factor
    assert (wavelen < high).any() and (wavelen > low).any()
    assert ((wavelen >= high) & (wavelen <= low)).any()
    tied, tied_params, *_ = load_case("tied")
    assert tied.tie_word_embeddings and "lm_head" not in tied_params
    assert "lm_head" in params


@pytest.mark.parametrize(
    "change",
    [
        {"rope_scaling": None},
        # Moves one frequency from the high band into the smoothed band and re-weights the band.
        {"high_freq_factor": 16.0},
        {"rms_norm_eps": 1e-1},
    ],
)
def test_reference_is_sensitive_to_the_config(change):
    """The comparison above can fail: a forward that got RoPE scaling, its smoothing band or
    the norm epsilon wrong would miss the reference by far more than the tolerance."""
    config, params, ids, logits, _ = load_case("llama3_gqa")
    if "high_freq_factor" in change:
        assert config.rope_scaling is not None
        config = attrs.evolve(config, rope_scaling=attrs.evolve(config.rope_scaling, **change))
    else:
        config = attrs.evolve(config, **change)
    got = np.asarray(forward(params, ids, config))
    assert np.abs(got - logits).max() > 100 * ATOL
