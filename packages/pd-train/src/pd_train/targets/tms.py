"""Toy models of superposition (TMS): n_features -> n_hidden -> n_features with a ReLU output.

``out = ReLU(x @ W1 [@ H_0 ... @ H_{n-1}] @ W2 + b)``; tied weights: W2 = W1ᵀ. One "layer" with
kinds ``linear1``, ``hidden_{i}``, ``linear2`` (sites ``layers.0.linear1`` ...); inputs are
sparse features x [B, 1, n_features] (one position per sample), the recon loss is the MSE of the
output. The true mechanism is known: feature i is read by row i of W1 and written by column i of
W2, so a right decomposition has one component per feature in each matrix.

:func:`sparse_features` draws the data on device from a key; :func:`pretrain` trains the target
as the SPD paper's appendix does (AdamW, wd 0.01, constant lr, on ``(out − x)²``)
deterministically from a seed. The paper's +ID models have one hidden layer fixed to the
identity (``n_hidden_layers=1``, pretrained with ``fixed_identity_hidden``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import optax

from pd_train.sources import uniform
from pd_train.targets.base import Linear

__all__ = ["TMSConfig", "TMSTarget", "pretrain", "reference_init", "sparse_features"]

DataMode = Literal["at_least_zero_active", "exactly_one_active"]


@attrs.frozen(kw_only=True)
class TMSConfig:
    """A TMS model's shape."""

    n_features: int
    n_hidden: int
    n_hidden_layers: int = 0
    tied_weights: bool = True


def _check_config(config: TMSConfig, path: str) -> None:
    from pd_train.config.io import ConfigError

    problems = []
    for name in ("n_features", "n_hidden"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append((f"{path}.{name}", f"got {value!r}; must be a positive int"))
    n = config.n_hidden_layers
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        problems.append((f"{path}.n_hidden_layers", f"got {n!r}; must be an int >= 0"))
    if not isinstance(config.tied_weights, bool):
        problems.append((f"{path}.tied_weights", f"got {config.tied_weights!r}; must be a bool"))
    if problems:
        raise ConfigError(problems)


@attrs.frozen(kw_only=True)
class TMSTarget:
    """The :class:`~pd_train.targets.Target` of a TMS model. Params: ``{"layers": {kind:
    [1, d_in, d_out]}, "b_final": [n_features]}`` (W2 stored even when tied: it is W1ᵀ)."""

    config: TMSConfig

    def __attrs_post_init__(self) -> None:
        _check_config(self.config, "target")

    @property
    def kinds(self) -> tuple[str, ...]:
        hidden = tuple(f"hidden_{i}" for i in range(self.config.n_hidden_layers))
        return ("linear1", *hidden, "linear2")

    @property
    def n_layers(self) -> int:
        return 1

    @property
    def tied_kinds(self) -> tuple[tuple[str, str], ...]:
        """A tied TMS decomposes linear2 with linear1's components transposed
        (:mod:`pd_train.targets.tied`)."""
        return (("linear1", "linear2"),) if self.config.tied_weights else ()

    @property
    def output_loss(self) -> Literal["kl", "mse"]:
        return "mse"

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        f, h = self.config.n_features, self.config.n_hidden
        shapes = {"linear1": (f, h)}
        shapes.update({k: (h, h) for k in self.kinds[1:-1]})
        shapes["linear2"] = (h, f)
        return shapes

    def init_params(self, *, key: jax.Array, dtype: Any = jnp.float32) -> Any:
        """Xavier-normal weights, zero bias (W2 = W1ᵀ when tied)."""
        shapes = self.site_shapes()
        keys = jax.random.split(key, len(shapes))
        layers = {}
        for k, (kind, (d_in, d_out)) in zip(keys, shapes.items(), strict=True):
            std = (2.0 / (d_in + d_out)) ** 0.5
            layers[kind] = (std * jax.random.normal(k, (1, d_in, d_out))).astype(dtype)
        if self.config.tied_weights:
            layers["linear2"] = jnp.swapaxes(layers["linear1"], 1, 2)
        return {"layers": layers, "b_final": jnp.zeros((self.config.n_features,), dtype)}

    def start(self, params: Any, inputs: jax.Array, dtype: Any) -> tuple[jax.Array, Any]:
        return inputs.astype(dtype), params["b_final"].astype(dtype)

    def layer(
        self,
        h: jax.Array,
        layer_params: Mapping[str, jax.Array],
        ctx: Any,
        linear: Linear | None = None,
    ) -> jax.Array:
        def plain(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
            del kind
            return x @ w.astype(x.dtype)

        lin = plain if linear is None else linear
        x = h
        for kind in self.kinds[:-1]:
            x = lin(kind, x, layer_params[kind])
        return jax.nn.relu(lin("linear2", x, layer_params["linear2"]) + ctx)

    def finish(self, params: Any, h: jax.Array) -> jax.Array:
        del params
        return h

    def forward(self, params: Any, x: jax.Array) -> jax.Array:
        """The plain model: x [..., n_features] -> out [..., n_features]."""
        h, ctx = self.start(params, x, x.dtype)
        return self.layer(h, {k: v[0] for k, v in params["layers"].items()}, ctx)


def sparse_features(
    *,
    key: jax.Array,
    batch_size: int,
    n_features: int,
    feature_probability: float,
    mode: DataMode = "at_least_zero_active",
    draws: str = "jax",
) -> jax.Array:
    """[batch_size, 1, n_features] float32 sparse features.

    ``at_least_zero_active``: each feature independently active with ``feature_probability``,
    value U[0, 1). ``exactly_one_active``: one uniformly chosen feature active per sample, value
    U[0, 1) (``feature_probability`` unused). ``draws``: how the uniforms are computed
    (:func:`pd_train.sources.uniform`, the same bits).
    """
    k_on, k_val = jax.random.split(key)
    shape = (batch_size, 1, n_features)
    values = uniform(k_val, shape, draws=draws)
    if mode == "at_least_zero_active":
        on = uniform(k_on, shape, draws=draws) < feature_probability
    elif mode == "exactly_one_active":
        idx = jax.random.randint(k_on, (batch_size, 1), 0, n_features)
        on = jax.nn.one_hot(idx, n_features, dtype=bool)
    else:
        msg = f"data mode {mode!r}; allowed: at_least_zero_active, exactly_one_active"
        raise ValueError(msg)
    return jnp.where(on, values, 0.0)


def reference_init(
    target: TMSTarget, *, key: jax.Array, zero_bias: bool, fixed_identity_hidden: bool
) -> dict[str, Any]:
    """The reference's initial TMS params (torch ``nn.Linear`` defaults): weights U(±1/√fan_in),
    the output bias U(±1/√n_hidden) (zero with ``zero_bias``), hidden layers the identity with
    ``fixed_identity_hidden``; W2 = W1ᵀ when tied. Layout as :meth:`TMSTarget.init_params`."""
    cfg = target.config
    shapes = target.site_shapes()
    keys = jax.random.split(key, len(shapes) + 1)
    layers = {}
    for k, (kind, (d_in, d_out)) in zip(keys[:-1], shapes.items(), strict=True):
        bound = 1.0 / d_in**0.5
        layers[kind] = jax.random.uniform(k, (1, d_in, d_out), minval=-bound, maxval=bound)
    if fixed_identity_hidden:
        for kind in target.kinds[1:-1]:
            layers[kind] = jnp.eye(cfg.n_hidden)[None]
    if cfg.tied_weights:
        layers["linear2"] = jnp.swapaxes(layers["linear1"], 1, 2)
    bound = 1.0 / cfg.n_hidden**0.5
    bias = jax.random.uniform(keys[-1], (cfg.n_features,), minval=-bound, maxval=bound)
    return {"layers": layers, "b_final": jnp.zeros_like(bias) if zero_bias else bias}


def pretrain(
    target: TMSTarget,
    *,
    seed: int,
    steps: int = 10_000,
    batch_size: int = 1024,
    lr: float = 5e-3,
    schedule: Literal["constant", "cosine"] = "constant",
    weight_decay: float = 0.01,
    feature_probability: float = 0.05,
    mode: DataMode = "at_least_zero_active",
    zero_bias: bool = False,
    fixed_identity_hidden: bool = False,
) -> tuple[dict[str, Any], float]:
    """Train a TMS model on ``mean (out − x)²`` with AdamW (``weight_decay`` on every trained
    array, as torch's AdamW) at a ``constant`` or ``cosine`` (to 0) lr, from
    :func:`reference_init`; the paper's appendix: 10k steps, constant 5e-3, wd 0.01. With
    ``fixed_identity_hidden`` the hidden layers stay the identity (the +ID models). Deterministic
    from ``seed`` (on one backend). Returns the params (fp32, numpy) and the final loss."""
    cfg = target.config
    init_key, data_key = jax.random.split(jax.random.key(seed))
    full = reference_init(
        target, key=init_key, zero_bias=zero_bias, fixed_identity_hidden=fixed_identity_hidden
    )
    frozen = {"linear2"} if cfg.tied_weights else set()
    if fixed_identity_hidden:
        frozen |= set(target.kinds[1:-1])
    trainable = {k: v for k, v in full["layers"].items() if k not in frozen}
    trainable = {"layers": trainable, "b_final": full["b_final"]}
    rate = lr if schedule == "constant" else optax.cosine_decay_schedule(lr, steps)
    tx = optax.adamw(rate, weight_decay=weight_decay)

    def expand(p: Any) -> Any:
        layers = {**full["layers"], **p["layers"]}
        if cfg.tied_weights:
            layers["linear2"] = jnp.swapaxes(layers["linear1"], 1, 2)
        return {"layers": layers, "b_final": p["b_final"]}

    def loss_fn(p: Any, x: jax.Array) -> jax.Array:
        return jnp.mean(jnp.square(target.forward(expand(p), x) - x))

    @jax.jit
    def run(p: Any) -> tuple[Any, jax.Array]:
        def step(carry: Any, i: jax.Array) -> tuple[Any, jax.Array]:
            p, opt = carry
            x = sparse_features(
                key=jax.random.fold_in(data_key, i),
                batch_size=batch_size,
                n_features=cfg.n_features,
                feature_probability=feature_probability,
                mode=mode,
            )
            loss, grads = jax.value_and_grad(loss_fn)(p, x)
            updates, opt = tx.update(grads, opt, p)
            return (optax.apply_updates(p, updates), opt), loss

        (p, _), losses = jax.lax.scan(step, (p, tx.init(p)), jnp.arange(steps))
        return p, losses[-1]

    trained, last = run(trainable)
    params = jax.tree_util.tree_map(np.asarray, expand(trained))
    return params, float(last)
