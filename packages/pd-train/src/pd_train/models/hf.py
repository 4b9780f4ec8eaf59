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
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open

from pd_train._config_io import FieldValueError
from pd_train.models.llama_config import LlamaConfig, RopeScaling

__all__ = [
    "CheckpointError",
    "HFConfig",
    "HFConfigError",
    "llama_config_from_hf",
    "llama_param_shapes",
    "load_llama_checkpoint",
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
    file = str(source) if source is not None else getattr(d, "path", None)
    top = _Reader(d, file)

    def unsupported(reader: _Reader, key: str, value: Any, allowed: str) -> HFConfigError:
        return reader.error(key, f"got {_shown(value)}; pd supports {allowed}")

    archs = d.get("architectures")
    if archs is not None and (
        not isinstance(archs, list | tuple) or list(archs) != ["LlamaForCausalLM"]
    ):
        raise unsupported(top, "architectures", archs, "['LlamaForCausalLM']")
    for key, only in (("model_type", "llama"), ("hidden_act", "silu")):
        value = d.get(key, only)
        if not isinstance(value, str) or value != only:
            raise unsupported(top, key, value, repr(only))
    for key in ("attention_bias", "mlp_bias"):
        if top.boolean(key, False):
            raise unsupported(top, key, True, "false (Llama has no biases)")
    missing = [k for k in _REQUIRED if d.get(k) is None]
    if missing:
        raise top.error(", ".join(missing), "required field(s) missing")

    # transformers: rope_scaling (legacy name) wins over rope_parameters when both are there.
    for key in ("rope_scaling", "rope_parameters"):
        value = d.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise unsupported(top, key, value, "an object or null")
    rope_field = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    if d.get("rope_scaling") and d.get("rope_parameters"):
        # Both spellings of the RoPE settings (written by some transformers versions): they
        # must agree wherever both give a value; pd does not pick one of two different models.
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
    rope = _Reader(rope_dict, file, prefix=f"{rope_field}.")
    for key, value in rope_dict.items():
        if isinstance(value, Mapping):
            raise unsupported(
                rope, key, value, "one RoPE setting for all layers (not per layer type)"
            )
    type_key = "rope_type" if "rope_type" in rope_dict or "type" not in rope_dict else "type"
    rope_type = rope_dict.get(type_key, "default")
    if not isinstance(rope_type, str) or rope_type not in ("default", "llama3"):
        raise unsupported(rope, type_key, rope_type, "'default' or 'llama3'")
    partial_from = rope if rope.has("partial_rotary_factor") else top
    if partial_from.d.get("partial_rotary_factor") is not None:
        partial = partial_from.number("partial_rotary_factor")
        if partial != 1.0:
            raise unsupported(
                partial_from,
                "partial_rotary_factor",
                partial,
                "1.0 (rotary embedding over the whole head)",
            )
    theta_from = rope if rope.has("rope_theta") else top
    rope_theta = theta_from.number("rope_theta", _HF_DEFAULTS["rope_theta"])
    for overridden in ("rope_theta", "partial_rotary_factor"):
        # A top-level value the rope dict overrides is unused, but still must be well-typed.
        if rope.has(overridden) and top.d.get(overridden) is not None:
            top.number(overridden)
    max_pos = top.integer("max_position_embeddings", _HF_DEFAULTS["max_position_embeddings"])

    scaling = None
    if rope_type == "llama3":
        absent = [k for k in _LLAMA3_KEYS if rope_dict.get(k) is None]
        if absent:
            raise rope.error(type_key, f"is 'llama3' but {absent} missing")
        # As in transformers: a top-level original_max_position_embeddings wins, then the one
        # inside the rope dict, then max_position_embeddings.
        original_from = top if top.has("original_max_position_embeddings") else rope
        original = original_from.integer("original_max_position_embeddings", max_pos)
        if original_from is top and rope.has("original_max_position_embeddings"):
            rope.integer("original_max_position_embeddings")  # unused, but still well-typed
        factors = {k: rope.number(k) for k in _LLAMA3_KEYS}
        try:
            scaling = RopeScaling(**factors, original_max_position_embeddings=original)
        except FieldValueError as e:
            reader = original_from if e.field == "original_max_position_embeddings" else rope
            raise reader.error(e.field, e.message) from None

    sizes = {k: top.integer(k) for k in _REQUIRED}
    heads = sizes["num_attention_heads"]
    kv_heads = top.integer("num_key_value_heads", heads, null_is_default=True)
    head_dim = top.integer("head_dim", None, null_is_default=True)
    # LlamaConfig checks sizes, divisibility and the RoPE head dim; its field names are the
    # config.json keys, except rope_theta read from inside the rope dict.
    try:
        return LlamaConfig(
            **sizes,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=top.number("rms_norm_eps", _HF_DEFAULTS["rms_norm_eps"]),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            max_position_embeddings=max_pos,
            tie_word_embeddings=top.boolean(
                "tie_word_embeddings", _HF_DEFAULTS["tie_word_embeddings"]
            ),
        )
    except FieldValueError as e:
        reader = theta_from if e.field == "rope_theta" else top
        raise reader.error(e.field, e.message) from None


# ---------------------------------------------------------------------------------------------
# parameter layout


def _hf_name(key: str, layer: int | None = None) -> str:
    """The checkpoint tensor that param ``key`` (of decoder layer ``layer``) comes from."""
    if layer is None:
        return {"embed_tokens": "model.embed_tokens.weight", "norm": "model.norm.weight"}.get(
            key, f"{key}.weight"
        )
    block = "self_attn" if key in _ATTN else "mlp" if key in _MLP else None
    middle = f"{block}.{key}" if block else key
    return f"model.layers.{layer}.{middle}.weight"


def _layout(config: LlamaConfig) -> dict[str, Any]:
    """For each param: (global shape, tensor source). Source is (name, transpose) or, for
    stacked layer arrays, (name of layer 0, transpose) with the layer index filled in later."""
    L, d, v = config.num_hidden_layers, config.hidden_size, config.vocab_size
    top: dict[str, Any] = {"embed_tokens": ((v, d), False), "norm": ((d,), False)}
    if not config.tie_word_embeddings:
        top["lm_head"] = ((d, v), True)
    layers: dict[str, Any] = {k: ((L, d), False) for k in _NORMS}
    for kind, (d_in, d_out) in config.site_shapes().items():
        layers[kind] = ((L, d_in, d_out), True)
    return {**top, "layers": layers}


def llama_param_shapes(config: LlamaConfig, dtype: Any = np.float32) -> dict[str, Any]:
    """The params pytree of ``config`` as :class:`jax.ShapeDtypeStruct` leaves (no data)."""
    return jax.tree.map(
        lambda entry: jax.ShapeDtypeStruct(entry[0], np.dtype(dtype)),
        _layout(config),
        is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], bool),
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


def _normalize(index: Index | None, shape: tuple[int, ...]) -> Index:
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
    ckpt: _Checkpoint,
    key: str,
    shape: tuple[int, ...],
    transpose: bool,
    stacked: bool,
    dtype: np.dtype,
) -> Callable[[Index | None], np.ndarray]:
    """A ``make_array_from_callback`` callback that reads param ``key``'s slice ``index``."""
    cache: dict[tuple[tuple[int, int], ...], np.ndarray] = {}

    def read_one(name: str, index: Index) -> np.ndarray:
        # Transposed params [d_in, d_out] come from HF's [d_out, d_in]: read the mirrored slice.
        src = index[::-1] if transpose else index
        part = ckpt.read_slice(name, src)
        part = part.T if transpose else part
        return np.ascontiguousarray(part, dtype=dtype)

    def callback(index: Index | None) -> np.ndarray:
        index = _normalize(index, shape)
        memo = tuple((s.start, s.stop) for s in index)
        if memo in cache:  # partially replicated shardings ask for one slice several times
            return cache[memo]
        if stacked:
            layers, rest = index[0], index[1:]
            out = np.empty([s.stop - s.start for s in index], dtype=dtype)
            for i, layer in enumerate(range(layers.start, layers.stop)):
                out[i] = read_one(_hf_name(key, layer), rest)
        else:
            out = read_one(_hf_name(key), index)
        cache[memo] = out
        return out

    return callback


def _check_tensor(ckpt: _Checkpoint, name: str, expected: tuple[int, ...], transpose: bool) -> str:
    shape, dtype = ckpt.info(name)
    want = expected[::-1] if transpose else expected
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


def load_llama_checkpoint(
    path: str | Path,
    *,
    shardings: Any = None,
    dtype: Any = None,
    layers: int | None = None,
    strict: bool = True,
) -> tuple[LlamaConfig, dict[str, Any]]:
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
    """
    root = Path(path)
    if not root.is_dir():
        msg = (
            f"checkpoint: {root} is not a directory (expected a Hugging Face checkpoint directory)"
        )
        raise CheckpointError(msg)
    if not isinstance(strict, bool):
        msg = f"strict: got {strict!r}; expected True or False"
        raise CheckpointError(msg)
    config = llama_config_from_hf(read_hf_config(root))
    described = config
    if layers is not None:
        if (
            isinstance(layers, bool)
            or not isinstance(layers, int)
            or not 1 <= layers <= config.num_hidden_layers
        ):
            msg = f"layers: got {layers!r}; expected an int in [1, {config.num_hidden_layers}] (num_hidden_layers)"
            raise CheckpointError(msg)
        config = _with_layers(config, layers)
    want_dtype = None
    if dtype is not None:
        want_dtype = np.dtype(dtype)
        if not jnp.issubdtype(want_dtype, jnp.floating):
            msg = f"dtype: got {want_dtype}; expected a floating dtype (float32, bfloat16, float16)"
            raise CheckpointError(msg)
    layout = _layout(config)
    placements = _resolve_shardings(shardings, layout)

    with ExitStack() as stack:
        ckpt = _Checkpoint(root, stack)
        _check_accounted_for(ckpt, described, strict=strict)
        # Check everything (names, shapes, dtypes) before reading any data.
        plan: list[tuple[tuple[str, ...], tuple[int, ...], bool, bool]] = []
        stored: dict[str, list[str]] = {}  # dtype → tensors stored in it
        for key, entry in layout.items():
            if key == "layers":
                continue
            shape, transpose = entry
            name = _hf_name(key)
            stored.setdefault(_check_tensor(ckpt, name, shape, transpose), []).append(name)
            plan.append(((key,), shape, transpose, False))
        for key, (shape, transpose) in layout["layers"].items():
            for i in range(config.num_hidden_layers):
                name = _hf_name(key, i)
                stored.setdefault(_check_tensor(ckpt, name, shape[1:], transpose), []).append(name)
            plan.append((("layers", key), shape, transpose, True))
        if want_dtype is None and len(stored) > 1:
            mix = "; ".join(
                f"{d}: {len(names)} tensor(s), e.g. {names[0]!r}"
                for d, names in sorted(stored.items())
            )
            msg = (
                f"checkpoint: {root} stores its tensors in several dtypes ({mix}); with "
                "dtype=None pd keeps the stored dtypes and the forward would run in a mix of "
                "precisions. Pass dtype= (target.dtype in a run config) to load all in one."
            )
            raise CheckpointError(msg)
        np_dtype = want_dtype or np.dtype(_np_dtype(next(iter(stored))))

        params: dict[str, Any] = {"layers": {}}
        for keys, shape, transpose, stacked in plan:
            sharding = placements[keys[0]] if len(keys) == 1 else placements["layers"][keys[1]]
            _check_divisible(keys, shape, sharding)
            callback = _reader(ckpt, keys[-1], shape, transpose, stacked, np_dtype)
            array = jax.make_array_from_callback(shape, sharding, callback)
            if len(keys) == 1:
                params[keys[0]] = array
            else:
                params["layers"][keys[1]] = array
    return config, params


_LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.(.+)")
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def _check_accounted_for(ckpt: _Checkpoint, config: LlamaConfig, *, strict: bool) -> None:
    """Refuse tensors that ``config`` (config.json as written) does not account for; with
    ``strict=False`` only whole decoder layers past its ``num_hidden_layers`` are skipped."""
    layout = _layout(config)
    expected = {_hf_name(k) for k in layout if k != "layers"}
    expected |= {_hf_name(k, i) for k in layout["layers"] for i in range(config.num_hidden_layers)}
    found = ckpt.all_names()
    unexpected = sorted(n for n in found if n not in expected and not _IGNORED.fullmatch(n))
    deeper: set[int] = set()
    for name in unexpected:
        m = _LAYER_TENSOR.fullmatch(name)
        if m and int(m.group(1)) >= config.num_hidden_layers:
            deeper.add(int(m.group(1)))
    if not strict:
        unexpected = [
            n
            for n in unexpected
            if not ((m := _LAYER_TENSOR.fullmatch(n)) and int(m.group(1)) in deeper)
        ]
    if not unexpected:
        if deeper:
            log.warning(
                "checkpoint %s: strict=False, skipping decoder layers %s past config.json's "
                "num_hidden_layers (%d)",
                ckpt.root,
                _ranges(sorted(deeper)),
                config.num_hidden_layers,
            )
        return
    shown = [f"{n} ({found[n]})" for n in unexpected[:8]]
    more = f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else ""
    hints = []
    if strict and deeper:
        hints.append(
            f"the checkpoint has decoder layers {_ranges(sorted(deeper))} past config.json's "
            f"num_hidden_layers ({config.num_hidden_layers}); to load only the first "
            f"{config.num_hidden_layers} on purpose, pass strict=False (target.strict: false)"
        )
    if any(n.endswith(".bias") for n in unexpected):
        hints.append(
            "config.json says attention_bias/mlp_bias false, but the checkpoint has biases"
        )
    if "lm_head.weight" in unexpected:
        hints.append(
            "config.json says tie_word_embeddings true, but the checkpoint has lm_head.weight"
        )
    msg = (
        f"checkpoint: {ckpt.root} holds {len(unexpected)} tensor(s) config.json does not account "
        f"for, which pd would silently ignore: {', '.join(shown)}{more}"
        + "".join(f"; {h}" for h in hints)
    )
    raise CheckpointError(msg)


def _ranges(values: list[int]) -> str:
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
