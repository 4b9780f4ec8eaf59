"""Hugging Face Llama checkpoints: ``config.json`` → :class:`LlamaConfig`, safetensors → params.

Parameters come out as a plain nested dict, keys as Hugging Face names them, Linear weights
transposed to right-multiplied ``[d_in, d_out]`` and decoder layers stacked on a leading axis::

    {"embed_tokens": [vocab, hidden],
     "lm_head": [hidden, vocab],                      # absent when embeddings are tied
     "norm": [hidden],
     "layers": {"input_layernorm": [L, hidden], "post_attention_layernorm": [L, hidden],
                "q_proj": [L, hidden, heads*hd], "k_proj": [L, hidden, kv_heads*hd],
                "v_proj": [L, hidden, kv_heads*hd], "o_proj": [L, heads*hd, hidden],
                "gate_proj": [L, hidden, ff], "up_proj": [L, hidden, ff],
                "down_proj": [L, ff, hidden]}}

Every array is built with :func:`jax.make_array_from_callback`: each process reads from the
memory-mapped safetensors files only the slices its own devices hold, so no process ever holds a
full host copy of a sharded array. torch is not needed.

Nothing is guessed: config.json fields are type-checked as JSON gives them (no coercion), every
tensor in the checkpoint must be one config.json accounts for (see ``strict``), a file
safetensors cannot open is named, and without ``dtype`` the stored dtypes must agree.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import re
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import attrs
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open

from pd_train.config.io import FieldValueError
from pd_train.models.gpt2 import GPT2Config
from pd_train.models.llama_config import LlamaConfig, RopeScaling

__all__ = [
    "CheckpointError",
    "HFConfig",
    "HFConfigError",
    "gpt2_config_from_hf",
    "llama_config_from_hf",
    "llama_param_shapes",
    "load_gpt2_checkpoint",
    "load_llama_checkpoint",
    "load_qwen2_checkpoint",
    "load_qwen3_checkpoint",
    "qwen2_config_from_hf",
    "qwen3_config_from_hf",
    "read_hf_config",
]

Index = tuple[slice, ...]

# Hugging Face LlamaConfig defaults, used for fields a config.json leaves out.
_HF_DEFAULTS: dict[str, Any] = {
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
    "rope_theta": 10_000.0,
    "tie_word_embeddings": False,
}
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor")
log = logging.getLogger(__name__)
_ABSENT = object()  # a required field: no default
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_NORMS = ("input_layernorm", "post_attention_layernorm")


class CheckpointError(ValueError):
    """A checkpoint directory or its config.json that pd cannot load as a Llama target."""


class HFConfigError(CheckpointError):
    """A ``config.json`` field pd refuses. ``field`` is its name as the file spells it (dotted
    inside ``rope_scaling``/``rope_parameters``); ``file`` the config.json, when there is one."""

    def __init__(self, field: str, message: str, *, file: str | Path | None = None) -> None:
        self.field = field
        self.message = message
        self.file = None if file is None else str(file)
        where = f"{file}: " if file is not None else ""
        super().__init__(f"checkpoint config: {where}{field}: {message}")


class HFConfig(dict[str, Any]):
    """A parsed ``config.json``: a plain dict that remembers its file (``path``), so errors
    raised from its fields name the file."""

    path: str | None = None


# ---------------------------------------------------------------------------------------------
# config.json


def read_hf_config(path: str | Path) -> HFConfig:
    """The parsed ``config.json`` of a checkpoint directory (or of the file itself), as an
    :class:`HFConfig` dict that :func:`llama_config_from_hf` names in its errors."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        msg = f"checkpoint config: {file} does not exist (a Hugging Face checkpoint directory holds config.json)"
        raise CheckpointError(msg)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        msg = f"checkpoint config: {file} is not valid JSON ({e})"
        raise CheckpointError(msg) from e
    if not isinstance(data, dict):
        msg = f"checkpoint config: {file} holds {_json_kind(data)}, expected a JSON object"
        raise CheckpointError(msg)
    config = HFConfig(data)
    config.path = str(file)
    return config


def _json_kind(value: Any) -> str:
    """What JSON calls ``value``'s type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, numbers.Integral):
        return "an integer"
    if isinstance(value, numbers.Real):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__


def _shown(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} ({_json_kind(value)})"


class _Reader:
    """Typed reads of one config.json object (or of its rope dict, fields named ``prefix.x``).

    JSON types are checked, never coerced: an integer field takes a JSON integer only (not a
    boolean, not ``32.0``: transformers would hand that float to ``nn.Linear`` and fail); a
    number field takes an integer or a finite number, not a boolean; a boolean field takes
    ``true``/``false`` only (not ``"false"``, not ``0``).
    """

    def __init__(self, d: Mapping[str, Any], file: str | None, prefix: str = "") -> None:
        self.d, self.file, self.prefix = d, file, prefix

    def error(self, key: str, message: str) -> HFConfigError:
        return HFConfigError(self.prefix + key, message, file=self.file)

    def has(self, key: str) -> bool:
        return key in self.d

    def integer(self, key: str, default: Any = _ABSENT, *, null_is_default: bool = False) -> Any:
        """An int, or ``default`` when absent (or null, with ``null_is_default``)."""
        found, value = self._get(key, default, null_is_default=null_is_default)
        if not found:
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            hint = ""
            if isinstance(value, float) and math.isfinite(value) and value.is_integer():
                hint = f" (write {int(value)}, not {value!r})"
            raise self.error(key, f"got {_shown(value)}; must be an integer{hint}")
        return int(value)

    def number(self, key: str, default: Any = _ABSENT) -> float:
        """A finite float (a JSON integer converts only when float64 holds it exactly)."""
        found, value = self._get(key, default)
        if not found:
            return float(value)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise self.error(key, f"got {_shown(value)}; must be a number")
        try:
            out = float(value)
        except OverflowError:
            out = math.inf
        if not math.isfinite(out) or (isinstance(value, numbers.Integral) and out != value):
            raise self.error(key, f"got {_shown(value)}; must be a finite float64 number")
        return out

    def boolean(self, key: str, default: bool) -> bool:
        _, value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"got {_shown(value)}; must be true or false")
        return value

    def _get(self, key: str, default: Any, *, null_is_default: bool = False) -> tuple[bool, Any]:
        """``(True, value)`` as the file gives it, or ``(False, default)`` when absent."""
        if key not in self.d or (null_is_default and self.d[key] is None):
            if default is _ABSENT:
                raise self.error(key, "required field missing")
            return False, default
        return True, self.d[key]


@attrs.frozen(kw_only=True)
class _Family:
    """What one Llama-like family's ``config.json`` may say (see :func:`llama_config_from_hf`)."""

    name: str  # for messages: "Llama", "Qwen2", "Qwen3"
    architecture: str  # the one ``architectures`` entry, e.g. "LlamaForCausalLM"
    model_type: str
    defaults: Mapping[str, Any]  # transformers' defaults for absent fields
    kv_heads_default: int | None = None  # None: num_attention_heads (Llama); Qwen: 32
    head_dim_default: int | None = None  # None: hidden_size / heads (Llama, Qwen2); Qwen3: 128
    rope_types: tuple[str, ...] = ("default", "llama3")
    qkv_bias: bool = False  # Qwen2: q/k/v always carry biases
    qk_norm: bool = False  # Qwen3: q/k RMSNorm per head
    bias_flags: tuple[str, ...] = ("attention_bias", "mlp_bias")  # refused when true
    sliding_window: bool = False  # reads use_sliding_window/layer_types (and refuses sliding)


_LLAMA = _Family(
    name="Llama", architecture="LlamaForCausalLM", model_type="llama", defaults=_HF_DEFAULTS
)
_QWEN_DEFAULTS = {**_HF_DEFAULTS, "max_position_embeddings": 32_768}
_QWEN2 = _Family(
    name="Qwen2",
    architecture="Qwen2ForCausalLM",
    model_type="qwen2",
    defaults=_QWEN_DEFAULTS,
    kv_heads_default=32,
    rope_types=("default",),
    qkv_bias=True,
    bias_flags=(),
    sliding_window=True,
)
_QWEN3 = _Family(
    name="Qwen3",
    architecture="Qwen3ForCausalLM",
    model_type="qwen3",
    defaults=_QWEN_DEFAULTS,
    kv_heads_default=32,
    head_dim_default=128,
    rope_types=("default",),
    qk_norm=True,
    bias_flags=("attention_bias",),
    sliding_window=True,
)


def llama_config_from_hf(d: Mapping[str, Any], *, source: str | Path | None = None) -> LlamaConfig:
    """Read a Hugging Face Llama ``config.json`` (as a dict) into a :class:`LlamaConfig`.

    Both dialects are read: the one most Llama 3.x checkpoints use (top-level ``rope_theta``,
    ``rope_scaling``, ``torch_dtype``) and the one transformers ≥ 5 writes (``rope_parameters``
    holding ``rope_theta`` and the scaling fields, ``dtype``). Fields that are absent take the
    defaults of transformers' ``LlamaConfig`` (null counts as absent only for
    ``num_key_value_heads``, ``head_dim``, ``rope_scaling``, ``rope_parameters``,
    ``architectures`` and ``partial_rotary_factor``, where transformers reads null as "unset"),
    and precedence follows transformers too (a value inside ``rope_scaling``/``rope_parameters``
    wins over the top-level one). Unknown fields are ignored, as transformers ignores them.

    Every field is type-checked as JSON gives it, never coerced (see :class:`_Reader`): sizes
    are JSON integers (``32.0`` is refused, not read as 32), ``"false"`` is not a boolean, a
    boolean is not a number. Anything the forward pass would not reproduce exactly is refused:
    other architectures, ``hidden_act`` other than silu, attention or MLP biases, RoPE types
    other than default and llama3, and partial rotary embeddings.

    Errors are :class:`HFConfigError` naming the field and, when ``d`` came from
    :func:`read_hf_config` (or ``source`` is given), the file.
    """
    return _llama_like_from_hf(d, _LLAMA, source)


def qwen2_config_from_hf(d: Mapping[str, Any], *, source: str | Path | None = None) -> LlamaConfig:
    """Read a Hugging Face Qwen2 / Qwen2.5 ``config.json`` (``Qwen2ForCausalLM``) into a
    :class:`LlamaConfig` with ``qkv_bias=True``: as :func:`llama_config_from_hf` (both
    dialects, the same type checks), with transformers' ``Qwen2Config`` defaults
    (``num_key_value_heads`` 32 when absent, ``max_position_embeddings`` 32768), RoPE type
    ``default`` only, and sliding-window attention refused (``use_sliding_window: true`` or a
    ``layer_types`` entry other than ``full_attention``: pd's attention is full causal)."""
    return _llama_like_from_hf(d, _QWEN2, source)


def qwen3_config_from_hf(d: Mapping[str, Any], *, source: str | Path | None = None) -> LlamaConfig:
    """Read a Hugging Face Qwen3 ``config.json`` (``Qwen3ForCausalLM``) into a
    :class:`LlamaConfig` with ``qk_norm=True``: as :func:`qwen2_config_from_hf`, with
    ``head_dim`` 128 when absent (transformers' ``Qwen3Config``) and ``attention_bias: true``
    refused (no released Qwen3 sets it)."""
    return _llama_like_from_hf(d, _QWEN3, source)


def _llama_like_from_hf(
    d: Mapping[str, Any], family: _Family, source: str | Path | None
) -> LlamaConfig:
    """The :class:`LlamaConfig` of one Llama-like ``family``'s config.json ``d`` (see
    :func:`llama_config_from_hf`): the family's fixed fields, the RoPE settings, the sizes."""
    file = str(source) if source is not None else getattr(d, "path", None)
    top = _Reader(d, file)
    _check_family_fields(d, top, family)
    rope_field, rope_dict = _rope_dict(d, top)
    rope = _Reader(rope_dict, file, prefix=f"{rope_field}.")
    type_key = "rope_type" if "rope_type" in rope_dict or "type" not in rope_dict else "type"
    rope_type = rope_dict.get(type_key, "default")
    if not isinstance(rope_type, str) or rope_type not in family.rope_types:
        raise _unsupported(rope, type_key, rope_type, " or ".join(map(repr, family.rope_types)))
    _check_partial_rotary(top, rope)
    theta_from = rope if rope.has("rope_theta") else top
    rope_theta = theta_from.number("rope_theta", family.defaults["rope_theta"])
    for overridden in ("rope_theta", "partial_rotary_factor"):
        # A top-level value the rope dict overrides is unused, but still must be well-typed.
        if rope.has(overridden) and top.d.get(overridden) is not None:
            top.number(overridden)
    max_pos = top.integer("max_position_embeddings", family.defaults["max_position_embeddings"])
    scaling = _llama3_scaling(top, rope, type_key, max_pos) if rope_type == "llama3" else None

    sizes = {k: top.integer(k) for k in _REQUIRED}
    heads = sizes["num_attention_heads"]
    kv_default = heads if family.kv_heads_default is None else family.kv_heads_default
    if family.kv_heads_default is not None and d.get("num_key_value_heads", 0) is None:
        kv_default = heads  # transformers: an explicit null means "as many as the heads"
    kv_heads = top.integer("num_key_value_heads", kv_default, null_is_default=True)
    head_dim = top.integer("head_dim", family.head_dim_default, null_is_default=True)
    # LlamaConfig checks sizes, divisibility and the RoPE head dim; its field names are the
    # config.json keys, except rope_theta read from inside the rope dict.
    try:
        return LlamaConfig(
            **sizes,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=top.number("rms_norm_eps", family.defaults["rms_norm_eps"]),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            max_position_embeddings=max_pos,
            tie_word_embeddings=top.boolean(
                "tie_word_embeddings", family.defaults["tie_word_embeddings"]
            ),
            qkv_bias=family.qkv_bias,
            qk_norm=family.qk_norm,
        )
    except FieldValueError as e:
        reader = theta_from if e.field == "rope_theta" else top
        raise reader.error(e.field, e.message) from None


def _unsupported(reader: _Reader, key: str, value: Any, allowed: str) -> HFConfigError:
    return reader.error(key, f"got {_shown(value)}; pd supports {allowed}")


def _check_family_fields(d: Mapping[str, Any], top: _Reader, family: _Family) -> None:
    """What the family fixes: its architecture and model type, SiLU, no biases beyond its own,
    full attention; and the required sizes present."""
    archs = d.get("architectures")
    if archs is not None and (
        not isinstance(archs, list | tuple) or list(archs) != [family.architecture]
    ):
        raise _unsupported(top, "architectures", archs, repr([family.architecture]))
    for key, only in (("model_type", family.model_type), ("hidden_act", "silu")):
        value = d.get(key, only)
        if not isinstance(value, str) or value != only:
            raise _unsupported(top, key, value, repr(only))
    for key in family.bias_flags:
        if top.boolean(key, False):
            extra = " beside its q/k/v biases" if family.qkv_bias else ""
            raise _unsupported(top, key, True, f"false ({family.name} has no biases{extra})")
    if family.sliding_window:
        _refuse_sliding_window(top)
    missing = [k for k in _REQUIRED if d.get(k) is None]
    if missing:
        raise top.error(", ".join(missing), "required field(s) missing")


def _rope_dict(d: Mapping[str, Any], top: _Reader) -> tuple[str, Mapping[str, Any]]:
    """``(field, settings)``: the RoPE settings' dict and the field it came from.
    transformers: ``rope_scaling`` (the legacy name) wins over ``rope_parameters``; when both
    are given they must agree wherever both give a value (pd does not pick one of two models).
    One setting for all layers (not per layer type)."""
    for key in ("rope_scaling", "rope_parameters"):
        value = d.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise _unsupported(top, key, value, "an object or null")
    rope_field = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    if d.get("rope_scaling") and d.get("rope_parameters"):
        legacy, modern = dict(d["rope_scaling"]), dict(d["rope_parameters"])
        for spelled in (legacy, modern):
            if "type" in spelled and "rope_type" not in spelled:
                spelled["rope_type"] = spelled.pop("type")
        for key in sorted(set(legacy) & set(modern), key=str):
            a, b = legacy[key], modern[key]
            if a != b or isinstance(a, bool) != isinstance(b, bool):
                msg = (
                    f"got {_shown(modern[key])} but rope_scaling.{key} is "
                    f"{_shown(legacy[key])}; the two must agree"
                )
                raise top.error(f"rope_parameters.{key}", msg)
    rope_dict = d.get(rope_field) or {}
    for key, value in rope_dict.items():
        if isinstance(value, Mapping):
            raise _unsupported(
                _Reader(rope_dict, top.file, prefix=f"{rope_field}."),
                key,
                value,
                "one RoPE setting for all layers (not per layer type)",
            )
    return rope_field, rope_dict


def _check_partial_rotary(top: _Reader, rope: _Reader) -> None:
    """``partial_rotary_factor`` (in the rope dict, else top-level): 1.0 or absent only."""
    partial_from = rope if rope.has("partial_rotary_factor") else top
    if partial_from.d.get("partial_rotary_factor") is not None:
        partial = partial_from.number("partial_rotary_factor")
        if partial != 1.0:
            raise _unsupported(
                partial_from,
                "partial_rotary_factor",
                partial,
                "1.0 (rotary embedding over the whole head)",
            )


def _llama3_scaling(top: _Reader, rope: _Reader, type_key: str, max_pos: int) -> RopeScaling:
    """Llama 3's RoPE scaling from the rope dict. As in transformers, a top-level
    ``original_max_position_embeddings`` wins, then the one inside the rope dict, then
    ``max_position_embeddings``."""
    absent = [k for k in _LLAMA3_KEYS if rope.d.get(k) is None]
    if absent:
        raise rope.error(type_key, f"is 'llama3' but {absent} missing")
    original_from = top if top.has("original_max_position_embeddings") else rope
    original = original_from.integer("original_max_position_embeddings", max_pos)
    if original_from is top and rope.has("original_max_position_embeddings"):
        rope.integer("original_max_position_embeddings")  # unused, but still well-typed
    factors = {k: rope.number(k) for k in _LLAMA3_KEYS}
    try:
        return RopeScaling(**factors, original_max_position_embeddings=original)
    except FieldValueError as e:
        reader = original_from if e.field == "original_max_position_embeddings" else rope
        raise reader.error(e.field, e.message) from None


def _refuse_sliding_window(top: _Reader) -> None:
    """Qwen's sliding-window attention is not what pd's full causal attention computes."""
    if top.boolean("use_sliding_window", False):
        msg = f"got {_shown(True)}; pd supports false (full causal attention in every layer)"
        raise top.error("use_sliding_window", msg)
    types_ = top.d.get("layer_types")
    if types_ is None:
        return
    if not isinstance(types_, list) or not all(isinstance(t, str) for t in types_):
        raise top.error("layer_types", f"got {_shown(types_)}; must be an array of strings")
    for i, kind in enumerate(types_):
        if kind != "full_attention":
            msg = f"got {kind!r}; pd supports 'full_attention' only"
            raise top.error(f"layer_types[{i}]", msg)


# ---------------------------------------------------------------------------------------------
# parameter layout


@attrs.frozen
class _Param:
    """Where one param comes from: its global shape (stacked: [L, ...]), the checkpoint tensor
    (``name`` with ``{i}`` for the layer), whether the tensor is a ``nn.Linear`` [d_out, d_in]
    to transpose, and ``part``: (start, stop, full) when the param is the columns
    [start, stop) of a tensor whose last axis (after any transpose) has ``full`` entries
    (GPT-2's fused ``c_attn`` split into q, k and v)."""

    shape: tuple[int, ...]
    name: str
    transpose: bool = False
    part: tuple[int, int, int] | None = None

    @property
    def stacked(self) -> bool:
        return "{i}" in self.name

    def tensor(self, layer: int | None = None) -> str:
        return self.name.format(i=layer) if self.stacked else self.name

    def stored_shape(self) -> tuple[int, ...]:
        """The tensor's shape on disk (one layer's, for a stacked param)."""
        shape = self.shape[1:] if self.stacked else self.shape
        if self.part is not None:
            shape = (*shape[:-1], self.part[2])
        return shape[::-1] if self.transpose else shape


def _llama_name(key: str) -> str:
    """The checkpoint tensor of Llama-layout param ``key`` (``{i}``: the decoder layer)."""
    top = {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight"}
    if key in top or key == "lm_head":
        return top.get(key, "lm_head.weight")
    block = "self_attn" if key in _ATTN else "mlp" if key in _MLP else None
    middle = f"{block}.{key}" if block else key
    return f"model.layers.{{i}}.{middle}.weight"


def _layout(config: LlamaConfig) -> dict[str, Any]:
    """Each param of a Llama-like model (Llama, Qwen2, Qwen3) and where it comes from."""
    L, d, v = config.num_hidden_layers, config.hidden_size, config.vocab_size
    top: dict[str, Any] = {
        "embed_tokens": _Param((v, d), _llama_name("embed_tokens")),
        "norm": _Param((d,), _llama_name("norm")),
    }
    if not config.tie_word_embeddings:
        top["lm_head"] = _Param((d, v), "lm_head.weight", transpose=True)
    layers: dict[str, Any] = {k: _Param((L, d), _llama_name(k)) for k in _NORMS}
    shapes = config.site_shapes()
    for kind, (d_in, d_out) in shapes.items():
        layers[kind] = _Param((L, d_in, d_out), _llama_name(kind), transpose=True)
    if config.qkv_bias:
        for k in ("q", "k", "v"):
            name = f"model.layers.{{i}}.self_attn.{k}_proj.bias"
            layers[f"{k}_bias"] = _Param((L, shapes[f"{k}_proj"][1]), name)
    if config.qk_norm:
        for k in ("q", "k"):
            name = f"model.layers.{{i}}.self_attn.{k}_norm.weight"
            layers[f"{k}_norm"] = _Param((L, config.resolved_head_dim), name)
    return {**top, "layers": layers}


def llama_param_shapes(config: LlamaConfig, dtype: Any = np.float32) -> dict[str, Any]:
    """The params pytree of ``config`` as :class:`jax.ShapeDtypeStruct` leaves (no data)."""
    return jax.tree.map(
        lambda p: jax.ShapeDtypeStruct(p.shape, np.dtype(dtype)),
        _layout(config),
        is_leaf=lambda x: isinstance(x, _Param),
    )


# ---------------------------------------------------------------------------------------------
# safetensors reading


class _Checkpoint:
    """The safetensors files of one checkpoint directory, opened memory-mapped for reading.

    A file that safetensors cannot open (truncated, corrupt, not safetensors) is a
    :class:`CheckpointError` naming that file, so with many shards the user knows which.
    """

    def __init__(self, root: Path, stack: ExitStack) -> None:
        self.root = root
        index = root / "model.safetensors.index.json"
        single = root / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                if not isinstance(weight_map, dict) or not all(
                    isinstance(v, str) for v in weight_map.values()
                ):
                    raise TypeError("weight_map must map tensor names to file names")
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
                msg = f"checkpoint: {index} is not a safetensors index (needs a 'weight_map' object): {e!r}"
                raise CheckpointError(msg) from e
            self.file_of: dict[str, str] = dict(weight_map)
        elif single.is_file():
            self.file_of = {}
        else:
            msg = (
                f"checkpoint: {root} holds neither model.safetensors nor "
                "model.safetensors.index.json (pd reads Hugging Face safetensors checkpoints)"
            )
            raise CheckpointError(msg)
        self._handles: dict[str, Any] = {}
        self._names: dict[str, set[str]] = {}
        names = sorted(set(self.file_of.values())) if self.file_of else ["model.safetensors"]
        for n, fname in enumerate(names):
            file = root / fname
            if not file.is_file():
                msg = f"checkpoint: {file} is named in model.safetensors.index.json but does not exist"
                raise CheckpointError(msg)
            try:
                handle = stack.enter_context(safe_open(str(file), framework="numpy"))
                self._names[fname] = set(handle.keys())
            except Exception as e:  # safetensors raises its own SafetensorError, or OSError
                which = f" (shard {n + 1} of {len(names)})" if len(names) > 1 else ""
                msg = (
                    f"checkpoint: {file}{which} is not a readable safetensors file; it may be "
                    f"truncated or corrupt: {e}"
                )
                raise CheckpointError(msg) from e
            self._handles[fname] = handle
        if not self.file_of:
            self.file_of = dict.fromkeys(self._names["model.safetensors"], "model.safetensors")

    def all_names(self) -> dict[str, str]:
        """Every tensor in the checkpoint (named by the index or present in a file) → its file."""
        out = dict(self.file_of)
        for fname, names in self._names.items():
            for name in names:
                out.setdefault(name, fname)
        return out

    def where(self, name: str) -> str:
        return str(self.root / self.file_of[name]) if name in self.file_of else str(self.root)

    def info(self, name: str) -> tuple[tuple[int, ...], str]:
        """Shape and dtype name (numpy spelling) of tensor ``name``, from the file header."""
        if name not in self.file_of:
            msg = f"checkpoint: tensor {name!r} is missing from {self.where(name)}"
            raise CheckpointError(msg)
        if name not in self._names[self.file_of[name]]:
            msg = f"checkpoint: tensor {name!r} is missing from {self.where(name)} (the index names that file)"
            raise CheckpointError(msg)
        view = self._guarded(name, lambda h: h.get_slice(name))
        raw = view.get_dtype()
        if raw not in _SAFETENSORS_DTYPES:
            msg = f"checkpoint: tensor {name!r} in {self.where(name)} has dtype {raw}; pd reads {sorted(_SAFETENSORS_DTYPES)}"
            raise CheckpointError(msg)
        return tuple(int(s) for s in view.get_shape()), _SAFETENSORS_DTYPES[raw]

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``tensor[index]`` of tensor ``name``, reading only those elements from disk."""
        return np.asarray(self._guarded(name, lambda h: h.get_slice(name)[index]))

    def _guarded(self, name: str, read: Callable[[Any], Any]) -> Any:
        try:
            return read(self._handles[self.file_of[name]])
        except Exception as e:
            msg = f"checkpoint: reading tensor {name!r} from {self.where(name)} failed: {e}"
            raise CheckpointError(msg) from e


def concrete_index(index: Index | None, shape: tuple[int, ...]) -> Index:
    """Concrete ``slice(start, stop)`` per dimension (JAX gives ``slice(None)`` for whole dims,
    and None for an unsharded array); the GGUF loader shares it."""
    index = index if index is not None else (slice(None),) * len(shape)
    out = []
    for s, n in zip(index, shape, strict=True):
        start, stop, step = s.indices(n)
        if step != 1:
            msg = f"internal: strided shard index {s} is not supported"
            raise CheckpointError(msg)
        out.append(slice(start, stop))
    return tuple(out)


def _reader(
    ckpt: _Checkpoint, param: _Param, dtype: np.dtype
) -> Callable[[Index | None], np.ndarray]:
    """A ``make_array_from_callback`` callback that reads ``param``'s slice ``index``."""
    cache: dict[tuple[tuple[int, int], ...], np.ndarray] = {}
    shape = param.shape

    def read_one(name: str, index: Index) -> np.ndarray:
        if param.part is not None:  # columns [start, stop) of a fused tensor
            last = index[-1]
            shift = param.part[0]
            index = (*index[:-1], slice(last.start + shift, last.stop + shift))
        # Transposed params [d_in, d_out] come from HF's [d_out, d_in]: read the mirrored slice.
        src = index[::-1] if param.transpose else index
        part = ckpt.read_slice(name, src)
        part = part.T if param.transpose else part
        return np.ascontiguousarray(part, dtype=dtype)

    def callback(index: Index | None) -> np.ndarray:
        index = concrete_index(index, shape)
        memo = tuple((s.start, s.stop) for s in index)
        if memo in cache:  # partially replicated shardings ask for one slice several times
            return cache[memo]
        if param.stacked:
            layers, rest = index[0], index[1:]
            out = np.empty([s.stop - s.start for s in index], dtype=dtype)
            for i, layer in enumerate(range(layers.start, layers.stop)):
                out[i] = read_one(param.tensor(layer), rest)
        else:
            out = read_one(param.tensor(), index)
        cache[memo] = out
        return out

    return callback


def _check_tensor(ckpt: _Checkpoint, name: str, param: _Param) -> str:
    shape, dtype = ckpt.info(name)
    want = param.stored_shape()
    if shape != want:
        msg = (
            f"checkpoint: tensor {name!r} in {ckpt.where(name)} has shape {list(shape)}; "
            f"config.json implies {list(want)}"
        )
        raise CheckpointError(msg)
    return dtype


def _resolve_shardings(shardings: Any, layout: dict[str, Any]) -> dict[str, Any]:
    """One sharding per param: a pytree matching the params, or one sharding for all."""
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    if shardings is None or isinstance(shardings, jax.sharding.Sharding):
        one = default if shardings is None else shardings
        return {k: ({kk: one for kk in v} if k == "layers" else one) for k, v in layout.items()}
    if not isinstance(shardings, Mapping):
        msg = f"shardings: got {type(shardings).__name__}; expected None, a Sharding or a dict matching the params"
        raise CheckpointError(msg)
    out: dict[str, Any] = {}
    for group, keys in (("", layout), ("layers.", layout["layers"])):
        source = shardings if not group else shardings.get("layers", {})
        if not isinstance(source, Mapping):
            msg = f"shardings.layers: got {type(source).__name__}; expected a dict"
            raise CheckpointError(msg)
        extra = sorted(set(source) - set(keys))
        missing = sorted(set(keys) - set(source))
        if extra or missing:
            msg = (
                f"shardings: keys must match the params; missing {[group + k for k in missing]}, "
                f"unexpected {[group + k for k in extra]}"
            )
            raise CheckpointError(msg)
        for k in keys:
            if k == "layers" and not group:
                continue
            if not isinstance(source[k], jax.sharding.Sharding):
                msg = f"shardings.{group}{k}: got {type(source[k]).__name__}; expected a jax.sharding.Sharding"
                raise CheckpointError(msg)
            if group:
                out.setdefault("layers", {})[k] = source[k]
            else:
                out[k] = source[k]
    return out


class CheckpointLoader(Protocol):
    """The signature of :func:`load_llama_checkpoint` and its Qwen siblings."""

    def __call__(
        self,
        path: str | Path,
        *,
        shardings: Any = None,
        dtype: Any = None,
        layers: int | None = None,
        strict: bool = True,
    ) -> tuple[LlamaConfig, dict[str, Any]]: ...


def _family_loader(family: _Family, name: str, doc: str) -> CheckpointLoader:
    """The public checkpoint loader of one Llama-like ``family`` (they differ only in it)."""

    def load(
        path: str | Path,
        *,
        shardings: Any = None,
        dtype: Any = None,
        layers: int | None = None,
        strict: bool = True,
    ) -> tuple[LlamaConfig, dict[str, Any]]:
        return _load_llama_like(
            path, family, shardings=shardings, dtype=dtype, layers=layers, strict=strict
        )

    load.__name__ = load.__qualname__ = name
    load.__doc__ = doc
    return load


load_llama_checkpoint = _family_loader(
    _LLAMA,
    "load_llama_checkpoint",
    """Load a Hugging Face Llama checkpoint directory straight into sharded jax arrays.

    Args:
      path: directory with ``config.json`` and either ``model.safetensors`` or shards named by
        ``model.safetensors.index.json``.
      shardings: where each param lives: a dict matching the params (see the module docstring;
        no ``lm_head`` when embeddings are tied), one ``Sharding`` for every array, or None
        (all on the first local device). Each process reads only the slices that its
        addressable devices hold.
      dtype: dtype of the loaded arrays (converted slice by slice on the host). None keeps the
        checkpoint's dtype, which then must be one dtype for every loaded tensor: a checkpoint
        storing some tensors in float32 and others in bfloat16 is refused (the forward would
        silently run in a mix of precisions); pass ``dtype`` to convert them all to one.
      layers: load only the first ``layers`` of the decoder layers config.json describes (the
        returned config says so). This is the explicit way to load fewer layers on purpose.
      strict: True (default): every tensor in the checkpoint must be one config.json accounts
        for; any other (a decoder layer past ``num_hidden_layers``, bias tensors of a
        config without biases, ``lm_head.weight`` of a model with tied embeddings, unknown
        names) is an error naming it. False tolerates only whole decoder layers past
        config.json's ``num_hidden_layers`` (loading a prefix of a deeper checkpoint on
        purpose; a warning says how many are skipped); every other unexpected tensor is still
        an error. (``*.rotary_emb.inv_freq`` buffers that old transformers saved are ignored
        either way: like transformers, pd computes RoPE from config.json.)

    Returns:
      ``(config, params)``. Every tensor's presence, shape and dtype is checked against
      config.json before anything is read.
    """,
)
load_qwen2_checkpoint = _family_loader(
    _QWEN2,
    "load_qwen2_checkpoint",
    """:func:`load_llama_checkpoint` for a Qwen2 / Qwen2.5 checkpoint (``Qwen2ForCausalLM``):
    config.json read by :func:`qwen2_config_from_hf`; beside Llama's tensors the
    ``self_attn.{q,k,v}_proj.bias`` of every layer are required (params ``q_bias``, ``k_bias``,
    ``v_bias`` [L, width]) and an ``o_proj.bias`` is refused as unaccounted for.""",
)
load_qwen3_checkpoint = _family_loader(
    _QWEN3,
    "load_qwen3_checkpoint",
    """:func:`load_llama_checkpoint` for a Qwen3 checkpoint (``Qwen3ForCausalLM``): config.json
    read by :func:`qwen3_config_from_hf`; beside Llama's tensors the
    ``self_attn.{q,k}_norm.weight`` of every layer are required (params ``q_norm``,
    ``k_norm`` [L, head_dim]).""",
)


_LLAMA_FORMAT_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_LLAMA_FORMAT_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def _load_llama_like(
    path: str | Path,
    family: _Family,
    *,
    shardings: Any,
    dtype: Any,
    layers: int | None,
    strict: bool,
    check_only: bool = False,
) -> tuple[LlamaConfig, dict[str, Any]]:
    root = _checkpoint_dir(path, strict)
    config = _llama_like_from_hf(read_hf_config(root), family, None)
    described = config
    if layers is not None:
        _check_layers(layers, config.num_hidden_layers)
        config = _with_layers(config, layers)
    bias_flags = "/".join(family.bias_flags) or "no o_proj or MLP biases"
    hints = {
        ".bias": f"config.json says {bias_flags} false, but the checkpoint has biases"
        if family.bias_flags
        else f"{family.name} has q/k/v biases only, but the checkpoint has other biases",
        "lm_head.weight": "config.json says tie_word_embeddings true, but the checkpoint has "
        "lm_head.weight",
    }
    fmt = _Format(layer_tensor=_LLAMA_FORMAT_LAYER, ignored=_LLAMA_FORMAT_IGNORED, hints=hints)
    params = _load_params(
        root,
        _layout(config),
        described=_layout(described),
        n_layers=config.num_hidden_layers,
        described_layers=described.num_hidden_layers,
        fmt=fmt,
        shardings=shardings,
        dtype=dtype,
        strict=strict,
        check_only=check_only,
    )
    return config, params


def _checkpoint_dir(path: str | Path, strict: Any) -> Path:
    root = Path(path)
    if not root.is_dir():
        msg = (
            f"checkpoint: {root} is not a directory (expected a Hugging Face checkpoint directory)"
        )
        raise CheckpointError(msg)
    if not isinstance(strict, bool):
        msg = f"strict: got {strict!r}; expected True or False"
        raise CheckpointError(msg)
    return root


def _check_layers(layers: Any, n_layers: int) -> None:
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= n_layers:
        msg = f"layers: got {layers!r}; expected an int in [1, {n_layers}] (num_hidden_layers)"
        raise CheckpointError(msg)


@attrs.frozen
class _Format:
    """How one family names its tensors: ``layer_tensor`` matches a decoder layer's tensors
    (group 1: the layer index), ``ignored`` the buffers that old transformers saved beside the
    weights (no parameters: RoPE tables, causal masks), ``hints`` a sentence per kind of
    unexpected tensor (keyed by a name suffix)."""

    layer_tensor: re.Pattern[str]
    ignored: re.Pattern[str]
    hints: Mapping[str, str]


def _load_params(
    root: Path,
    layout: dict[str, Any],
    *,
    described: dict[str, Any],
    n_layers: int,
    described_layers: int,
    fmt: _Format,
    shardings: Any,
    dtype: Any,
    strict: bool,
    check_only: bool = False,
) -> dict[str, Any]:
    """The params of ``layout`` read from the checkpoint at ``root`` into their shardings, after
    checking every tensor's presence, shape and dtype, and that the checkpoint holds nothing
    ``described`` (the layout config.json describes) does not account for. ``check_only``: run
    the checks from the files' headers and return ``{}`` without reading any data."""
    want_dtype = None
    if dtype is not None:
        want_dtype = np.dtype(dtype)
        if not jnp.issubdtype(want_dtype, jnp.floating):
            msg = f"dtype: got {want_dtype}; expected a floating dtype (float32, bfloat16, float16)"
            raise CheckpointError(msg)
    # Not for a check: resolving the default placement asks JAX for its devices, which starts
    # the backend (before jax.distributed.initialize in a multi-process run's validation).
    placements = None if check_only else _resolve_shardings(shardings, layout)
    entries: list[tuple[tuple[str, ...], _Param]] = [
        ((k,), p) for k, p in layout.items() if k != "layers"
    ]
    entries += [(("layers", k), p) for k, p in layout["layers"].items()]

    with ExitStack() as stack:
        ckpt = _Checkpoint(root, stack)
        _check_accounted_for(ckpt, described, described_layers, fmt, strict=strict)
        # Check everything (names, shapes, dtypes) before reading any data.
        stored: dict[str, list[str]] = {}  # dtype → tensors stored in it
        for _, param in entries:
            names = (
                [param.tensor(i) for i in range(n_layers)] if param.stacked else [param.tensor()]
            )
            for name in names:
                stored.setdefault(_check_tensor(ckpt, name, param), []).append(name)
        if want_dtype is None and len(stored) > 1:
            mix = "; ".join(
                f"{d}: {len(set(names))} tensor(s), e.g. {names[0]!r}"
                for d, names in sorted(stored.items())
            )
            msg = (
                f"checkpoint: {root} stores its tensors in several dtypes ({mix}); with "
                "dtype=None pd keeps the stored dtypes and the forward would run in a mix of "
                "precisions. Pass dtype= (target.dtype in a run config) to load all in one."
            )
            raise CheckpointError(msg)
        if check_only:
            return {}
        np_dtype = want_dtype or np.dtype(_np_dtype(next(iter(stored))))

        assert placements is not None
        params: dict[str, Any] = {"layers": {}}
        for keys, param in entries:
            sharding = placements[keys[0]] if len(keys) == 1 else placements["layers"][keys[1]]
            _check_divisible(keys, param.shape, sharding)
            callback = _reader(ckpt, param, np_dtype)
            array = jax.make_array_from_callback(param.shape, sharding, callback)
            if len(keys) == 1:
                params[keys[0]] = array
            else:
                params["layers"][keys[1]] = array
    return params


def _expected_names(layout: dict[str, Any], n_layers: int) -> set[str]:
    out = {p.tensor() for k, p in layout.items() if k != "layers"}
    out |= {p.tensor(i) for p in layout["layers"].values() for i in range(n_layers)}
    return out


def _check_accounted_for(
    ckpt: _Checkpoint, layout: dict[str, Any], n_layers: int, fmt: _Format, *, strict: bool
) -> None:
    """Refuse tensors that ``layout`` (config.json as written, ``n_layers`` decoder layers) does
    not account for; with ``strict=False`` only whole decoder layers past ``n_layers`` are
    skipped."""
    expected = _expected_names(layout, n_layers)
    found = ckpt.all_names()
    unexpected = sorted(n for n in found if n not in expected and not fmt.ignored.fullmatch(n))
    deeper: set[int] = set()
    for name in unexpected:
        m = fmt.layer_tensor.fullmatch(name)
        if m and int(m.group(1)) >= n_layers:
            deeper.add(int(m.group(1)))
    if not strict:
        unexpected = [
            n
            for n in unexpected
            if not ((m := fmt.layer_tensor.fullmatch(n)) and int(m.group(1)) in deeper)
        ]
    if not unexpected:
        if deeper:
            log.warning(
                "checkpoint %s: strict=False, skipping decoder layers %s past config.json's "
                "num_hidden_layers (%d)",
                ckpt.root,
                format_ranges(sorted(deeper)),
                n_layers,
            )
        return
    shown = [f"{n} ({found[n]})" for n in unexpected[:8]]
    more = f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else ""
    hints = []
    if strict and deeper:
        hints.append(
            f"the checkpoint has decoder layers {format_ranges(sorted(deeper))} past config.json's "
            f"num_hidden_layers ({n_layers}); to load only the first "
            f"{n_layers} on purpose, pass strict=False (target.strict: false)"
        )
    for suffix, hint in fmt.hints.items():
        if any(n.endswith(suffix) for n in unexpected):
            hints.append(hint)
    msg = (
        f"checkpoint: {ckpt.root} holds {len(unexpected)} tensor(s) config.json does not account "
        f"for, which pd would silently ignore: {', '.join(shown)}{more}"
        + "".join(f"; {h}" for h in hints)
    )
    raise CheckpointError(msg)


# ---------------------------------------------------------------------------------------------
# GPT-2

#: GPT-2's config.json names and the attribute_map aliases transformers also reads.
_GPT2_ALIASES = {
    "n_embd": "hidden_size",
    "n_positions": "max_position_embeddings",
    "n_head": "num_attention_heads",
    "n_layer": "num_hidden_layers",
}
_GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu")


def gpt2_config_from_hf(d: Mapping[str, Any], *, source: str | Path | None = None) -> GPT2Config:
    """Read a Hugging Face GPT-2 ``config.json`` (``GPT2LMHeadModel``) into a :class:`GPT2Config`.

    Both spellings transformers reads are accepted: GPT-2's own (``n_embd``, ``n_positions``,
    ``n_head``, ``n_layer``) and the generic aliases of its ``attribute_map`` (``hidden_size``,
    ``max_position_embeddings``, ``num_attention_heads``, ``num_hidden_layers``); both present
    must agree. Absent fields take ``GPT2Config``'s defaults, except the sizes, which are
    required. Types are checked as for Llama (no coercion). Refused, as the forward would not
    reproduce them: ``activation_function`` other than gelu_new / gelu_pytorch_tanh / gelu,
    ``scale_attn_weights: false``, ``scale_attn_by_inverse_layer_idx: true``,
    ``add_cross_attention: true``. (``reorder_and_upcast_attn`` only changes the precision of
    the scores; pd computes the softmax in fp32 either way.)
    """
    file = str(source) if source is not None else getattr(d, "path", None)
    top = _Reader(d, file)
    archs = d.get("architectures")
    if archs is not None and (
        not isinstance(archs, list | tuple) or list(archs) != ["GPT2LMHeadModel"]
    ):
        raise top.error("architectures", f"got {_shown(archs)}; pd supports ['GPT2LMHeadModel']")
    model_type = d.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise top.error("model_type", f"got {_shown(model_type)}; pd supports 'gpt2'")
    sizes: dict[str, int] = {}
    for name, alias in _GPT2_ALIASES.items():
        if top.has(name) and top.has(alias):
            a, b = top.integer(name), top.integer(alias)
            if a != b:
                msg = f"got {b!r} but {name} is {a!r}; the two spellings must agree"
                raise top.error(alias, msg)
        key = name if top.has(name) or not top.has(alias) else alias
        sizes[name] = top.integer(key)
    if d.get("vocab_size") is None:
        raise top.error("vocab_size", "required field missing")
    act = d.get("activation_function", "gelu_new")
    if act not in _GPT2_ACTIVATIONS:
        allowed = ", ".join(map(repr, _GPT2_ACTIVATIONS))
        raise top.error("activation_function", f"got {_shown(act)}; pd supports {allowed}")
    for key, want in (
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
    ):
        if top.boolean(key, want) != want:
            raise top.error(key, f"got {_shown(not want)}; pd supports {str(want).lower()}")
    top.boolean("reorder_and_upcast_attn", False)  # well-typed, though it changes no value here
    try:
        return GPT2Config(
            vocab_size=top.integer("vocab_size"),
            **sizes,
            n_inner=top.integer("n_inner", None, null_is_default=True),
            layer_norm_epsilon=top.number("layer_norm_epsilon", 1e-5),
            activation_function=act,
            tie_word_embeddings=top.boolean("tie_word_embeddings", True),
        )
    except FieldValueError as e:
        raise top.error(e.field, e.message) from None


def _gpt2_layout(config: GPT2Config, prefix: str) -> dict[str, Any]:
    """Each GPT-2 param and its tensor (``prefix``: ``"transformer."`` or ``""``)."""
    L, d, v, f = config.n_layer, config.n_embd, config.vocab_size, config.inner
    h = f"{prefix}h.{{i}}."
    top: dict[str, Any] = {
        "embed_tokens": _Param((v, d), f"{prefix}wte.weight"),
        "embed_positions": _Param((config.n_positions, d), f"{prefix}wpe.weight"),
        "norm": _Param((d,), f"{prefix}ln_f.weight"),
        "norm_bias": _Param((d,), f"{prefix}ln_f.bias"),
    }
    if not config.tie_word_embeddings:
        top["lm_head"] = _Param((d, v), "lm_head.weight", transpose=True)
    layers: dict[str, Any] = {}
    for key, module in (("input_layernorm", "ln_1"), ("post_attention_layernorm", "ln_2")):
        layers[key] = _Param((L, d), f"{h}{module}.weight")
        layers[key + "_bias"] = _Param((L, d), f"{h}{module}.bias")
    for j, k in enumerate(("q", "k", "v")):  # the fused c_attn [d, 3d]: columns [q | k | v]
        part = (j * d, (j + 1) * d, 3 * d)
        layers[f"{k}_proj"] = _Param((L, d, d), f"{h}attn.c_attn.weight", part=part)
        layers[f"{k}_bias"] = _Param((L, d), f"{h}attn.c_attn.bias", part=part)
    for kind, module, shape in (
        ("o", "attn.c_proj", (d, d)),
        ("up", "mlp.c_fc", (d, f)),
        ("down", "mlp.c_proj", (f, d)),
    ):
        layers[f"{kind}_proj"] = _Param((L, *shape), f"{h}{module}.weight")
        layers[f"{kind}_bias"] = _Param((L, shape[1]), f"{h}{module}.bias")
    return {**top, "layers": layers}


def _gpt2_prefix(root: Path) -> str:
    """``"transformer."`` for a checkpoint saved from ``GPT2LMHeadModel``, ``""`` for one saved
    from the bare ``GPT2Model`` (as the original ``gpt2`` repository is)."""
    with ExitStack() as stack:
        names = _Checkpoint(root, stack).all_names()
    if "transformer.wte.weight" in names:
        return "transformer."
    if "wte.weight" in names:
        return ""
    msg = f"checkpoint: tensor 'transformer.wte.weight' is missing from {root}"
    raise CheckpointError(msg)


def load_gpt2_checkpoint(
    path: str | Path,
    *,
    shardings: Any = None,
    dtype: Any = None,
    layers: int | None = None,
    strict: bool = True,
    check_only: bool = False,
) -> tuple[GPT2Config, dict[str, Any]]:
    """Load a Hugging Face GPT-2 checkpoint directory (``GPT2LMHeadModel`` safetensors) into
    sharded jax arrays laid out as :mod:`pd_train.models.gpt2` says, with the same checks and
    arguments as :func:`load_llama_checkpoint`. ``Conv1D`` weights are stored [in, out] and
    load as they are; the fused ``attn.c_attn`` weight and bias load as the q, k and v columns.
    Tensor names may carry the ``transformer.`` prefix or not (one spelling for the whole
    checkpoint); the causal-mask buffers old checkpoints saved (``h.{i}.attn.bias``,
    ``h.{i}.attn.masked_bias``) are ignored, as transformers ignores them. ``check_only``: run
    every check from the files' headers and return ``(config, {})`` without reading data."""
    root = _checkpoint_dir(path, strict)
    config = gpt2_config_from_hf(read_hf_config(root))
    described = config
    if layers is not None:
        _check_layers(layers, config.n_layer)
        config = attrs.evolve(config, n_layer=layers)
    prefix = _gpt2_prefix(root)
    fmt = _Format(
        layer_tensor=re.compile(re.escape(prefix) + r"h\.(\d+)\.(.+)"),
        ignored=re.compile(re.escape(prefix) + r"h\.\d+\.attn\.(masked_)?bias"),
        hints={
            "lm_head.weight": "config.json says tie_word_embeddings true (GPT-2's default), but "
            "the checkpoint has lm_head.weight",
        },
    )
    params = _load_params(
        root,
        _gpt2_layout(config, prefix),
        described=_gpt2_layout(described, prefix),
        n_layers=config.n_layer,
        described_layers=described.n_layer,
        fmt=fmt,
        shardings=shardings,
        dtype=dtype,
        strict=strict,
        check_only=check_only,
    )
    return config, params


def check_hf_checkpoint(path: str | Path, *, family: str, strict: bool = True) -> None:
    """Raise :class:`CheckpointError` when the ``family`` (``llama``, ``qwen2``, ``qwen3``,
    ``gpt2``) checkpoint directory at ``path`` would fail to load: every check its loader runs
    (config.json, each tensor's presence, shape and stored dtype, nothing unaccounted for),
    from the files' headers only."""
    if family == "gpt2":
        load_gpt2_checkpoint(path, strict=strict, check_only=True)
        return
    families = {"llama": _LLAMA, "qwen2": _QWEN2, "qwen3": _QWEN3}
    if family not in families:
        msg = f"check_hf_checkpoint: family {family!r}; known: {', '.join(sorted(families))}, gpt2"
        raise ValueError(msg)
    _load_llama_like(
        path,
        families[family],
        shardings=None,
        dtype=None,
        layers=None,
        strict=strict,
        check_only=True,
    )


def format_ranges(values: list[int]) -> str:
    """``[3, 4, 5, 7]`` → ``'3-5, 7'``."""
    out: list[str] = []
    for v in values:
        if out and out[-1].split("-")[-1] == str(v - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        else:
            out.append(str(v))
    return ", ".join(out)


def _np_dtype(name: str) -> Any:
    if name == "bfloat16":  # numpy has no bfloat16; ml_dtypes (a jax dependency) does
        return ml_dtypes.bfloat16
    return np.dtype(name)


def _check_divisible(keys: tuple[str, ...], shape: tuple[int, ...], sharding: Any) -> None:
    """Refuse a sharding that splits a dimension unevenly, naming the param."""
    try:
        sharding.shard_shape(shape)
    except ValueError as e:
        msg = f"shardings.{'.'.join(keys)}: cannot shard shape {list(shape)}: {e}"
        raise CheckpointError(msg) from e


def _with_layers(config: LlamaConfig, layers: int) -> LlamaConfig:
    return attrs.evolve(config, num_hidden_layers=layers)
