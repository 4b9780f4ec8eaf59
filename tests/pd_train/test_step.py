"""The train step: determinism, 4 devices vs 1, the AOT path, warmup, init keys, and a tiny Llama
that really decomposes."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pd_sharding
from pd_train.config.pd import (
    ChunkwiseSubsetRecon,
    DecompositionTarget,
    Faithfulness,
    SharedMLPCI,
)
from pd_train.models.llama_config import LlamaConfig
from pd_train.train import Trainer, step_key

from ._tiny import FAST, TINY, B, T, _pd, _run, _target, _tokens, _trainer


@functools.cache
def _one_device_metrics() -> tuple:
    return tuple(_run(_trainer(), 3, target=_target(), tokens=_tokens()))


def test_metrics_names() -> None:
    metrics = _one_device_metrics()[0]
    terms = ["faithfulness", "importance_minimality", "stochastic_recon", "chunkwise_subset_recon"]
    expected = {f"loss/{t}" for t in terms} | {"loss/total", "pnorm", "coeff_multiplier"}
    expected |= {f"{m}/{g}" for m in ("grad_norm", "lr") for g in ("components", "ci_fn")}
    sites = {
        f"l0/layers.{i}.{m}.{k}"
        for i in range(2)
        for m, k in [
            ("self_attn", "q_proj"),
            ("self_attn", "k_proj"),
            ("self_attn", "v_proj"),
            ("self_attn", "o_proj"),
            ("mlp", "gate_proj"),
            ("mlp", "up_proj"),
            ("mlp", "down_proj"),
        ]
    }
    assert set(metrics) == expected | sites
    coeffs = [1e4, 1e-3, 1.0, 1.0]
    total = sum(c * metrics[f"loss/{t}"] for c, t in zip(coeffs, terms, strict=True))
    assert metrics["loss/total"] == pytest.approx(total, rel=1e-5)
    assert metrics["coeff_multiplier"] == 1.0  # no schedule
    assert metrics["lr/components"] == pytest.approx(3e-3 / 10)  # warmup step 1 of 10
    assert metrics["lr/ci_fn"] == pytest.approx(3e-3 / 10)
    assert all(0 <= metrics[s] <= 16 for s in sites)


@pytest.mark.slow
def test_same_seed_gives_bit_identical_metrics_for_three_steps() -> None:
    first = _one_device_metrics()
    again = _run(_trainer(), 3, target=_target(), tokens=_tokens())
    assert list(first) == again
    assert first[0] != first[1]  # the step did change something


@pytest.mark.slow
def test_four_devices_match_one_device_through_the_aot_path() -> None:
    mesh = pd_sharding.make_mesh(data=4, devices=jax.devices()[:4])
    trainer = Trainer(TINY, _pd(), mesh=mesh, compiler_options=FAST)
    compiled = trainer.compile_step(batch_size=B, seq_len=T, target_dtype=jnp.float32)
    assert compiled.memory_analysis() is not None
    target = jax.device_put(_target(), trainer.target_shardings(_target()))
    tokens = jax.device_put(_tokens(), trainer.batch_sharding((B, T)))
    state = trainer.init_state(key=jax.random.key(1))
    v = state.params["components"]["down_proj"]["V"]
    assert len(v.sharding.device_set) == 4 and v.sharding.spec[1] == ("replicate", "data")
    got = _run(trainer, 3, target=target, tokens=tokens, step_fn=compiled)
    want = _one_device_metrics()
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w)
        for name in w:
            assert g[name] == pytest.approx(w[name], rel=1e-5, abs=1e-6), name


def test_faithfulness_warmup_reports_each_step_as_it_finishes(tiny_trainer: Trainer) -> None:
    trainer = tiny_trainer
    state = trainer.init_state(key=jax.random.key(1))
    seen: list[tuple[int, float]] = []
    _, losses = trainer.faithfulness_warmup(
        state, _target(), steps=4, on_step=lambda i, v: seen.append((i, v))
    )
    assert seen == list(enumerate(losses))


def test_faithfulness_warmup_reduces_faithfulness(tiny_trainer: Trainer) -> None:
    trainer = tiny_trainer
    state = trainer.init_state(key=jax.random.key(1))
    before = jax.device_get(state.params["ci_fn"])
    state, losses = trainer.faithfulness_warmup(state, _target(), steps=10)
    assert len(losses) == 10 and losses[-1] < 0.7 * losses[0]
    assert all(b < a for a, b in itertools.pairwise(losses))
    # Only the components moved; the CI function and the step counter did not.
    after = jax.device_get(state.params["ci_fn"])
    for a, b in zip(
        jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert int(state.step) == 0


def test_init_keys_come_from_names(tiny_trainer: Trainer) -> None:
    """Decomposing only layer 1's MLP gives exactly layer 1's arrays of the full decomposition."""
    full = tiny_trainer.init_params(key=jax.random.key(1))
    part = Trainer(
        TINY,
        _pd(decomposition_targets=(DecompositionTarget(module_pattern="layers.1.mlp.*", C=16),)),
    ).init_params(key=jax.random.key(1))
    assert set(part["components"]) == {"gate_proj", "up_proj", "down_proj"}
    for kind in part["components"]:
        for name in ("V", "U"):
            np.testing.assert_array_equal(
                np.asarray(part["components"][kind][name][0]),
                np.asarray(full["components"][kind][name][1]),
            )
        for name, value in part["ci_fn"][kind].items():
            np.testing.assert_array_equal(
                np.asarray(value[0]), np.asarray(full["ci_fn"][kind][name][1])
            )
    v = np.asarray(full["components"]["q_proj"]["V"])
    assert v.shape == (2, 16, 16) and 0.15 < v.std() < 0.35  # N(0, 1/d_in): std 0.25


def test_aot_lowering_on_abstract_inputs_allocates_nothing() -> None:
    """Lowering for 8 devices at a width no test could allocate quickly: shapes only."""
    big = LlamaConfig(
        vocab_size=128_256,
        hidden_size=4096,
        intermediate_size=14_336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    )
    mesh = pd_sharding.make_mesh(data=8)
    pd = _pd(
        decomposition_targets=(
            DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=1024),
        ),
        ci=SharedMLPCI(hidden_dims=(64,)),
        loss_metrics=(Faithfulness(coeff=1.0), ChunkwiseSubsetRecon(coeff=1.0, sites_per_chunk=8)),
    )
    trainer = Trainer(big, pd, mesh=mesh)
    state = trainer.abstract_state()
    v = state.params["components"]["down_proj"]["V"]
    assert v.shape == (32, 14_336, 1024) and v.sharding.spec[1] == ("replicate", "data")
    mu = state.opt_state["components"][1][0].mu["down_proj"]["V"]
    assert mu.sharding == v.sharding
    lowered = trainer.lower_step(batch_size=8, seq_len=16)
    assert "stablehlo" in lowered.as_text()[:20000]
    # Every other jit of a run lowers on abstract inputs too (what `pd-train compile` needs).
    key = jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype)
    assert trainer.init_plan().stacked_fn.lower(key=key) is not None
    assert trainer.lower_opt_init() is not None
    assert trainer.lower_warmup() is not None


@pytest.mark.slow
def test_a_tiny_llama_really_decomposes(tiny_trainer: Trainer) -> None:
    trainer = tiny_trainer
    steps = trainer.pd.steps
    target, tokens = _target(), _tokens()
    state = trainer.init_state(key=jax.random.key(1))
    state, warm = trainer.faithfulness_warmup(state, target)
    assert len(warm) == 200 and warm[-1] < 0.01 * warm[0]
    run_key = jax.random.key(2)
    history = []
    for i in range(steps):
        state, metrics = trainer.train_step(state, target, tokens, step_key(run_key, i))
        if i < 5 or i >= steps - 20:
            history.append(trainer.metrics_to_host(metrics))
    start, end = history[:5], history[-20:]
    assert end[-1]["loss/faithfulness"] < 1e-4
    recon_start = np.mean([m["loss/stochastic_recon"] for m in start])
    recon_end = np.mean([m["loss/stochastic_recon"] for m in end])
    assert recon_end < 0.4 * recon_start
    subset_start = np.mean([m["loss/chunkwise_subset_recon"] for m in start])
    subset_end = np.mean([m["loss/chunkwise_subset_recon"] for m in end])
    assert subset_end < 0.6 * subset_start
