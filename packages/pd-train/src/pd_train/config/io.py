"""Turning YAML into frozen attrs configs, with errors that name the field path.

One cattrs converter structures every config class. It is strict: unknown keys, wrong scalar
types (``"3"`` for an int, ``1`` for a bool), missing fields and unknown ``type`` discriminators
are errors. All problems of one config are collected and reported together, each as
``path: what is wrong; what is allowed`` with paths like ``pd.loss_metrics[2].coeff``.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import cattrs
import cattrs.gen
import yaml
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)

T = TypeVar("T")


class ConfigError(ValueError):
    """A config is invalid. ``problems`` holds ``(field path, message)`` pairs."""

    def __init__(self, problems: Sequence[tuple[str, str]], *, source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"invalid config{where}:"]
        lines += [f"  {path or '<root>'}: {message}" for path, message in self.problems]
        super().__init__("\n".join(lines))


class FieldValueError(ValueError):
    """Raised by config validators: the value of ``field`` is not allowed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


# ---------------------------------------------------------------------------------------------
# Validators (attrs validators that raise FieldValueError, so errors carry the field name)


def _check(predicate: Callable[[Any], bool], allowed: str) -> Callable[[Any, Any, Any], None]:
    def validate(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
        if value is not None and not predicate(value):
            msg = f"got {value!r}; must be {allowed}"
            raise FieldValueError(attribute.name, msg)

    return validate


def positive() -> Callable[[Any, Any, Any], None]:
    return _check(lambda v: v > 0, "> 0")


def non_negative() -> Callable[[Any, Any, Any], None]:
    return _check(lambda v: v >= 0, ">= 0")


def in_range(low: float, high: float) -> Callable[[Any, Any, Any], None]:
    return _check(lambda v: low <= v <= high, f"in [{low}, {high}]")


#: The largest ``seed``: JAX keys hold 32 bits (``jax.random.key(2**32)`` is ``key(0)``) and
#: ``seed + 1`` seeds the eval stream and random target weights.
MAX_SEED = 2**32 - 2
_SEED_ALLOWED = (
    f"an int in [0, {MAX_SEED}] (JAX keys hold 32 bits: a larger seed would repeat a smaller "
    "one's draws; numpy refuses a negative one)"
)


def _is_seed(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED


def seed_problem(value: Any) -> str | None:
    """Why ``value`` is not a usable ``seed``, or None (an int in [0, :data:`MAX_SEED`])."""
    return None if _is_seed(value) else f"got {value!r}; must be {_SEED_ALLOWED}"


#: attrs validator of a ``seed`` field (:func:`seed_problem`).
valid_seed = _check(_is_seed, _SEED_ALLOWED)


def in_half_open(low: float, high: float, why: str = "") -> Callable[[Any, Any, Any], None]:
    """``low <= value < high`` (``why``: what the bound means, appended to the message)."""
    return _check(lambda v: low <= v < high, f"in [{low}, {high}){why}")


def one_of(*choices: Any) -> Callable[[Any, Any, Any], None]:
    return _check(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


# ---------------------------------------------------------------------------------------------
# The converter


def _scalar_hook(expected: type, accepted: tuple[type, ...]) -> Callable[[Any, Any], Any]:
    def structure(value: Any, _type: Any) -> Any:
        # bool is an int subclass in Python; a YAML `true` is never a number here.
        if isinstance(value, bool) and expected is not bool:
            accepted_ok = False
        else:
            accepted_ok = isinstance(value, accepted)
        if not accepted_ok:
            msg = f"got {value!r} ({type(value).__name__}); expected {expected.__name__}"
            raise TypeError(msg)
        if expected is float and not math.isfinite(value):
            # .nan passes no comparison and .inf every upper-bound-free one: never a setting.
            raise ValueError(f"got {value!r}; expected a finite number")
        return expected(value)

    return structure


def _tag_of(cls: type) -> str | None:
    if not attrs.has(cls):
        return None
    field = attrs.fields_dict(cls).get("type")
    if field is None or not isinstance(field.default, str):
        return None
    return field.default


class TaggedFamily:
    """An open tagged config union: attrs classes with a ``type`` tag, registered under a base
    class that config fields are annotated with (``tuple[LossMetric, ...]``, ``CIConfig``). The
    converter structures a field of the base type by the value's ``type`` through
    :attr:`members`, read at structuring time, so a member registered later is accepted and an
    unregistered tag is refused with the registered ones listed."""

    def __init__(self, base: type) -> None:
        self.base = base
        self.members: dict[str, type] = {}

    def register(self, cls: type[T]) -> type[T]:
        """Add ``cls`` (an attrs class whose ``type`` field defaults to its tag); returns it."""
        tag = _tag_of(cls)
        if tag is None:
            msg = f"{cls.__name__}: a {self.base.__name__} needs a `type` field with a str default"
            raise TypeError(msg)
        if self.members.get(tag, cls) is not cls:
            msg = f"{self.base.__name__} type {tag!r} is already registered by {self.members[tag]}"
            raise ValueError(msg)
        self.members[tag] = cls
        return cls


_FAMILIES: dict[Any, TaggedFamily] = {}


def tagged_family(base: type) -> TaggedFamily:
    """The :class:`TaggedFamily` of ``base`` (made on first use)."""
    return _FAMILIES.setdefault(base, TaggedFamily(base))


def _is_tagged_union(tp: Any) -> bool:
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return False
    members = [m for m in typing.get_args(tp) if m is not type(None)]
    return len(members) > 1 and all(_tag_of(m) is not None for m in members)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp) or tp
    return {dict: "mapping", list: "list", tuple: "list"}.get(
        origin, getattr(origin, "__name__", str(tp))
    )


def _matches(value: Any, tp: Any) -> bool:
    """Does ``value`` have the plain runtime type of union member ``tp``?"""
    if tp is type(None):
        return value is None
    origin = typing.get_origin(tp) or tp
    if origin is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if origin is float:
        return isinstance(value, (int, float))
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, Mapping)
    return isinstance(origin, type) and isinstance(value, origin)


def _is_optional_class(tp: Any) -> bool:
    """``X | None`` with one non-None member: cattrs handles these itself."""
    members = [m for m in typing.get_args(tp) if m is not type(None)]
    return len(members) == 1


def _reported_fields(exc: BaseException) -> set[str]:
    if isinstance(exc, FieldValueError):
        return {re.split(r"[.\[]", exc.field, maxsplit=1)[0]}  # "setup[0]" is about "setup"
    names = {n.name for n in getattr(exc, "__notes__", []) or [] if hasattr(n, "name")}
    for sub in getattr(exc, "exceptions", ()):
        names |= _reported_fields(sub)
    return names


def _other_field_problems(
    converter: cattrs.Converter, value: Any, cls: type, reported: set[str]
) -> list[Exception]:
    """The validator problems of ``cls``'s fields not yet ``reported``: attrs runs validators
    only on a complete instance, one at a time, and stops at the first; each field's value is
    structured and validated here on its own, so a section's problems are reported together."""
    if not isinstance(value, Mapping):
        return []
    hints = typing.get_type_hints(cls)
    out: list[Exception] = []
    for a in attrs.fields(cls):
        if a.validator is None or a.name in reported or a.name not in value:
            continue
        try:
            structured = converter.structure(value[a.name], hints[a.name])
        except Exception:  # a type problem: its own error is reported already
            continue
        try:
            a.validator(None, a, structured)
        except FieldValueError as e:
            out.append(e)
        except (ValueError, TypeError) as e:
            out.append(FieldValueError(a.name, str(e)))
        except Exception:  # a validator that needs the whole instance: judged on it
            continue
    return out


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)

    def attrs_hook(cls: type) -> Callable[[Any, Any], Any]:
        base: Callable[[Any, Any], Any] = cattrs.gen.make_dict_structure_fn(cls, converter)

        def structure_attrs(value: Any, _type: Any) -> Any:
            if not isinstance(value, Mapping):  # cattrs would say "'float' is not iterable"
                names = ", ".join(a.name for a in attrs.fields(cls))
                msg = f"got {_short(value)} ({type(value).__name__}); expected a mapping of {names}"
                raise TypeError(msg)
            try:
                return base(value, cls)
            except (ClassValidationError, FieldValueError) as exc:
                more = _other_field_problems(converter, value, cls, _reported_fields(exc))
                if not more:
                    raise
                first = list(exc.exceptions) if isinstance(exc, ClassValidationError) else [exc]
                msg = f"While structuring {cls.__name__}"
                raise ClassValidationError(msg, [*first, *more], cls) from None

        return structure_attrs

    converter.register_structure_hook_factory(attrs.has, attrs_hook)
    converter.register_structure_hook(int, _scalar_hook(int, (int,)))
    converter.register_structure_hook(float, _scalar_hook(float, (int, float)))
    converter.register_structure_hook(bool, _scalar_hook(bool, (bool,)))
    converter.register_structure_hook(str, _scalar_hook(str, (str,)))

    def structure_tagged(value: Any, tp: Any) -> Any:
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        if value is None and type(None) in typing.get_args(tp):
            return None
        return structure_by_tag(value, {_tag_of(m): m for m in members})

    def structure_by_tag(value: Any, by_tag: Mapping[Any, type]) -> Any:
        allowed = ", ".join(repr(t) for t in by_tag)
        if not isinstance(value, Mapping) or "type" not in value:
            msg = f"got {value!r}; expected a mapping with a `type` field, one of {allowed}"
            raise TypeError(msg)
        cls = by_tag.get(value["type"])
        if cls is None:
            raise FieldValueError("type", f"got {value['type']!r}; must be one of {allowed}")
        return converter.structure(value, cls)

    converter.register_structure_hook_func(_is_tagged_union, structure_tagged)
    converter.register_structure_hook_func(
        lambda tp: tp in _FAMILIES, lambda v, tp: structure_by_tag(v, _FAMILIES[tp].members)
    )
    converter.register_unstructure_hook_func(
        lambda tp: tp in _FAMILIES, lambda obj: converter.unstructure(obj, unstructure_as=type(obj))
    )

    def structure_literal(value: Any, tp: Any) -> Any:
        allowed = typing.get_args(tp)
        if value not in allowed or isinstance(value, bool) != any(
            isinstance(a, bool) for a in allowed
        ):
            msg = f"got {value!r}; must be one of " + ", ".join(repr(a) for a in allowed)
            raise ValueError(msg)
        return value

    converter.register_structure_hook_func(
        lambda tp: typing.get_origin(tp) is typing.Literal, structure_literal
    )

    def structure_plain_union(value: Any, tp: Any) -> Any:
        members = typing.get_args(tp)
        for member in members:
            if _matches(value, member):
                return None if member is type(None) else converter.structure(value, member)
        names = " | ".join(_type_name(m) for m in members)
        msg = f"got {value!r} ({type(value).__name__}); expected {names}"
        raise TypeError(msg)

    converter.register_structure_hook_func(
        lambda tp: (
            typing.get_origin(tp) in (typing.Union, types.UnionType)
            and not _is_tagged_union(tp)
            and not _is_optional_class(tp)
        ),
        structure_plain_union,
    )
    converter.register_unstructure_hook(Path, str)
    converter.register_structure_hook(Path, lambda v, _: Path(_scalar_hook(str, (str,))(v, str)))
    return converter


converter = _make_converter()


# ---------------------------------------------------------------------------------------------
# Error reporting


def _join(path: str, part: str | int) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else part


def _note_path(exc: BaseException, path: str) -> str:
    for note in getattr(exc, "__notes__", []) or []:
        if hasattr(note, "name"):
            return _join(path, note.name)
        if hasattr(note, "index"):
            return _join(path, note.index)
    return path


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError):
        return "required field is missing"
    return str(exc)


def _collect(exc: BaseException, path: str, out: list[tuple[str, str]]) -> None:
    path = _note_path(exc, path)
    if isinstance(exc, ForbiddenExtraKeysError):
        allowed = ", ".join(a.name for a in attrs.fields(exc.cl)) if attrs.has(exc.cl) else ""
        # A member of a tagged family (a loss term, a CI function) says which one it is: the
        # same field is allowed in another member.
        tag = _tag_of(exc.cl)
        which = f" in a {tag!r} entry" if tag is not None else ""
        for key in sorted(exc.extra_fields):
            out.append((_join(path, key), f"unknown field{which}; allowed fields: {allowed}"))
        return
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        for sub in exc.exceptions:
            _collect(sub, path, out)
        return
    if isinstance(exc, FieldValueError):
        out.append((_join(path, exc.field), exc.message))
        return
    if isinstance(exc, BaseExceptionGroup):
        for member in exc.exceptions:
            _collect(member, path, out)
        return
    out.append((path, _describe(exc)))


def structure(raw: Any, cls: type[T], *, source: str | None = None) -> T:
    """Build ``cls`` from plain data, raising one :class:`ConfigError` listing every problem."""
    try:
        return converter.structure(raw, cls)
    except ConfigError:
        raise
    except (ClassValidationError, IterableValidationError, FieldValueError, TypeError) as exc:
        problems: list[tuple[str, str]] = []
        _collect(exc, "", problems)
        raise ConfigError(list(dict.fromkeys(problems)), source=source) from None


def unstructure(config: Any) -> Any:
    return converter.unstructure(config)


def to_yaml(config: Any) -> str:
    return yaml.safe_dump(unstructure(config), sort_keys=False, default_flow_style=False)


# ---------------------------------------------------------------------------------------------
# Files and overrides


class _Loader(yaml.SafeLoader):
    """The YAML 1.2 core schema, for config files and ``--set`` values alike (one parser).

    PyYAML implements YAML 1.1, whose implicit types turn ordinary text into something else:
    ``yes``/``no``/``on``/``off`` into booleans, ``010`` into 8 (octal), ``1:20`` into 80
    (base 60), ``2024-01-01`` into a date, and it needs a dot in ``1.0e-5`` (``1e-5`` stays a
    string). Here only ``true``/``false`` are booleans, only ``~``/``null``/empty are null,
    integers are decimal (or ``0x``/``0o``), floats are 1.2 floats, and all else is a string,
    which the strict converter then refuses where a number or a boolean is expected.
    """

    yaml_implicit_resolvers: dict[Any, Any] = {}  # noqa: RUF012 (PyYAML's class-level table)


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    sign = -1 if text.startswith("-") else 1
    digits = text.lstrip("+-")
    if digits.startswith(("0x", "0X")):
        return sign * int(digits[2:], 16)
    if digits.startswith(("0o", "0O")):
        return sign * int(digits[2:], 8)
    return sign * int(digits, 10)


for _tag, _pattern, _first in (
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
    ("merge", r"^(?:<<)$", "<"),
):
    _Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_pattern), list(_first))
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_path(dotted: str) -> list[str | int]:
    """``"pd.loss_metrics[2].coeff"`` -> ``["pd", "loss_metrics", 2, "coeff"]``."""
    parts: list[str | int] = []
    pos = 0
    for match in _PATH_PART.finditer(dotted):
        between = dotted[pos : match.start()]
        if between not in ("", "."):
            break
        parts.append(match.group(1) if match.group(1) is not None else int(match.group(2)))
        pos = match.end()
    if pos != len(dotted) or not parts or dotted.startswith(".") or dotted.endswith("."):
        msg = f"malformed field path {dotted!r}; expected dotted names with [index], e.g. pd.loss_metrics[1].coeff"
        raise ConfigError([(dotted, msg)])
    return parts


def parse_override(text: str) -> tuple[list[str | int], Any]:
    """``"a.b[1].c=value"`` with the value read as a YAML scalar or flow collection."""
    if "=" not in text:
        msg = f"override {text!r} has no '='; expected PATH=VALUE, e.g. pd.steps=100"
        raise ConfigError([(text, msg)])
    dotted, value_text = text.split("=", 1)
    try:
        value = load_yaml(value_text) if value_text.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError([(dotted, f"value {value_text!r} is not valid YAML: {exc}")]) from None
    return parse_path(dotted.strip()), value


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``raw`` with each ``PATH=VALUE`` set. New keys are allowed here and then
    rejected, with their path, by :func:`structure` if the schema has no such field."""
    result: dict[str, Any] = copy.deepcopy(dict(raw))
    for text in overrides:
        parts, value = parse_override(text)
        node: Any = result
        walked = ""
        for part, following in itertools.pairwise(parts):
            walked = _join(walked, part)
            if isinstance(part, int):
                if not isinstance(node, list) or part >= len(node):
                    size = len(node) if isinstance(node, list) else "not a list"
                    raise ConfigError([(walked, f"no such list item (length {size})")])
                node = node[part]
                continue
            if not isinstance(node, dict):
                raise ConfigError([(walked, _not_a_mapping(walked, part, node))])
            if node.get(part) is None:
                node[part] = [] if isinstance(following, int) else {}
            node = node[part]
        last = parts[-1]
        if isinstance(last, int):
            if not isinstance(node, list) or last >= len(node):
                raise ConfigError([(_join(walked, last), "no such list item")])
            node[last] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            where = _join(walked, last)
            raise ConfigError([(where, _not_a_mapping(where, last, node))])
    return result


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _not_a_mapping(walked: str, part: str | int, node: Any) -> str:
    """Why ``part`` (the last name of ``walked``) cannot be set inside ``node``."""
    parent = walked.rsplit(".", 1)[0] if "." in walked else "the config"
    if isinstance(node, list) and isinstance(part, str) and part.isdigit():
        return f"{parent} is a list ({len(node)} items); index it with brackets: {parent}[{part}]"
    return f"cannot set {part!r}: {parent} is {_short(node)} ({type(node).__name__}), not a mapping"


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        msg = f"config path {str(path)!r} is a directory; expected a YAML file"
        raise ConfigError([("", msg)])
    if not path.is_file():
        raise ConfigError([("", f"config file {str(path)!r} does not exist")])
    try:
        raw = load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError([("", f"not UTF-8 text: {exc}")], source=str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError([("", f"not valid YAML: {exc}")], source=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError([("", f"expected a mapping at the top, got {raw!r}")], source=str(path))
    return raw


def add_override_argument(
    parser: Any, *, example: str = "pd.steps=100", what: str = "a field"
) -> None:
    """``--set PATH=VALUE`` (repeatable) on an argparse parser, collected in ``overrides`` for
    :func:`apply_overrides`; every subcommand that reads a config takes it the same way."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help=f"override {what}, e.g. --set {example} (repeatable)",
    )
