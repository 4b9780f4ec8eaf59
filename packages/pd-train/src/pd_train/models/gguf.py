"""GGUF files (llama.cpp's format) as Llama checkpoints: metadata → :class:`LlamaConfig`,
tensors → params, dequantized to the requested dtype.

``target.checkpoint: path/to/model.gguf`` loads through here; the params come out exactly as
:func:`pd_train.models.hf.load_llama_checkpoint` gives them (Hugging Face key names, Linear
weights right-multiplied ``[d_in, d_out]``, decoder layers stacked on a leading axis, no
``lm_head`` when embeddings are tied).

Reading uses the ``gguf`` package (the format's own Python reader, a memory map): each array is
built with :func:`jax.make_array_from_callback`, and a callback dequantizes only the rows its
shard needs (GGUF quantizes each row on its own, in blocks along the row). Quantization types
are whatever ``gguf.quants.dequantize`` implements (F32, F16, BF16, Q4_0, Q4_1, Q8_0, the
K-quants, ...); a type it cannot dequantize is refused before anything is read.

llama.cpp's converter permutes the rows of ``q_proj`` and ``k_proj`` (per head, the two RoPE
halves are interleaved: Hugging Face row ``h*hd + i*hd/2 + j`` is stored at row
``h*hd + 2*j + i``); this loader reads them back in Hugging Face's order.

Only the ``llama`` architecture is read, without MoE, with full-head RoPE, and either no RoPE
scaling or Llama 3.x's llama3 scaling as llama.cpp stores it (per-frequency divisors in the
tensor ``rope_freqs.weight``, → :attr:`LlamaConfig.rope_freq_factors`); anything else is an
error naming the metadata key or tensor.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.config.io import FieldValueError
from pd_train.models.hf import CheckpointError, concrete_index, format_ranges, llama_param_shapes
from pd_train.models.llama import KINDS
from pd_train.models.llama_config import LlamaConfig

if TYPE_CHECKING:
    import gguf

__all__ = [
    "GGUF_SUFFIX",
    "check_gguf_checkpoint",
    "gguf_llama_config",
    "gguf_metadata",
    "is_gguf",
    "load_gguf_checkpoint",
    "open_gguf",
]

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
_ARCHITECTURES = ("llama",)
_FLOAT_TYPES = ("F32", "F16", "BF16", "F64")
# GGUF's integer tensor types: raw integers, not weights (gguf.quants passes them through as
# integers, so they would load as whole numbers).
_INTEGER_TYPES = ("I8", "I16", "I32", "I64")
_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.(.+)")

Index = tuple[slice, ...]

# pd's param key → GGUF tensor name (``{i}`` is the layer).
_TOP = {
    "embed_tokens": "token_embd.weight",
    "norm": "output_norm.weight",
    "lm_head": "output.weight",
}
_LAYER = {
    "input_layernorm": "blk.{i}.attn_norm.weight",
    "post_attention_layernorm": "blk.{i}.ffn_norm.weight",
    "q_proj": "blk.{i}.attn_q.weight",
    "k_proj": "blk.{i}.attn_k.weight",
    "v_proj": "blk.{i}.attn_v.weight",
    "o_proj": "blk.{i}.attn_output.weight",
    "gate_proj": "blk.{i}.ffn_gate.weight",
    "up_proj": "blk.{i}.ffn_up.weight",
    "down_proj": "blk.{i}.ffn_down.weight",
}
# Keys stored [d_out, d_in] (a Linear's weight) that pd holds transposed.
_TRANSPOSED = {"lm_head", *KINDS}


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file (by its ``.gguf`` suffix)."""
    return Path(path).suffix.lower() == GGUF_SUFFIX


def _gguf_module() -> Any:
    try:
        import gguf
    except ImportError:  # pragma: no cover - exercised only without the extra
        msg = (
            "checkpoint: reading a .gguf checkpoint needs the 'gguf' package; "
            "install it with `pip install 'pd-train[smollm2]'` (or `pip install gguf`)"
        )
        raise CheckpointError(msg) from None
    return gguf


@cache
def _open_cached(path: str, mtime_ns: int, size: int) -> gguf.GGUFReader:
    gguf = _gguf_module()
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # a truncated or garbled file fails anywhere in the header parse
        msg = f"checkpoint: {path} is not a readable GGUF file ({type(e).__name__}: {e})"
        raise CheckpointError(msg) from e


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """A ``gguf.GGUFReader`` (memory-mapped) of ``path``; a missing or unreadable file is a
    :class:`CheckpointError` naming it. Readers are cached per (path, mtime, size)."""
    file = Path(path)
    if not file.is_file():
        msg = f"checkpoint: {file} does not exist or is not a file (expected a .gguf file)"
        raise CheckpointError(msg)
    stat = file.stat()
    return _open_cached(str(file.resolve()), stat.st_mtime_ns, stat.st_size)


def gguf_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """The file's key/value metadata as plain Python values (strings, numbers, lists)."""
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = field.contents()
    return out


def gguf_llama_config(source: str | Path | gguf.GGUFReader) -> LlamaConfig:
    """The :class:`LlamaConfig` that a Llama GGUF's metadata describes.

    Read keys (``A`` is ``general.architecture``, which must be ``llama``): ``A.block_count``,
    ``A.embedding_length``, ``A.feed_forward_length``, ``A.attention.head_count``,
    ``A.attention.head_count_kv`` (default: head_count), ``A.attention.key_length`` (default
    hidden / heads), ``A.attention.layer_norm_rms_epsilon``, ``A.rope.freq_base`` (default
    10000), ``A.context_length``, ``A.vocab_size`` (default: the tokenizer's token count).
    Embeddings are tied when the file has no ``output.weight``.
    """
    reader = source if not isinstance(source, str | Path) else open_gguf(source)
    file = source if isinstance(source, str | Path) else _reader_path(reader)
    meta = reader.fields

    def get(key: str, default: Any = None, *, required: bool = False) -> Any:
        if key not in meta:
            if required:
                msg = f"checkpoint: {file} has no metadata key {key!r} (a Llama GGUF needs it)"
                raise CheckpointError(msg)
            return default
        value = meta[key].contents()
        if isinstance(value, list):
            msg = f"checkpoint: {file}: {key} is a per-layer list {value!r}; pd reads one value for all layers"
            raise CheckpointError(msg)
        return value

    arch = get("general.architecture", required=True)
    if arch not in _ARCHITECTURES:
        msg = (
            f"checkpoint: {file}: general.architecture is {arch!r}; pd reads {list(_ARCHITECTURES)}"
        )
        raise CheckpointError(msg)
    experts = get(f"{arch}.expert_count", 0)
    if experts:
        msg = f"checkpoint: {file}: {arch}.expert_count is {experts!r}; pd reads dense Llama models (0 experts)"
        raise CheckpointError(msg)
    scaling = get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        msg = (
            f"checkpoint: {file}: {arch}.rope.scaling.type is {scaling!r}; pd reads GGUF Llamas "
            "without RoPE scaling or with llama3 scaling given as per-frequency factors "
            "(the tensor rope_freqs.weight, type 'none')"
        )
        raise CheckpointError(msg)

    hidden = int(get(f"{arch}.embedding_length", required=True))
    heads = int(get(f"{arch}.attention.head_count", required=True))
    kv_heads = int(get(f"{arch}.attention.head_count_kv", heads))
    head_dim = get(f"{arch}.attention.key_length")
    value_dim = get(f"{arch}.attention.value_length", head_dim)
    if value_dim != head_dim:
        msg = f"checkpoint: {file}: {arch}.attention.value_length ({value_dim}) differs from key_length ({head_dim}); pd's Llama has one head dim"
        raise CheckpointError(msg)
    rope_dims = get(f"{arch}.rope.dimension_count")
    resolved_hd = int(head_dim) if head_dim is not None else hidden // heads
    if rope_dims is not None and int(rope_dims) != resolved_hd:
        msg = (
            f"checkpoint: {file}: {arch}.rope.dimension_count is {rope_dims}; pd applies RoPE "
            f"to the whole head ({resolved_hd})"
        )
        raise CheckpointError(msg)
    freq_factors = _rope_freq_factors(reader, file, resolved_hd)
    vocab = get(f"{arch}.vocab_size")
    if vocab is None:
        if "tokenizer.ggml.tokens" not in meta:
            msg = f"checkpoint: {file} has neither {arch}.vocab_size nor tokenizer.ggml.tokens"
            raise CheckpointError(msg)
        vocab = len(meta["tokenizer.ggml.tokens"].data)
    try:
        return LlamaConfig(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(get(f"{arch}.feed_forward_length", required=True)),
            num_hidden_layers=int(get(f"{arch}.block_count", required=True)),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=None if head_dim is None else int(head_dim),
            rms_norm_eps=_f32(get(f"{arch}.attention.layer_norm_rms_epsilon", required=True)),
            rope_theta=_f32(get(f"{arch}.rope.freq_base", 10_000.0)),
            max_position_embeddings=int(get(f"{arch}.context_length", 2048)),
            tie_word_embeddings="output.weight" not in _tensor_index(reader),
            rope_freq_factors=freq_factors,
        )
    except FieldValueError as e:
        msg = f"checkpoint: {file}: the metadata gives {e.field} {e.message}"
        raise CheckpointError(msg) from None


def _rope_freq_factors(
    reader: gguf.GGUFReader, file: str | Path, head_dim: int
) -> tuple[float, ...] | None:
    """``rope_freqs.weight`` [head_dim / 2] as floats, or None when the file has none.

    llama.cpp's converter stores a Llama 3.x's llama3 RoPE scaling this way: inverse frequency
    i is divided by entry i (1 for short wavelengths, ``factor`` for long ones, interpolated in
    between), which is what :func:`pd_train.models.llama.rope_inv_freq` applies."""
    tensor = _tensor_index(reader).get("rope_freqs.weight")
    if tensor is None:
        return None
    _check_readable(str(file), tensor, (head_dim // 2,))
    values = _Tensor(str(file), tensor, None).rows(slice(None))
    if not np.all(np.isfinite(values) & (values > 0)):
        msg = (
            f"checkpoint: tensor 'rope_freqs.weight' in {file} holds {values.tolist()}; "
            "RoPE frequency factors must be finite and > 0"
        )
        raise CheckpointError(msg)
    return tuple(float(v) for v in values)


def _f32(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.9999997e-06):
    the shortest decimal that rounds to the same float32."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def _reader_path(reader: gguf.GGUFReader) -> str:
    mm = getattr(reader, "data", None)
    name = getattr(mm, "filename", None)
    return str(name) if name else "the GGUF file"


def _tensor_index(reader: gguf.GGUFReader) -> dict[str, Any]:
    return {t.name: t for t in reader.tensors}


# ---------------------------------------------------------------------------------------------
# tensors


def _rope_rows(rows: int, heads: int) -> np.ndarray:
    """For each Hugging Face row of a q/k weight, the GGUF row that holds it (llama.cpp
    interleaves the two RoPE halves of every head: HF ``h*hd + i*hd/2 + j`` ↔ GGUF
    ``h*hd + 2*j + i``)."""
    hd = rows // heads
    h, i, j = np.meshgrid(np.arange(heads), np.arange(2), np.arange(hd // 2), indexing="ij")
    return (h * hd + 2 * j + i).reshape(-1)


class _Tensor:
    """One GGUF tensor, readable by (HF-order) row ranges as float32 [rows, cols]."""

    def __init__(self, file: str, tensor: Any, rope_heads: int | None) -> None:
        self.file, self.tensor = file, tensor
        self.name = tensor.name
        # GGUF lists dims fastest-first; the numpy (row-major) shape is the reverse.
        self.shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
        self.rope_rows = None if rope_heads is None else _rope_rows(self.shape[0], rope_heads)

    def rows(self, rows: slice) -> np.ndarray:
        gguf = _gguf_module()
        data = self.tensor.data
        if len(self.shape) == 1:
            raw = data[rows]
        elif self.rope_rows is not None:
            raw = data[self.rope_rows[rows]]
        else:
            raw = data[rows]
        try:
            out = gguf.quants.dequantize(np.asarray(raw), self.tensor.tensor_type)
        except Exception as e:
            msg = f"checkpoint: tensor {self.name!r} in {self.file} could not be dequantized ({type(e).__name__}: {e})"
            raise CheckpointError(msg) from e
        return np.asarray(out, dtype=np.float32)


def _check_readable(file: str, tensor: Any, want: tuple[int, ...]) -> None:
    """Shape agrees with the metadata, and the quantization type dequantizes (one row is tried)."""
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    if shape != want:
        msg = f"checkpoint: tensor {tensor.name!r} in {file} has shape {list(shape)}; the metadata implies {list(want)}"
        raise CheckpointError(msg)
    gguf = _gguf_module()
    qtype = tensor.tensor_type
    if qtype.name in _INTEGER_TYPES:
        msg = (
            f"checkpoint: tensor {tensor.name!r} in {file} is stored as {qtype.name} (integers); "
            f"expected a float type {_FLOAT_TYPES} or a quantized one (Q4_0, Q8_0, K-quants, ...)"
        )
        raise CheckpointError(msg)
    try:
        row = np.asarray(tensor.data[:1] if len(shape) > 1 else tensor.data)
        gguf.quants.dequantize(row, qtype)
    except NotImplementedError:
        msg = (
            f"checkpoint: tensor {tensor.name!r} in {file} is stored as {qtype.name}, which the "
            f"installed gguf package cannot dequantize; pd reads {_FLOAT_TYPES} and the types "
            "gguf.quants implements (Q4_0, Q4_1, Q5_*, Q8_0, K-quants, ...)"
        )
        raise CheckpointError(msg) from None
    except Exception as e:
        msg = f"checkpoint: tensor {tensor.name!r} in {file} is unreadable ({type(e).__name__}: {e}); is the file truncated?"
        raise CheckpointError(msg) from e


def _reader(
    sources: list[_Tensor], key: str, shape: tuple[int, ...], stacked: bool, dtype: np.dtype
) -> Callable[[Index | None], np.ndarray]:
    """A ``make_array_from_callback`` callback reading param ``key``'s slice ``index``."""
    transpose = key in _TRANSPOSED
    memo: dict[tuple[tuple[int, int], ...], np.ndarray] = {}

    def read_one(src: _Tensor, index: Index) -> np.ndarray:
        if len(index) == 1:
            return src.rows(index[0]).astype(dtype)
        # pd's [d_in, d_out] slice (a, b) is the stored [d_out, d_in] rows b, columns a.
        rows, cols = (index[1], index[0]) if transpose else index
        part = src.rows(rows)[:, cols]
        return np.ascontiguousarray(part.T if transpose else part, dtype=dtype)

    def callback(index: Index | None) -> np.ndarray:
        index = concrete_index(index, shape)
        key_ = tuple((s.start, s.stop) for s in index)
        if key_ in memo:  # partially replicated shardings ask for one slice several times
            return memo[key_]
        if stacked:
            out = np.empty([s.stop - s.start for s in index], dtype=dtype)
            for n, layer in enumerate(range(index[0].start, index[0].stop)):
                out[n] = read_one(sources[layer], index[1:])
        else:
            out = read_one(sources[0], index)
        memo[key_] = out
        return out

    return callback


def _placements(shardings: Any, shapes: dict[str, Any]) -> dict[str, Any]:
    """One sharding per param: a dict matching the params, one Sharding for all, or None."""
    if shardings is None or isinstance(shardings, jax.sharding.Sharding):
        one = shardings or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        return jax.tree.map(lambda _: one, shapes)
    if not isinstance(shardings, Mapping):
        msg = f"shardings: got {type(shardings).__name__}; expected None, a Sharding or a dict matching the params"
        raise CheckpointError(msg)
    want = {"/".join(str(k.key) for k in p) for p, _ in jax.tree_util.tree_leaves_with_path(shapes)}
    got_leaves = jax.tree_util.tree_leaves_with_path(
        shardings, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding)
    )
    got = {"/".join(str(getattr(k, "key", k)) for k in p): v for p, v in got_leaves}
    if set(got) != want:
        msg = (
            f"shardings: keys must match the params; missing {sorted(want - set(got))}, "
            f"unexpected {sorted(set(got) - want)}"
        )
        raise CheckpointError(msg)
    for name, value in got.items():
        if not isinstance(value, jax.sharding.Sharding):
            msg = f"shardings.{name.replace('/', '.')}: got {type(value).__name__}; expected a jax.sharding.Sharding"
            raise CheckpointError(msg)
    return dict(shardings)


def check_gguf_checkpoint(
    path: str | Path, *, strict: bool = True, layers: int | None = None
) -> LlamaConfig:
    """Check a Llama GGUF file as :func:`load_gguf_checkpoint` does, reading only its header
    (and one row per tensor, to try its quantization type): the metadata, every tensor's
    presence, shape and type, and that no tensor is left unaccounted for. Returns the config
    the load would return; raises :class:`CheckpointError` naming the file and the tensor."""
    config, _ = _checked_plan(Path(path), strict=strict, layers=layers)
    return config


def _checked_plan(
    file: Path, *, strict: bool, layers: int | None
) -> tuple[LlamaConfig, list[tuple[tuple[str, ...], list[_Tensor], bool]]]:
    """The config and, per param (keys, its tensors, stacked), the tensors to read, every one
    checked (see :func:`check_gguf_checkpoint`)."""
    if not isinstance(strict, bool):
        msg = f"strict: got {strict!r}; expected True or False"
        raise CheckpointError(msg)
    reader = open_gguf(file)
    described = gguf_llama_config(file)
    config = described
    if layers is not None:
        if (
            isinstance(layers, bool)
            or not isinstance(layers, int)
            or not 1 <= layers <= config.num_hidden_layers
        ):
            msg = f"layers: got {layers!r}; expected an int in [1, {config.num_hidden_layers}] (num_hidden_layers)"
            raise CheckpointError(msg)
        import attrs

        config = attrs.evolve(config, num_hidden_layers=layers)
    tensors = _tensor_index(reader)
    where = str(file)
    _check_accounted_for(where, tensors, described, strict=strict)
    shapes = llama_param_shapes(config)
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}

    def source(key: str, name: str, want: tuple[int, ...]) -> _Tensor:
        if name not in tensors:
            msg = f"checkpoint: tensor {name!r} (pd's {key}) is missing from {where}"
            raise CheckpointError(msg)
        stored = want[::-1] if key in _TRANSPOSED else want
        _check_readable(where, tensors[name], stored)
        return _Tensor(where, tensors[name], heads.get(key))

    plan: list[tuple[tuple[str, ...], list[_Tensor], bool]] = []
    for key, spec in shapes.items():
        if key == "layers":
            continue
        plan.append(((key,), [source(key, _TOP[key], spec.shape)], False))
    for key, spec in shapes["layers"].items():
        srcs = [
            source(key, _LAYER[key].format(i=i), spec.shape[1:])
            for i in range(config.num_hidden_layers)
        ]
        plan.append((("layers", key), srcs, True))
    return config, plan


def _check_accounted_for(
    file: str, tensors: Mapping[str, Any], config: LlamaConfig, *, strict: bool
) -> None:
    """Refuse tensors that the metadata (``config``, as the file describes it) does not account
    for, which a load would silently ignore (as the safetensors loader refuses them); with
    ``strict=False`` only whole blocks past ``block_count`` are skipped, with a warning."""
    expected = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"}
    expected |= {
        name.format(i=i) for name in _LAYER.values() for i in range(config.num_hidden_layers)
    }
    unexpected = sorted(n for n in tensors if n not in expected)
    deeper = {
        int(m.group(1))
        for n in unexpected
        if (m := _BLOCK_TENSOR.fullmatch(n)) and int(m.group(1)) >= config.num_hidden_layers
    }
    if not strict:
        unexpected = [
            n
            for n in unexpected
            if not ((m := _BLOCK_TENSOR.fullmatch(n)) and int(m.group(1)) in deeper)
        ]
    if not unexpected:
        if deeper:
            log.warning(
                "checkpoint %s: strict=False, skipping blocks %s past its block_count (%d)",
                file,
                format_ranges(sorted(deeper)),
                config.num_hidden_layers,
            )
        return
    shown = [repr(n) for n in unexpected[:8]]
    more = f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else ""
    hint = ""
    if strict and deeper:
        hint = (
            f"; the file has blocks {format_ranges(sorted(deeper))} past its metadata's block_count "
            f"({config.num_hidden_layers}); to load only the first {config.num_hidden_layers} "
            "on purpose, set target.strict: false"
        )
    msg = (
        f"checkpoint: {file} holds {len(unexpected)} tensor(s) its metadata does not account "
        f"for, which pd would silently ignore: {', '.join(shown)}{more}{hint}"
    )
    raise CheckpointError(msg)


def load_gguf_checkpoint(
    path: str | Path,
    *,
    shardings: Any = None,
    dtype: Any = np.float32,
    layers: int | None = None,
    strict: bool = True,
) -> tuple[LlamaConfig, dict[str, Any]]:
    """Load a Llama GGUF file straight into sharded jax arrays, dequantized to ``dtype``.

    Args:
      path: the ``.gguf`` file.
      shardings: as :func:`~pd_train.models.hf.load_llama_checkpoint`: a dict matching the
        params, one ``Sharding`` for all, or None (first local device).
      dtype: dtype of the arrays (float32 by default: quantized weights have no dtype of their
        own; None means float32 too).
      layers: load only the first ``layers`` decoder layers (the returned config says so).
      strict: True (default): every tensor in the file must be one its metadata accounts for
        (a block past ``block_count`` or an unknown tensor is an error naming it); False
        tolerates only whole blocks past ``block_count`` (a warning says which are skipped).

    Returns:
      ``(config, params)``. Every tensor's presence, shape and quantization type is checked
      before any data is read (:func:`check_gguf_checkpoint` does these checks alone).
    """
    file = Path(path)
    np_dtype = np.dtype(np.float32 if dtype is None else dtype)
    if not jnp.issubdtype(np_dtype, jnp.floating):
        msg = f"dtype: got {np_dtype}; expected a floating dtype (float32, bfloat16, float16)"
        raise CheckpointError(msg)
    config, plan = _checked_plan(file, strict=strict, layers=layers)
    shapes = llama_param_shapes(config, np_dtype)
    placements = _placements(shardings, shapes)

    params: dict[str, Any] = {"layers": {}}
    for keys, srcs, stacked in plan:
        shape = (shapes[keys[0]] if len(keys) == 1 else shapes["layers"][keys[1]]).shape
        sharding = placements[keys[0]] if len(keys) == 1 else placements["layers"][keys[1]]
        try:
            sharding.shard_shape(shape)
        except ValueError as e:
            msg = f"shardings.{'.'.join(keys)}: cannot shard shape {list(shape)}: {e}"
            raise CheckpointError(msg) from e
        array = jax.make_array_from_callback(
            shape, sharding, _reader(srcs, keys[-1], shape, stacked, np_dtype)
        )
        if len(keys) == 1:
            params[keys[0]] = array
        else:
            params["layers"][keys[1]] = array
    return config, params
