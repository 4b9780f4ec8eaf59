"""Embedding and unembedding sites (``embed_tokens``, ``lm_head``) on every LM target: selected
by module pattern, carried by the generic forwards as the one member of their own kind, exact at
all-ones masks, trained through the Trainer, and the CI types that cannot serve them refused by
field path."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train._forward import CleanRunner, ForwardSpec, masked_forward
from pd_train.config.io import ConfigError
from pd_train.config.pd import (
    MLPCI,
    DecompositionTarget,
    Faithfulness,
    GlobalTransformerCI,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    SharedMLPCI,
    StochasticRecon,
    VectorMLPCI,
)
from pd_train.decomposition import build_decomposition, site_weights
from pd_train.models import gpt2, llama
from pd_train.models.gpt2 import GPT2Config
from pd_train.models.llama_config import LlamaConfig
from pd_train.targets import as_target

LLAMA = LlamaConfig(
    vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1,
)  # fmt: skip
LLAMA_TIED = LlamaConfig(
    vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
)  # fmt: skip
GPT2 = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=2, n_head=2, n_inner=32)
MODELS = {"llama": LLAMA, "llama_tied": LLAMA_TIED, "gpt2": GPT2}
FORWARD = {"llama": llama.forward, "llama_tied": llama.forward, "gpt2": gpt2.forward}
B, T = 4, 8
C = 40  # >= vocab and d: V@U = W exactly with V = W padded, U = [I; 0]
ALL = (
    DecompositionTarget(module_pattern="embed_tokens", C=C),
    DecompositionTarget(module_pattern="layers.*", C=C),
    DecompositionTarget(module_pattern="lm_head", C=C),
)


def _tokens(vocab: int = 32) -> jax.Array:
    return jnp.asarray(np.random.default_rng(0).integers(0, vocab, (B, T)), jnp.int32)


def test_global_sites_are_named_by_kind_and_ordered_first_and_last() -> None:
    d = build_decomposition(LLAMA, ALL)
    names = [s.name for s in d.sites]
    assert names[0] == "embed_tokens" and names[-1] == "lm_head"
    assert names[1:-1] == [s.name for s in build_decomposition(LLAMA, ALL[1:2]).sites]
    assert d.kind("embed_tokens").layers == (0,)
    assert (d.kind("embed_tokens").d_in, d.kind("embed_tokens").d_out) == (32, 16)
    assert (d.kind("lm_head").d_in, d.kind("lm_head").d_out) == (16, 32)
    # outside the layer stack: the segments are those of the layer sites alone
    assert d.segments == build_decomposition(LLAMA, ALL[1:2]).segments
    g = build_decomposition(GPT2, [DecompositionTarget(module_pattern="lm_head", C=4)])
    assert [s.name for s in g.sites] == ["lm_head"] and g.segments[0].kinds == ()


def test_a_pattern_matching_nothing_lists_the_global_sites() -> None:
    with pytest.raises(ConfigError) as err:
        build_decomposition(LLAMA, [DecompositionTarget(module_pattern="wte", C=4)])
    text = str(err.value)
    assert "pd.decomposition_targets[0].module_pattern" in text
    assert "'embed_tokens', 'lm_head'" in text


def _exact_components(d: Any, weights: dict[str, Any]) -> dict[str, Any]:
    """V = W padded to C columns, U = [I; 0]: V@U = W at every site."""
    comps = {}
    for k in d.kinds:
        w = weights[k.kind][jnp.asarray(k.layers)] if k.kind.endswith("proj") else weights[k.kind]
        n = len(k.layers)
        v = jnp.zeros((n, k.d_in, C)).at[:, :, : k.d_out].set(w)
        u = jnp.zeros((C, k.d_out)).at[: k.d_out].set(jnp.eye(k.d_out))
        comps[k.kind] = {"V": v, "U": jnp.broadcast_to(u, (n, C, k.d_out))}
    return comps


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("static", [True, False])
def test_masked_forward_at_all_ones_masks_equals_the_clean_forward(name, static) -> None:
    """Every site live (embedding and head included), ci = 1, source scale 0 (m = 1, δ = 0) and
    V@U = W: the masked logits equal the model's; with sampled sources (δ > 0, m ≥ ci = 1)
    too, since then (x@V)(m − δ)@U + δ x@W = x@W; ci = 0 at the embedding alone changes them."""
    model = MODELS[name]
    target = as_target(model)
    params = target.init_params(key=jax.random.key(0))
    tokens = _tokens()
    d = build_decomposition(model, ALL)
    spec = ForwardSpec(model=model, decomposition=d)
    clean, inputs = CleanRunner(spec, params, tokens).run(
        lambda k, x, xs: x,
        {k: jnp.zeros((len(d.kind(k).layers),)) for k in ("embed_tokens", "lm_head")},
    )
    reference = FORWARD[name](params, tokens, model)
    np.testing.assert_allclose(clean, reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(inputs["embed_tokens"][0], tokens)  # the lookup's input
    comps = _exact_components(d, site_weights(target, params, d))
    ci = {k.kind: jnp.ones((len(k.layers), B, T, C)) for k in d.kinds}
    live = np.ones((target.n_layers, len(d.kinds)), bool)
    live_arg = live if static else jnp.asarray(live)

    def run(ci: Any, scale: float, clean_stream: Any = None) -> jax.Array:
        return masked_forward(
            spec, target=params, tokens=tokens, components=comps, ci_lower=ci, live=live_arg,
            routed=None, key=jax.random.key(2), source_scale=jnp.float32(scale),
            clean_stream=clean_stream,
        )  # fmt: skip

    np.testing.assert_allclose(run(ci, 0.0), reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(run(ci, 1.0), reference, rtol=1e-4, atol=1e-4)
    off = {**ci, "embed_tokens": jnp.zeros_like(ci["embed_tokens"])}
    assert np.abs(np.asarray(run(off, 0.0)) - np.asarray(reference)).max() > 0.1
    off = {**ci, "lm_head": jnp.zeros_like(ci["lm_head"])}
    assert np.abs(np.asarray(run(off, 0.0)) - np.asarray(reference)).max() > 0.1


@pytest.mark.parametrize("kind", ["embed_tokens", "lm_head"])
def test_a_global_site_alone_starts_from_the_clean_stream(kind) -> None:
    """Only one global site live, with the clean stream: the embedding recomputes every layer
    from its masked rows, the head reads the clean last layer; both give the exact logits at
    ci = 1 and differ from it at ci = 0."""
    d = build_decomposition(LLAMA, ALL)
    target = as_target(LLAMA)
    params = target.init_params(key=jax.random.key(0))
    tokens = _tokens()
    spec = ForwardSpec(model=LLAMA, decomposition=d)
    runner = CleanRunner(spec, params, tokens)
    clean, _ = runner.run(lambda k, x, xs: x, {})
    comps = _exact_components(d, site_weights(target, params, d))
    live = np.zeros((2, len(d.kinds)), bool)
    row = next(site.layer for site in d.sites if site.kind == kind)
    assert row == (0 if kind == "embed_tokens" else 1)  # the embedding's row, the last layer's
    live[row, d.kind_names.index(kind)] = True
    for static in (True, False):
        for value, equal in ((1.0, True), (0.0, False)):
            ci = {k.kind: jnp.full((len(k.layers), B, T, C), value) for k in d.kinds}
            out = masked_forward(
                spec, target=params, tokens=tokens, components=comps, ci_lower=ci,
                live=live if static else jnp.asarray(live), routed=None, key=jax.random.key(2),
                source_scale=jnp.float32(0.0), clean_stream=runner.stream,
            )  # fmt: skip
            gap = float(np.abs(np.asarray(out) - np.asarray(clean)).max())
            assert (gap < 1e-4) == equal, (static, value, gap)


def test_tied_lm_head_decomposes_the_transposed_table() -> None:
    """With tied embeddings the frozen head is the table transposed (one frozen array read by
    both sites); each site has its own components."""
    target = as_target(LLAMA_TIED)
    params = target.init_params(key=jax.random.key(0))
    assert "lm_head" not in params
    d = build_decomposition(LLAMA_TIED, ALL)
    weights = site_weights(target, params, d)
    np.testing.assert_array_equal(weights["lm_head"][0], params["embed_tokens"].T)
    np.testing.assert_array_equal(weights["embed_tokens"][0], params["embed_tokens"])


def _pd(ci: Any, targets: Any = ALL[::2], **kw: Any) -> PDConfig:
    base: dict[str, Any] = dict(
        steps=20,
        batch_size=B,
        decomposition_targets=tuple(targets),
        ci=ci,
        loss_metrics=(
            Faithfulness(coeff=1e3),
            ImportanceMinimality(coeff=1e-3, pnorm_start=2.0, pnorm_end=1.0, eps=1e-6),
            StochasticRecon(coeff=1.0),
        ),
        components=OptimizerConfig(lr=3e-3),
        ci_fn=OptimizerConfig(lr=3e-3),
    )
    base.update(kw)
    return PDConfig(**base)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_embedding_and_unembedding_sites_train(name) -> None:
    """A few Trainer steps with embed_tokens and lm_head (and one layer site) decomposed: the
    losses are finite, faithfulness falls, gradients reach both global sites' components."""
    from pd_train.train import Trainer, step_key

    model = MODELS[name]
    targets = (*ALL[::2], DecompositionTarget(module_pattern="layers.1.mlp.down_proj", C=8))
    pd = _pd(MLPCI(hidden_dims=(4,)), targets)
    trainer = Trainer(model, pd, compiler_options={"xla_backend_optimization_level": 0})
    params = as_target(model).init_params(key=jax.random.key(0))
    state = trainer.init_state(key=jax.random.key(1))
    before = jax.tree_util.tree_map(np.asarray, state.params["components"])
    history = []
    for i in range(8):
        state, metrics = trainer.train_step(
            state, params, _tokens(), step_key(jax.random.key(2), i)
        )
        history.append(trainer.metrics_to_host(metrics))
    assert all(np.isfinite(m["loss/total"]) for m in history if "loss/total" in m)
    assert history[-1]["loss/faithfulness"] < history[0]["loss/faithfulness"]
    after = state.params["components"]
    for kind in ("embed_tokens", "lm_head", "down_proj"):
        for part in ("V", "U"):
            assert np.abs(np.asarray(after[kind][part]) - before[kind][part]).max() > 0


@pytest.mark.parametrize(
    ("ci", "targets", "why"),
    [
        (VectorMLPCI(hidden_dims=(4,)), ALL[:1], "embed_tokens is a lookup"),
        (SharedMLPCI(hidden_dims=(4,)), ALL[:1], "embed_tokens is a lookup"),
        (GlobalTransformerCI(d_model=8, n_blocks=1, n_heads=2, mlp_hidden=8), ALL, "outside the layer stack"),
    ],
)  # fmt: skip
def test_ci_types_that_cannot_serve_a_global_site_are_refused_by_field_path(
    ci, targets, why
) -> None:
    from pd_train.train import Trainer

    with pytest.raises(ConfigError) as err:
        Trainer(LLAMA, _pd(ci, targets))
    assert "pd.ci.type" in str(err.value) and why in str(err.value)


def test_shared_mlp_serves_the_lm_head() -> None:
    """The head's input is a vector (the final normed stream): the x-reading CI types serve it."""
    from pd_train.train import Trainer

    Trainer(LLAMA, _pd(SharedMLPCI(hidden_dims=(4,)), ALL[2:]))
