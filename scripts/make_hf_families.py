"""Write the reference fixtures that pin pd-train's GPT-2, Qwen2 and Qwen3 forwards to transformers.

As ``scripts/make_hf_reference.py`` does for Llama: for each case a tiny Hugging Face model with
random weights (every parameter drawn, biases and norm gains included, so a forward that dropped
one would show) is saved with ``save_pretrained`` (safetensors, fp32) under
``tests/pd_train/fixtures/<name>/``, next to ``reference.npz`` holding ``input_ids`` [B, T] and
the logits [B, T, vocab] transformers computes in fp32 (``logits``) and, from the same weights,
in float64 (``logits_fp64``).

Cases (one per family and config dialect):
  * ``gpt2``: ``GPT2LMHeadModel``, tied embeddings (GPT-2's default), gelu_new, 2 layers,
    n_embd 32, 4 heads, config.json as transformers 5 writes it, tensors ``transformer.*``.
  * ``gpt2_bare``: untied, n_inner 48, gelu_pytorch_tanh, 3 layers; config.json spelled with
    the generic aliases (``hidden_size``, ``num_hidden_layers``, ...), ``torch_dtype``; tensors
    without the ``transformer.`` prefix plus the ``h.{i}.attn.bias`` causal-mask buffers, as the
    original ``gpt2`` repository stores them.
  * ``qwen2``: ``Qwen2ForCausalLM``, untied, 4 heads over 2 kv heads, q/k/v biases, config.json
    in the legacy dialect (top-level ``rope_theta``, ``rope_scaling`` null, ``torch_dtype``).
  * ``qwen3``: ``Qwen3ForCausalLM``, tied, head_dim 16 with hidden 32 (heads*head_dim !=
    hidden), q/k RMSNorm gains drawn, the transformers-5 dialect (``rope_parameters``).

The script reloads every fixture with transformers and checks it gives the same logits.

Needs torch and transformers, which pd never depends on; run it in a separate venv::

    uv venv .venv-ref -p 3.11
    uv pip install -p .venv-ref /opt/wheels/torch-*+cpu-*.whl transformers safetensors numpy
    .venv-ref/bin/python scripts/make_hf_families.py
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "pd_train" / "fixtures"
BATCH, SEQ = 2, 24

CASES: dict[str, dict[str, Any]] = {
    "gpt2": {
        "family": "gpt2",
        "config": dict(
            vocab_size=96,
            n_positions=64,
            n_embd=32,
            n_layer=2,
            n_head=4,
            activation_function="gelu_new",
            layer_norm_epsilon=1e-5,
        ),
        "seed": 11,
    },
    "gpt2_bare": {
        "family": "gpt2",
        "config": dict(
            vocab_size=80,
            n_positions=48,
            n_embd=32,
            n_layer=3,
            n_head=2,
            n_inner=48,
            activation_function="gelu_pytorch_tanh",
            layer_norm_epsilon=1e-6,
            tie_word_embeddings=False,
        ),
        "bare": True,
        "seed": 12,
    },
    "qwen2": {
        "family": "qwen2",
        "config": dict(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-6,
            max_position_embeddings=128,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        ),
        "legacy_dialect": True,
        "seed": 13,
    },
    "qwen3": {
        "family": "qwen3",
        "config": dict(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            rms_norm_eps=1e-6,
            max_position_embeddings=128,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        ),
        "seed": 14,
    },
}

CLASSES = {
    "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}
GPT2_ALIASES = {
    "n_embd": "hidden_size",
    "n_positions": "max_position_embeddings",
    "n_head": "num_attention_heads",
    "n_layer": "num_hidden_layers",
}


def randomize(model: torch.nn.Module, *, seed: int) -> None:
    """Every parameter drawn: weights N(0, 1/d_in) (Conv1D: d_in is dim 0, Linear: dim 1),
    embeddings N(0, 1) (positions N(0, 0.1²)), norm gains 1 + N(0, 0.2²), biases N(0, 0.1²)."""
    gen = torch.Generator().manual_seed(seed)
    conv1d = transformers.pytorch_utils.Conv1D
    fan_in = {}
    for mname, module in model.named_modules():
        if isinstance(module, conv1d):
            fan_in[f"{mname}.weight"] = module.weight.shape[0]
        elif isinstance(module, torch.nn.Linear):
            fan_in[f"{mname}.weight"] = module.weight.shape[1]
    with torch.no_grad():
        for name, p in model.named_parameters():
            draw = torch.randn(p.shape, generator=gen)
            if name in fan_in:
                p.copy_(draw / math.sqrt(fan_in[name]))
            elif name.endswith("wpe.weight"):
                p.copy_(0.1 * draw)
            elif "embed_tokens" in name or name.endswith("wte.weight"):
                p.copy_(draw)
            elif name.endswith(".bias"):
                p.copy_(0.1 * draw)
            else:  # RMSNorm / LayerNorm gains
                assert "norm" in name or ".ln_" in name, name
                p.copy_(1 + 0.2 * draw)


def logits_of(model: torch.nn.Module, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=ids).logits.numpy()


def to_legacy_dialect(path: Path) -> None:
    """Rewrite a transformers-5 config.json as older Qwen2 checkpoints spell it."""
    d = json.loads(path.read_text())
    rope = dict(d.pop("rope_parameters"))
    d["rope_theta"] = rope.pop("rope_theta")
    d["rope_scaling"] = None
    d["torch_dtype"] = d.pop("dtype")
    path.write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")


def to_bare_gpt2(out: Path, n_layer: int, n_positions: int) -> None:
    """config.json with the generic aliases and ``torch_dtype``; tensors without the
    ``transformer.`` prefix, plus the causal-mask buffers the original gpt2 repo stores."""
    d = json.loads((out / "config.json").read_text())
    for name, alias in GPT2_ALIASES.items():
        d[alias] = d.pop(name)
    d["torch_dtype"] = d.pop("dtype")
    (out / "config.json").write_text(json.dumps(d, indent=2, sort_keys=True) + "\n")
    tensors = load_file(str(out / "model.safetensors"))
    renamed = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    mask = np.tril(np.ones((n_positions, n_positions), np.float32))[None, None]
    for i in range(n_layer):
        renamed[f"h.{i}.attn.bias"] = mask
    save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})


def make(name: str, case: dict[str, Any], out_root: Path) -> None:
    config_cls, model_cls = CLASSES[case["family"]]
    torch.manual_seed(case["seed"])
    config = config_cls(**case["config"])
    model = model_cls._from_config(config, attn_implementation="eager").float().eval()
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
    if case.get("legacy_dialect"):
        to_legacy_dialect(out / "config.json")
    if case.get("bare"):
        to_bare_gpt2(out, config.n_layer, config.n_positions)
    np.savez_compressed(
        out / "reference.npz",
        input_ids=ids.numpy().astype(np.int32),
        logits=logits,
        logits_fp64=logits64,
    )

    # transformers reads the rewritten files back to the same logits.
    reloaded = model_cls.from_pretrained(out, attn_implementation="eager").float().eval()
    np.testing.assert_array_equal(logits_of(reloaded, ids), logits)
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(
        f"{name}: logits std {logits.std():.3f}, max |fp32 - fp64| "
        f"{np.abs(logits - logits64).max():.2e}; files {sizes}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURES)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name, case in CASES.items():
        make(name, case, args.out)


if __name__ == "__main__":
    main()
