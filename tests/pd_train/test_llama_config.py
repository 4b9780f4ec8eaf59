"""LlamaConfig and RopeScaling check themselves: a bad value is refused on construction, naming
the field (both fields for cross-field checks), the value and what is allowed, and reaches a
YAML user as a ConfigError under ``target.architecture``. Every shipped architecture still
constructs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pd_train import assets
from pd_train.cli import main
from pd_train.config.io import ConfigError, FieldValueError
from pd_train.config.run import ARCHITECTURE_PRESETS, target_architecture
from pd_train.configs import builtin_configs
from pd_train.models.hf import CheckpointError, llama_config_from_hf, read_hf_config
from pd_train.models.llama_config import LlamaConfig, RopeScaling
from pd_train.targets.llama import LlamaTargetConfig

from ._cli import TINY_ARCH

FIXTURES = Path(__file__).parent / "fixtures"

GOOD: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
SIZES = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)

# (change to GOOD, field the error names, substrings of the message)
BAD_LLAMA: list[tuple[dict[str, Any], str, list[str]]] = [
    *[({f: 0}, f, ["got 0", "an int > 0"]) for f in SIZES],
    *[({f: -2}, f, ["got -2", "an int > 0"]) for f in SIZES],
    ({"hidden_size": 32.0}, "hidden_size", ["got 32.0", "an int > 0"]),
    ({"num_hidden_layers": True}, "num_hidden_layers", ["got True", "an int > 0"]),
    ({"head_dim": 0}, "head_dim", ["got 0", "null or an int > 0"]),
    ({"head_dim": 15}, "head_dim", ["got 15", "even"]),
    ({"rms_norm_eps": 0.0}, "rms_norm_eps", ["got 0.0", "> 0"]),
    ({"rms_norm_eps": -1e-5}, "rms_norm_eps", ["got -1e-05", "> 0"]),
    ({"rms_norm_eps": math.nan}, "rms_norm_eps", ["got nan", "> 0"]),
    ({"rms_norm_eps": "1e-5"}, "rms_norm_eps", ["got '1e-5'", "a finite number > 0"]),
    ({"rms_norm_eps": math.inf}, "rms_norm_eps", ["got inf", "a finite number > 0"]),
    ({"rope_theta": math.inf}, "rope_theta", ["got inf", "a finite number > 0"]),
    ({"rope_theta": 0.0}, "rope_theta", ["got 0.0", "> 0"]),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings", ["got 1", "true or false"]),
    ({"rope_scaling": {"factor": 8.0}}, "rope_scaling", ["got {'factor': 8.0}", "RopeScaling"]),
    (
        {"num_key_value_heads": 3},
        "num_key_value_heads",
        ["got 3", "must divide num_attention_heads (4)"],
    ),
    (
        {"hidden_size": 30},
        "hidden_size",
        ["got 30", "multiple of num_attention_heads (4)", "head_dim is unset"],
    ),
    # 36 / 4 = 9: an odd head dim derived from hidden_size.
    ({"hidden_size": 36}, "hidden_size", ["got 36", "num_attention_heads (4)", "9", "even"]),
]

BAD_ROPE: list[tuple[dict[str, Any], str, list[str]]] = [
    ({"factor": 0.0}, "factor", ["got 0.0", "> 0"]),
    ({"low_freq_factor": 0.0}, "low_freq_factor", ["got 0.0", "> 0"]),
    ({"high_freq_factor": -4.0}, "high_freq_factor", ["got -4.0", "> 0"]),
    ({"original_max_position_embeddings": 0}, "original_max_position_embeddings", ["got 0"]),
    (
        {"high_freq_factor": 1.0},
        "high_freq_factor",
        ["got 1.0", "greater than low_freq_factor (1.0)"],
    ),
    (
        {"low_freq_factor": 4.0, "high_freq_factor": 2.0},
        "high_freq_factor",
        ["got 2.0", "greater than low_freq_factor (4.0)"],
    ),
]


def _ids(cases: list[tuple[dict[str, Any], str, list[str]]]) -> list[str]:
    return ["-".join(f"{k}={v!r}" for k, v in change.items()) for change, _, _ in cases]


@pytest.mark.parametrize(("change", "field", "needles"), BAD_LLAMA, ids=_ids(BAD_LLAMA))
def test_bad_llama_config_names_field_value_and_allowed(
    change: dict[str, Any], field: str, needles: list[str]
) -> None:
    with pytest.raises(FieldValueError) as info:
        LlamaConfig(**{**GOOD, **change})
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    for needle in needles:
        assert needle in str(info.value)


@pytest.mark.parametrize(("change", "field", "needles"), BAD_ROPE, ids=_ids(BAD_ROPE))
def test_bad_rope_scaling_names_field_value_and_allowed(
    change: dict[str, Any], field: str, needles: list[str]
) -> None:
    with pytest.raises(FieldValueError) as info:
        RopeScaling(**change)
    assert info.value.field == field
    for needle in needles:
        assert needle in str(info.value)


def test_good_values_at_the_edges_construct() -> None:
    # head_dim overrides hidden_size / heads (heads * head_dim != hidden_size is allowed), numpy
    # scalars pass, multi-query (one kv head) is a divisor.
    config = LlamaConfig(
        **{
            **GOOD,
            "hidden_size": 30,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "vocab_size": np.int64(7),
            "rms_norm_eps": np.float32(1e-6),
        }
    )
    assert config.resolved_head_dim == 16
    assert config.site_shapes()["q_proj"] == (30, 64)
    assert RopeScaling(factor=0.5, low_freq_factor=0.1, high_freq_factor=0.2).factor == 0.5


def test_shipped_architectures_construct() -> None:
    for name, preset in ARCHITECTURE_PRESETS.items():
        assert isinstance(preset(), LlamaConfig), name
    assert ARCHITECTURE_PRESETS["llama3_8b"]().resolved_head_dim == 128
    for directory in (assets.tiny_llama_path(), FIXTURES / "llama3_gqa", FIXTURES / "tied"):
        assert isinstance(llama_config_from_hf(read_hf_config(directory)), LlamaConfig)
    assert isinstance(llama_config_from_hf(TINY_ARCH), LlamaConfig)
    checked = 0
    for path in builtin_configs().values():
        target = yaml.safe_load(path.read_text()).get("target") or {}
        arch = target.get("architecture")
        if arch is not None and target.get("type", "llama") == "llama":
            assert isinstance(
                target_architecture(LlamaTargetConfig(architecture=arch)), LlamaConfig
            )
            checked += 1
    assert checked >= 1


def test_hf_config_errors_use_hf_field_names() -> None:
    base = json.loads((FIXTURES / "llama3_gqa" / "config.json").read_text())
    heads = base["num_attention_heads"]
    with pytest.raises(
        CheckpointError,
        match=rf"num_key_value_heads: got 3; must divide num_attention_heads \({heads}\)",
    ):
        llama_config_from_hf({**base, "num_key_value_heads": 3})
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0}
    with pytest.raises(CheckpointError, match=r"rope_scaling\.high_freq_factor: got 4\.0"):
        llama_config_from_hf({**base, "rope_scaling": rope})
    v5 = {
        **base,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 0},
    }
    with pytest.raises(CheckpointError, match=r"rope_parameters\.rope_theta: got 0\.0; must be"):
        llama_config_from_hf(v5)
    with pytest.raises(CheckpointError, match=r"checkpoint config: rms_norm_eps: got -1\.0"):
        llama_config_from_hf({**base, "rms_norm_eps": -1.0})


def test_bad_architecture_in_yaml_is_a_config_error_at_its_path() -> None:
    target = LlamaTargetConfig(architecture={**TINY_ARCH, "num_key_value_heads": 3})
    with pytest.raises(ConfigError) as info:
        target_architecture(target)
    [(path, message)] = info.value.problems
    assert path == "target.architecture"
    assert "num_key_value_heads: got 3; must divide num_attention_heads (4)" in message


def test_bad_architecture_override_reaches_the_cli_user(
    tiny_run_config: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text(yaml.safe_dump(tiny_run_config))
    argv = ["run", str(config_file), "--set", "target.architecture.hidden_size=30"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "target.architecture: hidden_size: got 30" in err, err
    assert not (tmp_path / "runs").exists()
