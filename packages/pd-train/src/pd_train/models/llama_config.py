"""Architecture hyper-parameters of a Llama-family target, named as Hugging Face names them.

Both classes check themselves on construction (hand-built, from a preset or from a Hugging Face
``config.json``): a bad value raises :class:`~pd_train.config.io.FieldValueError` naming the
field, the value and what is allowed, instead of failing later inside a traced reshape.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

import attrs

from pd_train.config.io import FieldValueError


def _check(ok: Callable[[Any], bool], allowed: str) -> Callable[[Any, Any, Any], None]:
    def validate(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
        if not ok(value):
            msg = f"got {value!r}; must be {allowed}"
            raise FieldValueError(attribute.name, msg)

    return validate


# bool is an Integral (and Real) in Python but never a size here; numpy ints and floats pass.
def _is_number(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


_positive_int = _check(lambda v: _is_number(v, numbers.Integral) and v > 0, "an int > 0")
_optional_positive_int = _check(
    lambda v: v is None or (_is_number(v, numbers.Integral) and v > 0), "null or an int > 0"
)
_positive_float = _check(
    lambda v: _is_number(v, numbers.Real) and 0 < v < math.inf, "a finite number > 0"
)
_bool = _check(lambda v: isinstance(v, bool), "true or false")


@attrs.frozen(kw_only=True)
class RopeScaling:
    """Llama-3 RoPE frequency scaling (Hugging Face ``rope_type: llama3``).

    Wavelengths above ``original_max_position_embeddings / low_freq_factor`` are slowed by
    ``factor``, those below ``... / high_freq_factor`` kept, the band between interpolated; so
    ``0 < low_freq_factor < high_freq_factor``.
    """

    factor: float = attrs.field(default=8.0, validator=_positive_float)
    low_freq_factor: float = attrs.field(default=1.0, validator=_positive_float)
    high_freq_factor: float = attrs.field(default=4.0, validator=_positive_float)
    original_max_position_embeddings: int = attrs.field(default=8192, validator=_positive_int)

    def __attrs_post_init__(self) -> None:
        # Equal factors would divide by zero in the band interpolation.
        if self.high_freq_factor <= self.low_freq_factor:
            msg = (
                f"got {self.high_freq_factor!r}; must be greater than low_freq_factor "
                f"({self.low_freq_factor!r})"
            )
            raise FieldValueError("high_freq_factor", msg)


@attrs.frozen(kw_only=True)
class LlamaConfig:
    """The fields of a Hugging Face ``LlamaConfig`` that the forward pass reads.

    Weight layout (right-multiplied, ``x @ W``): ``q_proj`` [hidden, heads*head_dim],
    ``k_proj``/``v_proj`` [hidden, kv_heads*head_dim], ``o_proj`` [heads*head_dim, hidden],
    ``gate_proj``/``up_proj`` [hidden, intermediate], ``down_proj`` [intermediate, hidden].

    Checked on construction: every size is an int > 0 (not a bool), ``rms_norm_eps``,
    ``rope_theta`` finite and > 0;
    ``num_key_value_heads`` divides ``num_attention_heads`` (grouped-query attention);
    without ``head_dim``, ``num_attention_heads`` divides ``hidden_size``; the head dim is even
    (rotate-half RoPE); ``rope_freq_factors`` has head_dim / 2 entries, without ``rope_scaling``.

    Two switches cover the Llama-like Qwen decoders (both false for Llama): ``qkv_bias`` adds a
    frozen bias to q/k/v (Qwen2, Qwen2.5: params ``q_bias``/``k_bias``/``v_bias``
    [L, heads*hd | kv*hd]); ``qk_norm`` applies an RMSNorm over head_dim to every query and key
    head before RoPE (Qwen3: params ``q_norm``/``k_norm`` [L, head_dim]).
    """

    vocab_size: int = attrs.field(validator=_positive_int)
    hidden_size: int = attrs.field(validator=_positive_int)
    intermediate_size: int = attrs.field(validator=_positive_int)
    num_hidden_layers: int = attrs.field(validator=_positive_int)
    num_attention_heads: int = attrs.field(validator=_positive_int)
    num_key_value_heads: int = attrs.field(validator=_positive_int)
    head_dim: int | None = attrs.field(default=None, validator=_optional_positive_int)
    rms_norm_eps: float = attrs.field(default=1e-5, validator=_positive_float)
    rope_theta: float = attrs.field(default=500_000.0, validator=_positive_float)
    rope_scaling: RopeScaling | None = attrs.field(
        default=None,
        validator=_check(
            lambda v: v is None or isinstance(v, RopeScaling), "null or a RopeScaling"
        ),
    )
    max_position_embeddings: int = attrs.field(default=8192, validator=_positive_int)
    tie_word_embeddings: bool = attrs.field(default=False, validator=_bool)
    #: Per-frequency RoPE divisors [head_dim // 2]: inverse frequency i is divided by entry i
    #: (llama.cpp's ``rope_freqs.weight``, how a GGUF of a Llama 3.x carries its llama3
    #: scaling). Null: none. Exclusive with ``rope_scaling``.
    rope_freq_factors: tuple[float, ...] | None = attrs.field(
        default=None,
        validator=_check(
            lambda v: (
                v is None
                or (
                    isinstance(v, tuple)
                    and len(v) > 0
                    and all(_is_number(x, numbers.Real) and 0 < x < math.inf for x in v)
                )
            ),
            "null or a non-empty tuple of finite numbers > 0",
        ),
    )

    qkv_bias: bool = attrs.field(default=False, validator=_bool)
    qk_norm: bool = attrs.field(default=False, validator=_bool)

    def __attrs_post_init__(self) -> None:
        heads, kv_heads = self.num_attention_heads, self.num_key_value_heads
        if heads % kv_heads:
            msg = f"got {kv_heads!r}; must divide num_attention_heads ({heads!r})"
            raise FieldValueError("num_key_value_heads", msg)
        if self.head_dim is None:
            if self.hidden_size % heads:
                msg = (
                    f"got {self.hidden_size!r}; must be a multiple of num_attention_heads "
                    f"({heads!r}) when head_dim is unset"
                )
                raise FieldValueError("hidden_size", msg)
            if (self.hidden_size // heads) % 2:
                msg = (
                    f"got {self.hidden_size!r}; with head_dim unset, hidden_size / "
                    f"num_attention_heads ({heads!r}) is the head dim "
                    f"{self.hidden_size // heads}, which must be even (rotate-half RoPE)"
                )
                raise FieldValueError("hidden_size", msg)
        elif self.head_dim % 2:
            msg = f"got {self.head_dim!r}; must be even (rotate-half RoPE)"
            raise FieldValueError("head_dim", msg)
        factors = self.rope_freq_factors
        if factors is not None:
            if self.rope_scaling is not None:
                msg = "is set and so is rope_scaling; give one of the two"
                raise FieldValueError("rope_freq_factors", msg)
            if len(factors) != self.resolved_head_dim // 2:
                msg = (
                    f"has {len(factors)} entries; must have head_dim / 2 = "
                    f"{self.resolved_head_dim // 2} (one per RoPE frequency)"
                )
                raise FieldValueError("rope_freq_factors", msg)

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


#: Named Llama architectures (``target.architecture: llama3_8b``).
LLAMA_PRESETS = {"llama3_8b": llama3_8b}
