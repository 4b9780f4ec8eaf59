"""ZeRO-1 layout: rules from an array's role to its PartitionSpec."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import jax
from jax.sharding import NamedSharding, PartitionSpec

from pd_sharding._errors import ShardingError
from pd_sharding._mesh import DATA_AXES, AnyMesh, axis_sizes
from pd_sharding._spec import check_spec, divisibility_message, entry_size

P = PartitionSpec
Shape = Sequence[int]
REPLICATE = "replicate"
"""Value of a :meth:`Zero1Layout.ci_params` rule that keeps a leaf whole on every device."""


def path_name(path: Any) -> str:
    """A pytree key path as a dotted name: ``('ci', 'q_proj', 'w1')`` → ``"ci.q_proj.w1"``."""
    return jax.tree_util.keystr(path, simple=True, separator=".")


class Zero1Layout:
    """Where each array role lives on a ``("replicate", "data", "tensor")`` mesh.

    Every method takes a shape and a ``name`` (used in errors only) and returns a
    :class:`~jax.sharding.NamedSharding`; ``.spec`` of it is the PartitionSpec. "Data axes" means
    the PartitionSpec entry ``("replicate", "data")``: the dim is cut into replicate × data pieces.
    Leading dims before the ones a rule names (e.g. a stacked layer axis) stay unsharded. A dim the
    axes do not divide raises :class:`ShardingError`; nothing falls back to replication.

    ==========================  ===================  =========================================
    role                        shape                rule
    ==========================  ===================  =========================================
    :meth:`v`                   ``[..., d_in, C]``   d_in over data axes, C over tensor if > 1
    :meth:`u`                   ``[..., C, d_out]``  d_out over data axes, C over tensor if > 1
    :meth:`ci_params` (leaf)    ``[L, ...]``         largest divisible non-leading dim over data
    :meth:`target_weight`       ``[..., d_in, d_out]``  the hidden_size dim over data (FSDP)
    :meth:`embedding`           ``[vocab, hidden]``  hidden over data axes
    :meth:`lm_head`             ``[hidden, vocab]``  hidden over data axes
    :meth:`norm`                any                  replicated
    :meth:`batch`               ``[B, ...]``         B over data axes
    ==========================  ===================  =========================================

    Masters of V/U and CI params are the params themselves (fp32); their Adam moments mirror
    them (:func:`opt_state_shardings`). ``factor_dim="components"`` shards V and U on C instead
    (over data axes, plus tensor when tensor > 1).

    ``mesh`` may be an :class:`~jax.sharding.AbstractMesh` for estimates without devices; the
    constraint helpers and placement need a real :class:`~jax.sharding.Mesh`.
    """

    def __init__(
        self, mesh: AnyMesh, *, factor_dim: Literal["model", "components"] = "model"
    ) -> None:
        if factor_dim not in ("model", "components"):
            msg = f"Zero1Layout: factor_dim={factor_dim!r} must be 'model' or 'components'"
            raise ValueError(msg)
        self.mesh = mesh
        self.sizes = axis_sizes(mesh)
        self.factor_dim = factor_dim
        self.data: tuple[str, ...] = DATA_AXES
        self.tensor: str | None = "tensor" if self.sizes["tensor"] > 1 else None
        self._components: tuple[str, ...] = DATA_AXES + (("tensor",) if self.tensor else ())

    def __repr__(self) -> str:
        return f"Zero1Layout({self.sizes}, factor_dim={self.factor_dim!r})"

    @property
    def data_size(self) -> int:
        """replicate × data: how many pieces a dim sharded over the data axes is cut into."""
        return entry_size(self.data, self.sizes)

    # -- building blocks ---------------------------------------------------------------------

    def named(self, shape: Shape, spec: PartitionSpec, *, name: str) -> NamedSharding:
        """``NamedSharding(mesh, spec)`` after checking ``spec`` fits ``shape``."""
        check_spec(shape, spec, self.sizes, name=name)
        return NamedSharding(self.mesh, spec)

    def replicated(self) -> NamedSharding:
        """Whole on every device (scalars such as optimizer step counts)."""
        return NamedSharding(self.mesh, P())

    def _rank(self, shape: Shape, least: int, *, name: str, role: str, layout: str) -> int:
        if len(shape) < least:
            msg = f"{name}: {role} expects shape {layout}, got {tuple(shape)}"
            raise ShardingError(msg)
        return len(shape) - least

    # -- roles -------------------------------------------------------------------------------

    def v(self, shape: Shape, *, name: str) -> NamedSharding:
        """Component factor V ``[..., d_in, C]`` (leading dims, e.g. layers, unsharded)."""
        lead = self._rank(shape, 2, name=name, role="V", layout="[..., d_in, C]")
        if self.factor_dim == "model":
            spec = P(*([None] * lead), self.data, self.tensor)
        else:
            spec = P(*([None] * lead), None, self._components)
        return self.named(shape, spec, name=name)

    def u(self, shape: Shape, *, name: str) -> NamedSharding:
        """Component factor U ``[..., C, d_out]`` (leading dims, e.g. layers, unsharded)."""
        lead = self._rank(shape, 2, name=name, role="U", layout="[..., C, d_out]")
        if self.factor_dim == "model":
            spec = P(*([None] * lead), self.tensor, self.data)
        else:
            spec = P(*([None] * lead), self._components, None)
        return self.named(shape, spec, name=name)

    def ci_params(
        self,
        tree: Any,
        *,
        name: str = "ci",
        stacked: bool = True,
        rules: Mapping[str, PartitionSpec | str] | None = None,
    ) -> Any:
        """Shardings for a pytree of CI-function params (arrays or ShapeDtypeStructs).

        Each leaf's largest non-leading dim that the data axes divide is sharded over them (the
        first such dim on ties; with ``stacked=False`` dim 0 counts too). ``rules`` maps a leaf's
        dotted path inside ``tree`` (``"q_proj.w1"``) to a PartitionSpec or to ``"replicate"``;
        a leaf with no divisible dim and no rule is an error, as is a rule that matches no leaf.
        """
        rules = dict(rules or {})
        used: set[str] = set()

        def one(path: Any, leaf: Any) -> NamedSharding:
            key = path_name(path)
            full = f"{name}.{key}" if key else name
            shape = tuple(leaf.shape)
            if key in rules:
                used.add(key)
                rule = rules[key]
                if isinstance(rule, str):
                    if rule != REPLICATE:
                        msg = f"{name}: rule for {key!r} is {rule!r}; use a PartitionSpec or 'replicate'"
                        raise ShardingError(msg)
                    return self.replicated()
                return self.named(shape, rule, name=full)
            start = 1 if stacked else 0
            dims = [d for d in range(start, len(shape)) if shape[d] % self.data_size == 0]
            if not dims:
                raise ShardingError(self._no_dim_message(full, key, shape, start))
            best = max(dims, key=lambda d: (shape[d], -d))
            spec = P(*[self.data if d == best else None for d in range(len(shape))])
            return self.named(shape, spec, name=full)

        out = jax.tree_util.tree_map_with_path(one, tree)
        unused = sorted(set(rules) - used)
        if unused:
            paths = [path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
            msg = f"{name}: rules {unused} match no leaf; leaves are {paths}"
            raise ShardingError(msg)
        return out

    def _no_dim_message(self, full: str, key: str, shape: tuple[int, ...], start: int) -> str:
        hint = f" or add rules={{{key!r}: 'replicate'}} to keep it whole"
        if len(shape) <= start:
            return (
                f"cannot shard {full} of shape {shape}: it has no non-leading dim to shard over "
                f"data axes {self.data} of size {self.data_size};{hint}"
            )
        largest = max(range(start, len(shape)), key=lambda d: shape[d])
        return (
            divisibility_message(full, shape, largest, self.data, self.sizes)
            + f" No non-leading dim of it is a multiple of {self.data_size}; resize one{hint}."
        )

    def target_weight(self, shape: Shape, *, name: str, hidden_size: int) -> NamedSharding:
        """Frozen target weight ``[..., d_in, d_out]``: FSDP on the dim of size ``hidden_size``.

        d_in is preferred when both are hidden_size (q_proj, o_proj); k/v/gate/up shard d_in,
        down_proj ``[d_ff, hidden]`` shards d_out.
        """
        lead = self._rank(shape, 2, name=name, role="target weight", layout="[..., d_in, d_out]")
        if shape[-2] == hidden_size:
            spec = P(*([None] * lead), self.data, None)
        elif shape[-1] == hidden_size:
            spec = P(*([None] * lead), None, self.data)
        else:
            msg = (
                f"{name}: target weight of shape {tuple(shape)} has neither d_in nor d_out equal "
                f"to hidden_size={hidden_size}; the FSDP rule shards the hidden_size dim"
            )
            raise ShardingError(msg)
        return self.named(shape, spec, name=name)

    def embedding(self, shape: Shape, *, name: str) -> NamedSharding:
        """Token embedding ``[vocab, hidden]``: hidden over the data axes."""
        self._exact_rank(shape, name=name, role="embedding", layout="[vocab, hidden]")
        return self.named(shape, P(None, self.data), name=name)

    def lm_head(self, shape: Shape, *, name: str) -> NamedSharding:
        """LM head ``[hidden, vocab]``: hidden over the data axes."""
        self._exact_rank(shape, name=name, role="lm_head", layout="[hidden, vocab]")
        return self.named(shape, P(self.data, None), name=name)

    def norm(self, shape: Shape, *, name: str) -> NamedSharding:
        """Norm scales (small vectors, any shape, e.g. ``[L, hidden]``): replicated by rule."""
        return self.named(shape, P(), name=name)

    def batch(self, shape: Shape, *, name: str = "batch") -> NamedSharding:
        """A batch ``[B, ...]`` (token ids ``[B, T]``): B over the data axes."""
        self._rank(shape, 1, name=name, role="batch", layout="[B, ...]")
        return self.named(shape, P(self.data), name=name)

    def _exact_rank(self, shape: Shape, *, name: str, role: str, layout: str) -> None:
        if len(shape) != 2:
            msg = f"{name}: {role} expects shape {layout}, got {tuple(shape)}"
            raise ShardingError(msg)

    # -- activation constraints inside jit ----------------------------------------------------

    def constrain_batch(self, x: jax.Array, *, name: str = "activations") -> jax.Array:
        """``x [B, ...]`` constrained to B over the data axes (inside jit)."""
        return jax.lax.with_sharding_constraint(x, self.batch(x.shape, name=name))

    def constrain_component_acts(self, x: jax.Array, *, name: str = "x@V") -> jax.Array:
        """``x@V [B, ..., C]``: B over the data axes, C over tensor when tensor > 1 (inside jit)."""
        lead = self._rank(x.shape, 2, name=name, role="component activations", layout="[B, ..., C]")
        spec = P(self.data, *([None] * lead), self.tensor)
        return jax.lax.with_sharding_constraint(x, self.named(x.shape, spec, name=name))
