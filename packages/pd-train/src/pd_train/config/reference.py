"""The config reference (``docs/config-reference.md``), generated from the schema itself.

Walks the attrs classes of the run config from its root: every field with its type, default,
allowed values (``Literal`` types and pd's validators) and description (the class docstring's
``Attributes:`` entries, or ``#:`` comments above the field), one section per class, titled by
its place in the YAML. Tagged unions (``type: ...``) get one section per member.

Regenerate after changing the schema (a test fails while the committed file is out of date)::

    python -m pd_train.config.reference --write
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

__all__ = ["REFERENCE_FILE", "render_reference", "root_config_class"]

#: Where the reference lives in a checkout (an installed, non-editable pd-train writes it
#: under the working directory's docs/ instead).
_CHECKOUT = Path(__file__).resolve().parents[5]
REFERENCE_FILE = (
    (_CHECKOUT if (_CHECKOUT / "packages").is_dir() else Path.cwd())
    / "docs"
    / ("config-reference.md")
)


def root_config_class() -> type:
    """The run config's root attrs class."""
    from pd_train.config.run import Config

    return Config


# ---------------------------------------------------------------------------------------------
# Reading a class


def _attribute_docs(cls: type) -> dict[str, str]:
    """Field name → description, from the docstring's ``Attributes:`` section and from ``#:``
    comments right above a field in the class body."""
    docs: dict[str, str] = {}
    doc = inspect.getdoc(cls) or ""
    if "Attributes:" in doc:
        current = None
        for line in doc.split("Attributes:", 1)[1].splitlines():
            match = re.match(r"^    (\w+): (.*)$", line)
            if match:
                current = match.group(1)
                docs[current] = match.group(2).strip()
            elif current and line.startswith("        "):
                docs[current] += " " + line.strip()
            elif line.strip() and not line.startswith(" "):
                break
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return docs
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        row = node.lineno - 2
        while row >= 0 and lines[row].strip().startswith("#:"):
            comment.insert(0, lines[row].strip()[2:].strip())
            row -= 1
        if comment and node.target.id not in docs:
            docs[node.target.id] = " ".join(comment)
    return docs


def _markdown(text: str) -> str:
    """Docstring markup as markdown: ``x`` -> `x`, :func:`~a.b` -> `a.b`."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _summary(cls: type) -> str:
    """The class docstring without its ``Attributes:`` section, as one paragraph block."""
    doc = inspect.getdoc(cls) or ""
    return _markdown(doc.split("Attributes:", 1)[0].strip())


def _tag(cls: Any) -> str | None:
    if not attrs.has(cls):
        return None
    field = attrs.fields_dict(cls).get("type")
    return field.default if field is not None and isinstance(field.default, str) else None


def _validators(validator: Any) -> Iterator[Any]:
    if validator is None:
        return
    inner = getattr(validator, "_validators", None)  # attrs' and_ (a list of validators)
    if inner is not None:
        for v in inner:
            yield from _validators(v)
        return
    wrapped = getattr(validator, "validator", None)  # attrs' optional()
    if wrapped is not None and type(validator).__name__ == "_OptionalValidator":
        yield from _validators(wrapped)
        return
    yield validator


def _allowed(field: attrs.Attribute, tp: Any) -> list[str]:  # type: ignore[type-arg]
    """What a value must be: Literal choices, pd's validators' own words, attrs' in_ (a
    validator of its own, like launch's SLURM checks, is described in the field's text)."""
    out: list[str] = []
    literals = [a for a in _flatten(tp) if typing.get_origin(a) is typing.Literal]
    for lit in literals:
        out.append("one of " + ", ".join(_yaml(v) for v in typing.get_args(lit)))
    for v in _validators(field.validator):
        code = getattr(v, "__code__", None)
        if code is not None and "allowed" in code.co_freevars and v.__closure__:
            allowed = v.__closure__[code.co_freevars.index("allowed")].cell_contents
            text = f"must be {allowed}"
            if not (literals and allowed.startswith("one of")):
                out.append(text)
        elif type(v).__name__ == "_InValidator":
            out.append("one of " + ", ".join(_yaml(o) for o in v.options))
    return out


def _flatten(tp: Any) -> list[Any]:
    """The members of a union (or the type itself)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in _flatten(a)]
    return [tp]


# ---------------------------------------------------------------------------------------------
# Writing values and types


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value) if value == "" else value
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _default(field: attrs.Attribute) -> str:  # type: ignore[type-arg]
    default: Any = field.default
    if default is attrs.NOTHING:
        return "**required**"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        factory: Any = default
        if factory.takes_self:
            return "computed"
        try:
            default = factory.factory()
        except Exception:
            return "computed"
        if attrs.has(type(default)):
            return "the section's defaults"
    return f"`{_yaml(default)}`"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


class _Walk:
    """Sections in the order a reader meets them: breadth first from the root."""

    def __init__(self) -> None:
        self.titles: dict[type, str] = {}
        self.queue: list[tuple[type, str]] = []

    def title(self, cls: type, path: str) -> str:
        if cls not in self.titles:
            tag = _tag(cls)
            self.titles[cls] = f"{path} ({'type: ' + tag if tag else cls.__name__})"
            self.queue.append((cls, path))
        return self.titles[cls]

    def type_text(self, tp: Any, path: str) -> str:
        if tp is type(None):
            return "null"
        if tp is Any:
            return "any"
        if isinstance(tp, type) and "registered_configs" in vars(tp):
            # A union built from a registry (target kinds, ...): its base class lists them.
            tp = typing.Union[tuple(typing.cast(Any, tp).registered_configs())]  # noqa: UP007
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            members = typing.get_args(tp)
            classes = [m for m in members if attrs.has(m)]
            if classes and all(_tag(c) for c in classes):  # a tagged union: one link per member
                links = [f"[{_tag(c)}](#{_anchor(self.title(c, path))})" for c in classes]
                rest = [self.type_text(m, path) for m in members if not attrs.has(m)]
                return "one of the `type`s " + ", ".join(links) + "".join(f" or {r}" for r in rest)
            return " or ".join(self.type_text(m, path) for m in members)
        if origin is typing.Literal:
            return "string" if all(isinstance(a, str) for a in typing.get_args(tp)) else "literal"
        if origin in (list, tuple) or tp in (list, tuple):
            args = [a for a in typing.get_args(tp) if a is not Ellipsis]
            inner = self.type_text(args[0], f"{path}[]") if args else "any"
            return f"list of {inner}"
        if origin is dict or tp is dict:
            pair = typing.get_args(tp)
            value = self.type_text(pair[1], f"{path}.*") if pair else "any"
            return f"mapping of string to {value}"
        if attrs.has(tp):
            return f"[{tp.__name__}](#{_anchor(self.title(tp, path))})"
        return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(
            tp, getattr(tp, "__name__", str(tp))
        )


def _section(walk: _Walk, cls: type, path: str) -> list[str]:
    hints = typing.get_type_hints(cls)
    docs = _attribute_docs(cls)
    lines = [f"## {walk.titles[cls]}", ""]
    summary = _summary(cls)
    if summary:
        lines += [summary, ""]
    lines += ["| field | type | default | allowed | description |", "|---|---|---|---|---|"]
    for field in attrs.fields(cls):
        tp = hints.get(field.name, field.type)
        prefix = f"{path}." if path else ""
        typ = walk.type_text(tp, f"{prefix}{field.name}")
        allowed = "; ".join(_allowed(field, tp)) or ""
        doc = _markdown(docs.get(field.name, ""))
        cells = [f"`{field.name}`", typ, _default(field), allowed, doc]
        lines.append(
            "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
        )
    return [*lines, ""]


def render_reference(root: type | None = None) -> str:
    """The whole reference as markdown."""
    root = root or root_config_class()
    walk = _Walk()
    walk.titles[root] = "top level"
    walk.queue.append((root, ""))
    body: list[str] = []
    done: set[type] = set()
    while walk.queue:
        cls, path = walk.queue.pop(0)
        if cls in done:
            continue
        done.add(cls)
        body += _section(walk, cls, path)
    head = [
        "# Config reference",
        "",
        "Every field of a `pd-train run` config, generated from the schema by",
        "`python -m pd_train.config.reference --write` (do not edit by hand; a test fails while",
        "this file is out of date). A section per class, titled by where it sits in the YAML;",
        "`[]` is an item of a list. Unknown keys are errors. `pd-train config CONFIG` prints a",
        "config with every default filled in.",
        "",
    ]
    return "\n".join(head + body).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pd_train.config.reference", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--write", action="store_true", help=f"write {REFERENCE_FILE} instead of printing"
    )
    args = parser.parse_args(argv)
    text = render_reference()
    if args.write:
        REFERENCE_FILE.write_text(text)
        print(f"wrote {REFERENCE_FILE}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
