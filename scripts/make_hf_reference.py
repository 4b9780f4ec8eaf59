"""Write the reference fixtures that pin pd-train's Llama forward to transformers' LlamaForCausalLM.

For each case, a tiny ``LlamaForCausalLM`` with random weights is saved with ``save_pretrained``
(safetensors, fp32) under ``tests/pd_train/fixtures/<name>/``, next to ``reference.npz`` holding
``input_ids`` [B, T] and the model's logits [B, T, vocab] (``logits`` in fp32 as transformers
computes them; ``logits_fp64`` from the same weights in float64, the exact answer up to rounding).

Cases:
  * ``llama3_gqa``: untied, 3 layers, 4 heads over 2 kv heads, head_dim 16 with hidden 48 (so
    heads*head_dim != hidden), Llama-3 RoPE scaling whose original context (256) and head_dim
    put two of its eight frequencies in the smoothed middle band, two above and four below it. Its config.json
    is rewritten in the dialect of Llama 3.x checkpoints (top-level ``rope_theta``,
    ``rope_scaling``, ``torch_dtype``); the script checks transformers reads it back identically.
  * ``tied``: tied embeddings (no ``lm_head.weight`` stored), 2 layers, 4 heads over 1 kv head,
    default RoPE, the transformers >= 5 dialect as ``save_pretrained`` writes it.

Needs torch and transformers, which pd never depends on; run it in a separate venv::

    uv venv /work/hfvenv -p 3.11
    uv pip install -p /work/hfvenv/bin/python /opt/wheels/torch-*.whl transformers safetensors numpy
    /work/hfvenv/bin/python scripts/make_hf_reference.py
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "pd_train" / "fixtures"

CASES = {
    "llama3_gqa": {
        "config": dict(
            vocab_size=96,
            hidden_size=48,
            intermediate_size=80,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            rms_norm_eps=1e-5,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10_000.0,
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 8.0,
                "original_max_position_embeddings": 256,
            },
        ),
        "legacy_dialect": True,
        "seed": 1,
    },
    "tied": {
        "config": dict(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            rms_norm_eps=1e-6,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        ),
        "legacy_dialect": False,
        "seed": 2,
    },
}
BATCH, SEQ = 2, 48


def randomize(model: LlamaForCausalLM, *, seed: int) -> None:
    """Weights at a scale where every part of the forward moves the logits: Linear weights
    N(0, 1/d_in), embeddings N(0, 1), RMSNorm gains 1 + N(0, 0.2^2) (not all ones, so a norm
    that ignored its gain would show)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))


def to_legacy_dialect(path: Path) -> None:
    """Rewrite a transformers-5 config.json the way Llama 3.x checkpoints spell it."""
    d = json.loads(path.read_text())
    rope = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rope.pop("rope_theta")
    d["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    d["torch_dtype"] = d.pop("dtype")
    path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")


def logits_of(model: LlamaForCausalLM, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=ids).logits.numpy()


def band_counts(config: dict) -> tuple[int, int, int]:
    """(high, middle, low) counts of RoPE frequencies relative to Llama-3's smoothing band."""
    rope = config["rope_parameters"]
    hd = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    wavelen = 2 * math.pi * rope["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    orig = rope["original_max_position_embeddings"]
    high_w, low_w = orig / rope["high_freq_factor"], orig / rope["low_freq_factor"]
    return (
        int((wavelen < high_w).sum()),
        int(((wavelen >= high_w) & (wavelen <= low_w)).sum()),
        int((wavelen > low_w).sum()),
    )


def make(name: str, case: dict, out_root: Path) -> None:
    torch.manual_seed(case["seed"])
    config = LlamaConfig(**case["config"])
    model = LlamaForCausalLM._from_config(config, attn_implementation="eager").float().eval()
    randomize(model, seed=case["seed"])
    gen = torch.Generator().manual_seed(case["seed"] + 100)
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), generator=gen)
    logits = logits_of(model, ids)
    logits64 = logits_of(model.double(), ids)
    model.float()

    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        for fname in ("config.json", "model.safetensors"):
            (out / fname).write_bytes((Path(tmp) / fname).read_bytes())
    if case["legacy_dialect"]:
        to_legacy_dialect(out / "config.json")
    np.savez_compressed(
        out / "reference.npz",
        input_ids=ids.numpy().astype(np.int32),
        logits=logits,
        logits_fp64=logits64,
    )

    # The files say what we think: transformers reads them back to the same logits, the tied
    # checkpoint stores no lm_head, and the config is in the intended dialect.
    reloaded = LlamaForCausalLM.from_pretrained(out, attn_implementation="eager").float().eval()
    np.testing.assert_array_equal(logits_of(reloaded, ids), logits)
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        stored = set(f.keys())
    assert ("lm_head.weight" in stored) is (not config.tie_word_embeddings), stored
    written = json.loads((out / "config.json").read_text())
    assert ("rope_scaling" in written) is case["legacy_dialect"], written
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(
        f"{name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, heads "
        f"{config.num_attention_heads}/{config.num_key_value_heads}, head_dim {config.head_dim}, "
        f"vocab {config.vocab_size}, tied {config.tie_word_embeddings}; RoPE bands (high, middle, "
        f"low) {band_counts(case['config']) if case['config']['rope_parameters']['rope_type'] == 'llama3' else 'n/a'}; "
        f"logits std {logits.std():.3f}, max |fp32 - fp64| {np.abs(logits - logits64).max():.2e}; "
        f"files {sizes}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURES)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name, case in CASES.items():
        make(name, case, args.out)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"total fixture size {total / 1024:.0f} KiB under {args.out}")


if __name__ == "__main__":
    main()
