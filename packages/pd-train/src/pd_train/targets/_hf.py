"""What the Hugging Face target kinds (Llama, Qwen2, Qwen3, GPT-2) share: the fields of their
``target:`` section, how its architecture is found, and the FSDP shardings of their params."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import attrs
import jax
import jax.numpy as jnp

from pd_train.config.io import ConfigError, FieldValueError, one_of
from pd_train.targets.registry import TargetConfig

__all__ = ["HFDecoderTarget", "HFTargetConfig", "hf_architecture", "hf_shardings"]


@attrs.frozen(kw_only=True)
class HFTargetConfig(TargetConfig):
    """The frozen model to decompose, from a Hugging Face checkpoint or random weights.

    ``checkpoint``: a Hugging Face checkpoint directory (``config.json`` + safetensors; Llama
    also reads llama.cpp ``.gguf`` files and the ``builtin:`` assets), or null for random
    weights of ``architecture`` (tests, probes, ``pd-train compile``). ``architecture``: a
    preset name, a mapping of the family's ``config.json`` fields, or null to read the
    checkpoint's ``config.json``. ``dtype``: the dtype the weights load in. ``strict`` (default
    true): a checkpoint tensor that ``config.json`` does not account for is an error; false
    loads a prefix of a deeper checkpoint's layers on purpose (only whole layers past the
    configured count are skipped; anything else is still an error).
    """

    checkpoint: str | None = None
    architecture: str | dict[str, Any] | None = None
    dtype: Literal["float32", "bfloat16"] = attrs.field(
        default="float32", validator=one_of("float32", "bfloat16")
    )
    strict: bool = True


@attrs.frozen(kw_only=True)
class HFDecoderTarget:
    """What the Hugging Face decoders (Llama and the Qwens, GPT-2) share behind the
    :class:`~pd_train.targets.Target` interface: their kinds, params and LM head come from one
    model module (``module``: :mod:`pd_train.models.llama`, :mod:`pd_train.models.gpt2`), the
    output is logits [B, T, vocab] compared by KL, and the sites outside the layer stack are
    ``embed_tokens`` (a lookup into its rows, [vocab, d]) and ``lm_head`` ([d, vocab]; with tied
    embeddings the table transposed). A subclass sets ``module`` and its ``start``/``layer``."""

    config: Any
    module: ClassVar[Any]

    @property
    def kinds(self) -> tuple[str, ...]:
        return self.module.KINDS  # type: ignore[no-any-return]

    @property
    def n_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def output_loss(self) -> Literal["kl", "mse"]:
        return "kl"

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        return self.config.site_shapes()  # type: ignore[no-any-return]

    def global_site_shapes(self) -> dict[str, tuple[int, int]]:
        d, v = self.config.hidden_size, self.config.vocab_size
        return {"embed_tokens": (v, d), "lm_head": (d, v)}

    def global_weights(self, params: Any) -> dict[str, jax.Array]:
        """The frozen weights of :meth:`global_site_shapes`: [vocab, d] and [d, vocab]."""
        table = params["embed_tokens"]
        head = table.T if self.config.tie_word_embeddings else params["lm_head"]
        return {"embed_tokens": table, "lm_head": head}

    def init_params(self, *, key: jax.Array, dtype: Any = jnp.float32) -> Any:
        return self.module.init_params(self.config, key=key, dtype=dtype)

    def embed(self, params: Any, inputs: jax.Array, dtype: Any, lookup: Any = None) -> jax.Array:
        """The residual stream [B, T, d] of tokens [B, T] (``lookup``: the embedding site's)."""
        if lookup is None:
            return self.module.embed(params, inputs, dtype)  # type: ignore[no-any-return]
        return self.module.embed(params, inputs, dtype, lookup)  # type: ignore[no-any-return]

    def finish(self, params: Any, h: jax.Array, linear: Any = None) -> jax.Array:
        if linear is None:
            return self.module.unembed(params, h, self.config)  # type: ignore[no-any-return]
        return self.module.unembed(params, h, self.config, linear)  # type: ignore[no-any-return]


def hf_architecture(
    config: HFTargetConfig,
    *,
    base: Path | None,
    from_hf: Callable[[Mapping[str, Any]], Any],
    presets: Mapping[str, Callable[[], Any]],
    from_file: Callable[[Path], Any] | None = None,
) -> Any:
    """The architecture of ``config``: its preset, its mapping read by ``from_hf`` (errors at
    ``target.architecture``), or the checkpoint's ``config.json`` (errors at
    ``target.checkpoint``). ``from_file(path)``: the architecture of a checkpoint in another
    format (GGUF), or None when ``path`` is not one."""
    from pd_train.config.run import resolve_path
    from pd_train.models.hf import read_hf_config

    arch = config.architecture
    if isinstance(arch, str):
        if arch not in presets:
            msg = f"got {arch!r}; presets are {sorted(presets)}, or give a mapping"
            raise ConfigError([("target.architecture", msg)])
        return presets[arch]()
    if isinstance(arch, Mapping):
        read = _KeysRead(arch)
        try:
            model = from_hf(read)
        except ValueError as exc:
            # The mapping came from this config, not from a checkpoint's config.json.
            msg = str(exc).removeprefix("checkpoint config: ")
            raise ConfigError([("target.architecture", msg)]) from None
        _refuse_unread(arch, read.keys_read)
        return model
    if config.checkpoint is None:
        msg = "is null and so is target.checkpoint; give an architecture or a checkpoint"
        raise ConfigError([("target.architecture", msg)])
    try:
        path = resolve_path(config.checkpoint, base=base)
    except (FieldValueError, FileNotFoundError) as exc:
        raise ConfigError([("target.checkpoint", str(exc))]) from None
    if from_file is not None:
        try:
            found = from_file(path)
        except ValueError as exc:
            raise ConfigError([("target.checkpoint", str(exc))]) from None
        if found is not None:
            return found
    if not (path / "config.json").is_file():
        msg = f"{str(path)!r} has no config.json; expected a Hugging Face checkpoint directory"
        raise ConfigError([("target.checkpoint", msg)])
    try:
        return from_hf(read_hf_config(path))
    except ValueError as exc:
        raise ConfigError([("target.checkpoint", str(exc))]) from None


#: ``config.json`` fields that say nothing about pd's forward (token ids, init, dropout,
#: caching, GPT-2's classification head, provenance; Qwen's window size, unused while
#: ``use_sliding_window`` is false, which pd requires): accepted in ``target.architecture``
#: and ignored.
IGNORED_HF_FIELDS = frozenset(
    {
        "_name_or_path",
        "attention_dropout",
        "attn_pdrop",
        "bos_token_id",
        "dtype",
        "embd_pdrop",
        "eos_token_id",
        "initializer_range",
        "max_window_layers",
        "n_ctx",
        "pad_token_id",
        "pretraining_tp",
        "resid_pdrop",
        "sliding_window",
        "summary_activation",
        "summary_first_dropout",
        "summary_proj_to_labels",
        "summary_type",
        "summary_use_proj",
        "task_specific_params",
        "torch_dtype",
        "transformers_version",
        "use_cache",
    }
)


class _KeysRead(dict):  # type: ignore[type-arg]
    """A copy of a mapping that records every key looked up in it."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        super().__init__(data)
        self.keys_read: set[Any] = set()

    def __getitem__(self, key: Any) -> Any:
        self.keys_read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.keys_read.add(key)
        return super().__contains__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.keys_read.add(key)
        return super().get(key, default)


def _refuse_unread(arch: Mapping[str, Any], keys_read: set[Any]) -> None:
    """A field of the config's ``target.architecture`` mapping that the family's reader never
    looked at is a typo or a setting pd does not have (``rope_thetha``, ``n_heads``): refused,
    not left to a default (a checkpoint's own config.json may carry anything, as for
    transformers)."""
    unread = [k for k in arch if k not in keys_read and k not in IGNORED_HF_FIELDS]
    if unread:
        known = ", ".join(sorted(str(k) for k in keys_read if isinstance(k, str)))
        raise ConfigError(
            [
                (f"target.architecture.{k}", f"unknown field; this family reads {known}")
                for k in unread
            ]
        )


def hf_shardings(layout: Any, params: Mapping[str, Any], *, hidden_size: int) -> Any:
    """FSDP shardings of a Hugging Face family's params tree: the token embedding hidden over
    the data axes (``embedding``), the LM head too (``lm_head``), every stacked weight
    [L, d_in, d_out] on its hidden dimension (``target_weight``); vectors (norm gains and biases
    [L, n], [n]) and the position table replicated (``norm``: small beside the weights)."""

    def one(name: str, shape: tuple[int, ...]) -> Any:
        if name == "embed_tokens":
            return layout.embedding(shape, name=name)
        if name == "lm_head":
            return layout.lm_head(shape, name=name)
        if name.startswith("layers.") and len(shape) == 3:
            return layout.target_weight(shape, name=name, hidden_size=hidden_size)
        return layout.norm(shape, name=name)

    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "layers":
            out[key] = {k: one(f"layers.{k}", v.shape) for k, v in value.items()}
        else:
            out[key] = one(key, value.shape)
    return out
