"""The whole run config: YAML → frozen attrs classes → validated, all before anything runs.

Sections: ``run_name``, ``seed``, ``output_dir``, ``target``, ``data``, ``pd`` (the
decomposition and its training, :class:`~pd_train.config.pd.PDConfig`), ``cadence`` and ``runtime``.
:func:`load_config` reads YAML, applies ``--set PATH=VALUE`` overrides, structures through the
one strict converter and runs :func:`validate`, which checks everything that can be known
before a device is touched: patterns match sites, C and batch divide the mesh axes, files exist,
steps and cadences agree. Errors name the field path, the value and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from pd_train.config import io as _config_io
from pd_train.config.io import ConfigError, FieldValueError, non_negative, positive, valid_seed
from pd_train.config.launch import LaunchConfig
from pd_train.config.pd import PDConfig, RuntimeConfig
from pd_train.config.tracking import parse_tracking
from pd_train.models.llama_config import LLAMA_PRESETS
from pd_train.targets.registry import TargetConfig

__all__ = [
    "ARCHITECTURE_PRESETS",
    "BUILTIN_PREFIX",
    "CadenceConfig",
    "Config",
    "DataConfig",
    "TargetConfig",
    "absolute_paths",
    "load_config",
    "resolve_path",
    "target_architecture",
    "to_yaml",
]

BUILTIN_PREFIX = "builtin:"
#: Llama's named architectures (``target.architecture: llama3_8b``).
ARCHITECTURE_PRESETS = LLAMA_PRESETS


def _structure_target(value: Any, _type: Any) -> Any:
    """``target:``: the registered kind named by its ``type`` (absent: ``llama``)."""
    from pd_train.targets.registry import structure_target_config

    return structure_target_config(value, _config_io.converter.structure)


# ``target`` is a tagged union over the registered kinds (pd_train.targets.registry), built when a
# config is read, so a kind registered by any module is part of it.
_config_io.converter.register_structure_hook_func(lambda tp: tp is TargetConfig, _structure_target)
_config_io.converter.register_unstructure_hook_func(
    lambda tp: tp is TargetConfig,
    lambda value: _config_io.converter.unstructure(value, unstructure_as=type(value)),
)


@attrs.frozen(kw_only=True)
class DataConfig:
    """Pre-tokenized tokens: a ``.npy``/``.bin`` file or a directory of shards
    (``builtin:tiny_corpus`` names the corpus that ships with pd-train). ``dtype`` is needed
    for ``.bin`` files. ``eval_path`` defaults to ``path``."""

    path: str | None = None
    seq_len: int = attrs.field(validator=positive())
    dtype: Literal["uint16", "uint32", "int32"] | None = None
    eval_path: str | None = None
    eval_batches: int = attrs.field(default=2, validator=positive())


@attrs.frozen(kw_only=True)
class CadenceConfig:
    """Every how many steps to log, evaluate and save (0 turns eval/save off; a final
    checkpoint is always written). ``slow_eval_every``: every how many steps an eval also
    computes the expensive recon metrics (hidden activations, attention patterns; see
    :mod:`pd_train.analysis.recon_eval`), a multiple of ``eval_every``; 0 turns them off."""

    train_log_every: int = attrs.field(default=10, validator=positive())
    eval_every: int = attrs.field(default=0, validator=non_negative())
    slow_eval_every: int = attrs.field(default=0, validator=non_negative())
    save_every: int = attrs.field(default=0, validator=non_negative())
    keep_last_n_checkpoints: int = attrs.field(default=2, validator=positive())


@attrs.frozen(kw_only=True)
class Config:
    run_name: str
    seed: int = attrs.field(default=0, validator=valid_seed)
    output_dir: str = "runs"
    target: TargetConfig
    data: DataConfig
    pd: PDConfig
    cadence: CadenceConfig = attrs.field(factory=CadenceConfig)
    runtime: RuntimeConfig = attrs.field(factory=RuntimeConfig)
    launch: LaunchConfig = attrs.field(factory=LaunchConfig)
    #: Optional experiment tracking, ``{wandb: {project, entity, mode, tags}}`` (checked by
    #: :func:`pd_train.config.tracking.parse_tracking`); ``pd-train run`` mirrors its
    #: metrics.jsonl into it on process 0. Null: no tracking.
    tracking: dict[str, Any] | None = None


# ---------------------------------------------------------------------------------------------


def resolve_path(value: str, *, base: Path | None = None) -> Path:
    """``builtin:NAME`` → the shipped asset; relative paths → against ``base`` (the config's
    directory) when given."""
    if value.startswith(BUILTIN_PREFIX):
        from pd_train import assets

        name = value[len(BUILTIN_PREFIX) :]
        builtins = {
            "tiny_llama": assets.tiny_llama_path,
            "tiny_corpus": assets.tiny_corpus_path,
            "tiny_corpus_val": lambda: assets.tiny_corpus_path("val"),
            **_smollm2_builtins(),
        }
        if name not in builtins:
            msg = f"got {value!r}; builtin assets are " + ", ".join(
                BUILTIN_PREFIX + n for n in builtins
            )
            raise FieldValueError("path", msg)
        return builtins[name]()
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return path


def _smollm2_builtins() -> dict[str, Any]:
    from pd_train.assets import smollm2

    return {
        "smollm2": smollm2.smollm2_gguf_path,
        "smollm2_corpus": smollm2.smollm2_corpus_path,
        "smollm2_corpus_val": lambda: smollm2.smollm2_corpus_path("val"),
    }


def target_architecture(target: TargetConfig, *, base: Path | None = None) -> Any:
    """The architecture ``target`` describes (a ``LlamaConfig`` for the Llama, Qwen2 and Qwen3
    kinds, a ``GPT2Config`` for GPT-2): from its preset or mapping, else from the checkpoint.
    Errors are ConfigErrors by field path (``target.architecture``, ``target.checkpoint``)."""
    from pd_train.targets.registry import target_kind

    return target_kind(target.type).architecture(target, base=base)


def absolute_paths(config: Config, base: Path | None) -> Config:
    """``config`` with its relative file paths (checkpoint, data, eval data) made absolute
    against ``base``, the config's directory: a run saves its config in the run dir, where a
    relative path would point somewhere else. ``builtin:`` assets stay as they are."""
    if base is None:
        return config

    def fix(value: str | None) -> str | None:
        if value is None or value.startswith(BUILTIN_PREFIX):
            return value
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else base / path)

    target = config.target
    if target.checkpoint is not None:  # kinds without a checkpoint field inherit None
        target = attrs.evolve(target, checkpoint=fix(target.checkpoint))  # type: ignore[misc]
    data = attrs.evolve(
        config.data, path=fix(config.data.path), eval_path=fix(config.data.eval_path)
    )
    return attrs.evolve(config, target=target, data=data)


_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def load_config(
    source: str | Path | Mapping[str, Any],
    overrides: Sequence[str] = (),
) -> tuple[Config, dict[str, Any]]:
    """Read, override and structure a config. Returns ``(config, raw)``, where ``raw`` is the
    overridden plain data (what pd-probe derives arms from)."""
    where = None
    if isinstance(source, Mapping):
        raw = dict(source)
    else:
        where = str(source)
        raw = _config_io.read_yaml(source)
    raw = _config_io.apply_overrides(raw, overrides)
    config = _config_io.structure(raw, Config, source=where)
    problems = []
    if not _RUN_NAME.match(config.run_name):
        msg = f"got {config.run_name!r}; use letters, digits, '.', '_' and '-' (a directory name)"
        problems.append(("run_name", msg))
    if config.tracking is not None:
        try:
            parse_tracking(config.tracking)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems, source=where)
    return config, raw


def to_yaml(config: Config) -> str:
    return _config_io.to_yaml(config)
