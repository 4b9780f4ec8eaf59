"""``runtime.init``: the stacked and the per-array init give the same params, element for
element and sharding for sharding; the per-array jit really has one output per array; bad values
are refused naming the field; ``pd-train compile`` reports the init jits of both modes."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

import pd_init
import pd_sharding
from pd_train.cli import main
from pd_train.config.pd import (
    MLPCI,
    ChunkwiseSubsetRecon,
    ConfigError,
    DecompositionTarget,
    Faithfulness,
    OptimizerConfig,
    PDConfig,
    RuntimeConfig,
)
from pd_train.config.run import load_config
from pd_train.run import prepare
from pd_train.train import Trainer

from ._cli import tiny_config
from ._recon import MODEL  # the tiny two-layer Llama the step tests use

PD = PDConfig(
    steps=10,
    # Two kinds of different shapes over both layers: every pd-init group is a fixed ~0.3 s
    # of compile here, so the test keeps the groups few.
    decomposition_targets=(
        DecompositionTarget(module_pattern="layers.*.self_attn.k_proj", C=8),
        DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=16),
    ),
    ci=MLPCI(hidden_dims=(8,)),
    loss_metrics=(Faithfulness(coeff=1.0), ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=2)),
    components=OptimizerConfig(lr=1e-3),
    ci_fn=OptimizerConfig(lr=1e-3),
)
ABSTRACT_KEY = jax.eval_shape(lambda: jax.random.key(0))


def _trainer(init: str, mesh=None) -> Trainer:
    return Trainer(MODEL, PD, RuntimeConfig(init=init), mesh=mesh)  # type: ignore[arg-type]


def _leaves(params) -> list[tuple[str, jax.Array]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in flat]


@pytest.mark.slow
@pytest.mark.parametrize("devices", [None, 4], ids=["no-mesh", "4-devices"])
def test_stacked_and_per_array_init_are_bit_identical(devices) -> None:
    mesh = None if devices is None else pd_sharding.make_mesh(data=4, devices=jax.devices()[:4])
    key = jax.random.key(7)
    stacked = _trainer("stacked", mesh).init_params(key=key)
    per_array = _trainer("per_array", mesh).init_params(key=key)
    got, want = _leaves(per_array), _leaves(stacked)
    assert [p for p, _ in got] == [p for p, _ in want]
    # 2 kinds: V, U and the MLP CI's w0, b0, w_out, b_out per kind, stacked over 2 layers.
    assert len(want) == 2 * 6 and all(leaf.shape[0] == 2 for _, leaf in want)
    for (path, a), (_, b) in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, path
        assert np.array_equal(np.asarray(a), np.asarray(b)), path
        if mesh is not None:
            assert a.sharding.is_equivalent_to(b.sharding, a.ndim), path
            assert len(a.sharding.device_set) == 4, path
    # Not trivially equal: the random arrays hold distinct, non-zero values.
    v = np.asarray(stacked["components"]["down_proj"]["V"])
    assert v.std() > 0 and not np.array_equal(v[0], v[1])


def test_stacked_init_draws_every_random_group_from_counters_with_no_loop() -> None:
    trainer = _trainer("stacked")
    plan = trainer.init_plan()
    random = {g.name for g in plan.groups if not isinstance(g.init, pd_init.Zeros)}
    assert random and set(plan.counter_drawn) == random  # the zero groups: a broadcast
    lowered = dict(trainer.init_lowerings(key=ABSTRACT_KEY))["init_params"]()
    assert "stablehlo.while" not in lowered.as_text()  # draw="map": a loop per group


def test_per_array_init_jit_has_one_output_per_array() -> None:
    mesh = pd_sharding.make_mesh(data=4, devices=jax.devices()[:4])
    n_arrays = len(_trainer("stacked", mesh).param_specs())
    n_groups = len(_trainer("stacked", mesh).init_plan().groups)
    assert (n_arrays, n_groups) == (2 * 2 * 6, 2 * 6)

    stacked = dict(_trainer("stacked", mesh).init_lowerings(key=ABSTRACT_KEY))
    assert list(stacked) == ["init_params"]
    assert len(jax.tree_util.tree_leaves(stacked["init_params"]().out_info)) == n_groups

    per_array = dict(_trainer("per_array", mesh).init_lowerings(key=ABSTRACT_KEY))
    assert list(per_array) == ["init_params", "init_stack"]
    assert len(jax.tree_util.tree_leaves(per_array["init_params"]().out_info)) == n_arrays
    stack = per_array["init_stack"]()
    assert len(jax.tree_util.tree_leaves(stack.out_info)) == n_groups
    assert len(jax.tree_util.tree_leaves(stack.in_avals)) == n_arrays


def _expect_refused(exc: ConfigError) -> None:
    text = str(exc)
    assert "runtime.init" in text, text
    assert "'foo'" in text, text
    assert "'stacked'" in text and "'per_array'" in text, text


def test_bad_init_value_is_refused_naming_the_field(tiny_run_config: dict, tmp_path: Path) -> None:
    config = tiny_run_config
    with pytest.raises(ConfigError) as by_override:
        prepare(config, ["runtime.init=foo"], for_run=False)
    _expect_refused(by_override.value)
    config["runtime"]["init"] = "foo"
    with pytest.raises(ConfigError) as by_file:
        load_config(config)
    _expect_refused(by_file.value)
    config["runtime"]["init"] = "per_array"
    assert load_config(config)[0].runtime.init == "per_array"


def test_cli_set_bad_init_exits_2_naming_the_field(
    tiny_run_config: dict, tmp_path: Path, capsys
) -> None:
    config = tiny_run_config
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["compile", str(path), "--set", "runtime.init=foo"]) == 2
    err = capsys.readouterr().err
    assert "runtime.init" in err and "'foo'" in err and "'per_array'" in err, err


@pytest.mark.slow
def test_compile_reports_the_per_array_init_jits(tmp_path: Path, capsys) -> None:
    """The stacked mode's single ``init_params`` row is covered by test_compile.py."""
    # A small step (faithfulness only, no warmup): the init jits are what this test is about.
    config = tiny_config(
        tmp_path,
        tmp_path / "cache",
        decomposition_targets=[{"module_pattern": "layers.*.mlp.down_proj", "C": 8}],
        loss_metrics=[{"type": "faithfulness", "coeff": 1.0}],
        faithfulness_warmup={"steps": 0},
    )
    config["data"]["path"] = None
    config["runtime"]["init"] = "per_array"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    record = tmp_path / "compile.json"
    assert main(["compile", str(path), "--record", str(record)]) == 0
    out = capsys.readouterr().out
    for jit in ("init_params", "init_stack", "opt_init", "train_step"):
        assert f"| {jit} |" in out, out
    recorded = json.loads(record.read_text())["jits"]
    assert {"init_params", "init_stack"} <= set(recorded)
    assert recorded["init_params"]["memory"]["output_size_in_bytes"] > 0
