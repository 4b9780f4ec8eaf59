"""The Flax module over pd-train's Llama: same parameter tree as ``llama.init_params``, the same
logits as ``llama.forward`` bit for bit, Hugging Face's logits on the reference fixtures, and its
params are a target the Trainer takes."""

from __future__ import annotations

import functools
from pathlib import Path

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.errors import ScopeParamNotFoundError, ScopeParamShapeError

from pd_train.config.pd import (
    DecompositionTarget,
    Faithfulness,
    OptimizerConfig,
    PDConfig,
    StochasticRecon,
)
from pd_train.models import LlamaForCausalLM, llama
from pd_train.models.hf import load_llama_checkpoint
from pd_train.models.llama_config import LlamaConfig, RopeScaling
from pd_train.train import Trainer

from ._recon import MODEL as TINY_MODEL  # the tiny two-layer Llama the step tests use
from ._tiny import FAST

FIXTURES = Path(__file__).parent / "fixtures"
HF_ATOL = 1e-4  # as test_hf_reference.py
# Less LLVM optimization for the init and trainer jits: Flax draws each parameter with its own RNG
# op, and those compile slowly on CPU at the default level.

CASES = {
    "gqa_untied_scaled": LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,  # heads * head_dim != hidden_size
        rope_theta=10_000.0,
        rope_scaling=RopeScaling(
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
        tie_word_embeddings=False,
    ),
    "mha_tied": LlamaConfig(
        vocab_size=53,
        hidden_size=32,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}


def _tokens(config: LlamaConfig, shape: tuple[int, int] = (2, 12)) -> jax.Array:
    return jnp.asarray(np.random.default_rng(1).integers(0, config.vocab_size, shape), jnp.int32)


@functools.cache
def _params(config: LlamaConfig) -> dict:
    """``llama.init_params`` with norm weights away from 1, so a dropped or misplaced norm scale
    would change the logits. Cached: treat as read-only."""
    params = llama.init_params(config, key=jax.random.key(0))
    rng = np.random.default_rng(0)
    for tree, name in [
        (params["layers"], "input_layernorm"),
        (params["layers"], "post_attention_layernorm"),
        (params, "norm"),
    ]:
        tree[name] = jnp.asarray(1 + 0.1 * rng.standard_normal(tree[name].shape), jnp.float32)
    return params


def _init(model: LlamaForCausalLM, key: jax.Array) -> dict:
    """``model.init`` without a forward, jitted."""
    init = jax.jit(lambda k: model.init(k, method="param_tree"), compiler_options=FAST)
    return init(key)["params"]  # type: ignore[no-any-return]


def _shapes(tree: object) -> object:
    return jax.tree_util.tree_map(lambda a: (a.shape, jnp.dtype(a.dtype)), tree)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_init_gives_the_tree_of_init_params(name: str, dtype: object) -> None:
    """Structure, shapes and dtypes, abstractly (nothing compiles or allocates)."""
    config = CASES[name]
    model = LlamaForCausalLM(config, param_dtype=dtype)
    want = jax.eval_shape(
        lambda k: llama.init_params(config, key=k, dtype=dtype), jax.random.key(0)
    )
    through_forward = jax.eval_shape(model.init, jax.random.key(1), _tokens(config))
    without_forward = jax.eval_shape(
        lambda k: model.init(k, method="param_tree"), jax.random.key(1)
    )
    assert set(through_forward) == set(without_forward) == {"params"}
    for got in (through_forward["params"], without_forward["params"]):
        assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
        assert _shapes(got) == _shapes(want)
    assert ("lm_head" in want) != config.tie_word_embeddings


def test_init_with_or_without_a_forward_draws_the_same_values() -> None:
    config = CASES["gqa_untied_scaled"]
    model = LlamaForCausalLM(config)
    key = jax.random.key(1)
    through_forward = jax.jit(model.init, compiler_options=FAST)(key, _tokens(config))["params"]
    without_forward = _init(model, key)
    assert jax.tree_util.tree_all(
        jax.tree_util.tree_map(np.array_equal, through_forward, without_forward)
    )


def test_init_draws_the_distributions_of_init_params() -> None:
    """Weights N(0, 1/d_in), embeddings N(0, 1), norms 1. d_in differs from d_out for every kind
    here, so N(0, 1/d_out) or N(0, 1) would miss the tolerance by far."""
    config = CASES["gqa_untied_scaled"]
    params = _init(LlamaForCausalLM(config), jax.random.key(3))
    stds = {"embed_tokens": 1.0, "lm_head": config.hidden_size**-0.5}
    stds |= {f"layers.{k}": d_in**-0.5 for k, (d_in, _) in config.site_shapes().items()}
    for path, std in stds.items():
        a = params
        for part in path.split("."):
            a = a[part]
        a = np.asarray(a, np.float64)
        assert abs(a.mean()) < 0.05 * std, path
        assert abs(a.std() / std - 1) < 0.05, (path, a.std(), std)
    assert not np.array_equal(params["layers"]["q_proj"][0], params["layers"]["q_proj"][1])
    for a in (
        params["norm"],
        *(params["layers"][n] for n in ("input_layernorm", "post_attention_layernorm")),
    ):
        np.testing.assert_array_equal(np.asarray(a), 1.0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_apply_is_llama_forward_bit_for_bit(name: str) -> None:
    config = CASES[name]
    params, tokens = _params(config), _tokens(config)
    apply = jax.jit(LlamaForCausalLM(config).apply)
    got = apply({"params": params}, tokens)
    assert got.shape == (*tokens.shape, config.vocab_size) and got.dtype == jnp.float32
    want = jax.jit(llama.forward, static_argnums=2)(params, tokens, config)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # The comparison can fail: other weights give other logits.
    other = jax.tree_util.tree_map(lambda a: a * 1.01, params)
    assert not np.array_equal(np.asarray(apply({"params": other}, tokens)), np.asarray(got))


def test_compute_dtype_casts_the_params_first() -> None:
    config = CASES["mha_tied"]
    params, tokens = _params(config), _tokens(config)
    got = jax.jit(LlamaForCausalLM(config, dtype=jnp.bfloat16).apply)({"params": params}, tokens)
    bf16 = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), params)
    want = jax.jit(llama.forward, static_argnums=2)(bf16, tokens, config)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_linear_hook_replaces_the_layer_matmuls() -> None:
    config = CASES["gqa_untied_scaled"]
    params, tokens = _params(config), _tokens(config)
    seen: list[str] = []

    def plain(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
        seen.append(kind)
        return x @ w.astype(x.dtype)

    hooked = jax.jit(LlamaForCausalLM(config, linear=plain).apply)({"params": params}, tokens)
    want = jax.jit(llama.forward, static_argnums=2)(params, tokens, config)
    np.testing.assert_array_equal(np.asarray(hooked), np.asarray(want))
    assert seen == list(llama.KINDS)  # traced once: the layers run under one scan

    def no_mlp_out(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
        y = x @ w.astype(x.dtype)
        return jnp.zeros_like(y) if kind == "down_proj" else y

    got = jax.jit(LlamaForCausalLM(config, linear=no_mlp_out).apply)({"params": params}, tokens)
    zeroed = {**params, "layers": {**params["layers"]}}
    zeroed["layers"]["down_proj"] = jnp.zeros_like(params["layers"]["down_proj"])
    want_zeroed = jax.jit(llama.forward, static_argnums=2)(zeroed, tokens, config)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want_zeroed))
    assert not np.allclose(np.asarray(got), np.asarray(want))


def test_params_that_do_not_fit_the_config_are_named() -> None:
    """Flax checks every parameter against its declaration, which ``llama.forward`` does not."""
    config = CASES["gqa_untied_scaled"]
    tokens = _tokens(config)
    tied = attrs.evolve(config, tie_word_embeddings=True)
    params = jax.eval_shape(lambda k: llama.init_params(tied, key=k), jax.random.key(0))
    with pytest.raises(ScopeParamNotFoundError, match='"lm_head"'):
        jax.eval_shape(LlamaForCausalLM(config).apply, {"params": params}, tokens)
    params = jax.eval_shape(lambda k: llama.init_params(config, key=k), jax.random.key(0))
    wider = attrs.evolve(config, intermediate_size=128)
    with pytest.raises(ScopeParamShapeError, match=r'"gate_proj".*\(3, 64, 128\).*\(3, 64, 96\)'):
        jax.eval_shape(LlamaForCausalLM(wider).apply, {"params": params}, tokens)


@pytest.mark.parametrize("name", ["llama3_gqa", "tied"])
def test_logits_match_transformers_through_the_module(name: str) -> None:
    """The fixtures of test_hf_reference.py (written by scripts/make_hf_reference.py)."""
    config, params = load_llama_checkpoint(FIXTURES / name)
    ref = np.load(FIXTURES / name / "reference.npz")
    got = np.asarray(jax.jit(LlamaForCausalLM(config).apply)({"params": params}, ref["input_ids"]))
    assert got.shape == ref["logits"].shape
    for key in ("logits", "logits_fp64"):
        err = np.abs(got - ref[key]).max()
        assert err < HF_ATOL, f"{name}: max |flax - transformers {key}| = {err:.3e}"


@pytest.mark.slow  # compiles pd-init's stacked init and the loss: ~8 CPU seconds
def test_init_params_are_a_trainer_target() -> None:
    config = TINY_MODEL
    pd = PDConfig(
        steps=10,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*.mlp.*", C=4),),
        loss_metrics=(Faithfulness(coeff=1.0), StochasticRecon(coeff=1.0)),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
    )
    trainer = Trainer(config, pd, compiler_options=FAST)
    target = _init(LlamaForCausalLM(config), jax.random.key(0))
    assert _shapes(target) == _shapes(trainer.abstract_target(jnp.float32))
    params = trainer.init_params(key=jax.random.key(1))
    loss = jax.jit(trainer.loss, compiler_options=FAST)
    total, aux = loss(params, target, _tokens(config, (4, 8)), jnp.int32(0), jax.random.key(2))
    # Faithfulness read the target's weights: Σ‖W − V@U‖² / Σ numel over the MLP sites.
    comps, layers = params["components"], target["layers"]
    sq = sum(
        float(np.sum((np.asarray(layers[k]) - np.asarray(comps[k]["V"] @ comps[k]["U"])) ** 2))
        for k in ("gate_proj", "up_proj", "down_proj")
    )
    numel = sum(layers[k].size for k in ("gate_proj", "up_proj", "down_proj"))
    np.testing.assert_allclose(float(aux["terms"]["faithfulness"]), sq / numel, rtol=1e-5)
    # Stochastic recon ran the target's forward: a KL between real logits, finite and positive.
    recon = float(aux["terms"]["stochastic_recon"])
    assert np.isfinite(recon) and recon > 0
    assert np.isfinite(float(total))
