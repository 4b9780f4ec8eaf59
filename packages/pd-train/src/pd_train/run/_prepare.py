"""Step 1 of a run: load and validate a config completely, touching no device and writing no
file; and what is read from it later (the target's weights, its dtype)."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_train._config_io import ConfigError
from pd_train.run_config import (
    Config,
    absolute_paths,
    load_config,
    resolve_path,
    target_architecture,
)


@dataclass
class Prepared:
    """A validated config and what was resolved from it; nothing allocated yet."""

    config: Config
    raw: dict[str, Any]
    base: Path | None
    model: Any
    checkpoint: Path | None
    data_path: Path | None
    eval_path: Path | None
    resume_dir: Path | None = None


def prepare(
    source: str | Path | dict[str, Any],
    overrides: Sequence[str] = (),
    *,
    for_run: bool = True,
    resume_dir: Path | None = None,
) -> Prepared:
    """Load and validate a config without touching a device or writing a file.

    ``for_run=False`` (``pd-train compile``, probes) skips the checks that need weights and
    data on disk.
    """
    from pd_train.analysis.statistics import resolve_l0_groups
    from pd_train.config import check_pd_config
    from pd_train.data import DataError, TokenDataset
    from pd_train.decomposition import build_decomposition

    config, raw = load_config(source, overrides)
    base = None if isinstance(source, dict) else Path(source).absolute().parent
    config = absolute_paths(config, base)
    problems: list[tuple[str, str]] = []

    def attempt(fn: Any) -> Any:
        try:
            return fn()
        except ConfigError as exc:
            problems.extend(exc.problems)
        return None

    model = attempt(lambda: target_architecture(config.target, base=base))
    checkpoint = data_path = eval_path = None
    if config.target.checkpoint is not None:
        checkpoint = attempt(lambda: _existing(config.target.checkpoint, "target.checkpoint", base))
    if for_run:
        if config.data.path is None:
            problems.append(("data.path", "is null; a run needs token files"))
        else:
            data_path = attempt(lambda: _existing(config.data.path, "data.path", base))
            eval_source = config.data.eval_path or config.data.path
            eval_path = attempt(lambda: _existing(eval_source, "data.eval_path", base))
    attempt(lambda: check_pd_config(config.pd))
    if model is not None:
        decomposition = attempt(lambda: build_decomposition(model, config.pd.decomposition_targets))
        if decomposition is not None:
            # CI checks that need the decomposition (transformer chunks) before any compile.
            attempt(lambda: _check_ci_function(config, decomposition))
            attempt(lambda: resolve_l0_groups(config.pd.l0_groups, decomposition.sites))
    if model is not None and checkpoint is not None and config.target.architecture is not None:
        attempt(lambda: _check_architecture_matches(model, checkpoint))
    problems.extend(_cadence_problems(config))
    if model is not None and config.data.seq_len > model.max_position_embeddings:
        msg = (
            f"got {config.data.seq_len}, more than the target's max_position_embeddings "
            f"({model.max_position_embeddings}); must be <= {model.max_position_embeddings}"
        )
        problems.append(("data.seq_len", msg))
    if for_run:
        problem = directory_problem(Path(config.output_dir).expanduser(), base=Path.cwd())
        if problem is not None:
            problems.append(("output_dir", problem))
    if for_run and model is not None:
        for path, where in ((data_path, "data.path"), (eval_path, "data.eval_path")):
            if path is None:
                continue
            try:
                TokenDataset(
                    path,
                    seq_len=config.data.seq_len,
                    dtype=config.data.dtype,
                    vocab_size=model.vocab_size,
                )
            except DataError as exc:
                problems.append((where, str(exc).removeprefix("data: ")))
    if problems:
        raise ConfigError(problems, source=None if isinstance(source, dict) else str(source))
    return Prepared(
        config=config,
        raw=raw,
        base=base,
        model=model,
        checkpoint=checkpoint,
        data_path=data_path,
        eval_path=eval_path,
        resume_dir=resume_dir,
    )


def directory_problem(path: Path, *, base: Path) -> str | None:
    """Why the directory ``path`` (relative to ``base``) cannot be used or created, or None.
    Nothing is created: an existing path must be a writable directory; otherwise its nearest
    existing ancestor must be."""
    path = path if path.is_absolute() else base / path
    if path.exists():
        if not path.is_dir():
            return f"{str(path)!r} is a file, not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{str(path)!r} is not writable"
        return None
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"cannot create {str(path)!r}: {str(ancestor)!r} is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot create {str(path)!r}: {str(ancestor)!r} is not writable"
    return None


def _check_ci_function(config: Config, decomposition: Any) -> None:
    """The CI function's own checks against the decomposition (``pd.ci.*`` field paths)."""
    from pd_train.ci import make_ci_function

    make_ci_function(config.pd.ci, decomposition=decomposition).check(decomposition)


def load_target(prepared: Prepared, *, shardings: Any, dtype: Any) -> Any:
    """The frozen target's params, straight into ``shardings``: the checkpoint's weights
    (safetensors, or GGUF by its magic bytes; ``target.strict`` applies to safetensors), or the
    random weights of ``seed + 1`` for an architecture-only target."""
    import jax

    from pd_train.models import llama

    config = prepared.config
    if prepared.checkpoint is not None:
        from pd_train.models.gguf import is_gguf, load_gguf_checkpoint
        from pd_train.models.hf import load_llama_checkpoint

        if is_gguf(prepared.checkpoint):
            _, target = load_gguf_checkpoint(prepared.checkpoint, shardings=shardings, dtype=dtype)
        else:
            _, target = load_llama_checkpoint(
                prepared.checkpoint, shardings=shardings, dtype=dtype, strict=config.target.strict
            )
        return target
    init = functools.partial(llama.init_params, prepared.model, dtype=dtype)
    return jax.jit(init, out_shardings=shardings)(key=jax.random.key(config.seed + 1))


def _existing(value: str, where: str, base: Path | None) -> Path:
    from pd_train._config_io import FieldValueError

    try:
        path = resolve_path(value, base=base)
    except (FieldValueError, FileNotFoundError) as exc:
        raise ConfigError([(where, str(exc))]) from None
    if not path.exists():
        raise ConfigError([(where, f"{str(path)!r} does not exist")])
    return path


def _check_architecture_matches(model: Any, checkpoint: Path) -> None:
    from pd_train.models.gguf import gguf_llama_config, is_gguf
    from pd_train.models.hf import llama_config_from_hf, read_hf_config

    if is_gguf(checkpoint):
        on_disk = gguf_llama_config(checkpoint)
    else:
        on_disk = llama_config_from_hf(read_hf_config(checkpoint))
    if on_disk != model:
        msg = (
            f"target.architecture differs from {checkpoint}/config.json; drop target.architecture "
            "to use the checkpoint's, or point target.checkpoint at a matching checkpoint"
        )
        raise ConfigError([("target.architecture", msg)])


def _cadence_problems(config: Config) -> list[tuple[str, str]]:
    steps = config.pd.steps
    out = []
    for name in ("train_log_every", "eval_every", "save_every"):
        every = getattr(config.cadence, name)
        if every > steps:
            msg = f"got {every}, more than pd.steps ({steps}); must be <= pd.steps (0 turns it off)"
            if name != "train_log_every":
                out.append((f"cadence.{name}", msg))
            else:
                out.append((f"cadence.{name}", msg.replace(" (0 turns it off)", "")))
    from pd_train.analysis.recon_eval import slow_eval_problems

    return out + slow_eval_problems(config.cadence)


# ---------------------------------------------------------------------------------------------


def target_dtype(config: Config) -> Any:
    import jax.numpy as jnp

    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[config.target.dtype]
