"""Overrides: ``dotted.path[index].key=value`` applied to a raw (plain nested dict) config.

pd-probe never re-types config fields: an override is a path and a value, applied to the raw
config as it would be read from YAML, and the caller's schema judges the result. Values given as
text are parsed as YAML 1.2 core-schema scalars (plus flow sequences of them), so
``lr=1e-5`` is a float, ``flag=true`` a bool, ``name=null`` None and ``'007'`` a string.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import attrs

from pd_probe._errors import OverrideError

Segment: TypeAlias = str | int
"""One step of a path: a mapping key (str) or a list index (int)."""

_KEY = r"[^.\[\]=\s]+"
_SEGMENT_RE = re.compile(rf"(?P<key>{_KEY})|\[(?P<index>\d+|\*)\]")
_INT_RE = re.compile(r"[-+]?[0-9]+")
_OCT_RE = re.compile(r"0o[0-7]+")
_HEX_RE = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT_RE = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF_RE = re.compile(r"[-+]?\.(inf|Inf|INF)")
_NAN_RE = re.compile(r"\.(nan|NaN|NAN)")


def parse_path(text: str) -> tuple[Segment, ...]:
    """Split ``pd.loss_metrics[2].sites_per_chunk`` into ``("pd", "loss_metrics", 2, ...)``.

    ``*`` (a key) and ``[*]`` (an index) are kept as the string ``"*"``; only patterns
    (``free_form``) give them a meaning.
    """
    segments: list[Segment] = []
    pos = 0
    expect_key = True  # at the start and after a dot a key must follow
    while pos < len(text):
        if not expect_key and text[pos] == ".":
            pos += 1
            expect_key = True
            continue
        match = _SEGMENT_RE.match(text, pos)
        if match is None or (expect_key and match.group("key") is None):
            msg = (
                f"bad config path {text!r} at character {pos}: expected a key made of "
                "anything but '.', '[', ']', '=' and spaces, e.g. 'pd.loss_metrics[2].coeff'"
            )
            raise OverrideError(msg)
        if not expect_key and match.group("key") is not None:
            msg = f"bad config path {text!r} at character {pos}: expected '.' or '[index]'"
            raise OverrideError(msg)
        key, index = match.group("key"), match.group("index")
        if key is not None:
            segments.append(key)
        else:
            segments.append("*" if index == "*" else int(index))
        pos = match.end()
        expect_key = False
    if expect_key:
        msg = f"bad config path {text!r}: it is empty or ends with '.'"
        raise OverrideError(msg)
    return tuple(segments)


def format_path(segments: Sequence[Segment]) -> str:
    """The inverse of :func:`parse_path`; ``()`` formats as ``<top level>``."""
    out = ""
    for seg in segments:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            out += ("." if out else "") + seg
    return out or "<top level>"


def parse_scalar(text: str) -> Any:
    """Parse ``text`` as a YAML 1.2 core-schema scalar or a flow sequence ``[a, b]`` of them.

    null/~/empty → None; true/false → bool; decimal, 0o and 0x integers → int; decimals,
    exponents, .inf and .nan → float; '…' and "…" → str; anything else → the text, stripped.
    Flow mappings (``{…}``) are refused: set each key with its own override.
    """
    s = text.strip()
    if s in ("", "~", "null", "Null", "NULL"):
        return None
    if s in ("true", "True", "TRUE"):
        return True
    if s in ("false", "False", "FALSE"):
        return False
    if _INT_RE.fullmatch(s):
        return int(s)
    if _OCT_RE.fullmatch(s):
        return int(s[2:], 8)
    if _HEX_RE.fullmatch(s):
        return int(s[2:], 16)
    if _FLOAT_RE.fullmatch(s):
        return float(s)
    if _INF_RE.fullmatch(s):
        return -math.inf if s.startswith("-") else math.inf
    if _NAN_RE.fullmatch(s):
        return math.nan
    if len(s) >= 2 and s[0] == s[-1] == '"':
        try:
            return json.loads(s)
        except json.JSONDecodeError as e:
            msg = f"bad double-quoted value {s!r}: {e}"
            raise OverrideError(msg) from e
    if len(s) >= 2 and s[0] == s[-1] == "'":
        return s[1:-1].replace("''", "'")
    if s.startswith("["):
        if not s.endswith("]"):
            msg = f"bad flow sequence {s!r}: it starts with '[' but does not end with ']'"
            raise OverrideError(msg)
        return [parse_scalar(item) for item in _split_flow(s[1:-1], s)]
    if s.startswith("{"):
        msg = f"flow mappings are not supported in override values ({s!r}); set each key with its own override"
        raise OverrideError(msg)
    return s


def _split_flow(body: str, whole: str) -> list[str]:
    """Split the inside of ``[...]`` at top-level commas, respecting quotes and brackets."""
    if not body.strip():
        return []
    items, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(body):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
    if quote or depth:
        msg = f"bad flow sequence {whole!r}: unbalanced quotes or brackets"
        raise OverrideError(msg)
    items.append(body[start:])
    return items


@attrs.frozen
class Override:
    """Set the config value at ``path`` (dotted, with ``[index]``) to ``value``."""

    path: str
    value: Any

    def __attrs_post_init__(self) -> None:
        parse_path(self.path)  # fail at construction, not when applied

    @classmethod
    def parse(cls, text: str) -> Override:
        """``"runtime.compiler_options.xla_gpu_autotune_level=0"`` → Override(path, 0)."""
        if "=" not in text:
            msg = f"bad override {text!r}: expected 'dotted.path=value', e.g. 'pd.lr=1e-4'"
            raise OverrideError(msg)
        path, _, value = text.partition("=")
        return cls(path.strip(), parse_scalar(value))

    @property
    def segments(self) -> tuple[Segment, ...]:
        return parse_path(self.path)

    def __str__(self) -> str:
        return f"{self.path}={json.dumps(self.value)}"


OverridesLike: TypeAlias = (
    str | Override | Mapping[str, Any] | Iterable["str | Override | tuple[str, Any]"] | None
)
"""What callers may give as overrides: one ``"path=value"`` text, a mapping ``{path: value}``
(values used as given, not parsed), or an iterable of texts, Overrides and ``(path, value)``."""


def to_overrides(value: OverridesLike) -> tuple[Override, ...]:
    """Normalize any :data:`OverridesLike` to a tuple of :class:`Override`."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (Override.parse(value),)
    if isinstance(value, Override):
        return (value,)
    if isinstance(value, Mapping):
        return tuple(Override(str(path), v) for path, v in value.items())
    out: list[Override] = []
    for item in value:
        if isinstance(item, Override):
            out.append(item)
        elif isinstance(item, str):
            out.append(Override.parse(item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            out.append(Override(item[0], item[1]))
        else:
            msg = (
                f"bad override {item!r} ({type(item).__name__}): expected a 'path=value' "
                "string, an Override or a (path, value) pair"
            )
            raise OverrideError(msg)
    return tuple(out)


def _matches(segments: Sequence[Segment], pattern: Sequence[Segment]) -> bool:
    return len(segments) == len(pattern) and all(
        p == "*" or p == s for s, p in zip(segments, pattern, strict=True)
    )


def _creatable(segments: Sequence[Segment], depth: int, patterns: Sequence[tuple[Segment, ...]]):
    """Whether the missing key ``segments[depth]`` may be created.

    Allowed when the key lies at or below a free-form field (a prefix of length ≤ depth + 1
    matches a pattern), i.e. inside the free-form mapping, or is the free-form field itself.
    """
    return any(
        _matches(segments[:n], pattern)
        for pattern in patterns
        for n in range(1, depth + 2)
        if n == len(pattern)
    )


def apply_overrides(
    config: Mapping[str, Any],
    overrides: OverridesLike,
    *,
    free_form: Iterable[str] = (),
) -> dict[str, Any]:
    """Return a deep copy of ``config`` with ``overrides`` applied in order.

    Every path segment must already exist, so a typo fails here naming the path
    (``runtime.compiler_options.nonexistent does not exist``). Give a fully populated raw config
    (defaults filled in) so that "exists in the config" means "exists in the schema".

    Args:
      config: the raw config, a nested structure of dicts, lists and scalars; not modified.
      overrides: see :data:`OverridesLike`.
      free_form: paths of mapping-typed fields whose keys are free (compiler options, env
        variables), e.g. ``"runtime.compiler_options"``; ``*`` / ``[*]`` match any key / index.
        Keys below them (and the field itself) are created when missing.
    """
    patterns = [parse_path(p) for p in free_form]
    out = copy.deepcopy(dict(config))
    for override in to_overrides(overrides):
        _set(out, override, patterns)
    return out


def _set(root: dict[str, Any], override: Override, patterns: Sequence[tuple[Segment, ...]]):
    segments = override.segments
    node: Any = root
    for depth, seg in enumerate(segments):
        last = depth == len(segments) - 1
        where = format_path(segments[: depth + 1])
        parent = format_path(segments[:depth])
        if seg == "*":
            msg = f"override {str(override)!r}: '*' is only allowed in free_form patterns"
            raise OverrideError(msg)
        if isinstance(seg, int):
            if not isinstance(node, list):
                msg = (
                    f"override {str(override)!r}: {where} indexes {parent}, which is a "
                    f"{type(node).__name__}, not a list"
                )
                raise OverrideError(msg)
            if seg >= len(node):
                msg = (
                    f"override {str(override)!r}: {where} does not exist: {parent} has "
                    f"{len(node)} items (indices 0..{len(node) - 1})"
                )
                raise OverrideError(msg)
        elif isinstance(node, dict):
            if seg not in node:
                if not _creatable(segments, depth, patterns):
                    keys = ", ".join(sorted(map(str, node))[:30]) or "none"
                    msg = (
                        f"override {str(override)!r}: {where} does not exist ({parent} has "
                        f"keys: {keys}); only keys inside free-form fields may be created"
                    )
                    raise OverrideError(msg)
                if not last:
                    node[seg] = {}
        else:
            kind = "list; use [index]" if isinstance(node, list) else type(node).__name__
            msg = (
                f"override {str(override)!r}: {where} does not exist: {parent} is a {kind}, "
                "not a mapping"
            )
            raise OverrideError(msg)
        if last:
            node[seg] = copy.deepcopy(override.value)
        else:
            node = node[seg]
