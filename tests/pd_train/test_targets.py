"""The target interface: a toy (TMS) target through the same decomposition, forwards and loss
as Llama, and its errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train._forward import CleanRunner, ForwardSpec, masked_forward
from pd_train.analysis.ground_truth import ground_truth_table
from pd_train.config.pd import ConfigError, DecompositionTarget
from pd_train.decomposition import build_decomposition
from pd_train.losses.recon import mse_clean_masked
from pd_train.models.llama_config import LlamaConfig
from pd_train.targets import LlamaTarget, as_target
from pd_train.targets.tms import TMSConfig, TMSTarget, sparse_features
from pd_train.targets.toys import (
    assignment_l1_distance,
    features_separated,
    separates_every_feature,
    toy_config,
)

TMS = TMSTarget(config=TMSConfig(n_features=5, n_hidden=2, n_hidden_layers=1))


def test_tms_sites_and_shapes() -> None:
    d = build_decomposition(TMS, [DecompositionTarget(module_pattern="layers.0.*", C=3)])
    assert [s.name for s in d.sites] == [
        "layers.0.linear1",
        "layers.0.hidden_0",
        "layers.0.linear2",
    ]
    assert [(k.d_in, k.d_out) for k in d.kinds] == [(5, 2), (2, 2), (2, 5)]


def test_pattern_matching_no_tms_site_names_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        build_decomposition(TMS, [DecompositionTarget(module_pattern="layers.0.mlp.*", C=3)])
    text = str(err.value)
    assert "pd.decomposition_targets[0].module_pattern" in text
    assert "layers.0.linear1" in text  # the message shows how sites are named


def test_unknown_target_kind_and_bad_toy_fields_are_named() -> None:
    with pytest.raises(TypeError, match="not a pd target"):
        as_target({"n_features": 5})
    with pytest.raises(ConfigError, match=r"target\.n_hidden"):
        TMSTarget(config=TMSConfig(n_features=5, n_hidden=0))
    with pytest.raises(ConfigError, match=r"toy.*no built-in toy 'tms_9_9'"):
        toy_config("tms_9_9")


def test_llama_config_is_the_llama_target() -> None:
    cfg = LlamaConfig(
        vocab_size=8, hidden_size=8, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    assert as_target(cfg) == LlamaTarget(config=cfg)
    assert as_target(cfg).output_loss == "kl"


def test_tms_clean_runner_and_masked_forward_at_full_masks_equal_the_model() -> None:
    """The generic layer loop runs a TMS target: clean output = the model's forward; with every
    site live, ci = 1 and zero sources, components V@U = W reproduce it."""
    params = TMS.init_params(key=jax.random.key(0))
    params["b_final"] = jnp.full((5,), 0.1)
    d = build_decomposition(TMS, [DecompositionTarget(module_pattern="layers.0.*", C=5)])
    spec = ForwardSpec(model=TMS, decomposition=d)
    x = sparse_features(key=jax.random.key(1), batch_size=16, n_features=5, feature_probability=0.5)
    out, _ = CleanRunner(spec, params, x).run(lambda k, x, xs: x, {})
    np.testing.assert_allclose(out, TMS.forward(params, x), rtol=1e-6)
    # Exact components: V = W (padded to C), U = [I; 0]-like so V@U = W.
    comps = {}
    for layout in d.kinds:
        w = params["layers"][layout.kind][0]
        v = jnp.zeros((layout.d_in, 5)).at[:, : layout.d_out].set(w)
        u = jnp.zeros((5, layout.d_out)).at[: layout.d_out].set(jnp.eye(layout.d_out))
        comps[layout.kind] = {"V": v[None], "U": u[None]}
    ci = {k.kind: jnp.ones((1, 16, 1, 5)) for k in d.kinds}
    live = np.ones((1, len(d.kinds)), bool)
    masked = masked_forward(
        spec, target=params, tokens=x, components=comps, ci_lower=ci, live=live, routed=None,
        key=jax.random.key(2), source_scale=jnp.float32(0.0),
    )  # fmt: skip
    np.testing.assert_allclose(masked, out, rtol=1e-5, atol=1e-6)
    assert float(mse_clean_masked(out, masked)) < 1e-10
    ci0 = {k: jnp.zeros_like(v) for k, v in ci.items()}
    off = masked_forward(
        spec, target=params, tokens=x, components=comps, ci_lower=ci0, live=live, routed=None,
        key=jax.random.key(2), source_scale=jnp.float32(0.0),
    )  # fmt: skip
    np.testing.assert_allclose(off, jnp.broadcast_to(jax.nn.relu(params["b_final"]), off.shape))


def test_sparse_features_modes() -> None:
    x = sparse_features(
        key=jax.random.key(0), batch_size=4000, n_features=5, feature_probability=0.1
    )
    assert x.shape == (4000, 1, 5)
    assert abs(float(jnp.mean(x > 0)) - 0.1) < 0.02
    y = sparse_features(
        key=jax.random.key(0), batch_size=100, n_features=5, feature_probability=0.1,
        mode="exactly_one_active",
    )  # fmt: skip
    assert (np.asarray(jnp.sum(y > 0, axis=-1)) <= 1).all()
    assert float(jnp.mean(jnp.sum(y > 0, axis=-1))) > 0.95  # U[0, 1) is 0 with probability 0


def test_lenient_metrics_keep_their_own_names() -> None:
    """pd's earlier lenient measures (an L1 distance; "on" above 0.5), renamed so that no pd
    name means something else than the reference's (IdentityCIError: test_ground_truth.py)."""
    perfect = np.zeros((3, 6))
    perfect[[0, 1, 2], [4, 0, 2]] = 1.0
    assert assignment_l1_distance(perfect) == 0.0
    assert separates_every_feature(perfect)
    shared = perfect.copy()
    shared[1] = perfect[0]  # two features on one component
    assert not separates_every_feature(shared)
    assert assignment_l1_distance(shared) > 0.5
    leaky = perfect.copy()
    leaky[0, 1] = 0.2
    assert not separates_every_feature(leaky)
    assert assignment_l1_distance(leaky) == pytest.approx(0.2 / 3)
    ci = np.zeros((4, 6))
    ci[[0, 1, 2, 3], [4, 0, 2, 2]] = 0.9  # features 2 and 3 share component 2
    ci[1, 5] = 0.3  # feature 1 also turns on component 5
    np.testing.assert_array_equal(features_separated(ci), [True, False, False, False])


def test_ground_truth_table_judges_only_the_matched_sites() -> None:
    ci = 0.95 * np.eye(4, 6)
    table = ground_truth_table({"a": ci, "b": ci}, identity=("a",))
    assert table == {
        "gt/alive_one_hot/a": 4.0,
        "gt/identity_ci_error/a": 0.0,
        "gt/alive_one_hot/b": 4.0,
        "gt/identity_ci_error": 0.0,
    }
