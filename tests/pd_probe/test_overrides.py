"""Overrides: scalar parsing, paths with list indices, existence checks, free-form fields."""

import math

import pytest

from pd_probe import (
    Override,
    OverrideError,
    apply_overrides,
    format_path,
    parse_path,
    parse_scalar,
    to_overrides,
)

BASE = {
    "pd": {
        "lr": 2e-5,
        "loss_metrics": [
            {"type": "faithfulness", "coeff": 1e6},
            {"type": "importance_minimality", "coeff": 5e-6},
            {"type": "chunkwise_subset_recon", "sites_per_chunk": 56},
        ],
    },
    "runtime": {"compiler_options": {}, "cache": {"enabled": True, "dir": None}},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("-12", -12),
        ("0x1f", 31),
        ("0o17", 15),
        ("1e-5", 1e-5),  # pyyaml's YAML 1.1 would read this as a string
        ("2.5", 2.5),
        (".5", 0.5),
        ("-.inf", -math.inf),
        ("true", True),
        ("False", False),
        ("null", None),
        ("~", None),
        ("", None),
        ("'007'", "007"),
        ('"a\\tb"', "a\tb"),
        ("'it''s'", "it's"),
        ("unroll", "unroll"),
        ("  spaced  ", "spaced"),
        ("--xla_gpu_autotune_level=2", "--xla_gpu_autotune_level=2"),
        ("[0, 1, 'x', [2, 3]]", [0, 1, "x", [2, 3]]),
        ("[]", []),
        ("yes", "yes"),  # YAML 1.2: not a bool
    ],
)
def test_parse_scalar(text, expected):
    assert parse_scalar(text) == expected
    assert type(parse_scalar(text)) is type(expected)


def test_parse_scalar_nan_and_refusals():
    assert math.isnan(parse_scalar(".nan"))
    with pytest.raises(OverrideError, match="flow mappings are not supported"):
        parse_scalar("{a: 1}")
    with pytest.raises(OverrideError, match="unbalanced"):
        parse_scalar("[1, 'a]")


def test_paths_round_trip():
    segments = parse_path("pd.loss_metrics[2].sites_per_chunk")
    assert segments == ("pd", "loss_metrics", 2, "sites_per_chunk")
    assert format_path(segments) == "pd.loss_metrics[2].sites_per_chunk"
    assert parse_path("a[0][1]") == ("a", 0, 1)
    for bad in ("", "a..b", "a.", ".a", "a[x]", "a b", "[0]"):
        with pytest.raises(OverrideError, match="bad config path"):
            parse_path(bad)


def test_override_parse_keeps_equals_in_value():
    o = Override.parse("runtime.launch_env.XLA_FLAGS=--a=1 --b=2")
    assert o.path == "runtime.launch_env.XLA_FLAGS"
    assert o.value == "--a=1 --b=2"
    with pytest.raises(OverrideError, match=r"expected 'dotted\.path=value'"):
        Override.parse("pd.lr")


def test_to_overrides_accepts_text_mapping_pairs():
    got = to_overrides(["pd.lr=1e-4", ("pd.loss_metrics[0].coeff", 3), Override("a", [1])])
    assert [(o.path, o.value) for o in got] == [
        ("pd.lr", 1e-4),
        ("pd.loss_metrics[0].coeff", 3),
        ("a", [1]),
    ]
    # Mapping values are used as given, not parsed.
    assert to_overrides({"x.y": "1"})[0].value == "1"
    with pytest.raises(OverrideError, match="bad override 3"):
        to_overrides([3])


def test_apply_sets_nested_and_indexed_values_without_touching_input():
    out = apply_overrides(
        BASE, ["pd.loss_metrics[2].sites_per_chunk=28", "pd.lr=1e-4", "runtime.cache.dir=/x"]
    )
    assert out["pd"]["loss_metrics"][2]["sites_per_chunk"] == 28
    assert out["pd"]["lr"] == 1e-4
    assert out["runtime"]["cache"]["dir"] == "/x"
    assert BASE["pd"]["loss_metrics"][2]["sites_per_chunk"] == 56
    assert BASE["runtime"]["cache"]["dir"] is None


def test_missing_key_names_the_path():
    with pytest.raises(OverrideError) as info:
        apply_overrides(BASE, "runtime.cache.nonexistent=1")
    message = str(info.value)
    assert "runtime.cache.nonexistent does not exist" in message
    assert "runtime.cache has keys: dir, enabled" in message


def test_free_form_fields_allow_new_keys_only_there():
    with pytest.raises(OverrideError, match=r"runtime\.compiler_options\.xla_gpu_autotune_level"):
        apply_overrides(BASE, "runtime.compiler_options.xla_gpu_autotune_level=0")
    out = apply_overrides(
        BASE,
        ["runtime.compiler_options.xla_gpu_autotune_level=0", "runtime.compiler_options.a.b=x"],
        free_form=["runtime.compiler_options"],
    )
    assert out["runtime"]["compiler_options"] == {"xla_gpu_autotune_level": 0, "a": {"b": "x"}}
    # Free-form covers only its own subtree.
    with pytest.raises(OverrideError, match=r"runtime\.cache\.nonexistent does not exist"):
        apply_overrides(BASE, "runtime.cache.nonexistent=1", free_form=["runtime.compiler_options"])
    # A free-form field missing from the raw config may itself be created.
    out = apply_overrides(BASE, "runtime.env.JAX_X=1", free_form=["runtime.env"])
    assert out["runtime"]["env"] == {"JAX_X": 1}


def test_free_form_wildcards():
    out = apply_overrides(
        BASE, "pd.loss_metrics[1].extra.k=1", free_form=["pd.loss_metrics[*].extra"]
    )
    assert out["pd"]["loss_metrics"][1]["extra"] == {"k": 1}


def test_bad_indices_and_types_name_the_path():
    with pytest.raises(OverrideError, match=r"pd\.loss_metrics\[3\] does not exist: .*3 items"):
        apply_overrides(BASE, "pd.loss_metrics[3].coeff=1")
    with pytest.raises(OverrideError, match=r"pd\.lr\[0\] indexes pd\.lr, which is a float"):
        apply_overrides(BASE, "pd.lr[0]=1")
    with pytest.raises(OverrideError, match=r"pd\.loss_metrics is a list; use \[index\]"):
        apply_overrides(BASE, "pd.loss_metrics.coeff=1")
    with pytest.raises(OverrideError, match=r"pd\.lr\.x does not exist: pd\.lr is a float"):
        apply_overrides(BASE, "pd.lr.x=1")
