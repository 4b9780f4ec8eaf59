"""Array specs and their validation."""

from __future__ import annotations

import math
from typing import Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, Sharding, SingleDeviceSharding

from pd_init._errors import InitSpecError
from pd_init._initializers import Initializer, Normal, is_supported_dtype, to_initializer


def _to_shape(value: Any) -> tuple[int, ...]:
    try:
        return tuple(value)
    except TypeError:
        # A bare int: let validation name the array and say what is allowed.
        return value  # type: ignore[no-any-return]


@attrs.frozen(kw_only=True)
class ArraySpec:
    """One named array to initialize.

    Args:
        name: unique name; the array's key is derived from it (see ``pd_init`` docs).
        shape: the array's shape, e.g. ``(d_in, C)``.
        dtype: a floating dtype for ``Normal``/``TruncatedNormal``/``Uniform``; any numeric dtype for ``Zeros`` and
            ``Custom``. 64-bit dtypes need ``jax_enable_x64``.
        init: ``Normal``, ``TruncatedNormal``, ``Uniform``, ``Zeros``, ``Custom`` or a bare function
            ``fn(key, shape, dtype) -> array`` (wrapped in ``Custom``).
        sharding: the array's target sharding (``NamedSharding`` or ``SingleDeviceSharding``),
            or None for JAX's default placement.
        group: name of the stacked group this array joins; arrays without one are grouped by
            (shape, dtype, init).
    """

    name: str
    shape: tuple[int, ...] = attrs.field(converter=_to_shape)
    dtype: Any = jnp.float32
    init: Initializer = attrs.field(default=Normal(), converter=to_initializer)
    sharding: Sharding | None = None
    group: str | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            msg = f"ArraySpec.name must be a non-empty string, got {self.name!r}"
            raise InitSpecError(msg)
        where = f"array {self.name!r}"
        if not isinstance(self.shape, tuple) or not all(
            isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0
            for d in self.shape
        ):
            msg = f"{where}: shape must be a tuple of non-negative ints, got {self.shape!r}"
            raise InitSpecError(msg)
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", _check_dtype(where, self.dtype, self.init))
        if self.group is not None and (not isinstance(self.group, str) or not self.group):
            msg = f"{where}: group must be a non-empty string or None, got {self.group!r}"
            raise InitSpecError(msg)
        if self.sharding is not None:
            check_sharding(where, self.sharding, self.shape)


def _check_dtype(where: str, dtype: Any, init: Initializer) -> np.dtype:
    try:
        normalized = jnp.dtype(dtype)
    except TypeError:
        normalized = None
    if normalized is None or not is_supported_dtype(init, normalized):
        allowed = "a floating dtype" if init.floating_only else "a numeric or bool dtype"
        msg = f"{where}: dtype {dtype!r} is not supported by {init.label()}; use {allowed}"
        raise InitSpecError(msg)
    if normalized.itemsize == 8 and not jax.config.jax_enable_x64:  # type: ignore[attr-defined]
        msg = (
            f"{where}: dtype {normalized} needs jax_enable_x64 (JAX would silently give "
            f"{jnp.dtype(normalized.kind + '4')}); enable x64 or use a 32-bit dtype"
        )
        raise InitSpecError(msg)
    problem = init.check_dtype(normalized)
    if problem is not None:
        msg = f"{where}: {init.label()} cannot draw {normalized.name}: {problem}"
        raise InitSpecError(msg)
    return normalized


def check_sharding(where: str, sharding: Sharding, shape: tuple[int, ...]) -> None:
    """Raise unless every sharded dimension of ``shape`` is divisible by its mesh axes."""
    if isinstance(sharding, SingleDeviceSharding):
        return
    if not isinstance(sharding, NamedSharding):
        msg = (
            f"{where}: sharding must be a NamedSharding or SingleDeviceSharding, "
            f"got {type(sharding).__name__}"
        )
        raise InitSpecError(msg)
    spec = tuple(sharding.spec)
    if len(spec) > len(shape):
        msg = (
            f"{where}: sharding spec {sharding.spec} has {len(spec)} entries but the array has "
            f"{len(shape)} dimensions {shape}"
        )
        raise InitSpecError(msg)
    mesh_shape = dict(sharding.mesh.shape)
    for dim, (size, entry) in enumerate(zip(shape, spec, strict=False)):
        if entry is None:
            continue
        axes = (entry,) if isinstance(entry, str) else tuple(entry)
        unknown = [a for a in axes if a not in mesh_shape]
        if unknown:
            msg = (
                f"{where}: sharding spec {sharding.spec} names mesh axes {unknown} that the mesh "
                f"does not have (axes: {list(mesh_shape)})"
            )
            raise InitSpecError(msg)
        ways = math.prod(mesh_shape[a] for a in axes)
        if size % ways:
            msg = (
                f"{where}: dimension {dim} of shape {shape} has size {size}, which mesh axes "
                f"{axes} ({ways} ways) do not divide; shard a divisible dimension or replicate it"
            )
            raise InitSpecError(msg)
