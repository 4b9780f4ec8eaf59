"""Bad configs: each gives a message naming the field, the value and what is allowed, exits 2,
and leaves no run dir behind."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_train.cli import main


def _set(config: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    config = copy.deepcopy(config)
    node: Any = config
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = parts[-1]
    if value is DELETE:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return config


DELETE = object()

CASES = [
    ("pd.steps", "ten", "pd.steps: got 'ten' (str); expected int"),
    ("pd.batch_size", 0, "pd.batch_size: got 0; must be > 0"),
    ("pd.bogus", 1, "pd.bogus: unknown field; allowed fields: steps"),
    ("pd.loss_metrics.1.coeff", -1.0, "pd.loss_metrics[1].coeff: got -1.0; must be >= 0"),
    ("pd.loss_metrics.2.type", "kl", "pd.loss_metrics[2].type: got 'kl'; must be one of"),
    # A field that another loss term has (importance minimality's p) names the entry's type.
    (
        "pd.loss_metrics.0",
        {"type": "faithfulness", "coeff": 1.0, "pnorm_end": 1.0},
        "pd.loss_metrics[0].pnorm_end: unknown field in a 'faithfulness' entry; allowed fields:"
        " type, name, coeff",
    ),
    (
        "pd.ci.type",
        "transformer",
        "pd.ci.type: got 'transformer'; must be one of 'mlp', 'shared_mlp'",
    ),
    (
        "pd.recon",
        {"chunk_loop": "loop"},
        "pd.recon.chunk_loop: got 'loop'; must be one of 'scan', 'unroll'",
    ),
    ("pd.recon", {"pair_terms": "maybe"}, "pd.recon.pair_terms: got 'maybe' (str); expected bool"),
    (
        "pd.recon",
        {"random_draws": "rbg"},
        "pd.recon.random_draws: got 'rbg'; must be one of 'jax', 'blocked'",
    ),
    (
        "pd.components.hold_steps",
        6,
        "pd.components.hold_steps: got 6; with warmup_steps 2 the lr would never decay within"
        " pd.steps (8): must be < 6",
    ),
    ("run_name", DELETE, "run_name: required field is missing"),
    ("run_name", "a/b", "run_name: got 'a/b'"),
    (
        "pd.decomposition_targets.0.module_pattern",
        "layers.*.self_atn.*",
        "pd.decomposition_targets[0].module_pattern",
    ),
    ("data.path", "/nonexistent/tokens.npy", "data.path: '/nonexistent/tokens.npy' does not exist"),
    ("data.seq_len", 100_000, "data.path:"),
    ("cadence.save_every", 50, "cadence.save_every: got 50, more than pd.steps (8)"),
    ("pd.batch_size", 12, "pd.batch_size: got 12; must be a multiple of the data axes' size 8"),
    ("runtime.mesh", {"data": 3}, "runtime.mesh"),
    ("runtime.compile_cache", {"xla_caches": "all"}, "crashed at run time on GPU"),
    ("target.architecture", "llama2", "target.architecture: got 'llama2'; presets are"),
]


@pytest.mark.parametrize(("path", "value", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_config_is_reported_and_leaves_nothing(
    tiny_run_config: dict,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: str,
    value: Any,
    message: str,
) -> None:
    config = _set(tiny_run_config, path, value)
    config_file = tmp_path / "bad.yaml"
    config_file.write_text(yaml.safe_dump(config))
    assert main(["run", str(config_file)]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()


def test_bad_override_names_its_path(
    tiny_run_config: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text(yaml.safe_dump(tiny_run_config))
    assert main(["config", str(config_file), "--set", "pd.stepz=3"]) == 2
    assert "pd.stepz: unknown field" in capsys.readouterr().err


def test_config_prints_defaults(
    tiny_run_config: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text(yaml.safe_dump(tiny_run_config))
    assert main(["config", str(config_file), "--set", "pd.steps=5"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["pd"]["steps"] == 5
    assert printed["runtime"]["compile_cache"]["enabled"] is True  # a default, filled in
