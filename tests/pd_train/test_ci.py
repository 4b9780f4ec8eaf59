"""CI functions against hand computations, their parameter specs, and the remat switch."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.ci import MLPCIFunction, SharedMLPCIFunction, VectorMLPCIFunction
from pd_train.ci._base import gelu
from pd_train.decomposition import KindLayout

RNG = np.random.default_rng(0)
LAYOUT = KindLayout(kind="up_proj", layers=(0, 1), C=3, d_in=5, d_out=7)


def _gelu(x: np.ndarray) -> np.ndarray:  # the exact (erf) GELU
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:  # jax.nn.gelu's default approximation
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _params(specs: dict) -> dict:
    return {k: RNG.standard_normal(v.shape).astype(np.float32) for k, v in specs.items()}


def test_mlp_ci_by_hand_with_two_hidden_layers() -> None:
    fn = MLPCIFunction(hidden_dims=(4, 2))
    specs = fn.param_specs(LAYOUT)
    assert {k: v.shape for k, v in specs.items()} == {
        "w0": (3, 4),
        "b0": (3, 4),
        "w1": (3, 4, 2),
        "b1": (3, 2),
        "w_out": (3, 2),
        "b_out": (3,),
    }
    p = _params(specs)
    inner = RNG.standard_normal((2, 3, 3)).astype(np.float32)  # [B, T, C]
    want = np.zeros_like(inner)
    for b in range(2):
        for t in range(3):
            for c in range(3):
                h = _gelu(inner[b, t, c] * p["w0"][c] + p["b0"][c])
                h = _gelu(h @ p["w1"][c] + p["b1"][c])
                want[b, t, c] = h @ p["w_out"][c] + p["b_out"][c]
    got = fn.site_apply({k: jnp.asarray(v) for k, v in p.items()}, jnp.asarray(inner))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_shared_mlp_ci_by_hand() -> None:
    fn = SharedMLPCIFunction(hidden_dims=(6,))
    specs = fn.param_specs(LAYOUT)
    assert {k: v.shape for k, v in specs.items()} == {
        "w0": (5, 6),
        "b0": (6,),
        "w1": (6, 3),
        "b1": (3,),
    }
    p = _params(specs)
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    want = _gelu(x @ p["w0"] + p["b0"]) @ p["w1"] + p["b1"]
    got = fn.site_apply({k: jnp.asarray(v) for k, v in p.items()}, jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


class _FakeClean:
    """A CleanRun over fixed site inputs x [n_k, B, T, d_in] per kind."""

    def __init__(self, inputs: dict) -> None:
        self.inputs = inputs

    def run(self, site_fn, site_xs):
        out = {}
        for kind, x in self.inputs.items():
            rows = []
            for i in range(x.shape[0]):
                xs = jax.tree_util.tree_map(lambda a, i=i: a[i], site_xs[kind])
                rows.append(site_fn(kind, x[i], xs))
            out[kind] = jnp.stack(rows)
        return jnp.zeros(()), out


def test_causal_importance_and_the_remat_switch() -> None:
    """causal_importance applies the site function per stacked site; ``remat=True`` (from
    ``runtime.remat.ci_fn``) puts it under jax.checkpoint: same values and grads."""
    specs = MLPCIFunction(hidden_dims=(4,)).param_specs(LAYOUT)
    params = {
        "up_proj": {
            k: jnp.asarray(RNG.standard_normal((2, *v.shape)), jnp.float32)
            for k, v in specs.items()
        }
    }
    comps = {"up_proj": {"V": jnp.asarray(RNG.standard_normal((2, 5, 3)), jnp.float32)}}
    clean = _FakeClean({"up_proj": jnp.asarray(RNG.standard_normal((2, 2, 3, 5)), jnp.float32)})

    def loss(remat: bool):
        fn = MLPCIFunction(hidden_dims=(4,), remat=remat)

        def f(p):
            _, pre = fn.causal_importance(p, comps, clean)
            return jnp.sum(pre["up_proj"] ** 2), pre

        grad = jax.jit(jax.value_and_grad(f, has_aux=True))
        return grad(params), grad.lower(params).as_text()

    ((v0, pre0), g0), text0 = loss(False)
    ((v1, _), g1), text1 = loss(True)
    assert pre0["up_proj"].shape == (2, 2, 3, 3)
    site1 = MLPCIFunction(hidden_dims=(4,)).site_apply(
        jax.tree_util.tree_map(lambda a: a[1], params["up_proj"]),
        clean.inputs["up_proj"][1] @ comps["up_proj"]["V"][1],
    )
    np.testing.assert_allclose(
        np.asarray(pre0["up_proj"][1]), np.asarray(site1), rtol=1e-5, atol=1e-6
    )
    assert float(v0) == float(v1)
    for a, b in zip(jax.tree_util.tree_leaves(g0), jax.tree_util.tree_leaves(g1), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert "optimization_barrier" in text1 and "optimization_barrier" not in text0


def test_ci_mlps_use_the_exact_gelu_not_the_tanh_approximation() -> None:
    """Issue 14 item 7: every CI-function MLP uses erf GELU. Inputs where the two forms differ
    by ~1e-3 (|x| near 2-3), so a tolerance of 1e-6 tells them apart."""
    x = np.linspace(-3.0, 3.0, 13, dtype=np.float32)
    assert np.abs(_gelu(x) - _gelu_tanh(x)).max() > 1e-4  # the test can tell them apart
    one = {"w0": np.ones((1, 1), np.float32), "b0": np.zeros((1, 1), np.float32)}
    one |= {"w_out": np.ones((1, 1), np.float32), "b_out": np.zeros((1,), np.float32)}
    got = MLPCIFunction(hidden_dims=(1,)).site_apply(
        {k: jnp.asarray(v) for k, v in one.items()}, jnp.asarray(x).reshape(1, 13, 1)
    )
    np.testing.assert_allclose(np.asarray(got).ravel(), _gelu(x), rtol=0, atol=1e-6)
    eye = {"w0": np.eye(13, dtype=np.float32), "b0": np.zeros(13, np.float32)}
    eye |= {"w1": np.eye(13, dtype=np.float32), "b1": np.zeros(13, np.float32)}
    got = SharedMLPCIFunction(hidden_dims=(13,)).site_apply(
        {k: jnp.asarray(v) for k, v in eye.items()}, jnp.asarray(x).reshape(1, 1, 13)
    )
    np.testing.assert_allclose(np.asarray(got).ravel(), _gelu(x), rtol=0, atol=1e-6)
    vec = {"w0": np.ones((13, 1, 1), np.float32), "b0": np.zeros((13, 1), np.float32)}
    vec |= {"w_out": np.ones((13, 1), np.float32), "b_out": np.zeros(13, np.float32)}
    got = VectorMLPCIFunction(hidden_dims=(1,)).site_apply(
        {k: jnp.asarray(v) for k, v in vec.items()}, jnp.asarray(x).reshape(13, 1, 1)
    )
    np.testing.assert_allclose(np.asarray(got)[:, 0, 0], _gelu(x), rtol=0, atol=1e-6)
    # The transformers' MLPs call the same function.
    np.testing.assert_allclose(np.asarray(gelu(jnp.asarray(x))), _gelu(x), rtol=0, atol=1e-6)


def test_site_ci_params_keep_the_names_groups_and_values_they_had() -> None:
    """mlp / shared_mlp arrays keep the pd-init names, groups and initializers of the per-kind
    code before the CI package (same names => same keys => same values): a stack's row equals
    pd-init's reference draw under the literal old name and init."""
    import pd_init
    from pd_train.config.pd import DecompositionTarget
    from pd_train.decomposition import build_decomposition

    from ._recon import MODEL

    dec = build_decomposition(
        MODEL, [DecompositionTarget(module_pattern="layers.*.mlp.up_proj", C=3)]
    )
    fn = MLPCIFunction(hidden_dims=(4,))
    arrays = fn.arrays(dec)
    assert [(a.name, a.group) for a in arrays[:4]] == [
        ("layers.0.mlp.up_proj.ci_fn.w0", "ci_fn.up_proj.w0"),
        ("layers.0.mlp.up_proj.ci_fn.b0", "ci_fn.up_proj.b0"),
        ("layers.0.mlp.up_proj.ci_fn.w_out", "ci_fn.up_proj.w_out"),
        ("layers.0.mlp.up_proj.ci_fn.b_out", "ci_fn.up_proj.b_out"),
    ]
    specs = [
        pd_init.ArraySpec(name=a.name, shape=a.shape, init=a.init, group=a.group) for a in arrays
    ]
    stacks = pd_init.InitPlan(specs).init_stacked(key=jax.random.key(5)).stacks
    old = pd_init.init_reference(
        [
            pd_init.ArraySpec(
                name="layers.1.mlp.up_proj.ci_fn.w0",
                shape=(3, 4),
                init=pd_init.Normal(std=2.0**0.5),
            )
        ],
        key=jax.random.key(5),
    )
    np.testing.assert_array_equal(
        np.asarray(stacks["ci_fn.up_proj.w0"][1]), np.asarray(old["layers.1.mlp.up_proj.ci_fn.w0"])
    )
    shared = SharedMLPCIFunction(hidden_dims=(6,)).arrays(dec)
    assert [(a.name, a.group, a.shape) for a in shared[:2]] == [
        ("layers.0.mlp.up_proj.ci_fn.w0", "ci_fn.up_proj.w0", (16, 6)),
        ("layers.0.mlp.up_proj.ci_fn.b0", "ci_fn.up_proj.b0", (6,)),
    ]
    assert shared[0].init == pd_init.Normal(std=(2.0 / 16) ** 0.5)
