"""Property-based tests of run configs (issue 14, item 8, the run-config part).

Around the valid default config (``configs/default.yaml``) hypothesis generates run configs with
one field changed — wrong types, boundary values (0, -1, huge, nan, inf), unicode, missing and
extra keys — as YAML dicts and as ``--set PATH=VALUE`` overrides. Each must either be refused
with a :class:`ConfigError` whose problems name the changed field (or a field inside it, or the
section holding a missing or extra key), or load into a config that holds exactly the value
given (no coercion: ``yes`` stays a string, ``True`` never becomes ``1``), equal to the one the
same value gives as a dict. Any other exception fails. Example counts are fixed and derandomized.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pd_train.config.io import ConfigError, read_yaml, unstructure
from pd_train.config.run import load_config
from pd_train.run import prepare

SETTINGS = settings(
    max_examples=80,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

DEFAULT = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
RAW = read_yaml(DEFAULT)


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a scalar (or empty list) of the raw config, e.g. ("pd", "ci", "type")."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*path, k))]
    if isinstance(node, list) and node:
        return [p for i, v in enumerate(node) for p in _leaves(v, (*path, i))]
    return [path]


def _mappings(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a mapping of the raw config (the root is ``()``)."""
    out = [path] if isinstance(node, dict) else []
    if isinstance(node, dict):
        out += [p for k, v in node.items() for p in _mappings(v, (*path, k))]
    elif isinstance(node, list):
        out += [p for i, v in enumerate(node) for p in _mappings(v, (*path, i))]
    return out


LEAVES = _leaves(RAW)
MAPPINGS = _mappings(RAW)


def dotted(path: tuple[Any, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def get(node: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        node = node[part]
    return node


def with_value(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    raw = yaml.safe_load(yaml.safe_dump(RAW))  # a deep copy of plain data
    node = raw
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    node[path[-1]] = value
    return raw


def related(problem_path: str, field: str) -> bool:
    """The problem is about ``field``: the field itself, something inside it, or the object
    holding it (a wrong value for a ``type`` discriminator, a missing required field)."""
    return (
        problem_path == field
        or problem_path.startswith((field + ".", field + "["))
        or field.startswith((problem_path + ".", problem_path + "["))
        or problem_path == ""
    )


def same_kind(given: Any, held: Any) -> bool:
    """``held`` (unstructured) is ``given`` without coercion: equal, and a bool only for a bool."""
    if isinstance(given, bool) or isinstance(held, bool):
        return type(given) is type(held)
    if isinstance(given, (int, float)) and isinstance(held, (int, float)):
        return given == held or (math.isnan(given) and math.isnan(held))
    if isinstance(given, list) and isinstance(held, (list, tuple)):
        return len(given) == len(held) and all(map(same_kind, given, held))
    return bool(given == held)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, -1.5]),
    st.text(max_size=12),
    st.sampled_from(["yes", "no", "on", "off", "010", "1:20", "2024-01-01", "1e-5", "ü", "∞", ""]),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.text(max_size=6), scalars, max_size=2),
)


def check(raw: dict[str, Any], field: str, *, given_value: Any = None, path: Any = None) -> None:
    """Loads and fully validates (``prepare`` without files' data): a ConfigError about
    ``field``, or a config that holds the value given."""
    try:
        config = prepare(raw, for_run=False).config
    except ConfigError as exc:
        assert exc.problems, exc
        # Named as the problem's path, or in its message (``target.architecture: is null and so
        # is target.checkpoint``).
        assert any(related(p, field) or field in m for p, m in exc.problems), (
            field,
            exc.problems,
        )
        for p, message in exc.problems:
            assert message.strip(), (p, exc.problems)
        return
    if path is not None:
        held = get(unstructure(config), path)
        assert same_kind(given_value, held), (field, given_value, held)


@SETTINGS
@given(path=st.sampled_from(LEAVES), value=values)
def test_a_changed_field_is_refused_by_name_or_held_exactly(path: Any, value: Any) -> None:
    check(with_value(path, value), dotted(path), given_value=value, path=path)


@SETTINGS
@given(path=st.sampled_from(LEAVES))
def test_a_missing_field_is_refused_by_name_or_defaulted(path: Any) -> None:
    raw = yaml.safe_load(yaml.safe_dump(RAW))
    parent = get(raw, path[:-1])
    if isinstance(parent, list):
        del parent[path[-1]]
    else:
        del parent[path[-1]]
    check(raw, dotted(path[:-1]) if isinstance(path[-1], int) else dotted(path))


@SETTINGS
@given(where=st.sampled_from(MAPPINGS), key=st.text(min_size=1, max_size=10), value=scalars)
def test_an_extra_key_is_refused_by_name(where: Any, key: str, value: Any) -> None:
    raw = yaml.safe_load(yaml.safe_dump(RAW))
    parent = get(raw, where)
    if key in parent:
        return
    parent[key] = value
    field = f"{dotted(where)}.{key}" if where else key
    with pytest.raises(ConfigError) as info:
        prepare(raw, for_run=False)
    assert any(p == field and "unknown field" in m for p, m in info.value.problems), (
        field,
        info.value.problems,
    )


override_text = st.one_of(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        max_size=12,
    ),
    st.sampled_from(["yes", "true", "010", "0x10", "1:20", ".inf", "[1, 2]", "{a: 1}", "'x"]),
)


@SETTINGS
@given(path=st.sampled_from(LEAVES), text=override_text)
def test_a_set_override_is_refused_by_name_or_equals_the_same_value_in_the_file(
    path: Any, text: str
) -> None:
    """``--set PATH=TEXT``: a ConfigError naming PATH, or the config the file gives with TEXT
    written there as a YAML value (one parser for both)."""
    field = dotted(path)
    try:
        by_set, _ = load_config(RAW, [f"{field}={text}"])
    except ConfigError as exc:
        assert any(related(p, field) or p == f"{field}={text}" for p, _ in exc.problems), (
            field,
            text,
            exc.problems,
        )
        return
    document = yaml.safe_dump(with_value(path, "__VALUE__")).replace("__VALUE__", text, 1)
    try:
        from pd_train.config.io import load_yaml

        in_file = load_yaml(document)
    except yaml.YAMLError:
        return  # text that is no YAML value inside a block mapping (e.g. "a: b"); --set is flow
    if get(in_file, path) != get(with_value(path, load_yaml(text) if text.strip() else ""), path):
        return  # the text reads differently inside a document (a comment, a quote): no claim
    by_file, _ = load_config(in_file)
    assert by_set == by_file, (field, text)


def test_yaml_1_1_surprises_read_the_same_in_both_places(tmp_path: Path) -> None:
    """The cases found: YAML 1.1 read `yes` as a bool, `010` as 8 and `1:20` as 80. Now, in
    --set and in the file alike, `yes` and `1:20` are strings (refused where a bool or a
    number is due, accepted where a string is) and `010` is 10."""

    def file_with(field: str, text: str) -> Path:
        path = tmp_path / "c.yaml"
        document = yaml.safe_dump(with_value(tuple(field.split(".")), "__V__"))
        path.write_text(document.replace("__V__", text))
        return path

    for text, field in (("yes", "runtime.compile_cache.enabled"), ("1:20", "pd.steps")):
        with pytest.raises(ConfigError) as by_set:
            load_config(RAW, [f"{field}={text}"])
        with pytest.raises(ConfigError) as by_file:
            load_config(file_with(field, text))
        assert by_set.value.problems == by_file.value.problems
        assert by_set.value.problems[0][0] == field
        assert f"got {text!r} (str)" in by_set.value.problems[0][1]
    assert load_config(RAW, ["run_name=yes"])[0].run_name == "yes"
    assert load_config(RAW, ["seed=010"])[0].seed == 10
    assert load_config(file_with("seed", "010"))[0].seed == 10


scalar_text = st.one_of(
    st.text(alphabet="0123456789.+-eExoabfINnulrtyF_:~ ", max_size=8),
    st.sampled_from(["yes", "No", "on", "TRUE", "~", "null", ".inf", "-.Inf", ".NaN", "0o17"]),
)


@SETTINGS
@given(text=scalar_text)
def test_probe_arm_values_read_like_set_values(text: str) -> None:
    """`pd-train probe --arm NAME:PATH=VALUE` (pd-probe's scalar parser) and `--set PATH=VALUE`
    (pd-train's YAML loader) read a scalar alike: one schema, YAML 1.2 core."""
    from pd_probe import OverrideError, parse_scalar
    from pd_train.config.io import load_yaml

    try:
        by_arm = parse_scalar(text)
        by_set = load_yaml(text) if text.strip() else None
    except (OverrideError, yaml.YAMLError):
        return
    if isinstance(by_set, (dict, list)):
        return  # flow collections: pd-probe refuses mappings and parses lists itself
    if isinstance(by_set, str):
        by_set = by_set.strip()
    assert type(by_arm) is type(by_set), (text, by_arm, by_set)
    assert by_arm == by_set or (by_arm != by_arm and by_set != by_set), (text, by_arm, by_set)
