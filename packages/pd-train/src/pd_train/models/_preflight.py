"""The target checkpoint's tensors checked at validation, before a run dir exists.

:func:`check_target_checkpoint` runs every check the loaders run before they read data (each
tensor's presence, shape and stored type; no tensor left unaccounted for), from the files'
headers only, so that ``pd-train run`` refuses a bad checkpoint with exit 2 and nothing written
instead of failing once the run dir is made and the compile has started.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from pd_train._config_io import ConfigError
from pd_train.models.hf import CheckpointError

__all__ = ["check_target_checkpoint"]

FIELD = "target.checkpoint"


def check_target_checkpoint(path: Path, *, strict: bool = True) -> None:
    """Raise :class:`ConfigError` on ``target.checkpoint`` when the GGUF file or Hugging Face
    directory at ``path`` would fail to load (``strict`` as ``target.strict``)."""
    from pd_train.models.gguf import check_gguf_checkpoint, is_gguf

    try:
        if is_gguf(path):
            check_gguf_checkpoint(path, strict=strict)
        else:
            _check_safetensors(path, strict=strict)
    except CheckpointError as exc:
        raise ConfigError([(FIELD, str(exc).removeprefix("checkpoint: "))]) from None


def _check_safetensors(root: Path, *, strict: bool) -> None:
    """:func:`pd_train.models.hf.load_llama_checkpoint`'s checks before it reads data."""
    from pd_train.models import hf

    config = hf.llama_config_from_hf(hf.read_hf_config(root))
    layout = hf._layout(config)
    with ExitStack() as stack:
        ckpt = hf._Checkpoint(root, stack)
        hf._check_accounted_for(ckpt, config, strict=strict)
        for key, entry in layout.items():
            if key == "layers":
                continue
            shape, transpose = entry
            hf._check_tensor(ckpt, hf._hf_name(key), shape, transpose)
        for key, (shape, transpose) in layout["layers"].items():
            for i in range(config.num_hidden_layers):
                hf._check_tensor(ckpt, hf._hf_name(key, i), shape[1:], transpose)
