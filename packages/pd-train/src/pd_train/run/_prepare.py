"""Step 1 of a run: load and validate a config completely, touching no device and writing no
file; and what is read from it later (the target's weights, its dtype)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_train.config.io import ConfigError
from pd_train.config.run import (
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
    from pd_train.config.pd import check_pd_config
    from pd_train.decomposition import build_decomposition
    from pd_train.run.data import DataError, TokenDataset

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
            attempt(lambda: _check_terms(config, decomposition))
            attempt(lambda: resolve_l0_groups(config.pd.l0_groups, decomposition.sites))
    if model is not None and checkpoint is not None and config.target.architecture is not None:
        attempt(lambda: _check_architecture_matches(config.target, model, checkpoint))
    if for_run and model is not None and checkpoint is not None:
        from pd_train.models.preflight import check_target_checkpoint

        attempt(
            lambda: check_target_checkpoint(
                checkpoint, strict=config.target.strict, family=config.target.type
            )
        )
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
    if problems:  # one line per problem (a path resolved twice reports once)
        problems = list(dict.fromkeys(problems))
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
    """Why the directory ``path`` (relative to ``base``) cannot be used or created, or None
    (:func:`pd_train._output_paths.directory_problem`: asked of the filesystem, nothing made)."""
    from pd_train._output_paths import directory_problem as problem

    return problem(path, base=base)


def _check_terms(config: Config, decomposition: Any) -> None:
    """The loss terms' checks that need the decomposition (one persistent adversary)."""
    from pd_train.losses import check_one_adversary

    check_one_adversary(config.pd, decomposition, seq_len=config.data.seq_len)


def _check_ci_function(config: Config, decomposition: Any) -> None:
    """The CI function's own checks against the decomposition (``pd.ci.*`` field paths)."""
    from pd_train.ci import make_ci_function

    make_ci_function(config.pd.ci, decomposition=decomposition).check(decomposition)


def load_target(prepared: Prepared, *, shardings: Any, dtype: Any) -> Any:
    """The frozen target's params, straight into ``shardings``: the checkpoint's weights, read by
    the target kind's loader (:mod:`pd_train.targets.registry`), or the random weights of
    ``seed + 1`` for an architecture-only target."""
    import jax

    from pd_train.targets import as_target, target_kind

    config = prepared.config
    if prepared.checkpoint is not None:
        kind = target_kind(config.target.type)
        return kind.load(config.target, prepared.checkpoint, shardings=shardings, dtype=dtype)
    init = functools.partial(as_target(prepared.model).init_params, dtype=dtype)
    return jax.jit(init, out_shardings=shardings)(key=jax.random.key(config.seed + 1))


def _existing(value: str, where: str, base: Path | None) -> Path:
    from pd_train.config.io import FieldValueError

    try:
        path = resolve_path(value, base=base)
    except (FieldValueError, FileNotFoundError) as exc:
        raise ConfigError([(where, str(exc))]) from None
    if not path.exists():
        raise ConfigError([(where, f"{str(path)!r} does not exist")])
    return path


def _check_architecture_matches(target: Any, model: Any, checkpoint: Path) -> None:
    import attrs

    from pd_train.targets import target_kind

    without = attrs.evolve(target, architecture=None)
    on_disk = target_kind(target.type).architecture(without, base=None)
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
