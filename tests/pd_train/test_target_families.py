"""Target kinds through the registry: the ``target:`` tagged union, the GPT-2 and Qwen targets in
the generic layer loop (clean and masked forwards), their FSDP shardings, and a GPT-2 and a Qwen2
checkpoint decomposed end to end by ``pd-train run``.

The checkpoints are the transformers-made fixtures of ``test_hf_families.py``
(``scripts/make_hf_families.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from pd_train._forward import CleanRunner, ForwardSpec, masked_forward
from pd_train.config.io import ConfigError, structure
from pd_train.config.pd import DecompositionTarget
from pd_train.config.run import Config, TargetConfig, load_config, target_architecture
from pd_train.decomposition import build_decomposition
from pd_train.models import gpt2
from pd_train.models.hf import load_gpt2_checkpoint, load_qwen2_checkpoint, load_qwen3_checkpoint
from pd_train.models.llama import forward as llama_forward
from pd_train.targets import (
    GPT2Target,
    GPT2TargetConfig,
    LlamaTarget,
    LlamaTargetConfig,
    Qwen2TargetConfig,
    Qwen3TargetConfig,
    TargetKind,
    as_target,
    kind_of,
    register_target,
    target_kind,
    target_kinds,
)

from ._tiny import FAST

FIXTURES = Path(__file__).parent / "fixtures"


# ------------------------------------------------------------------------ the tagged union


@attrs.frozen(kw_only=True)
class _OutsideConfig(TargetConfig):
    type: Literal["outside_test_kind"] = "outside_test_kind"
    width: int = 3


_OUTSIDE = TargetKind(
    name="outside_test_kind",
    config=_OutsideConfig,
    architecture=lambda config, *, base: ("outside", config.width),
    load=lambda *a, **k: None,
    owns=lambda model: False,
    target=lambda model: None,
    shardings=lambda model, layout, params: None,
)


@pytest.fixture(autouse=True, scope="module")
def _outside_kind_registered() -> Iterator[None]:
    """The outside kind is registered for this module's tests only: registered at import, it
    would leak into every later walk of the schema (the config reference, the field
    classification) of the whole session."""
    from pd_train.config.io import tagged_family
    from pd_train.targets import registry

    register_target(_OUTSIDE)
    try:
        yield
    finally:
        registry._KINDS.pop(_OUTSIDE.name, None)
        tagged_family(TargetConfig).members.pop(_OUTSIDE.name, None)


def test_a_target_without_type_is_llama_and_each_type_picks_its_kind() -> None:
    assert structure({"checkpoint": "x"}, TargetConfig) == LlamaTargetConfig(checkpoint="x")
    for name, cls in (
        ("llama", LlamaTargetConfig),
        ("qwen2", Qwen2TargetConfig),
        ("qwen3", Qwen3TargetConfig),
        ("gpt2", GPT2TargetConfig),
    ):
        got = structure({"type": name, "strict": False}, TargetConfig)
        assert type(got) is cls and got.strict is False and got.type == name
    assert {"llama", "qwen2", "qwen3", "gpt2"} <= set(target_kinds())


def test_a_kind_registered_outside_pd_is_part_of_the_union() -> None:
    got = structure({"type": "outside_test_kind", "width": 5}, TargetConfig)
    assert got == _OutsideConfig(width=5)
    assert target_architecture(got) == ("outside", 5)
    with pytest.raises(ValueError, match="registered already"):
        register_target(_OUTSIDE)


def test_an_unknown_kind_is_refused_by_field_path_listing_the_registered_ones(tmp_path) -> None:
    raw = _run_config(tmp_path, {"type": "gpt3", "checkpoint": "x"})
    with pytest.raises(ConfigError) as err:
        load_config(raw)
    text = str(err.value)
    assert "target.type: got 'gpt3'; registered target kinds are" in text
    for name in ("'gpt2'", "'llama'", "'qwen2'", "'qwen3'"):
        assert name in text
    with pytest.raises(ConfigError, match=r"target\.type: got 'nope'"):
        target_kind("nope")


def test_fields_of_one_kind_are_checked_against_that_kind(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"target\.layers: unknown field"):
        load_config(_run_config(tmp_path, {"type": "gpt2", "layers": 3}))
    with pytest.raises(ConfigError, match=r"target\.dtype: got 'float16'"):
        load_config(_run_config(tmp_path, {"type": "qwen2", "dtype": "float16"}))


def test_the_config_round_trips_through_yaml_with_its_type(tmp_path) -> None:
    from pd_train.config.run import to_yaml

    config, _ = load_config(_run_config(tmp_path, {"type": "qwen3", "checkpoint": "x"}))
    again = yaml.safe_load(to_yaml(config))
    assert again["target"]["type"] == "qwen3"
    assert structure(again, Config).target == config.target


@pytest.mark.parametrize(
    ("kind", "wrong"),
    [("qwen2", "gpt2"), ("gpt2", "qwen2"), ("llama", "qwen3"), ("qwen3", "qwen2")],
)
def test_a_checkpoint_of_another_family_is_refused_at_target_checkpoint(kind, wrong) -> None:
    target = structure({"type": kind, "checkpoint": str(FIXTURES / wrong)}, TargetConfig)
    with pytest.raises(ConfigError, match=r"target\.checkpoint: .*architectures: got"):
        target_architecture(target)


def test_architecture_mappings_use_the_kinds_reader() -> None:
    arch = dict(json.loads((FIXTURES / "gpt2" / "config.json").read_text()))
    got = target_architecture(GPT2TargetConfig(architecture=arch))
    assert isinstance(got, gpt2.GPT2Config) and got.n_layer == 2
    with pytest.raises(ConfigError, match=r"target\.architecture: n_head: got 2\.0"):
        target_architecture(GPT2TargetConfig(architecture={**arch, "n_head": 2.0}))
    qwen = target_architecture(Qwen2TargetConfig(checkpoint=str(FIXTURES / "qwen2")))
    assert qwen.qkv_bias and kind_of(qwen).name == "qwen2"
    assert isinstance(as_target(qwen), LlamaTarget)


# ------------------------------------------------------------- targets in the generic loop

LOAD = {
    "gpt2": load_gpt2_checkpoint,
    "qwen2": load_qwen2_checkpoint,
    "qwen3": load_qwen3_checkpoint,
}


def _exact_components(decomposition: Any, params: Any, c: int) -> dict[str, Any]:
    """V = W padded to C columns and U = [I; 0], so V@U = W for every site."""
    comps = {}
    for layout in decomposition.kinds:
        w = params["layers"][layout.kind][jnp.asarray(layout.layers)]
        v = jnp.zeros((len(layout.layers), layout.d_in, c)).at[:, :, : layout.d_out].set(w)
        u = jnp.zeros((c, layout.d_out)).at[: layout.d_out].set(jnp.eye(layout.d_out))
        comps[layout.kind] = {
            "V": v,
            "U": jnp.broadcast_to(u, (len(layout.layers), c, layout.d_out)),
        }
    return comps


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "qwen3"])
def test_clean_and_full_mask_forwards_equal_the_model(name) -> None:
    """The generic layer loop runs the family: clean logits = the model's forward (pinned to
    transformers by test_hf_families); every site live with ci = 1, no sources and V@U = W gives
    the same logits; ci = 0 changes them."""
    config, params = LOAD[name](FIXTURES / name)
    ids = np.load(FIXTURES / name / "reference.npz")["input_ids"]
    model = config
    forward = gpt2.forward if name == "gpt2" else llama_forward
    c = 128
    patterns = [DecompositionTarget(module_pattern="layers.*", C=c)]
    d = build_decomposition(model, patterns)
    assert len(d.sites) == as_target(model).n_layers * len(as_target(model).kinds)
    spec = ForwardSpec(model=model, decomposition=d)
    clean, _ = CleanRunner(spec, params, ids).run(lambda k, x, xs: x, {})
    np.testing.assert_allclose(clean, forward(params, ids, config), rtol=1e-5, atol=1e-5)
    comps = _exact_components(d, params, c)
    b, t = ids.shape
    ci = {k.kind: jnp.ones((len(k.layers), b, t, c)) for k in d.kinds}
    live = np.ones((as_target(model).n_layers, len(d.kinds)), bool)
    run = lambda ci: masked_forward(  # noqa: E731
        spec, target=params, tokens=ids, components=comps, ci_lower=ci, live=live, routed=None,
        key=jax.random.key(2), source_scale=jnp.float32(0.0),
    )  # fmt: skip
    np.testing.assert_allclose(run(ci), clean, rtol=1e-4, atol=1e-4)
    off = run({k: jnp.zeros_like(v) for k, v in ci.items()})
    assert np.abs(np.asarray(off) - np.asarray(clean)).max() > 0.1


def test_gpt2_sites_are_named_like_every_lm_target() -> None:
    config, _ = load_gpt2_checkpoint(FIXTURES / "gpt2")
    d = build_decomposition(config, [DecompositionTarget(module_pattern="layers.1.*", C=4)])
    assert [s.name for s in d.sites] == [
        "layers.1.self_attn.q_proj", "layers.1.self_attn.k_proj", "layers.1.self_attn.v_proj",
        "layers.1.self_attn.o_proj", "layers.1.mlp.up_proj", "layers.1.mlp.down_proj",
    ]  # fmt: skip
    assert as_target(config) == GPT2Target(config=config)


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_checkpoints_load_into_the_kinds_fsdp_shardings(name) -> None:
    from pd_sharding import Zero1Layout, make_mesh

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 (simulated) devices")
    layout = Zero1Layout(make_mesh(data=8))
    config, host = LOAD[name](FIXTURES / name)
    kind = kind_of(config)
    shardings = kind.shardings(config, layout, host)
    _, params = LOAD[name](FIXTURES / name, shardings=shardings)
    for got, want, sharding in zip(
        jax.tree.leaves(params), jax.tree.leaves(host), jax.tree.leaves(shardings), strict=True
    ):
        assert got.sharding == sharding
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    q = params["layers"]["q_proj"]
    assert q.sharding.spec[1] is not None  # FSDP on the hidden dim, not replicated


# ----------------------------------------------------------------------- end to end


def _run_config(tmp: Path, target: dict[str, Any], *, vocab: int = 64) -> dict[str, Any]:
    tokens = tmp / "tokens.npy"
    np.save(tokens, np.random.default_rng(0).integers(0, vocab, size=8_000, dtype=np.uint16))
    return {
        "run_name": "family",
        "seed": 3,
        "output_dir": str(tmp / "runs"),
        "target": target,
        "data": {"path": str(tokens), "seq_len": 16},
        "pd": {
            "steps": 4,
            "batch_size": 4,
            "decomposition_targets": [
                {"module_pattern": "layers.*.self_attn.*", "C": 8},
                {"module_pattern": "layers.*.mlp.*", "C": 16},
            ],
            "ci": {"type": "mlp", "hidden_dims": [4]},
            "loss_metrics": [
                {"type": "faithfulness", "coeff": 100.0},
                {
                    "type": "importance_minimality",
                    "coeff": 1e-3,
                    "pnorm_start": 2.0,
                    "pnorm_end": 1.0,
                },
                {"type": "stochastic_recon", "coeff": 1.0},
            ],
            "components": {"lr": 1e-3, "warmup_steps": 1, "final_val_frac": 0.1, "clip": 1.0},
            "ci_fn": {"lr": 1e-3},
            "faithfulness_warmup": {"steps": 2, "lr": 1e-3},
        },
        "cadence": {"train_log_every": 1},
        # Unoptimized XLA code (the same HLO) compiles about twice as fast on CPU.
        "runtime": {"compile_cache": {"dir": str(tmp / "cache")}, "compiler_options": dict(FAST)},
    }


@pytest.mark.parametrize(("kind", "vocab"), [("gpt2", 96), ("qwen2", 96)])
def test_a_checkpoint_decomposes_end_to_end(tmp_path, kind, vocab) -> None:
    raw = _run_config(tmp_path, {"type": kind, "checkpoint": str(FIXTURES / kind)}, vocab=vocab)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
        "JAX_PLATFORMS": "cpu",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pd_train.cli", "run", str(config), "--run-dir", str(run_dir)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("phase") == "train"]
    assert [r["step"] for r in train] == [0, 1, 2, 3]
    for r in train:
        assert np.isfinite(r["loss/total"]), r
    sites = {k.split("/")[-1] for r in train for k in r if "layers." in k}
    assert any("self_attn.q_proj" in s for s in sites) and any(
        "mlp.down_proj" in s for s in sites
    ), sites
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["target"]["type"] == kind


@pytest.mark.parametrize("kind", ["gpt2", "qwen2", "qwen3"])
def test_the_built_in_family_configs_validate(kind) -> None:
    from pd_train.run import prepare

    path = Path(__file__).resolve().parents[2] / "configs" / f"{kind}-tiny.yaml"
    prepared = prepare(path, for_run=True)
    assert prepared.config.target.type == kind
    assert kind_of(prepared.model).name == kind


def test_presets_per_family_and_unknown_presets_named() -> None:
    q3 = target_architecture(Qwen3TargetConfig(architecture="qwen3_8b"))
    assert kind_of(q3).name == "qwen3" and q3.resolved_head_dim == 128
    assert as_target(q3).site_shapes()["k_proj"] == (4096, 8 * 128)
    q2 = target_architecture(Qwen2TargetConfig(architecture="qwen2_5_7b"))
    assert kind_of(q2).name == "qwen2" and q2.num_hidden_layers == 28
    g = target_architecture(GPT2TargetConfig(architecture="gpt2"))
    assert as_target(g).site_shapes()["up_proj"] == (768, 3072)
    with pytest.raises(
        ConfigError, match=r"target\.architecture: got 'llama3_8b'; presets are \['gpt2'\]"
    ):
        target_architecture(GPT2TargetConfig(architecture="llama3_8b"))
