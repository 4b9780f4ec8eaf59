"""Initializers: frozen value objects, so that equal initializers put arrays in one shape group."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, ClassVar, TypeAlias

import attrs
import jax
import jax.numpy as jnp
import numpy as np

Shape: TypeAlias = tuple[int, ...]
InitFunction: TypeAlias = Callable[[jax.Array, Shape, Any], jax.Array]


@attrs.frozen(kw_only=True)
class Normal:
    """Draw from N(mean, std²): ``mean + std * jax.random.normal(key, shape, dtype)``."""

    std: float = attrs.field(default=1.0, converter=float)
    mean: float = attrs.field(default=0.0, converter=float)

    def __call__(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        draw = jax.random.normal(key, shape, dtype)
        return draw * jnp.asarray(self.std, dtype) + jnp.asarray(self.mean, dtype)

    def label(self) -> str:
        return f"normal(mean={self.mean}, std={self.std})"

    floating_only: ClassVar[bool] = True


@attrs.frozen(kw_only=True)
class Uniform:
    """Draw from U[low, high): ``jax.random.uniform(key, shape, dtype, low, high)``."""

    low: float = attrs.field(default=0.0, converter=float)
    high: float = attrs.field(default=1.0, converter=float)

    def __attrs_post_init__(self) -> None:
        if not self.low < self.high:
            msg = f"Uniform: low must be below high, got low={self.low}, high={self.high}"
            raise ValueError(msg)

    def __call__(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=self.low, maxval=self.high)

    def label(self) -> str:
        return f"uniform(low={self.low}, high={self.high})"

    floating_only: ClassVar[bool] = True


@attrs.frozen(kw_only=True)
class Zeros:
    """All zeros (the key is not used)."""

    def __call__(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        del key
        return jnp.zeros(shape, dtype)

    def label(self) -> str:
        return "zeros"

    floating_only: ClassVar[bool] = False


@attrs.frozen
class Custom:
    """A user function ``fn(key, shape, dtype) -> array of that shape and dtype``.

    Two ``Custom`` initializers are equal only when they wrap the very same function object, so
    arrays share a shape group only if their specs pass the same ``fn``. ``fn`` must be traceable
    by ``jax.jit``, ``jax.lax.map`` and ``jax.vmap`` (no Python control flow on the key's values).
    """

    fn: InitFunction = attrs.field(eq=attrs.cmp_using(eq=operator.is_), hash=False)

    def __hash__(self) -> int:
        return id(self.fn)

    def __call__(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        return self.fn(key, shape, dtype)

    def label(self) -> str:
        return f"custom({getattr(self.fn, '__qualname__', type(self.fn).__name__)})"

    floating_only: ClassVar[bool] = False


Initializer: TypeAlias = Normal | Uniform | Zeros | Custom
INITIALIZER_TYPES = (Normal, Uniform, Zeros, Custom)


def to_initializer(value: Initializer | InitFunction) -> Initializer:
    """Accept an initializer, or wrap a bare ``fn(key, shape, dtype)`` in :class:`Custom`."""
    if isinstance(value, INITIALIZER_TYPES):
        return value
    if callable(value):
        return Custom(value)
    msg = (
        f"init must be Normal, Uniform, Zeros, Custom or a function (key, shape, dtype) -> array, "
        f"got {value!r}"
    )
    raise TypeError(msg)


def is_supported_dtype(init: Initializer, dtype: np.dtype) -> bool:
    """Whether ``init`` can produce ``dtype`` (floating for random draws; numeric otherwise)."""
    if init.floating_only:
        return bool(jnp.issubdtype(dtype, jnp.floating))
    return bool(
        jnp.issubdtype(dtype, jnp.floating)
        or jnp.issubdtype(dtype, jnp.integer)
        or jnp.issubdtype(dtype, jnp.bool_)
    )
