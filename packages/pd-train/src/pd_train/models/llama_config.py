"""Architecture hyper-parameters of a Llama-family target, named as Hugging Face names them."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class RopeScaling:
    """Llama-3 RoPE frequency scaling (Hugging Face ``rope_type: llama3``)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@attrs.frozen(kw_only=True)
class LlamaConfig:
    """The fields of a Hugging Face ``LlamaConfig`` that the forward pass reads.

    Weight layout (right-multiplied, ``x @ W``): ``q_proj`` [hidden, heads*head_dim],
    ``k_proj``/``v_proj`` [hidden, kv_heads*head_dim], ``o_proj`` [heads*head_dim, hidden],
    ``gate_proj``/``up_proj`` [hidden, intermediate], ``down_proj`` [intermediate, hidden].
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500_000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False

    @property
    def resolved_head_dim(self) -> int:
        return (
            self.head_dim
            if self.head_dim is not None
            else self.hidden_size // self.num_attention_heads
        )

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        """``(d_in, d_out)`` of each decomposable kind, in canonical order."""
        hd = self.resolved_head_dim
        d, f = self.hidden_size, self.intermediate_size
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        return {
            "q_proj": (d, q),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (q, d),
            "gate_proj": (d, f),
            "up_proj": (d, f),
            "down_proj": (f, d),
        }


def llama3_8b() -> LlamaConfig:
    """Meta-Llama-3-8B's architecture."""
    return LlamaConfig(
        vocab_size=128_256,
        hidden_size=4096,
        intermediate_size=14_336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500_000.0,
        rope_scaling=RopeScaling(
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    )
