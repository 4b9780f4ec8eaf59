"""``runtime.remat.recon_layers``: each masked-forward layer recomputed in the backward (the
default run's setting, docs/findings.md section 10). Same step, fewer stored activations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.config.pd import (
    RematConfig,
    RuntimeConfig,
)
from pd_train.config.run import load_config
from pd_train.configs import builtin_config
from pd_train.models import llama
from pd_train.train import Trainer, step_key

from ._speed import PD, B, T
from ._tiny import FAST, TINY


def _step(recon_layers: bool) -> tuple[Trainer, object, dict]:
    runtime = RuntimeConfig(remat=RematConfig(recon_layers=recon_layers))
    trainer = Trainer(TINY, PD, runtime, compiler_options=FAST, seq_len=T)
    target = llama.init_params(TINY, key=jax.random.key(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (B, T)), jnp.int32)
    state = trainer.init_state(key=jax.random.key(1))
    jaxpr = jax.make_jaxpr(trainer._step)(state, target, tokens, step_key(jax.random.key(2), 0))
    state, metrics = trainer.train_step(state, target, tokens, step_key(jax.random.key(2), 0))
    return trainer, jaxpr, {"state": state, "metrics": metrics}


def test_layer_remat_keeps_the_step_and_checkpoints_only_the_layers() -> None:
    """One step with and without ``recon_layers``: every loss term, L0, the grad norms, the new
    params and the persistent-PGD sources agree to float noise; the remat'd step holds
    checkpointed layer bodies (one per masked-forward layer scan), the plain one none."""
    _, plain_jaxpr, plain = _step(False)
    _, remat_jaxpr, remat = _step(True)
    assert "checkpoint" not in str(plain_jaxpr) and "remat" not in str(plain_jaxpr)
    text = str(remat_jaxpr)
    assert text.count("checkpoint") + text.count("remat") >= 3  # route-all, chunks, PPGD
    for name, value in plain["metrics"].items():
        np.testing.assert_allclose(
            jax.tree.leaves(remat["metrics"][name]),
            jax.tree.leaves(value),
            rtol=2e-5,
            atol=1e-7,
            err_msg=name,
        )
    for a, b in zip(jax.tree.leaves(remat["state"]), jax.tree.leaves(plain["state"]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_the_default_run_recomputes_layers_and_ci_and_other_configs_do_not() -> None:
    """The shipped default opts in (CPU: overhead-bound); the field defaults to off, so the
    production configs keep their own remat settings."""
    config, _ = load_config(str(builtin_config("default")))
    assert config.runtime.remat.recon_layers and config.runtime.remat.ci_fn
    assert not config.runtime.remat.recon  # no chunk-level recompute
    assert RematConfig().recon_layers is False
    assert RuntimeConfig().remat.recon_layers is False


def test_a_one_chunk_plan_is_traced_specialized_with_the_scanned_values() -> None:
    """A route-all plan with one draw (stochastic recon, persistent PGD) is traced with static
    liveness: no per-layer switch in its program, and the loss and gradients of the scanned
    path (``masked_forward`` with liveness as data: copy / frozen / live switch per layer)."""
    from pd_train._forward import CleanRunner, masked_forward
    from pd_train.losses.recon import all_sites_plan, output_divergence, recon_loss, site_grid

    from ._recon import DEC, SPEC, _data

    target, comps, ci, tokens = _data()
    key = jax.random.key(3)

    def clean() -> tuple[jax.Array, jax.Array]:
        runner = CleanRunner(SPEC, target, tokens)
        logits, _ = runner.run(lambda kind, x, xs: None, {})
        return logits, runner.stream  # type: ignore[return-value]

    def specialized(comps: dict, ci: dict) -> jax.Array:
        logits, stream = clean()
        return recon_loss(
            SPEC,
            all_sites_plan(DEC),
            n_samples=1,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            clean_logits=logits,
            clean_stream=stream,
            key=key,
        )

    def scanned(comps: dict, ci: dict) -> jax.Array:
        logits, stream = clean()
        draw_key = jax.random.fold_in(jax.random.fold_in(key, 0), 0)
        masked = masked_forward(
            SPEC,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            live=jnp.asarray(site_grid(DEC) >= 0),  # traced liveness: the switch per layer
            routed=None,
            key=jax.random.fold_in(draw_key, 0),
            clean_stream=stream,
        )
        return output_divergence(SPEC, logits, masked)

    assert "cond[" not in str(jax.make_jaxpr(specialized)(comps, ci))
    assert "cond[" in str(jax.make_jaxpr(scanned)(comps, ci))
    grad = jax.value_and_grad
    (v1, g1), (v2, g2) = grad(specialized, (0, 1))(comps, ci), grad(scanned, (0, 1))(comps, ci)
    assert float(v1) > 0
    np.testing.assert_allclose(float(v1), float(v2), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_a_rematerialized_layer_draws_its_sources_once_with_the_same_gradients() -> None:
    """With ``remat_layers`` and static liveness the layer's backward recomputes the layer but
    keeps its drawn sources (``_forward.SOURCE_NAME``): the gradient program draws each live
    site's source once (the plain checkpoint drew it again in the backward). With scanned
    liveness (the chunk loop's switch) the plain checkpoint stays: saved there, the sources
    become a stacked residual per chunk (memory). Loss and gradients equal those without
    remat either way."""
    import attrs

    from pd_train._forward import masked_forward
    from pd_train.losses.recon import site_grid

    from ._recon import DEC, SPEC, _data

    target, comps, ci, tokens = _data()
    for live in (site_grid(DEC) >= 0, jnp.asarray(site_grid(DEC) >= 0)):

        def loss(comps: dict, ci: dict, spec: object, live: object = live) -> jax.Array:
            logits = masked_forward(
                spec,  # type: ignore[arg-type]
                target=target,
                tokens=tokens,
                components=comps,
                ci_lower=ci,
                live=live,  # type: ignore[arg-type]
                routed=None,
                key=jax.random.key(5),
            )
            return jnp.mean(jnp.square(logits))

        remat = attrs.evolve(SPEC, remat_layers=True)
        grad = jax.value_and_grad(loss, (0, 1))
        draws = [
            str(jax.make_jaxpr(grad, static_argnums=2)(comps, ci, spec)).count("name=_uniform")
            for spec in (remat, SPEC)
        ]
        if isinstance(live, np.ndarray):
            assert draws[0] == draws[1] > 0  # a plain jax.checkpoint: 12 vs 8 here
        else:
            assert draws[0] > draws[1] > 0
        (v1, g1), (v2, g2) = grad(comps, ci, remat), grad(comps, ci, SPEC)
        np.testing.assert_allclose(float(v1), float(v2), rtol=1e-6)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
