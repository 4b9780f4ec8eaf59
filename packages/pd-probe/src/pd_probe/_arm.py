"""An arm: one variant of the base config, run in its own process with its own caches."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from pd_probe._errors import OverrideError, ProbeError
from pd_probe._overrides import Override, OverridesLike, parse_scalar, to_overrides

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_name(_: Any, __: Any, name: str) -> None:
    # Names become directory names and table rows: keep them path- and shell-safe.
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        msg = (
            f"bad arm name {name!r}: use letters, digits and '_.+-', starting with a letter or "
            "digit (it becomes a directory name)"
        )
        raise ProbeError(msg)


def _to_env(env: Mapping[str, Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not _ENV_RE.fullmatch(key):
            msg = f"bad environment variable name {key!r}: expected e.g. XLA_FLAGS or JAX_…"
            raise ProbeError(msg)
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, str | int | float):
            msg = (
                f"environment variable {key}: value {value!r} is a {type(value).__name__}; "
                "expected a string (or a number or bool, converted to text)"
            )
            raise ProbeError(msg)
        out[key] = str(value)
    return out


def _to_meta(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(meta or {})


def _check_positive(_: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and not value > 0:
        msg = f"Arm.{attribute.name} = {value!r}: must be positive"
        raise ProbeError(msg)


@attrs.frozen(kw_only=True)
class Arm:
    """One probe arm.

    Attributes:
      name: unique in its grid; becomes the arm's directory name.
      overrides: config overrides (``"dotted.path=value"`` texts, a ``{path: value}`` mapping,
        or :class:`Override` objects) applied to the base config.
      env: environment variables for the arm's process (XLA_FLAGS, JAX_*, …); XLA_FLAGS are
        merged with the inherited ones, flag by flag.
      meta: free metadata for the report, e.g. ``{"layers": 8}`` or ``{"chunks": 4}``.
      gpu_only: the arm only means something on GPU (e.g. autotune levels); CPU runs skip it.
      equivalence: a group label; arms with the same label must log identical losses in
        ``steps`` mode (e.g. chunk loop scan vs unroll).
      repeats: how many times the arm's command runs in its (shared) caches: run 1 is cold,
        later runs show what a warm persistent cache saves.
      timeout_s: per-run timeout, overriding the runner's.
      description: one line for people.
    """

    name: str = attrs.field(validator=_check_name)
    overrides: tuple[Override, ...] = attrs.field(default=(), converter=to_overrides)
    env: dict[str, str] = attrs.field(factory=dict, converter=_to_env)
    meta: dict[str, Any] = attrs.field(factory=dict, converter=_to_meta)
    gpu_only: bool = False
    equivalence: str | None = None
    repeats: int = attrs.field(default=1, validator=_check_positive)
    timeout_s: float | None = attrs.field(default=None, validator=_check_positive)
    description: str = ""

    def with_overrides(self, overrides: OverridesLike) -> Arm:
        """This arm with ``overrides`` appended (later ones win)."""
        return attrs.evolve(self, overrides=(*self.overrides, *to_overrides(overrides)))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description (the ``arms`` entries of ``grid.json``)."""
        return {
            "name": self.name,
            "overrides": {o.path: o.value for o in self.overrides},
            "env": dict(self.env),
            "meta": dict(self.meta),
            "gpu_only": self.gpu_only,
            "equivalence": self.equivalence,
            "repeats": self.repeats,
            "timeout_s": self.timeout_s,
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Arm:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**data, "overrides": list(data.get("overrides", {}).items())})


def parse_arm(spec: str) -> Arm:
    """An arm from a command-line spec: ``NAME[:ITEM;ITEM;…]``.

    Items are ``dotted.path=value`` (a config override, value parsed as a YAML scalar),
    ``$VAR=value`` (an environment variable, value taken verbatim) or ``@key=value`` (report
    metadata, e.g. ``@layers=8``). Example::

        unroll8:pd.recon.loop=unroll;pd.loss_metrics[2].sites_per_chunk=28;$XLA_FLAGS=--xla_dump_to=/tmp/d
    """
    name, _, rest = spec.partition(":")
    overrides: list[Override] = []
    env: dict[str, str] = {}
    meta: dict[str, Any] = {}
    for raw in rest.split(";") if rest.strip() else []:
        item = raw.strip()
        if not item:
            continue
        if "=" not in item:
            msg = (
                f"arm spec {spec!r}: item {item!r} has no '='; expected dotted.path=value, "
                "$VAR=value or @key=value"
            )
            raise OverrideError(msg)
        if item.startswith("$"):
            key, _, value = item[1:].partition("=")
            env[key.strip()] = value
        elif item.startswith("@"):
            key, _, value = item[1:].partition("=")
            meta[key.strip()] = parse_scalar(value)
        else:
            overrides.append(Override.parse(item))
    return Arm(name=name.strip(), overrides=tuple(overrides), env=env, meta=meta)
