"""The strict converter: every kind of bad input is reported with its field path."""

from __future__ import annotations

from typing import Literal

import attrs
import pytest

from pd_train.config.io import (
    ConfigError,
    apply_overrides,
    load_yaml,
    non_negative,
    parse_path,
    structure,
    to_yaml,
)


@attrs.frozen(kw_only=True)
class Faith:
    type: Literal["faith"] = "faith"
    coeff: float = attrs.field(validator=non_negative())


@attrs.frozen(kw_only=True)
class Recon:
    type: Literal["recon"] = "recon"
    coeff: float = attrs.field(validator=non_negative())
    n_samples: int = 1


@attrs.frozen(kw_only=True)
class Section:
    steps: int
    losses: tuple[Faith | Recon, ...] = ()
    flag: bool = False


@attrs.frozen(kw_only=True)
class Root:
    name: str
    pd: Section


GOOD = {"name": "x", "pd": {"steps": 3, "losses": [{"type": "faith", "coeff": 1.0}]}}


def problems(raw: object) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        structure(raw, Root)
    return info.value.problems


def test_good_config_round_trips_through_yaml() -> None:
    config = structure(GOOD, Root)
    assert config.pd.losses == (Faith(coeff=1.0),)
    assert "coeff: 1.0" in to_yaml(config)


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        ({**GOOD, "extra": 1}, "extra", "unknown field; allowed fields: name, pd"),
        ({"name": "x"}, "pd", "required field is missing"),
        ({"name": "x", "pd": {"steps": "3"}}, "pd.steps", "got '3' (str); expected int"),
        ({"name": "x", "pd": {"steps": 3, "flag": 1}}, "pd.flag", "expected bool"),
        ({"name": "x", "pd": {"steps": True}}, "pd.steps", "expected int"),
        (
            {
                "name": "x",
                "pd": {"steps": 3, "losses": [{"type": "faith", "coeff": 1}, {"type": "kl"}]},
            },
            "pd.losses[1].type",
            "got 'kl'; must be one of 'faith', 'recon'",
        ),
        (
            {"name": "x", "pd": {"steps": 3, "losses": [{"type": "recon", "coeff": -1.0}]}},
            "pd.losses[0].coeff",
            "got -1.0; must be >= 0",
        ),
        (
            {
                "name": "x",
                "pd": {"steps": 3, "losses": [{"type": "recon", "coeff": 1, "bogus": 2}]},
            },
            "pd.losses[0].bogus",
            "unknown field",
        ),
    ],
)
def test_bad_input_names_path_value_and_allowed(raw: object, path: str, words: str) -> None:
    found = problems(raw)
    assert any(p == path and words in m for p, m in found), found


def test_all_problems_are_reported_together() -> None:
    found = problems({"name": 3, "pd": {"steps": "x", "nope": 1}})
    assert {p for p, _ in found} == {"name", "pd.steps", "pd.nope"}


def test_overrides_set_nested_values_and_list_items() -> None:
    raw = apply_overrides(GOOD, ["pd.steps=10", "pd.losses[0].coeff=0.5", "pd.flag=true"])
    config = structure(raw, Root)
    assert (config.pd.steps, config.pd.losses[0].coeff, config.pd.flag) == (10, 0.5, True)
    assert GOOD["pd"]["steps"] == 3  # the input is not modified


def test_override_of_unknown_field_fails_with_its_path() -> None:
    raw = apply_overrides(GOOD, ["pd.stepz=10"])
    assert any(p == "pd.stepz" for p, _ in problems(raw))


def test_override_of_missing_list_item_fails() -> None:
    with pytest.raises(ConfigError, match=r"pd.losses\[5\]"):
        apply_overrides(GOOD, ["pd.losses[5].coeff=1"])


@pytest.mark.parametrize("bad", ["a..b", ".a", "a.", "a[x]", ""])
def test_malformed_paths_are_rejected(bad: str) -> None:
    with pytest.raises(ConfigError, match="malformed field path"):
        parse_path(bad)


def test_yaml_reads_exponent_floats_without_a_dot() -> None:
    assert load_yaml("a: 1e-5\nb: 2E+3\nc: 1.5\nd: 7\ne: '1e-5'") == {
        "a": 1e-5,
        "b": 2000.0,
        "c": 1.5,
        "d": 7,
        "e": "1e-5",
    }
