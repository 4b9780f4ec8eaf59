"""The residual-MLP toy target through the generic forwards: kinds stacked over repeated layers,
the layer scan, and the MSE recon (exact components reproduce the model)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train._forward import CleanRunner, ForwardSpec, masked_forward
from pd_train.config import ConfigError, DecompositionTarget
from pd_train.decomposition import build_decomposition
from pd_train.targets.resid_mlp import ResidMLPConfig, ResidMLPTarget, resid_mlp_features

TARGET = ResidMLPTarget(
    config=ResidMLPConfig(n_features=6, d_embed=8, d_mlp=4, n_layers=3, bias=True)
)


def test_resid_mlp_kinds_stack_over_layers() -> None:
    d = build_decomposition(
        TARGET,
        [
            DecompositionTarget(module_pattern="layers.[12].mlp_in", C=5),
            DecompositionTarget(module_pattern="layers.*.mlp_out", C=7),
        ],
    )
    assert [(k.kind, k.layers, k.C) for k in d.kinds] == [
        ("mlp_in", (1, 2), 5),
        ("mlp_out", (0, 1, 2), 7),
    ]
    assert [s.name for s in d.sites][:3] == [
        "layers.0.mlp_out",
        "layers.1.mlp_in",
        "layers.1.mlp_out",
    ]
    with pytest.raises(ConfigError, match=r"target\.d_mlp"):
        ResidMLPTarget(config=ResidMLPConfig(n_features=6, d_embed=8, d_mlp=0))
    with pytest.raises(ConfigError, match=r"target\.bias"):
        ResidMLPTarget(config=ResidMLPConfig(n_features=6, d_embed=8, d_mlp=2, bias=1))  # type: ignore[arg-type]


def test_resid_mlp_has_no_biases_unless_asked() -> None:
    """The paper's residual MLPs have none: h + ReLU(h W_in) W_out, read back with Eᵀ."""
    target = ResidMLPTarget(config=ResidMLPConfig(n_features=3, d_embed=4, d_mlp=2))
    params = target.init_params(key=jax.random.key(0))
    assert sorted(params["layers"]) == ["mlp_in", "mlp_out"]
    x = jnp.array([[0.5, -1.0, 0.0]])
    e, w_in, w_out = (np.asarray(a, np.float64) for a in (
        params["embed"], params["layers"]["mlp_in"][0], params["layers"]["mlp_out"][0]))  # fmt: skip
    h = x @ e
    expected = (h + np.maximum(h @ w_in, 0.0) @ w_out) @ e.T
    np.testing.assert_allclose(target.forward(params, x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("live_dynamic", [False, True])
def test_resid_mlp_forwards(live_dynamic: bool) -> None:
    params = TARGET.init_params(key=jax.random.key(0))
    params["layers"]["b_in"] = jnp.full((3, 4), 0.05)
    d = build_decomposition(TARGET, [DecompositionTarget(module_pattern="layers.*", C=8)])
    spec = ForwardSpec(model=TARGET, decomposition=d)
    x = resid_mlp_features(
        key=jax.random.key(1), batch_size=8, n_features=6, feature_probability=0.5
    )
    out, _ = CleanRunner(spec, params, x).run(lambda k, x, xs: x, {})
    np.testing.assert_allclose(out, TARGET.forward(params, x), rtol=1e-5, atol=1e-6)
    comps = {}
    for layout in d.kinds:  # V = [W | 0], U = [I; 0]: V@U = W
        w = params["layers"][layout.kind]
        v = jnp.zeros((3, layout.d_in, 8)).at[:, :, : layout.d_out].set(w)
        eye = jnp.broadcast_to(jnp.eye(layout.d_out), (3, layout.d_out, layout.d_out))
        u = jnp.zeros((3, 8, layout.d_out)).at[:, : layout.d_out].set(eye)
        comps[layout.kind] = {"V": v, "U": u}
    ci = {k.kind: jnp.ones((3, 8, 1, 8)) for k in d.kinds}
    live = np.zeros((3, 2), bool)
    live[1:] = True  # layer 0 frozen, layers 1-2 on the component path
    masked = masked_forward(
        spec, target=params, tokens=x, components=comps, ci_lower=ci,
        live=jnp.asarray(live) if live_dynamic else live, routed=None,
        key=jax.random.key(2), source_scale=jnp.float32(0.0),
    )  # fmt: skip
    np.testing.assert_allclose(masked, out, rtol=1e-5, atol=1e-5)
