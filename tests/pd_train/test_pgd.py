"""Adversarial recon: the ascents by hand, fresh PGD against random masks, persistent PGD's
sources (init, final ascent, state, devices) and its config errors."""

from __future__ import annotations

import functools

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pd_sharding
from pd_train._forward import CleanRunner
from pd_train.config.io import ConfigError
from pd_train.config.pd import (
    PersistentPGDRecon,
    PGDOptimizer,
    PGDRecon,
)
from pd_train.decomposition import site_name
from pd_train.losses import (
    FreshPGD,
    PersistentPGD,
    adam_ascent,
    all_sites_plan,
    chunkwise_plan,
    recon_loss,
    sign_ascent,
)
from pd_train.train import Trainer, step_key

from ._pgd import FAST, TINY, B, T, _pd, _target, _tokens, _trainer
from ._recon import DEC, SPEC, _data


# ------------------------------------------------------------------ the ascents by hand
def test_sign_ascent_by_hand_clamps_to_the_unit_interval() -> None:
    s = {"q_proj": jnp.asarray([0.5, 0.95, 0.02, 0.3, 0.7])}
    g = {"q_proj": jnp.asarray([1.0, 2.0, -3.0, 0.0, -1e-9])}
    got = np.asarray(sign_ascent(s, g, 0.1)["q_proj"])
    np.testing.assert_allclose(got, [0.6, 1.0, 0.0, 0.3, 0.6], atol=1e-7)


def test_adam_ascent_by_hand_with_eps_after_the_sqrt() -> None:
    """Two ascents computed with numpy. eps = 0.5 is large so that eps inside the square root
    (sqrt(v̂ + eps)) would give visibly different values."""
    b1, b2, eps, lr = 0.5, 0.99, 0.5, 0.1
    s0 = np.array([0.5, 0.5, 0.98, 0.01], np.float32)
    g1 = np.array([1.0, -2.0, 0.25, -0.5], np.float32)
    g2 = np.array([-1.0, -2.0, 0.5, 4.0], np.float32)
    state = {"count": jnp.int32(0), "m": {"k": jnp.zeros(4)}, "v": {"k": jnp.zeros(4)}}
    s, m, v = s0.astype(np.float64), np.zeros(4), np.zeros(4)
    got = {"k": jnp.asarray(s0)}
    for t, g in ((1, g1), (2, g2)):
        got, state = adam_ascent(got, state, {"k": jnp.asarray(g)}, lr, b1=b1, b2=b2, eps=eps)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1**t), v / (1 - b2**t)
        s = np.clip(s + lr * mhat / (np.sqrt(vhat) + eps), 0, 1)
        np.testing.assert_allclose(np.asarray(got["k"]), s, rtol=1e-6, atol=1e-7)
        before = s - lr * mhat / (np.sqrt(vhat) + eps)
        inside = np.clip(before + lr * mhat / np.sqrt(vhat + eps), 0, 1)
        assert not np.allclose(inside, s, atol=1e-4)
    assert int(state["count"]) == 2
    # First ascent: m̂ = g and v̂ = g², so each step is lr·g/(|g| + eps); the clamp holds 0.98 → 1.
    assert np.asarray(got["k"])[2] == 1.0


# ------------------------------------------------------------------ fresh PGD
@functools.cache
def _recon_values() -> dict[str, float]:
    target, comps, ci, tokens = _data()

    def values() -> dict[str, jax.Array]:
        clean = CleanRunner(SPEC, target, tokens)
        logits, _ = clean.run(lambda kind, x, xs: None, {})
        common = dict(
            n_samples=1,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            clean_logits=logits,
            clean_stream=clean.stream,
            key=jax.random.key(5),
        )
        pgd = FreshPGD(init="random", n_steps=4, step_size=0.2)
        out = {}
        for name, plan in (("all", all_sites_plan(DEC)), ("chunks", chunkwise_plan(DEC, 4))):
            out[f"stochastic/{name}"] = recon_loss(SPEC, plan, **common)
            out[f"pgd/{name}"] = recon_loss(SPEC, plan, pgd=pgd, **common)
        shared = FreshPGD(init="ones", n_steps=2, step_size=0.2, mask_scope="shared_across_batch")
        out["pgd_shared/all"] = recon_loss(SPEC, all_sites_plan(DEC), pgd=shared, **common)
        out["pgd_zero_steps/all"] = recon_loss(
            SPEC, all_sites_plan(DEC), pgd=FreshPGD(init="zeros", n_steps=0), **common
        )
        return out

    return {k: float(v) for k, v in jax.jit(values, compiler_options=FAST)().items()}


def test_pgd_recon_is_worse_than_stochastic_recon_at_the_same_params() -> None:
    v = _recon_values()
    assert v["pgd/all"] > 1.2 * v["stochastic/all"] > 0
    assert v["pgd/chunks"] > 1.2 * v["stochastic/chunks"] > 0
    assert v["pgd_shared/all"] > 0


def test_pgd_with_zero_steps_and_zero_sources_is_the_ci_mask() -> None:
    """Zero sources give m = ci_lower, δ = 0: the KL of a plain forward under ci_lower masks."""
    target, comps, ci, tokens = _data()
    from pd_train._forward import masked_forward
    from pd_train.losses import kl_clean_masked

    def by_hand() -> jax.Array:
        clean = CleanRunner(SPEC, target, tokens)
        logits, _ = clean.run(lambda kind, x, xs: None, {})
        zeros = {k: jnp.zeros((*v.shape[:-1], v.shape[-1] + 1)) for k, v in ci.items()}
        masked = masked_forward(
            SPEC,
            target=target,
            tokens=tokens,
            components=comps,
            ci_lower=ci,
            live=np.ones((2, len(DEC.kinds)), bool),
            routed=None,
            key=jax.random.key(0),
            sources=zeros,
        )
        return kl_clean_masked(logits, masked)

    want = float(jax.jit(by_hand, compiler_options=FAST)())
    assert _recon_values()["pgd_zero_steps/all"] == pytest.approx(want, rel=1e-5)


def test_fresh_pgd_sources_stay_in_the_unit_interval_and_climb() -> None:
    def objective(s: dict) -> jax.Array:  # pushes every source up and over 1
        return jnp.sum(s["q_proj"] * 3.0) - jnp.sum((s["q_proj"] - 2.0) ** 2)

    pgd = FreshPGD(init="random", n_steps=7, step_size=0.3)
    start = pgd.init_sources({"q_proj": jnp.zeros((2, 3, 4, 5))}, (3, 4), key=jax.random.key(0))
    assert start["q_proj"].shape == (2, 3, 4, 6)
    out = np.asarray(jax.jit(lambda s: pgd.ascend(objective, s))(start)["q_proj"])
    assert out.min() >= 0.0 and out.max() <= 1.0
    np.testing.assert_array_equal(out, 1.0)


# ------------------------------------------------------------------ persistent PGD
def test_persistent_sources_init_equals_the_per_array_reference_and_is_sharded() -> None:
    term = PersistentPGDRecon(coeff=1.0, scope="bsc", optimizer=PGDOptimizer(lr=0.01))
    mesh = pd_sharding.make_mesh(data=4, devices=jax.devices()[:4])
    ppgd = PersistentPGD(
        term,
        DEC,
        batch_size=8,
        seq_len=6,
        total_steps=10,
        layout=pd_sharding.Zero1Layout(mesh),
    )
    key = jax.random.key(11)
    stacked = ppgd.init_sources(key=key)
    reference = ppgd.init_plan().init_reference(key=key)
    for layout in DEC.kinds:
        got = stacked[layout.kind]
        assert got.shape == (len(layout.layers), 8, 6, layout.C + 1)
        assert got.sharding.spec == jax.sharding.PartitionSpec(None, ("replicate", "data"))
        for j, layer in enumerate(layout.layers):
            name = f"{site_name(layer, layout.kind)}.ppgd_source"
            np.testing.assert_array_equal(np.asarray(got[j]), np.asarray(reference[name]))
        values = np.asarray(got)
        assert values.min() >= 0.0 and values.max() < 1.0
    sc = PersistentPGD(
        PersistentPGDRecon(coeff=1.0, scope="sc", optimizer=PGDOptimizer(lr=0.01)),
        DEC,
        batch_size=8,
        seq_len=6,
        total_steps=10,
    )
    assert sc.abstract_sources()["q_proj"].shape == (2, 1, 6, 5)


def test_init_lowerings_list_the_sources_init_jits() -> None:
    # `pd-train compile` and the probe compile what init_lowerings lists: with persistent PGD
    # that includes the sources' stacked init and their optimizer state, in their shardings.
    mesh = pd_sharding.make_mesh(data=4, devices=jax.devices()[:4])
    trainer = Trainer(TINY, _pd(), mesh=mesh, compiler_options=FAST, seq_len=T)
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=trainer.layout.replicated())
    lowerings = dict(trainer.init_lowerings(key=key))
    assert list(lowerings) == ["init_params", "init_sources", "init_sources_opt"]
    want = trainer.abstract_state().adversary

    def info(tree):
        return jax.tree.map(lambda a: (a.shape, a.dtype, a.sharding), tree)

    sources = lowerings["init_sources"]()  # one stack per kind, named by its pd-init group
    got = {k.removeprefix("ppgd."): v for k, v in info(sources.out_info).items()}
    assert got == info(want["sources"])
    opt = lowerings["init_sources_opt"]()
    assert info(opt.out_info) == info(want["opt_state"])
    for lowered, tree in ((sources, want["sources"]), (opt, want["opt_state"])):
        shardings = jax.tree.leaves(lowered.compile().output_shardings)
        assert sorted(map(str, shardings)) == sorted(str(a.sharding) for a in jax.tree.leaves(tree))
    without = Trainer(TINY, attrs.evolve(_pd(), loss_metrics=_pd().loss_metrics[:3]), mesh=mesh)
    assert [name for name, _ in without.init_lowerings(key=key)] == ["init_params"]


def test_final_ascent_reuses_the_main_backward_as_a_second_backward_would() -> None:
    trainer = _trainer()
    state = trainer.init_state(key=jax.random.key(1))
    target, tokens, key = _target(), _tokens(), step_key(jax.random.key(2), 0)
    coeff = 0.5

    def explicit(state):  # the warmed sources, then a backward of the total w.r.t. them alone
        zeros = jax.tree.map(jnp.zeros_like, state.adversary["sources"])

        def total(offset):
            return trainer.loss(
                state.params, target, tokens, state.step, key, state.adversary, offset
            )

        (_, aux), grads = jax.value_and_grad(total, has_aux=True)(zeros)
        warmed = aux["adversary"]
        g = {k: v / coeff for k, v in grads.items()}
        return trainer.ppgd.ascend(
            warmed["sources"], warmed["opt_state"], g, trainer.ppgd.lr(state.step)
        ), aux["terms"]

    (want, want_opt), terms = jax.jit(explicit, compiler_options=FAST)(state)
    before = jax.tree.map(np.asarray, state.adversary["sources"])
    new, metrics = trainer.train_step(state, target, tokens, key)
    for k in want:
        got = np.asarray(new.adversary["sources"][k])
        np.testing.assert_allclose(got, np.asarray(want[k]), rtol=1e-5, atol=1e-6)
        assert got.min() >= 0.0 and got.max() <= 1.0
        assert not np.array_equal(got, before[k])
    assert int(new.adversary["opt_state"]["count"]) == 3  # 2 warmup ascents + the final one
    assert int(want_opt["count"]) == 3
    for k in want:
        np.testing.assert_allclose(
            np.asarray(new.adversary["opt_state"]["v"][k]),
            np.asarray(want_opt["v"][k]),
            rtol=1e-5,
            atol=1e-9,
        )
    assert float(metrics["loss/persistent_pgd_recon"]) == pytest.approx(
        float(terms["persistent_pgd_recon"]), rel=1e-5
    )
    assert float(metrics["lr/ppgd"]) == pytest.approx(0.05 / 2)  # warmup step 1 of 2


@pytest.mark.slow
def test_four_devices_match_one_with_persistent_pgd() -> None:
    target, tokens = _target(), _tokens()
    run_key = jax.random.key(2)

    def run(trainer: Trainer, tgt, toks) -> tuple[list, dict]:
        state = trainer.init_state(key=jax.random.key(1))
        out = []
        for i in range(2):
            state, metrics = trainer.train_step(state, tgt, toks, step_key(run_key, i))
            out.append(trainer.metrics_to_host(metrics))
        return out, jax.tree.map(np.asarray, state.adversary)

    one, one_adv = run(_trainer(), target, tokens)
    mesh = pd_sharding.make_mesh(data=4, devices=jax.devices()[:4])
    trainer = Trainer(TINY, _pd(), mesh=mesh, compiler_options=FAST, seq_len=T)
    tgt = jax.device_put(target, trainer.target_shardings(target))
    toks = jax.device_put(tokens, trainer.batch_sharding((B, T)))
    four, four_adv = run(trainer, tgt, toks)
    for a, b in zip(one, four, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
    # The sources move by Adam steps of ~lr = 0.05 each; Adam's m / sqrt(v) turns the 1- vs
    # 4-device reduction order's ~1e-7 differences in a near-zero gradient into up to ~1e-4
    # (measured 1.0e-4 on one Xeon, under 1e-5 on another). A sharding mistake moves a source
    # by a whole step: atol 1e-3 tells the two apart.
    assert set(one_adv) == set(four_adv) == {"sources", "opt_state"}
    pairs = zip(
        jax.tree.leaves(one_adv["sources"]), jax.tree.leaves(four_adv["sources"]), strict=True
    )
    for x, y in pairs:
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-3)
    # Adam's moments are not normalized: within 0.1 % of each leaf's largest value.
    pairs = zip(
        jax.tree.leaves(one_adv["opt_state"]), jax.tree.leaves(four_adv["opt_state"]), strict=True
    )
    for x, y in pairs:
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-3 * float(np.abs(y).max()))


def test_bsc_scope_needs_a_batch_the_data_axes_divide() -> None:
    mesh = pd_sharding.make_mesh(data=4, devices=jax.devices()[:4])
    pd = _pd()
    import attrs

    with pytest.raises(ConfigError, match=r"pd\.loss_metrics\[3\]\.scope"):
        Trainer(TINY, attrs.evolve(pd, batch_size=6), mesh=mesh, seq_len=T)
    with pytest.raises(ConfigError, match="seq_len"):
        Trainer(TINY, pd)


def test_pgd_config_fields_are_checked() -> None:
    from pd_train.config.io import FieldValueError

    with pytest.raises(FieldValueError, match="scope"):
        PersistentPGDRecon(coeff=1.0, scope="bc", optimizer=PGDOptimizer(lr=0.1))  # type: ignore[arg-type]
    with pytest.raises(FieldValueError, match="n_warmup_steps: got -1; must be >= 0"):
        PersistentPGDRecon(coeff=1.0, n_warmup_steps=-1, optimizer=PGDOptimizer(lr=0.1))
    with pytest.raises(FieldValueError, match=r"coeff: got 0\.0; must be > 0"):
        PersistentPGDRecon(coeff=0.0, optimizer=PGDOptimizer(lr=0.1))
    with pytest.raises(FieldValueError, match="n_steps: got -2; must be >= 0"):
        PGDRecon(coeff=1.0, n_steps=-2)
    with pytest.raises(FieldValueError, match="mask_scope"):
        PGDRecon(coeff=1.0, mask_scope="per_batch")  # type: ignore[arg-type]
    with pytest.raises(FieldValueError, match="type"):
        PGDOptimizer(type="sgd", lr=0.1)  # type: ignore[arg-type]
