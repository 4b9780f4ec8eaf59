"""The CI-function interface the step relies on, and what the per-site functions share.

A CI function maps what the clean (frozen) forward sees at each decomposed site to CI
pre-activations [B, T, C] per site; :mod:`pd_train.squash` turns those into ``ci_lower`` and
``ci_upper``. The step asks a CI function three things:

- :meth:`CIFunction.arrays`: its parameters as pd-init members — each with a name (its key
  derives from it), a per-member shape and initializer, and the ``path`` of the stack it belongs
  to in ``params["ci_fn"]`` (pd-init group ``"ci_fn." + ".".join(path)``; members of one path
  are stacked in the order listed). Per-site functions stack per kind (path ``(kind, name)``,
  ``[n_k, ...]``), the transformers per chunk (path ``("in_w",)``, ``[n_chunks, ...]``).
- :meth:`CIFunction.sharding_rules`: rules for :meth:`pd_sharding.Zero1Layout.ci_params` (which
  shards every other leaf's largest divisible non-leading dim over the data axes).
- :meth:`CIFunction.causal_importance`: given a :class:`CleanRun` — a handle that runs the clean
  forward and hands the CI function every site's input — the clean logits and the CI
  pre-activations ``{kind: [n_k, B, T, C]}``.

:meth:`CIFunction.check` raises :class:`~pd_train.config.pd.ConfigError` (field paths) for a
decomposition the function cannot serve, before anything compiles.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import attrs
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

import pd_init
from pd_train.config.io import ConfigError
from pd_train.decomposition import Decomposition, KindLayout, site_name

__all__ = [
    "CIArray",
    "CIFunction",
    "CleanRun",
    "ParamSpec",
    "SiteCIFunction",
    "SiteFn",
    "gelu",
]

#: ``site_fn(kind, x [B, T, d_in], site_xs) -> y``: called on every decomposed site of the clean
#: forward; ``site_xs`` is that site's slice of the ``site_xs`` tree passed to ``CleanRun.run``.
SiteFn = Callable[[str, jax.Array, Any], Any]

#: The exact (erf) GELU, as the reference implementations use (not jax's tanh default).
gelu = functools.partial(jax.nn.gelu, approximate=False)


class CleanRun(Protocol):
    """Runs the frozen target once (the step builds it)."""

    def run(self, site_fn: SiteFn, site_xs: Mapping[str, Any]) -> tuple[jax.Array, dict[str, Any]]:
        """Clean logits [B, T, vocab] and ``{kind: stacked site_fn outputs [n_k, ...]}``.

        ``site_xs[kind]`` is a tree of arrays with leading axis n_k (the kind's stack); the
        site inputs given to ``site_fn`` carry no gradient (the target is frozen).
        """
        ...


@attrs.frozen(kw_only=True)
class CIArray:
    """One CI parameter array as a pd-init member.

    ``name``: its pd-init name (``layers.3.mlp.down_proj.ci_fn.w0``); ``path``: where its stack
    lives in ``params["ci_fn"]`` (``("down_proj", "w0")``); ``shape``: the member's shape, without
    the stack axis; ``init``: its initializer.
    """

    name: str
    path: tuple[str, ...]
    shape: tuple[int, ...]
    init: pd_init.Initializer

    @property
    def group(self) -> str:
        """The pd-init group: ``ci_fn.`` + the dotted path."""
        return "ci_fn." + ".".join(self.path)


@attrs.frozen(kw_only=True)
class ParamSpec:
    """One per-site parameter of a site-local CI function: shape (no stack axis), initializer."""

    shape: tuple[int, ...]
    init: pd_init.Initializer


class CIFunction(Protocol):
    """The interface the step relies on (see the module docstring)."""

    def arrays(self, decomposition: Decomposition) -> list[CIArray]:
        """Every parameter array, members of one path in stack order."""
        ...

    def sharding_rules(self, decomposition: Decomposition) -> dict[str, PartitionSpec | str]:
        """``Zero1Layout.ci_params`` rules by dotted path (``{}``: the default rule for all)."""
        ...

    def check(self, decomposition: Decomposition, *, path: str = "pd.ci") -> None:
        """Raise ConfigError (field paths) if this function cannot serve ``decomposition``."""
        ...

    def causal_importance(
        self,
        params: Mapping[str, Any],
        components: Mapping[str, Mapping[str, jax.Array]],
        clean: CleanRun,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Clean logits [B, T, vocab] and CI pre-activations ``{kind: [n_k, B, T, C]}`` (fp32).

        ``params``: the stacks of :meth:`arrays` as a nested dict by path; ``components[kind]``:
        {"V": [n_k, d_in, C], "U": [n_k, C, d_out]} in the compute dtype.
        """
        ...


def he(fan_in: int) -> pd_init.Normal:
    """N(0, 2/fan_in): the Kaiming init for a layer followed by a ReLU-like nonlinearity."""
    return pd_init.Normal(std=(2.0 / fan_in) ** 0.5)


def lecun(fan_in: int) -> pd_init.Normal:
    """N(0, 1/fan_in): a linear layer."""
    return pd_init.Normal(std=(1.0 / fan_in) ** 0.5)


class SiteCIFunction:
    """Base of the site-local CI functions: one small network per site, its parameters stacked
    per kind (path ``(kind, name)``, named ``{site}.ci_fn.{name}``), run inside the clean layer
    scan through ``clean.run``. Subclasses define :meth:`param_specs` and :meth:`site_fn`."""

    remat: bool
    #: Whether the function reads a site only through its component activations x@V (then a
    #: lookup site, ``embed_tokens``, serves it with ``V[tokens]``); False: it reads the site
    #: input x itself, which a lookup site does not have as a vector.
    reads_inner_only: ClassVar[bool] = False

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        """Per-site parameters of one kind (stacked to ``[n_k, *shape]``)."""
        raise NotImplementedError

    def site_fn(self, params: Mapping[str, jax.Array], x: jax.Array, V: jax.Array) -> jax.Array:
        """One site: its params, input x [B, T, d_in] and V [d_in, C] -> [B, T, C] (fp32)."""
        raise NotImplementedError

    def arrays(self, decomposition: Decomposition) -> list[CIArray]:
        out = []
        for layout in decomposition.kinds:
            specs = self.param_specs(layout)
            for layer in layout.layers:
                site = site_name(layer, layout.kind)
                for pname, ps in specs.items():
                    out.append(
                        CIArray(
                            name=f"{site}.ci_fn.{pname}",
                            path=(layout.kind, pname),
                            shape=ps.shape,
                            init=ps.init,
                        )
                    )
        return out

    def sharding_rules(self, decomposition: Decomposition) -> dict[str, PartitionSpec | str]:
        del decomposition
        return {}

    def check(self, decomposition: Decomposition, *, path: str = "pd.ci") -> None:
        if "embed_tokens" in decomposition.kind_names and not self.reads_inner_only:
            msg = (
                f"{type(self).__name__} reads each site's input x, but embed_tokens is a lookup "
                "into V's rows (its input is a token id, not a vector); decompose embed_tokens "
                "with pd.ci.type: mlp (it reads x@V = V[token]), or leave it out"
            )
            raise ConfigError([(f"{path}.type", msg)])

    def causal_importance(
        self,
        params: Mapping[str, Any],
        components: Mapping[str, Mapping[str, jax.Array]],
        clean: CleanRun,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        apply = jax.checkpoint(self.site_fn) if self.remat else self.site_fn

        def site_fn(kind: str, x: jax.Array, xs: Any) -> jax.Array:
            del kind
            return apply(xs["params"], x, xs["V"])

        site_xs = {k: {"params": params[k], "V": components[k]["V"]} for k in params}
        return clean.run(site_fn, site_xs)


def site_inner(x: jax.Array, V: jax.Array) -> jax.Array:
    """A site's component activations [B, T, C]: ``x @ V`` (x [B, T, d_in]), or ``V[x]`` at a
    lookup site (x: tokens [B, T] int, V [vocab, C])."""
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.take(V, x, axis=0)
    return x @ V


def rms_normalize(x: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x², -1) + eps) in fp32, cast back to x's dtype (no learned scale)."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return y.astype(x.dtype)
