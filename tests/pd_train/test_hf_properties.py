"""Property-based tests of ``config.json`` reading (issue 14, item 8, the HF part).

Around a valid tiny config.json (in both dialects) hypothesis generates wrong types, boundary
values, unicode, missing and extra keys. Each generated file, written to disk and read back
with :func:`read_hf_config` (so values are exactly what JSON gives), must either be refused
with an :class:`HFConfigError` naming the field and the file, or read into exactly the
LlamaConfig an independent oracle predicts from the JSON value: the valid one with that field
set to that value (or to transformers' default), never a coerced or otherwise different model.
Any other exception fails the test. Example counts are fixed and derandomized (CI runs the same
examples every time, in a few seconds).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pd_train.models.hf import HFConfigError, llama_config_from_hf, read_hf_config
from pd_train.models.llama_config import LlamaConfig, RopeScaling

from ._hf import EXPECTED, config_v4, config_v5

SETTINGS = settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

DIALECTS = {"v4": config_v4, "v5": config_v5}
ROPE_FIELD = {"v4": "rope_scaling", "v5": "rope_parameters"}


# --------------------------------------------------------------------------------------------
# the oracle: which JSON values a field takes, and what LlamaConfig they give


def is_int(v: Any) -> bool:
    return type(v) is int  # JSON integers only: not booleans, not 16.0


def is_number(v: Any) -> bool:
    if type(v) is float:
        return math.isfinite(v)
    if type(v) is int:
        try:
            return math.isfinite(float(v)) and int(float(v)) == v
        except OverflowError:
            return False
    return False


def evolve_scaling(**change: Any) -> LlamaConfig:
    assert EXPECTED.rope_scaling is not None
    return attrs.evolve(EXPECTED, rope_scaling=attrs.evolve(EXPECTED.rope_scaling, **change))


# field (dotted, "@" stands for the dialect's rope dict) → (accepts, expected config)
def oracle(field: str, v: Any) -> LlamaConfig | None:
    """The LlamaConfig the valid config with ``field`` set to ``v`` must give, or None when
    JSON's type of ``v`` is not one the field takes. Building the config raises ValueError
    when LlamaConfig's own bounds or cross-field rules refuse the value."""
    ints = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
    ints += ("num_attention_heads", "max_position_embeddings")
    if field in ints:
        return attrs.evolve(EXPECTED, **{field: v}) if is_int(v) else None
    if field == "num_key_value_heads":
        if v is None:
            return attrs.evolve(EXPECTED, num_key_value_heads=EXPECTED.num_attention_heads)
        return attrs.evolve(EXPECTED, num_key_value_heads=v) if is_int(v) else None
    if field == "head_dim":
        return attrs.evolve(EXPECTED, head_dim=v) if v is None or is_int(v) else None
    if field in ("rms_norm_eps", "rope_theta", "@.rope_theta"):
        return attrs.evolve(EXPECTED, **{field.lstrip("@."): float(v)}) if is_number(v) else None
    if field == "tie_word_embeddings":
        return attrs.evolve(EXPECTED, tie_word_embeddings=v) if type(v) is bool else None
    if field in ("attention_bias", "mlp_bias"):
        return EXPECTED if v is False else None
    if field == "model_type":
        return EXPECTED if v == "llama" and type(v) is str else None
    if field == "hidden_act":
        return EXPECTED if v == "silu" and type(v) is str else None
    if field == "architectures":
        return EXPECTED if v is None or v == ["LlamaForCausalLM"] else None
    if field in ("partial_rotary_factor", "@.partial_rotary_factor"):
        return EXPECTED if v is None or (is_number(v) and v == 1) else None
    if field == "@.rope_type":
        if v == "llama3" and type(v) is str:
            return EXPECTED
        return attrs.evolve(EXPECTED, rope_scaling=None) if v == "default" else None
    if field in ("@.factor", "@.low_freq_factor", "@.high_freq_factor"):
        return evolve_scaling(**{field[2:]: float(v)}) if is_number(v) else None
    if field == "@.original_max_position_embeddings":
        return evolve_scaling(original_max_position_embeddings=v) if is_int(v) else None
    raise AssertionError(field)


FIELDS = {
    "v4": [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_theta",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "model_type",
        "hidden_act",
        "architectures",
        "partial_rotary_factor",
        "@.rope_type",
        "@.factor",
        "@.low_freq_factor",
        "@.high_freq_factor",
        "@.original_max_position_embeddings",
        "@.partial_rotary_factor",
    ],
}
FIELDS["v5"] = [f if f != "rope_theta" else "@.rope_theta" for f in FIELDS["v4"]]


def with_value(dialect: str, field: str, v: Any, *, drop: bool = False) -> dict[str, Any]:
    d = json.loads(json.dumps(DIALECTS[dialect]()))
    target, key = (d[ROPE_FIELD[dialect]], field[2:]) if field.startswith("@.") else (d, field)
    if drop:
        del target[key]
    else:
        target[key] = v
    return d


def spelled(dialect: str, field: str) -> str:
    """The field as the error message spells it."""
    return f"{ROPE_FIELD[dialect]}.{field[2:]}" if field.startswith("@.") else field


# --------------------------------------------------------------------------------------------
# generated values

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=4,
)
BOUNDARY: list[Any] = [
    *(0, 1, -1, 2, 3, 4, 16, 24, 2**31 - 1, 2**31, 2**53 + 1, 2**63, -(2**63), 10**400),
    *(0.0, -0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 1e-5, 5e-324, 1e308, math.inf, math.nan),
    *("", "0", "16", "1e-5", "false", "true", "False", "null", "llama", "silu", "SiLU"),
    *(
        "llama3",
        "default",
        "LlamaForCausalLM",
        "ll\u0430ma",
        "s\u0456lu",
        "llama\u200b",
        "\U0001f999",
    ),
    *(True, False, None, [], {}, ["LlamaForCausalLM"], ["LlamaForCausalLM", "x"], [16], {"a": 1}),
]
boundary = st.sampled_from(BOUNDARY)
values = st.one_of(boundary, st.integers(min_value=-3, max_value=300), json_values)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf_properties")


def read_back(workdir: Path, d: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    file = workdir / "config.json"
    file.write_text(json.dumps(d), encoding="utf-8")
    return file, read_hf_config(file)


@SETTINGS
@given(dialect=st.sampled_from(sorted(DIALECTS)), data=st.data())
def test_one_field_changed_is_refused_by_name_or_read_exactly(workdir, dialect, data):
    field = data.draw(st.sampled_from(FIELDS[dialect]), label="field")
    value = data.draw(values, label="value")
    file, d = read_back(workdir, with_value(dialect, field, value))
    value = (d[ROPE_FIELD[dialect]] if field.startswith("@.") else d)[field.removeprefix("@.")]
    try:
        want = oracle(field, value)  # None: a JSON type the field does not take
    except ValueError:
        want = None  # the right type, but LlamaConfig's bounds or cross-field rules refuse it
    try:
        got = llama_config_from_hf(d)
    except HFConfigError as e:
        text = str(e)
        assert want is None, f"{spelled(dialect, field)}={value!r} was refused: {text}"
        assert str(file) in text, text
        assert field.removeprefix("@.") in text, (field, value, text)
        return
    assert want is not None, f"{spelled(dialect, field)}={value!r} was accepted as {got}"
    assert got == want, (field, value)
    assert type(got.rope_theta) is float and type(got.rms_norm_eps) is float


def present(dialect: str, field: str) -> bool:
    d = DIALECTS[dialect]()
    return field.removeprefix("@.") in (d[ROPE_FIELD[dialect]] if field.startswith("@.") else d)


@pytest.mark.parametrize(
    ("dialect", "field"),
    [(dl, f) for dl in sorted(DIALECTS) for f in FIELDS[dl] if present(dl, f)],
)
def test_a_missing_field_is_named_or_takes_transformers_default(workdir, dialect, field):
    file, d = read_back(workdir, with_value(dialect, field, None, drop=True))
    defaults: dict[str, LlamaConfig | None] = {
        "num_key_value_heads": attrs.evolve(EXPECTED, num_key_value_heads=4),
        "head_dim": attrs.evolve(EXPECTED, head_dim=None),
        "max_position_embeddings": attrs.evolve(EXPECTED, max_position_embeddings=2048),
        "rms_norm_eps": attrs.evolve(EXPECTED, rms_norm_eps=1e-6),
        "rope_theta": attrs.evolve(EXPECTED, rope_theta=10_000.0),
        "@.rope_theta": attrs.evolve(EXPECTED, rope_theta=10_000.0),
        "@.rope_type": attrs.evolve(EXPECTED, rope_scaling=None),
        # falls back to max_position_embeddings (256)
        "@.original_max_position_embeddings": evolve_scaling(original_max_position_embeddings=256),
        **dict.fromkeys(
            ("tie_word_embeddings", "attention_bias", "mlp_bias", "model_type"), EXPECTED
        ),
        **dict.fromkeys(("hidden_act", "architectures"), EXPECTED),
    }
    want = defaults.get(field)
    if want is None:  # required
        with pytest.raises(HFConfigError) as info:
            llama_config_from_hf(d)
        assert field.removeprefix("@.") in str(info.value) and str(file) in str(info.value)
        assert "missing" in str(info.value)
    else:
        assert llama_config_from_hf(d) == want


not_known = st.text(min_size=1, max_size=12).filter(
    lambda k: (
        k not in config_v4()
        and k not in config_v5()
        and k != "partial_rotary_factor"
        and k != "original_max_position_embeddings"
        and k not in ("rope_theta", "head_dim")
    )
)


@SETTINGS
@given(
    dialect=st.sampled_from(sorted(DIALECTS)),
    extra=st.dictionaries(not_known, json_values, min_size=1, max_size=4),
    in_rope=st.booleans(),
)
def test_unknown_keys_change_nothing(workdir, dialect, extra, in_rope):
    d = DIALECTS[dialect]()
    if in_rope:
        rope = {k: v for k, v in extra.items() if k not in ("rope_type", "type")}
        if any(isinstance(v, dict) for v in rope.values()):
            return  # a nested dict in the rope dict is refused (per-layer RoPE), tested below
        d[ROPE_FIELD[dialect]] = {**d[ROPE_FIELD[dialect]], **rope}
    else:
        d = {**d, **extra}
    _, d = read_back(workdir, d)
    assert llama_config_from_hf(d) == EXPECTED


def test_nested_rope_settings_are_refused():
    d = config_v5()
    d["rope_parameters"] = {"full_attention": d["rope_parameters"]}
    with pytest.raises(HFConfigError, match=r"rope_parameters\.full_attention: got .*per layer"):
        llama_config_from_hf(d)


@st.composite
def valid_architectures(draw: st.DrawFn) -> tuple[dict[str, Any], LlamaConfig]:
    kv = draw(st.integers(1, 4))
    heads = kv * draw(st.integers(1, 4))
    head_dim = 2 * draw(st.integers(1, 8))
    explicit_head_dim = draw(st.booleans())
    hidden = heads * head_dim if not explicit_head_dim else draw(st.integers(1, 200))
    theta = draw(st.floats(1.0, 1e7) | st.integers(1, 10**7))
    eps = draw(st.floats(1e-8, 1e-2))
    llama3 = draw(st.booleans())
    low = draw(st.floats(0.1, 4.0))
    rope = {"factor": draw(st.floats(0.5, 64.0)), "low_freq_factor": low}
    rope |= {"high_freq_factor": low + draw(st.floats(0.1, 8.0))}
    rope |= {"original_max_position_embeddings": draw(st.integers(1, 1 << 20))}
    sizes = {
        "vocab_size": draw(st.integers(1, 1 << 18)),
        "hidden_size": hidden,
        "intermediate_size": draw(st.integers(1, 1 << 15)),
        "num_hidden_layers": draw(st.integers(1, 128)),
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "max_position_embeddings": draw(st.integers(1, 1 << 20)),
    }
    tied = draw(st.booleans())
    config = LlamaConfig(
        **sizes,
        head_dim=head_dim if explicit_head_dim else None,
        rms_norm_eps=eps,
        rope_theta=float(theta),
        rope_scaling=RopeScaling(**rope) if llama3 else None,
        tie_word_embeddings=tied,
    )
    common = {**sizes, "rms_norm_eps": eps, "tie_word_embeddings": tied}
    if explicit_head_dim:
        common["head_dim"] = head_dim
    rope_type = {"rope_type": "llama3", **rope} if llama3 else {"rope_type": "default"}
    v4 = {**common, "rope_theta": theta, "rope_scaling": rope_type if llama3 else None}
    v5 = {**common, "rope_parameters": {**rope_type, "rope_theta": theta}}
    return {"v4": v4, "v5": v5}, config


@SETTINGS
@given(valid_architectures())
def test_both_dialects_read_any_valid_architecture_exactly(workdir, case):
    spellings, want = case
    for d in spellings.values():
        _, d = read_back(workdir, d)
        assert llama_config_from_hf(d) == want
