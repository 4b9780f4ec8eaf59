"""The residual MLP toy: many ReLUs computed in superposition.

A fixed random embedding E [n_features, d_embed] (unit-norm rows) writes the features into a
residual stream; ``n_layers`` residual MLP layers ``h += ReLU(h @ W_in) @ W_out`` follow (with
``bias``: ``ReLU(h @ W_in + b_in) @ W_out + b_out``); the output is read back with Eᵀ. The target is
trained so that output feature i matches
``x_i + ReLU(x_i)`` (the residual carries x_i, the MLPs must add ReLU(x_i)), with features in
[-1, 1]. Kinds ``mlp_in`` [d_embed, d_mlp] and ``mlp_out`` [d_mlp, d_embed] repeat over the
layers (sites ``layers.{i}.mlp_in`` / ``layers.{i}.mlp_out``), so the decomposition stacks them
and the forwards scan the layers as for Llama. Output recon: MSE.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import optax

from pd_train.targets.base import Linear

__all__ = [
    "ReducedResidMLP",
    "ResidMLPConfig",
    "ResidMLPTarget",
    "pretrain_resid_mlp",
    "reference_cosine",
    "resid_mlp_features",
    "stream_free_forward",
]


@attrs.frozen(kw_only=True)
class ResidMLPConfig:
    """A residual-MLP toy's shape."""

    n_features: int
    d_embed: int
    d_mlp: int
    n_layers: int = 1
    #: Biases b_in, b_out in every layer (the paper's models have none).
    bias: bool = False


@attrs.frozen(kw_only=True)
class ResidMLPTarget:
    """The :class:`~pd_train.targets.Target` of a residual MLP. Params: ``{"embed": [F, d_embed],
    "layers": {"mlp_in": [L, d_embed, d_mlp], "mlp_out": [L, d_mlp, d_embed]}}``, with ``bias``
    also ``"b_in": [L, d_mlp], "b_out": [L, d_embed]`` in ``layers``."""

    config: ResidMLPConfig

    def __attrs_post_init__(self) -> None:
        from pd_train.config.io import ConfigError

        problems = []
        for name in ("n_features", "d_embed", "d_mlp", "n_layers"):
            value = getattr(self.config, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append((f"target.{name}", f"got {value!r}; must be a positive int"))
        if not isinstance(self.config.bias, bool):
            problems.append(("target.bias", f"got {self.config.bias!r}; must be a bool"))
        if problems:
            raise ConfigError(problems)

    @property
    def kinds(self) -> tuple[str, ...]:
        return ("mlp_in", "mlp_out")

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    @property
    def output_loss(self) -> Literal["kl", "mse"]:
        return "mse"

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        c = self.config
        return {"mlp_in": (c.d_embed, c.d_mlp), "mlp_out": (c.d_mlp, c.d_embed)}

    def init_params(self, *, key: jax.Array, dtype: Any = jnp.float32) -> Any:
        """Random unit-norm embedding rows, MLP weights U(±1/√fan_in) (torch's ``nn.Linear``
        default, as the reference), zero biases (with ``bias``)."""
        c = self.config
        k_e, k_in, k_out = jax.random.split(key, 3)
        embed = jax.random.normal(k_e, (c.n_features, c.d_embed))
        embed = embed / jnp.linalg.norm(embed, axis=-1, keepdims=True)
        lim_in, lim_out = 1.0 / c.d_embed**0.5, 1.0 / c.d_mlp**0.5
        shape_in, shape_out = (c.n_layers, c.d_embed, c.d_mlp), (c.n_layers, c.d_mlp, c.d_embed)
        layers = {
            "mlp_in": jax.random.uniform(k_in, shape_in, minval=-lim_in, maxval=lim_in),
            "mlp_out": jax.random.uniform(k_out, shape_out, minval=-lim_out, maxval=lim_out),
        }
        if c.bias:
            layers["b_in"] = jnp.zeros((c.n_layers, c.d_mlp))
            layers["b_out"] = jnp.zeros((c.n_layers, c.d_embed))
        tree = {"embed": embed, "layers": layers}
        return jax.tree_util.tree_map(lambda a: a.astype(dtype), tree)

    def start(self, params: Any, inputs: jax.Array, dtype: Any) -> tuple[jax.Array, Any]:
        return inputs.astype(dtype) @ params["embed"].astype(dtype), None

    def layer(
        self,
        h: jax.Array,
        layer_params: Mapping[str, jax.Array],
        ctx: Any,
        linear: Linear | None = None,
    ) -> jax.Array:
        del ctx

        def plain(kind: str, x: jax.Array, w: jax.Array) -> jax.Array:
            del kind
            return x @ w.astype(x.dtype)

        lin = plain if linear is None else linear
        pre = lin("mlp_in", h, layer_params["mlp_in"])
        if self.config.bias:
            pre = pre + layer_params["b_in"]
        out = lin("mlp_out", jax.nn.relu(pre), layer_params["mlp_out"])
        if self.config.bias:
            out = out + layer_params["b_out"]
        return h + out

    def finish(self, params: Any, h: jax.Array) -> jax.Array:
        return h @ params["embed"].T.astype(h.dtype)

    def reduced_stream(
        self,
        params: Any,
        components: Mapping[str, Mapping[str, jax.Array]] | None,
        *,
        force: bool,
    ) -> tuple[ReducedResidMLP, Any, dict[str, dict[str, jax.Array]] | None] | None:
        """The same model and components with the residual stream in a basis of R ≪ d_embed
        rows (the optional ``reduced_stream`` capability of :mod:`pd_train.targets.base`).

        Everything written to the stream lies in the span of the basis
        B = [E; U_out[0]; W_out[0]; (b_out[0]); U_out[1]; …] [R, d_embed] (R = F + L·(C_out + d_mlp
        (+ 1))): the embedding writes x (the first F coefficients), a layer's mlp_out its
        component activations (U_out's rows), its δ-scaled or frozen ReLU outputs (W_out's rows)
        and its bias. So with the stream held as coefficients h' [B, T, R] (h = h'·B), every
        product of the stream against a matrix w becomes h'·(B·w), with B·w batch-independent:
        mlp_in's W_in and V_in become B·W_in, B·V_in [L, R, ·] (layer l's input holds only E's
        and the earlier layers' coefficients, so only those rows are formed; the later ones are
        zeros); mlp_out's W_out and U_out become selectors of their rows' slots [·, R]; the
        read-off Eᵀ becomes B·Eᵀ [R, F], formed block by block. The
        function, the sites' inputs (x·W_in, x·V_in, ReLU outputs), their CI and the
        gradients to every component are unchanged up to float rounding. (The reduced forward
        compares no stream activations: only the output and the sites' values are the same.)

        ``components`` None: the frozen model's reduced stream (no component slots, for the
        clean forward; the components returned are None). The reduced params' ``basis``
        [R, d_embed] gives the stream back (h = h'·basis); the reduced target's
        ``stream_kinds`` (mlp_in) read it.

        None when not every layer decomposes both kinds, or (unless ``force``) when R is more
        than half of d_embed (the basis products would cost about what they save)."""
        c = self.config
        if components is not None:
            stacks = {k: components.get(k) for k in self.kinds}
            if any(s is None or s["V"].shape[0] != c.n_layers for s in stacks.values()):
                return None
        c_out = 0 if components is None else components["mlp_out"]["U"].shape[1]
        slot = c_out + c.d_mlp + (1 if c.bias else 0)
        width = c.n_features + c.n_layers * slot
        if not force and 2 * width > c.d_embed:
            return None
        dt = params["embed"].dtype if components is None else components["mlp_in"]["V"].dtype
        layers = {k: a.astype(dt) for k, a in params["layers"].items()}
        embed = params["embed"].astype(dt)
        slots = []  # each layer's rows of the basis, in row blocks
        for layer in range(c.n_layers):
            slot_rows = [] if components is None else [components["mlp_out"]["U"][layer]]
            slot_rows.append(layers["mlp_out"][layer])
            if c.bias:
                slot_rows.append(layers["b_out"][layer][None])
            slots.append(slot_rows)
        blocks = [embed, *itertools.chain.from_iterable(slots)]
        basis = jnp.concatenate(blocks, axis=0)  # [R, d_embed]
        starts = [c.n_features + layer * slot for layer in range(c.n_layers)]
        w_sel = jnp.stack([jnp.eye(c.d_mlp, width, s + c_out, dtype=dt) for s in starts])
        reduced_layers = {
            "mlp_in": _causal_products(embed, slots, layers["mlp_in"], width),
            "mlp_out": w_sel,
        }
        if c.bias:
            reduced_layers["b_in"] = layers["b_in"]
            b_at = [s + c_out + c.d_mlp for s in starts]
            reduced_layers["b_out"] = jnp.stack([jnp.eye(1, width, b, dtype=dt)[0] for b in b_at])
        read = jnp.concatenate([block @ embed.T for block in blocks], axis=0)
        reduced_params = {"read": read, "basis": basis, "layers": reduced_layers}
        reduced_components = None
        if components is not None:
            comp_in, comp_out = components["mlp_in"], components["mlp_out"]
            u_sel = jnp.stack([jnp.eye(c_out, width, s, dtype=dt) for s in starts])
            v_in = _causal_products(embed, slots, comp_in["V"], width)
            reduced_components = {
                "mlp_in": {"V": v_in, "U": comp_in["U"]},
                "mlp_out": {"V": comp_out["V"], "U": u_sel},
            }
        reduced = ReducedResidMLP(config=attrs.evolve(c, d_embed=width), n_features=c.n_features)
        return reduced, reduced_params, reduced_components

    def forward(self, params: Any, x: jax.Array) -> jax.Array:
        """The plain model: x [..., n_features] -> out [..., n_features]."""
        h, ctx = self.start(params, x, x.dtype)

        def body(h: jax.Array, layer: Any) -> tuple[jax.Array, None]:
            return self.layer(h, layer, ctx), None

        h, _ = jax.lax.scan(body, h, params["layers"])
        return self.finish(params, h)


def _causal_products(
    embed: jax.Array, slots: list[list[jax.Array]], w: jax.Array, width: int
) -> jax.Array:
    """[L, width, m]: layer l's rows of basis·w[l], the basis being E then each layer's
    ``slots`` (row blocks). Only the rows layer l's input can hold are formed: E's and the
    earlier layers' slots; the rest, which meet zero stream coefficients, are zeros. So a
    layer's product costs only the rows before it, and no gradient flows to a later slot."""
    out = []
    for layer in range(w.shape[0]):
        seen = [embed, *itertools.chain.from_iterable(slots[:layer])]
        rows = jnp.concatenate([block @ w[layer] for block in seen], axis=0)
        out.append(jnp.pad(rows, ((0, width - rows.shape[0]), (0, 0))))
    return jnp.stack(out)


@attrs.frozen(kw_only=True)
class ReducedResidMLP:
    """A :class:`ResidMLPTarget` whose stream holds coefficients in a basis of
    ``config.d_embed`` = R rows (:meth:`ResidMLPTarget.reduced_stream` builds it and its params:
    ``{"read": [R, F], "basis": [R, d_embed], "layers": {"mlp_in": [L, R, d_mlp], "mlp_out": [L, d_mlp, R]}}``, with
    bias also ``"b_in": [L, d_mlp], "b_out": [L, R]``). The layer is the residual MLP's; the
    stream enters as x padded with zeros to R (x on E's rows) and is read off through ``read``
    (B·Eᵀ). Inputs [B, T, F] -> outputs [B, T, F]."""

    config: ResidMLPConfig
    n_features: int

    @property
    def kinds(self) -> tuple[str, ...]:
        return ("mlp_in", "mlp_out")

    @property
    def stream_kinds(self) -> tuple[str, ...]:
        """The kinds whose input is the stream (coefficients on ``params["basis"]``)."""
        return ("mlp_in",)

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    @property
    def output_loss(self) -> Literal["kl", "mse"]:
        return "mse"

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        c = self.config
        return {"mlp_in": (c.d_embed, c.d_mlp), "mlp_out": (c.d_mlp, c.d_embed)}

    def init_params(self, *, key: jax.Array, dtype: Any = jnp.float32) -> Any:
        """Params of the reduced shapes: the residual MLP's layers at width R, a random read."""
        c = self.config
        k_layers, k_read = jax.random.split(key)
        layers = ResidMLPTarget(config=c).init_params(key=k_layers, dtype=dtype)["layers"]
        read = jax.random.normal(k_read, (c.d_embed, self.n_features), dtype)
        return {"read": read, "layers": layers}  # (no basis: its width is the original model's)

    def start(self, params: Any, inputs: jax.Array, dtype: Any) -> tuple[jax.Array, Any]:
        del params
        pad = [(0, 0)] * (inputs.ndim - 1) + [(0, self.config.d_embed - self.n_features)]
        return jnp.pad(inputs.astype(dtype), pad), None

    def layer(
        self,
        h: jax.Array,
        layer_params: Mapping[str, jax.Array],
        ctx: Any,
        linear: Linear | None = None,
    ) -> jax.Array:
        return ResidMLPTarget(config=self.config).layer(h, layer_params, ctx, linear)

    def finish(self, params: Any, h: jax.Array) -> jax.Array:
        return h @ params["read"].astype(h.dtype)


def resid_mlp_features(
    *, key: jax.Array, batch_size: int, n_features: int, feature_probability: float
) -> jax.Array:
    """[batch_size, 1, n_features]: each feature active with ``feature_probability``, value
    U[-1, 1) (at least zero active)."""
    k_on, k_val = jax.random.split(key)
    values = jax.random.uniform(k_val, (batch_size, 1, n_features), minval=-1.0, maxval=1.0)
    on = jax.random.uniform(k_on, (batch_size, 1, n_features)) < feature_probability
    return jnp.where(on, values, 0.0)


def stream_free_forward(
    config: ResidMLPConfig, embed: jax.Array, layers: Mapping[str, jax.Array], x: jax.Array
) -> jax.Array:
    """:meth:`ResidMLPTarget.forward` without the d_embed-wide residual stream, the same function
    (up to float rounding) at a fraction of the cost when the batch is large: the stream is
    ``x E + Σ_k r_k W_out[k]`` (r_k: layer k's ReLU outputs), so layer l's pre-activations are
    ``x (E W_in[l]) + Σ_{k<l} r_k (W_out[k] W_in[l])`` (+ b_in) and the output is
    ``x (E Eᵀ) + Σ_l r_l (W_out[l] Eᵀ)`` (+ Σ_l b_out[l] Eᵀ; a b_out also feeds the later
    layers through ``b_out[k] W_in[l]``). Only [F, d_mlp], [d_mlp, d_mlp] and [d_mlp, F] products
    meet the batch. x [..., F] -> [..., F]."""
    w_in, w_out = layers["mlp_in"], layers["mlp_out"]  # [L, D, M], [L, M, D]
    into = jnp.einsum("fd,ldm->lfm", embed, w_in)
    read = jnp.einsum("lmd,fd->lmf", w_out, embed)
    cross = jnp.einsum("kmd,ldn->klmn", w_out, w_in)  # [L, L, M, M]: W_out[k] W_in[l]
    out = x @ (embed @ embed.T)
    acts: list[jax.Array] = []
    for layer in range(config.n_layers):
        from_earlier = (r @ cross[k, layer] for k, r in enumerate(acts))
        pre = x @ into[layer] + sum(from_earlier, jnp.zeros(()))
        if config.bias:
            pre = pre + layers["b_in"][layer] + layers["b_out"][:layer].sum(0) @ w_in[layer]
        acts.append(jax.nn.relu(pre))
        out = out + acts[layer] @ read[layer]
    if config.bias:
        out = out + layers["b_out"].sum(0) @ embed.T
    return out


def reference_cosine(lr: float, steps: int) -> optax.Schedule:
    """The reference's cosine to 0 (spd's ``get_scheduled_value``, no warmup): step t's lr is
    ``lr · ½(1 + cos(π t / (steps − 1)))``, so the last step's is 0 (optax's
    ``cosine_decay_schedule`` divides by ``steps``); ``steps`` ≤ 1: constant."""
    if steps <= 1:
        return optax.constant_schedule(lr)

    def schedule(t: jax.Array) -> jax.Array:
        progress = jnp.minimum(t, steps - 1) / (steps - 1)
        return lr * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))

    return schedule


def pretrain_resid_mlp(
    target: ResidMLPTarget,
    *,
    seed: int,
    steps: int = 1000,
    batch_size: int = 2048,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    feature_probability: float = 0.01,
) -> tuple[dict[str, Any], float]:
    """Train the MLPs (the embedding stays fixed) on ``mean (out − (x + ReLU(x)))²`` with AdamW
    (``weight_decay``, decoupled and scaled by the lr as torch's) and a cosine schedule to 0
    (:func:`reference_cosine`), as the paper's appendix (wd 0.01, lr 3e-3, batch 2048; the
    reference's scripts: 1000 steps for 1 and 2 layers, 10k for 3), deterministic from
    ``seed``. Returns params (numpy) and final loss."""
    init_key, data_key = jax.random.split(jax.random.key(seed))
    full = target.init_params(key=init_key)
    embed = full["embed"]
    tx = optax.adamw(reference_cosine(lr, steps), weight_decay=weight_decay)
    n = target.config.n_features

    def loss_fn(layers: Any, embed: jax.Array, x: jax.Array) -> jax.Array:
        out = stream_free_forward(target.config, embed, layers, x)
        return jnp.mean(jnp.square(out - (x + jax.nn.relu(x))))

    @jax.jit
    def run(layers: Any, embed: jax.Array) -> tuple[Any, jax.Array]:
        def step(carry: Any, i: jax.Array) -> tuple[Any, jax.Array]:
            p, opt = carry
            x = resid_mlp_features(
                key=jax.random.fold_in(data_key, i),
                batch_size=batch_size,
                n_features=n,
                feature_probability=feature_probability,
            )
            loss, grads = jax.value_and_grad(loss_fn)(p, embed, x)
            updates, opt = tx.update(grads, opt, p)
            return (optax.apply_updates(p, updates), opt), loss

        (p, _), losses = jax.lax.scan(step, (layers, tx.init(layers)), jnp.arange(steps))
        return p, losses[-1]

    layers, last = run(full["layers"], embed)  # embed an argument: no constant folding
    params = jax.tree_util.tree_map(np.asarray, {"embed": embed, "layers": layers})
    return params, float(last)
