"""The train step passes its CI pre-activations as ``ci_lower`` under
``lower_leaky_hard_deferred`` and every use clips (``sources.masks``, the L0): same values and
gradients as the materialized ``lower_leaky_hard(pre)``, without a clipped all-site copy of the
CI next to the pre-activations (one CI-sized buffer per device less at the production
topology, docs/findings.md section 8)."""

from __future__ import annotations

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

import pd_train.train.trainer
from pd_train.config.pd import (
    ChunkwiseSubsetRecon,
    ChunkwiseTransformerCI,
    DecompositionTarget,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    PersistentPGDRecon,
    PGDOptimizer,
    RematConfig,
    RuntimeConfig,
)
from pd_train.models import llama
from pd_train.sources import masks
from pd_train.squash import lower_leaky_hard, lower_leaky_hard_deferred, unit_clip
from pd_train.train import Trainer

from ._tiny import FAST, TINY

# Exact 0 and 1, both sides of them, far outside [0, 1].
X = jnp.asarray([-3.0, -1e-7, 0.0, 1e-7, 0.25, 0.5, 1.0 - 1e-7, 1.0, 1.0 + 1e-7, 2.5])


def test_deferred_lower_then_clip_at_each_use_equals_lower_leaky_hard() -> None:
    """Three uses whose gradients differ in sign per element: the leak rule must see their
    sum (a per-use squash would leak where one use's gradient is negative)."""
    w = jnp.asarray(np.random.default_rng(0).standard_normal((3, X.size)), jnp.float32)

    def three_uses(ci: jax.Array, clip: bool) -> jax.Array:
        f = unit_clip if clip else (lambda c: c)
        return sum(jnp.sum(w[i] * f(ci) ** (i + 1)) for i in range(3))  # type: ignore[return-value]

    want, want_grad = jax.value_and_grad(lambda x: three_uses(lower_leaky_hard(x), False))(X)
    got, got_grad = jax.value_and_grad(lambda x: three_uses(lower_leaky_hard_deferred(x), True))(X)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(got_grad), np.asarray(want_grad))
    leaked = (X <= 0) & (want_grad != 0)
    assert bool(jnp.any(leaked)), "the case must exercise the leak"


def test_masks_of_an_already_clipped_ci_are_unchanged() -> None:
    """Callers that pass a clipped ci_lower (evaluation, analysis) see the old formula, values
    and gradients: the straight-through clip is not jnp.clip's 0.5 gradient at the edges."""
    ci = jnp.clip(X, 0.0, 1.0)
    source = jnp.linspace(0.0, 1.0, X.size + 1)

    def old(ci: jax.Array) -> jax.Array:
        m = ci + (1 - ci) * source[:-1]
        return jnp.sum(m * jnp.arange(1.0, X.size + 1))

    def new(ci: jax.Array) -> jax.Array:
        return jnp.sum(masks(ci, source)[0] * jnp.arange(1.0, X.size + 1))

    np.testing.assert_array_equal(np.asarray(new(ci)), np.asarray(old(ci)))
    np.testing.assert_array_equal(np.asarray(jax.grad(new)(ci)), np.asarray(jax.grad(old)(ci)))


B, T = 4, 8


@functools.cache
def _loss_and_grads(materialized: bool) -> tuple:
    """The production terms on a tiny Llama (every site, C 64: the CI buffers dominate):
    total, terms, gradients w.r.t. params and the PPGD offset, and the compiled temp bytes.
    ``materialized``: the step squashes with ``lower_leaky_hard`` (the clipped copy)."""
    pd = PDConfig(
        steps=10,
        batch_size=B,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*", C=64),),
        ci=ChunkwiseTransformerCI(
            blocks_per_chunk=1, d_model=16, n_blocks=1, n_heads=2, mlp_hidden=32
        ),
        loss_metrics=(
            ImportanceMinimality(coeff=1e-2, pnorm_start=2.0, pnorm_end=0.4, eps=1e-6),
            ChunkwiseSubsetRecon(coeff=2.0, sites_per_chunk=7),
            PersistentPGDRecon(
                coeff=0.5, scope="bsc", n_warmup_steps=2, optimizer=PGDOptimizer(lr=0.01)
            ),
        ),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
        l0_threshold=0.1,
    )
    runtime = RuntimeConfig(remat=RematConfig(recon=True, ci_fn=True))
    trainer = Trainer(TINY, pd, runtime, compiler_options=FAST, seq_len=T)
    state = trainer.init_state(key=jax.random.key(1))
    rng = np.random.default_rng(0)
    # Pre-activations on both sides of 0 and 1 (the init's zero output biases put them near 0).
    params = dict(state.params)
    params["ci_fn"] = {
        **params["ci_fn"],
        "out_b": {
            k: jnp.asarray(rng.uniform(-0.5, 1.5, v.shape), jnp.float32)
            for k, v in params["ci_fn"]["out_b"].items()
        },
    }
    target = llama.init_params(TINY, key=jax.random.key(0))
    tokens = jnp.asarray(rng.integers(0, TINY.vocab_size, (B, T)), jnp.int32)
    offset = jax.tree.map(jnp.zeros_like, state.adversary["sources"])

    def f(params, adversary, offset):
        return jax.value_and_grad(trainer.loss, argnums=(0, 6), has_aux=True)(
            params, target, tokens, jnp.int32(3), jax.random.key(2), adversary, offset
        )

    squash = lower_leaky_hard if materialized else lower_leaky_hard_deferred
    with mock.patch.object(pd_train.train.trainer, "lower_leaky_hard_deferred", squash):
        compiled = jax.jit(f, compiler_options=FAST).lower(params, state.adversary, offset)
        compiled = compiled.compile()
    (total, aux), grads = compiled(params, state.adversary, offset)
    temp = compiled.memory_analysis().temp_size_in_bytes
    return jax.device_get((total, aux, grads)), temp


def test_the_step_s_loss_and_gradients_equal_the_materialized_clip() -> None:
    """Loss terms, L0, the warmed sources and every gradient (components, CI fn, sources):
    equal to the step that materializes ``lower_leaky_hard(pre)``."""
    want, _ = _loss_and_grads(True)
    got, _ = _loss_and_grads(False)
    flat_want, tree_want = jax.tree.flatten(want)
    flat_got, tree_got = jax.tree.flatten(got)
    assert tree_got == tree_want
    for a, b in zip(flat_got, flat_want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ci_grad = want[2][0]["ci_fn"]["out_b"]
    assert any(float(np.abs(g).max()) > 0 for g in ci_grad.values())


def test_the_step_does_not_materialize_a_clipped_copy_of_the_ci() -> None:
    """Compiled temporaries of the tiny step's loss + backward: less than with the clipped
    copy (where the all-site CI buffers dominate, as at the production topology)."""
    _, temp_materialized = _loss_and_grads(True)
    _, temp = _loss_and_grads(False)
    assert temp < temp_materialized, (temp, temp_materialized)
