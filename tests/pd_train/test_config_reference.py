"""docs/config-reference.md is generated from the schema and stays in step with it (issue 31,
item 8); ``pd-train config builtin:nope`` names the toys beside the configs."""

from __future__ import annotations

import typing
from pathlib import Path

import attrs
import pytest

from pd_train.config.reference import render_reference, root_config_class

# The checkout's file (the package may be installed elsewhere, as in the nox sessions).
REFERENCE_FILE = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"

REGENERATE = "python -m pd_train.config.reference --write"


def test_the_committed_reference_matches_the_schema() -> None:
    assert REFERENCE_FILE.is_file(), f"{REFERENCE_FILE} is missing: run {REGENERATE}"
    if REFERENCE_FILE.read_text() != render_reference():
        pytest.fail(f"{REFERENCE_FILE} is out of date with the config schema: run {REGENERATE}")


def _reachable(cls: type) -> set[type]:
    """Every attrs class reachable from ``cls`` through field types (walked here on its own,
    not with the generator's code)."""
    seen: set[type] = set()
    todo = [cls]
    while todo:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        for tp in typing.get_type_hints(c).values():
            stack = [tp]
            while stack:
                t = stack.pop()
                if attrs.has(t):
                    todo.append(t)
                stack.extend(typing.get_args(t))
                # A union built from a registry (its base class defines registered_configs):
                # its members are the registered classes.
                if isinstance(t, type) and "registered_configs" in vars(t):
                    stack.extend(t.registered_configs())
    return seen


def test_every_field_of_every_class_has_a_row() -> None:
    text = render_reference()
    sections = text.split("\n## ")[1:]
    classes = _reachable(root_config_class())
    assert len(sections) == len(classes)
    rows = {
        line.split("|")[1].strip().strip("`")
        for section in sections
        for line in section.splitlines()
        if line.startswith("| `")
    }
    for cls in classes:
        for field in attrs.fields(cls):
            assert field.name in rows, f"{cls.__name__}.{field.name} has no row"


def _row(text: str, section: str, field: str) -> list[str]:
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    line = next(x for x in body.splitlines() if x.startswith(f"| `{field}` |"))
    return [cell.strip() for cell in line.split("|")[1:-1]]


def test_rows_carry_type_default_and_allowed_values() -> None:
    text = render_reference()
    assert _row(text, "data (DataConfig)", "dtype") == [
        "`dtype`",
        "string or null",
        "`null`",
        "one of uint16, uint32, int32",
        "",
    ]
    assert _row(text, "data (DataConfig)", "seq_len")[2:4] == ["**required**", "must be > 0"]
    signal = _row(text, "launch (LaunchConfig)", "signal")
    assert signal[2] == "`TERM@300`" and "SIGTERM 300 s before the limit" in signal[4]
    # A tagged union: a link per member, each with a section of its own.
    ci = _row(text, "pd (PDConfig)", "ci")[1]
    assert "[mlp](#pdci-type-mlp)" in ci
    assert "\n## pd.ci (type: mlp)\n" in text


def test_an_unknown_builtin_lists_the_configs_and_the_toys(capsys) -> None:
    from pd_train.cli import main
    from pd_train.targets.toys import TOYS

    assert main(["config", "builtin:nope"]) == 2
    err = capsys.readouterr().err
    assert "builtin:default" in err and "builtin:llama8b-full32L" in err
    for toy in TOYS:
        assert f"builtin:{toy}" in err, err
