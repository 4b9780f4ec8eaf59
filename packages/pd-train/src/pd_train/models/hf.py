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
"""

from __future__ import annotations

import json
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
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_NORMS = ("input_layernorm", "post_attention_layernorm")


class CheckpointError(ValueError):
    """A checkpoint directory or its config.json that pd cannot load as a Llama target."""


# ---------------------------------------------------------------------------------------------
# config.json


def read_hf_config(path: str | Path) -> dict[str, Any]:
    """The parsed ``config.json`` of a checkpoint directory (or of the file itself)."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        msg = f"checkpoint config: {file} does not exist (a Hugging Face checkpoint directory holds config.json)"
        raise CheckpointError(msg)
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        msg = f"checkpoint config: {file} is not valid JSON ({e})"
        raise CheckpointError(msg) from e
    if not isinstance(data, dict):
        msg = f"checkpoint config: {file} holds a {type(data).__name__}, expected a JSON object"
        raise CheckpointError(msg)
    return data


def llama_config_from_hf(d: Mapping[str, Any]) -> LlamaConfig:
    """Read a Hugging Face Llama ``config.json`` (as a dict) into a :class:`LlamaConfig`.

    Both dialects are read: the one most Llama 3.x checkpoints use (top-level ``rope_theta``,
    ``rope_scaling``, ``torch_dtype``) and the one transformers ≥ 5 writes (``rope_parameters``
    holding ``rope_theta`` and the scaling fields, ``dtype``). Fields that are absent take the
    defaults of transformers' ``LlamaConfig``, and precedence follows transformers too (a value
    inside ``rope_scaling``/``rope_parameters`` wins over the top-level one). Anything the
    forward pass would not reproduce exactly is refused: other architectures, ``hidden_act``
    other than silu, attention or MLP biases, RoPE types other than default and llama3, and
    partial rotary embeddings.
    """

    def bad(field: str, value: Any, allowed: str) -> CheckpointError:
        return CheckpointError(f"checkpoint config: {field} is {value!r}; pd supports {allowed}")

    def refused(field: str, error: FieldValueError) -> CheckpointError:
        return CheckpointError(f"checkpoint config: {field}: {error.message}")

    archs = d.get("architectures")
    if archs is not None and list(archs) != ["LlamaForCausalLM"]:
        raise bad("architectures", archs, "['LlamaForCausalLM']")
    if d.get("model_type", "llama") != "llama":
        raise bad("model_type", d.get("model_type"), "'llama'")
    if d.get("hidden_act", "silu") != "silu":
        raise bad("hidden_act", d.get("hidden_act"), "'silu'")
    for field in ("attention_bias", "mlp_bias"):
        if d.get(field, False):
            raise bad(field, d[field], "false (Llama has no biases)")
    missing = [k for k in _REQUIRED if d.get(k) is None]
    if missing:
        msg = f"checkpoint config: required field(s) {missing} missing"
        raise CheckpointError(msg)

    # transformers: rope_scaling (legacy name) wins over rope_parameters when both are there.
    rope_field = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    rope = d.get(rope_field) or {}
    if not isinstance(rope, Mapping):
        raise bad(rope_field, rope, "a mapping or null")
    if any(isinstance(v, Mapping) for v in rope.values()):
        raise bad(rope_field, rope, "one RoPE setting for all layers (not nested per layer type)")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise bad(f"{rope_field}.rope_type", rope_type, "'default' or 'llama3'")
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial is not None and partial != 1.0:
        raise bad("partial_rotary_factor", partial, "1.0 (rotary embedding over the whole head)")
    rope_theta = rope.get("rope_theta", d.get("rope_theta", _HF_DEFAULTS["rope_theta"]))
    max_pos = d.get("max_position_embeddings", _HF_DEFAULTS["max_position_embeddings"])

    scaling = None
    if rope_type == "llama3":
        absent = [k for k in _LLAMA3_KEYS if rope.get(k) is None]
        if absent:
            msg = f"checkpoint config: {rope_field} has rope_type 'llama3' but no {absent}"
            raise CheckpointError(msg)
        # As in transformers: a top-level original_max_position_embeddings wins, then the one
        # inside the rope dict, then max_position_embeddings.
        original = d.get(
            "original_max_position_embeddings",
            rope.get("original_max_position_embeddings", max_pos),
        )
        try:
            scaling = RopeScaling(
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(original),
            )
        except FieldValueError as e:
            top_level = e.field == "original_max_position_embeddings" and e.field in d
            raise refused(e.field if top_level else f"{rope_field}.{e.field}", e) from None

    heads = int(d["num_attention_heads"])
    kv_heads = d.get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else int(kv_heads)
    head_dim = d.get("head_dim")
    # LlamaConfig checks sizes, divisibility and the RoPE head dim; its field names are the
    # config.json keys, except rope_theta read from inside the rope dict.
    try:
        return LlamaConfig(
            vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=None if head_dim is None else int(head_dim),
            rms_norm_eps=float(d.get("rms_norm_eps", _HF_DEFAULTS["rms_norm_eps"])),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=int(max_pos),
            tie_word_embeddings=bool(
                d.get("tie_word_embeddings", _HF_DEFAULTS["tie_word_embeddings"])
            ),
        )
    except FieldValueError as e:
        in_rope = e.field == "rope_theta" and "rope_theta" in rope
        raise refused(f"{rope_field}.{e.field}" if in_rope else e.field, e) from None


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
    """The safetensors files of one checkpoint directory, opened memory-mapped for reading."""

    def __init__(self, root: Path, stack: ExitStack) -> None:
        self.root = root
        index = root / "model.safetensors.index.json"
        single = root / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
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
        for fname in names:
            file = root / fname
            if not file.is_file():
                msg = f"checkpoint: {file} is named in model.safetensors.index.json but does not exist"
                raise CheckpointError(msg)
            self._handles[fname] = stack.enter_context(safe_open(str(file), framework="numpy"))
            self._names[fname] = set(self._handles[fname].keys())
        if not self.file_of:
            self.file_of = dict.fromkeys(
                self._handles["model.safetensors"].keys(), "model.safetensors"
            )

    def where(self, name: str) -> str:
        return str(self.root / self.file_of[name]) if name in self.file_of else str(self.root)

    def info(self, name: str) -> tuple[tuple[int, ...], str]:
        """Shape and dtype name (numpy spelling) of tensor ``name``, from the file header."""
        if name not in self.file_of:
            msg = f"checkpoint: tensor {name!r} is missing from {self.where(name)}"
            raise CheckpointError(msg)
        handle = self._handles[self.file_of[name]]
        if name not in self._names[self.file_of[name]]:
            msg = f"checkpoint: tensor {name!r} is missing from {self.where(name)} (the index names that file)"
            raise CheckpointError(msg)
        view = handle.get_slice(name)
        raw = view.get_dtype()
        if raw not in _SAFETENSORS_DTYPES:
            msg = f"checkpoint: tensor {name!r} in {self.where(name)} has dtype {raw}; pd reads {sorted(_SAFETENSORS_DTYPES)}"
            raise CheckpointError(msg)
        return tuple(int(s) for s in view.get_shape()), _SAFETENSORS_DTYPES[raw]

    def read_slice(self, name: str, index: Index) -> np.ndarray:
        """``tensor[index]`` of tensor ``name``, reading only those elements from disk."""
        out = self._handles[self.file_of[name]].get_slice(name)[index]
        return np.asarray(out)


def _normalize(index: Index, shape: tuple[int, ...]) -> Index:
    """Concrete ``slice(start, stop)`` per dimension (JAX gives ``slice(None)`` for whole dims)."""
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
        index = _normalize(index if index is not None else (slice(None),) * len(shape), shape)
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
) -> tuple[LlamaConfig, dict[str, Any]]:
    """Load a Hugging Face Llama checkpoint directory straight into sharded jax arrays.

    Args:
      path: directory with ``config.json`` and either ``model.safetensors`` or shards named by
        ``model.safetensors.index.json``.
      shardings: where each param lives: a dict matching the params (see the module docstring;
        no ``lm_head`` when embeddings are tied), one ``Sharding`` for every array, or None
        (all on the first local device). Each process reads only the slices that its
        addressable devices hold.
      dtype: dtype of the loaded arrays (converted slice by slice on the host); None keeps the
        checkpoint's dtype.
      layers: load only the first ``layers`` decoder layers (the returned config says so).

    Returns:
      ``(config, params)``. Every tensor's presence and shape is checked against config.json
      before anything is read.
    """
    root = Path(path)
    if not root.is_dir():
        msg = (
            f"checkpoint: {root} is not a directory (expected a Hugging Face checkpoint directory)"
        )
        raise CheckpointError(msg)
    config = llama_config_from_hf(read_hf_config(root))
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
        # Check everything (names, shapes, per-layer dtype agreement) before reading any data.
        plan: list[tuple[tuple[str, ...], tuple[int, ...], bool, bool, np.dtype]] = []
        for key, entry in layout.items():
            if key == "layers":
                continue
            shape, transpose = entry
            stored = _check_tensor(ckpt, _hf_name(key), shape, transpose)
            plan.append(
                ((key,), shape, transpose, False, want_dtype or np.dtype(_np_dtype(stored)))
            )
        for key, (shape, transpose) in layout["layers"].items():
            stored_dtypes = {
                _check_tensor(ckpt, _hf_name(key, i), shape[1:], transpose)
                for i in range(config.num_hidden_layers)
            }
            if want_dtype is None and len(stored_dtypes) > 1:
                msg = (
                    f"checkpoint: layers of {key} are stored in several dtypes {sorted(stored_dtypes)}; "
                    "pass dtype= to stack them"
                )
                raise CheckpointError(msg)
            plan.append(
                (
                    ("layers", key),
                    shape,
                    transpose,
                    True,
                    want_dtype or np.dtype(_np_dtype(stored_dtypes.pop())),
                )
            )

        params: dict[str, Any] = {"layers": {}}
        for keys, shape, transpose, stacked, np_dtype in plan:
            sharding = placements[keys[0]] if len(keys) == 1 else placements["layers"][keys[1]]
            _check_divisible(keys, shape, sharding)
            callback = _reader(ckpt, keys[-1], shape, transpose, stacked, np_dtype)
            array = jax.make_array_from_callback(shape, sharding, callback)
            if len(keys) == 1:
                params[keys[0]] = array
            else:
                params["layers"][keys[1]] = array
    return config, params


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
