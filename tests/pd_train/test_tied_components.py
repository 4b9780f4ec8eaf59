"""A tied TMS (W2 = W1ᵀ) is decomposed with one set of components (U2 = V1ᵀ, V2 = U1ᵀ): tied at
init, after every step and after the faithfulness warmup; linear1 gets the gradient of both uses
(the chain rule through the transpose), linear2's own leaves none. The faithfulness warmup's
weight decay is decoupled AdamW's, as the formula computed here says."""

from __future__ import annotations

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.config.io import ConfigError
from pd_train.config.pd import DecompositionTarget, FaithfulnessWarmup
from pd_train.targets.tied import tie_components
from pd_train.targets.tms import TMSConfig, TMSTarget, sparse_features
from pd_train.targets.toys import toy_config, toy_weights
from pd_train.train import Trainer

TOY = toy_config("tms_5_2_fast")
PD = attrs.evolve(TOY.pd, steps=10, batch_size=32)
TARGET = TMSTarget(config=TOY.target)


def _assert_tied(components: dict) -> None:
    c = jax.device_get(components)
    np.testing.assert_array_equal(c["linear2"]["V"], np.swapaxes(c["linear1"]["U"], 1, 2))
    np.testing.assert_array_equal(c["linear2"]["U"], np.swapaxes(c["linear1"]["V"], 1, 2))


def test_tie_components_transposes_the_source_into_the_tied_kind() -> None:
    v1 = np.arange(5 * 3, dtype=np.float32).reshape(1, 5, 3)  # [n, d_in 5, C 3]
    u1 = -np.arange(3 * 2, dtype=np.float32).reshape(1, 3, 2)  # [n, C 3, d_out 2]
    comps = {
        "linear1": {"V": v1, "U": u1},
        "linear2": {"V": np.zeros((1, 2, 3)), "U": np.zeros((1, 3, 5))},
    }
    out = tie_components(comps, (("linear1", "linear2"),))
    # Component c of linear2 is V2[:, c] ⊗ U2[c] = U1[c] ⊗ V1[:, c]: its matrix is the transpose.
    for c in range(3):
        m1 = np.outer(v1[0][:, c], u1[0][c])
        m2 = np.outer(
            np.asarray(out["linear2"]["V"])[0][:, c], np.asarray(out["linear2"]["U"])[0][c]
        )
        np.testing.assert_array_equal(m2, m1.T)
    assert tie_components(comps, ()) == comps


def test_a_tied_tms_stays_tied_through_init_warmup_and_steps() -> None:
    pd = attrs.evolve(
        PD, faithfulness_warmup=FaithfulnessWarmup(steps=3, lr=1e-2, weight_decay=0.1)
    )
    trainer = Trainer(TARGET, pd)
    assert trainer.ties == (("linear1", "linear2"),)
    state = trainer.init_state(key=jax.random.key(0))
    _assert_tied(state.params["components"])
    target = jax.tree_util.tree_map(jnp.asarray, toy_weights("tms_5_2"))
    before = jax.device_get(state.params["components"])
    state, _ = trainer.faithfulness_warmup(state, target)
    _assert_tied(state.params["components"])
    x = sparse_features(
        key=jax.random.key(1), batch_size=32, n_features=5, feature_probability=0.05
    )
    for i in range(3):
        state, _ = trainer.train_step(state, target, x, jax.random.key(i))
        _assert_tied(state.params["components"])
    after = jax.device_get(state.params["components"])
    assert np.abs(after["linear1"]["V"] - before["linear1"]["V"]).max() > 1e-3


def test_linear1_gets_the_gradient_of_both_uses() -> None:
    trainer = Trainer(TARGET, PD)
    untied = Trainer(TMSTarget(config=attrs.evolve(TOY.target, tied_weights=False)), PD)
    assert untied.ties == ()
    state = trainer.init_state(key=jax.random.key(0))
    target = jax.tree_util.tree_map(jnp.asarray, toy_weights("tms_5_2"))
    x = sparse_features(key=jax.random.key(1), batch_size=32, n_features=5, feature_probability=0.2)
    args = (target, x, state.step, jax.random.key(2))
    g_tied = jax.grad(lambda p: trainer.loss(p, *args)[0])(state.params)["components"]
    g_free = jax.grad(lambda p: untied.loss(p, *args)[0])(state.params)["components"]
    # The chain rule through V2 = U1ᵀ, U2 = V1ᵀ: dL/dV1 = ∂L/∂V1 + (∂L/∂U2)ᵀ, dL/dU1 likewise.
    want_v1 = g_free["linear1"]["V"] + jnp.swapaxes(g_free["linear2"]["U"], 1, 2)
    want_u1 = g_free["linear1"]["U"] + jnp.swapaxes(g_free["linear2"]["V"], 1, 2)
    np.testing.assert_allclose(g_tied["linear1"]["V"], want_v1, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(g_tied["linear1"]["U"], want_u1, rtol=1e-4, atol=1e-7)
    assert float(jnp.abs(g_free["linear2"]["U"]).max()) > 1e-6  # linear2's use is real
    assert float(jnp.abs(g_tied["linear2"]["V"]).max()) == 0.0
    assert float(jnp.abs(g_tied["linear2"]["U"]).max()) == 0.0


def test_tied_kinds_need_the_same_c() -> None:
    pd = attrs.evolve(
        PD,
        decomposition_targets=(
            DecompositionTarget(module_pattern="layers.0.linear1", C=20),
            DecompositionTarget(module_pattern="layers.0.linear2", C=10),
        ),
    )
    with pytest.raises(ConfigError, match=r"pd.decomposition_targets.*'linear2' is tied"):
        Trainer(TARGET, pd)


def test_the_warmup_weight_decay_is_decoupled_adamw() -> None:
    """One warmup step from the same state with weight decay 0 and wd: the difference is
    −lr·wd·c (torch's AdamW: the decay is added to the Adam update, scaled by lr)."""
    target_cfg = TMSConfig(n_features=5, n_hidden=2, tied_weights=False)
    target = jax.tree_util.tree_map(jnp.asarray, toy_weights("tms_5_2"))
    lr, wd = 1e-2, 0.5
    out = {}
    for decay in (0.0, wd):
        warm = FaithfulnessWarmup(steps=1, lr=lr, weight_decay=decay)
        trainer = Trainer(TMSTarget(config=target_cfg), attrs.evolve(PD, faithfulness_warmup=warm))
        state = trainer.init_state(key=jax.random.key(0))
        start = jax.device_get(state.params["components"])
        state, _ = trainer.faithfulness_warmup(state, target)
        out[decay] = jax.device_get(state.params["components"])
    for kind in start:
        for name in ("V", "U"):
            np.testing.assert_allclose(
                out[wd][kind][name] - out[0.0][kind][name],
                -lr * wd * start[kind][name],
                rtol=1e-4,
                atol=1e-8,
            )
