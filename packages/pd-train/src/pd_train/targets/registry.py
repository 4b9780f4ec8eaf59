"""Target kinds: each family of models pd decomposes, registered by the name of its config's ``type``.

A run config's ``target:`` section is a tagged union over the registered kinds: its ``type``
field picks the kind (``llama``, ``qwen2``, ``qwen3``, ``gpt2``; a section without ``type`` is a
Llama target, so configs written before the registry load unchanged), and the rest of the
section is structured into that kind's config class. An unregistered ``type`` is refused as
``target.type``, listing the registered kinds.

A :class:`TargetKind` says everything the run needs from a family:

- ``config``: its ``target:`` section, an attrs class subclassing :class:`TargetConfig` whose
  ``type`` field defaults to the kind's name;
- ``architecture(config, *, base) -> model``: the hashable architecture the config describes (a
  ``LlamaConfig``, a ``GPT2Config``), read from the config or the checkpoint; errors are
  :class:`~pd_train.config.io.ConfigError` by field path (``target.checkpoint``). ``base``: the
  run config's directory;
- ``load(config, checkpoint, *, shardings, dtype) -> params``: the frozen weights, straight into
  their shardings;
- ``owns(model) -> bool`` and ``target(model) -> Target``: which architectures are this kind's,
  and the :class:`~pd_train.targets.Target` (layer body, sites, init) that runs one;
- ``shardings(model, layout, params) -> shardings``: FSDP shardings of a params tree (arrays or
  ShapeDtypeStructs) under a :class:`pd_sharding.Layout`;
- ``census(model, pd, *, seq_len) -> Census``: the FLOP census of one train step (optional:
  without one a run has no MFU metrics).

Adding a family is one module that builds its :class:`TargetKind` and calls
:func:`register_target` at import, plus its name in ``BUILTIN_KIND_MODULES`` (below), which
the registry imports before it answers, so that it is complete before a config is read. A kind
from outside pd registers when its module is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from pd_train.config.io import ConfigError, FieldValueError

__all__ = [
    "BUILTIN_KIND_MODULES",
    "DEFAULT_KIND",
    "TargetConfig",
    "TargetKind",
    "kind_of",
    "register_target",
    "structure_target_config",
    "target_kind",
    "target_kinds",
]

#: The kind of a ``target:`` section without ``type`` (every config before the registry).
DEFAULT_KIND = "llama"


class TargetConfig:
    """Base of every kind's ``target:`` config (attrs classes with a ``type`` field): the type
    a run config's ``target`` has. Structured by :func:`structure_target_config`.

    The run reads ``checkpoint``, ``architecture``, ``dtype`` and ``strict`` of every kind; a kind whose
    config has no such field inherits these class defaults (no checkpoint file, no architecture
    mapping, float32 weights)."""

    type: str
    checkpoint: str | None = None
    architecture: Any = None
    dtype: str = "float32"
    strict: bool = True

    @classmethod
    def registered_configs(cls) -> tuple[Any, ...]:
        """The config class of every registered kind, by name (the members of the union)."""
        return tuple(kind.config for _, kind in sorted(_builtins().items()))


@attrs.frozen(kw_only=True)
class TargetKind:
    """One registered family of targets (see the module docstring for each field)."""

    name: str
    config: type
    architecture: Callable[..., Any]
    load: Callable[..., Any]
    owns: Callable[[Any], bool]
    target: Callable[[Any], Any]
    shardings: Callable[[Any, Any, Any], Any]
    census: Callable[..., Any] | None = None


_KINDS: dict[str, TargetKind] = {}


def register_target(kind: TargetKind) -> TargetKind:
    """Add ``kind`` to the registry (returns it). Its config must subclass :class:`TargetConfig`
    with a ``type`` field defaulting to ``kind.name``; a name registered twice is an error."""
    if kind.name in _KINDS:
        msg = f"target kind {kind.name!r} is registered already"
        raise ValueError(msg)
    fields = attrs.fields_dict(kind.config) if attrs.has(kind.config) else {}
    if not issubclass(kind.config, TargetConfig) or fields.get("type") is None:
        msg = f"target kind {kind.name!r}: config {kind.config!r} must be an attrs subclass of TargetConfig with a type field"
        raise TypeError(msg)
    if fields["type"].default != kind.name:
        msg = f"target kind {kind.name!r}: its config's type defaults to {fields['type'].default!r}"
        raise ValueError(msg)
    _KINDS[kind.name] = kind
    return kind


#: The modules that register the built-in kinds, imported by the registry before it answers
#: (a new family adds its module here).
BUILTIN_KIND_MODULES = ("pd_train.targets.llama", "pd_train.targets.qwen", "pd_train.targets.gpt2")


def _builtins() -> dict[str, TargetKind]:
    """The registry, with the built-in kinds' modules imported (they register themselves)."""
    import importlib

    for module in BUILTIN_KIND_MODULES:
        importlib.import_module(module)
    return _KINDS


def target_kinds() -> tuple[str, ...]:
    """The registered kinds' names, sorted."""
    return tuple(sorted(_builtins()))


def target_kind(name: str) -> TargetKind:
    """The kind registered as ``name``; ConfigError at ``target.type`` when there is none."""
    kinds = _builtins()
    if name not in kinds:
        allowed = ", ".join(repr(n) for n in sorted(kinds))
        raise ConfigError([("target.type", f"got {name!r}; registered target kinds are {allowed}")])
    return kinds[name]


def kind_of(model: Any) -> TargetKind | None:
    """The kind that owns the architecture ``model`` (a LlamaConfig, a GPT2Config, ...), or None
    (a bare :class:`~pd_train.targets.Target` such as a toy's)."""
    for kind in _builtins().values():
        if kind.owns(model):
            return kind
    return None


def structure_target_config(value: Any, structure: Callable[[Any, type], Any]) -> Any:
    """A ``target:`` section → its kind's config (``structure``: the strict converter's).
    A mapping without ``type`` is a :data:`DEFAULT_KIND` target."""
    if not isinstance(value, Mapping):
        msg = f"got {value!r}; expected a mapping (the target section)"
        raise TypeError(msg)
    name = value.get("type", DEFAULT_KIND)
    kinds = _builtins()
    if not isinstance(name, str) or name not in kinds:
        allowed = ", ".join(repr(n) for n in sorted(kinds))
        raise FieldValueError("type", f"got {name!r}; registered target kinds are {allowed}")
    return structure({**value, "type": name}, kinds[name].config)
