"""The target checkpoint's tensors checked at validation, before a run dir exists.

:func:`check_target_checkpoint` runs every check the loaders run before they read data (each
tensor's presence, shape and stored type; no tensor left unaccounted for), from the files'
headers only, so that ``pd-train run`` refuses a bad checkpoint with exit 2 and nothing written
instead of failing once the run dir is made and the compile has started.
"""

from __future__ import annotations

from pathlib import Path

from pd_train.config.io import ConfigError
from pd_train.models.hf import CheckpointError

__all__ = ["check_target_checkpoint"]

FIELD = "target.checkpoint"


def check_target_checkpoint(path: Path, *, strict: bool = True, family: str = "llama") -> None:
    """Raise :class:`ConfigError` on ``target.checkpoint`` when the GGUF file or Hugging Face
    directory at ``path`` would fail to load as a ``family`` checkpoint (``target.type``;
    ``strict`` as ``target.strict``)."""
    from pd_train.models.gguf import check_gguf_checkpoint, is_gguf
    from pd_train.models.hf import check_hf_checkpoint

    try:
        if is_gguf(path):
            check_gguf_checkpoint(path, strict=strict)
        else:
            check_hf_checkpoint(path, family=family, strict=strict)
    except CheckpointError as exc:
        raise ConfigError([(FIELD, str(exc).removeprefix("checkpoint: "))]) from None
