"""Initializers: frozen value objects, so that equal initializers put arrays in one shape group."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from typing import Any, ClassVar, TypeAlias

import attrs
import jax
import jax.numpy as jnp
import numpy as np

Shape: TypeAlias = tuple[int, ...]
InitFunction: TypeAlias = Callable[[jax.Array, Shape, Any], jax.Array]


def opaque(dtype: Any, *values: float) -> tuple[jax.Array, ...]:
    """``values`` as scalars of ``dtype`` that XLA cannot see through (an optimization barrier).

    Every built-in initializer passes its parameters (and the constants it derives from them)
    through this before any arithmetic. XLA's algebraic simplifier rewrites floating-point
    arithmetic on *visible* constants in ways that are not exact (it reassociates
    ``(x + c1) + c2`` into ``x + (c1 + c2)``, folds ``x * c1 * c2`` into ``x * (c1 * c2)``), and
    whether a constant is visible depends on where the draw is compiled: straight-line code sees
    it, a loop body may receive it as a hoisted loop-invariant value. Behind the barrier no
    parameter is ever a constant, so the same draw compiles to the same arithmetic everywhere.
    """
    dtype = jnp.dtype(dtype)
    arrays = tuple(jnp.asarray(np.asarray(v, dtype=np.float64).astype(dtype)) for v in values)
    return tuple(jax.lax.optimization_barrier(arrays))


def _unit_uniform(key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
    """U[0, 1) in ``dtype``: random mantissa bits with exponent 0, minus 1.

    Every float operation here is exact (``f - 1`` for ``f`` in [1, 2), then JAX's ``* 1 + 0``
    and ``max(0, .)``), so no rewrite XLA may apply to them can change a bit.
    """
    return jax.random.uniform(key, shape, dtype)


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _jitted_draw(init: Any, key: jax.Array, shape: Shape, dtype: np.dtype) -> jax.Array:
    """One jit around a built-in draw, as ``jax.random.normal`` has: called outside jit, the draw
    runs as one compiled program (the same arithmetic as inside any other jit), not op by op."""
    return init.draw(key, shape, dtype)  # type: ignore[no-any-return]


def _float(value: Any) -> float:
    """A real number as ``float``, with -0.0 made 0.0 (they compare equal, so must draw equally).

    bools and strings are refused rather than read as numbers.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        msg = f"expected a real number, got {type(value).__name__} {value!r}"
        raise TypeError(msg)
    return float(value) + 0.0


def _check_params(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not math.isfinite(value):
            msg = f"{owner}: {name} must be a finite number, got {value}"
            raise ValueError(msg)


def _in_dtype(value: float, dtype: Any) -> float:
    with np.errstate(over="ignore"):  # an overflow gives inf, which the callers report
        return float(np.asarray(value, dtype=np.float64).astype(jnp.dtype(dtype)))


@attrs.frozen(kw_only=True)
class Normal:
    """Draw from N(mean, std²): ``mean + std * z`` with ``z`` a standard normal draw.

    ``z = sqrt(2) * erf_inv(u)`` with ``u`` uniform on (-1, 1), as ``jax.random.normal`` draws
    it; ``sqrt(2) * std`` is rounded once to ``dtype``. ``std`` must be finite and >= 0.
    """

    std: float = attrs.field(default=1.0, converter=_float)
    mean: float = attrs.field(default=0.0, converter=_float)

    def __attrs_post_init__(self) -> None:
        _check_params("Normal", std=self.std, mean=self.mean)
        if self.std < 0:
            msg = f"Normal: std must be >= 0, got std={self.std}"
            raise ValueError(msg)

    def __call__(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        return _jitted_draw(self, key, tuple(shape), jnp.dtype(dtype))

    def draw(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        return self.from_unit(_unit_uniform(key, shape, dtype), dtype)

    def from_unit(self, unit: jax.Array, dtype: Any) -> jax.Array:
        """The values, elementwise, from ``unit``: U[0, 1) as ``jax.random.uniform`` draws it."""
        lo = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype), dtype=dtype)
        lo, hi, scale, mean = opaque(dtype, float(lo), 1.0, math.sqrt(2.0) * self.std, self.mean)
        u = jnp.maximum(lo, unit * (hi - lo) + lo)
        return jax.lax.erf_inv(u) * scale + mean

    def check_dtype(self, dtype: Any) -> str | None:
        big = _in_dtype(math.sqrt(2.0) * self.std, dtype), _in_dtype(self.mean, dtype)
        if not all(math.isfinite(v) for v in big):
            return f"sqrt(2)*std or mean overflows {jnp.dtype(dtype).name}"
        return None

    def label(self) -> str:
        return f"normal(mean={self.mean}, std={self.std})"

    floating_only: ClassVar[bool] = True


@attrs.frozen(kw_only=True)
class TruncatedNormal:
    """Draw from N(mean, std²) truncated to [mean + lower·std, mean + upper·std].

    ``lower`` and ``upper`` are in units of ``std`` (default ±2, the usual truncated-normal
    init). As ``jax.random.truncated_normal``: ``z = sqrt(2) * erf_inv(u)`` with ``u`` uniform
    between ``erf(lower/sqrt(2))`` and ``erf(upper/sqrt(2))`` (computed in float64), clipped to
    the open interval (lower, upper); the result is ``z * std + mean``.
    """

    std: float = attrs.field(default=1.0, converter=_float)
    mean: float = attrs.field(default=0.0, converter=_float)
    lower: float = attrs.field(default=-2.0, converter=_float)
    upper: float = attrs.field(default=2.0, converter=_float)

    def __attrs_post_init__(self) -> None:
        _check_params(
            "TruncatedNormal", std=self.std, mean=self.mean, lower=self.lower, upper=self.upper
        )
        if self.std < 0:
            msg = f"TruncatedNormal: std must be >= 0, got std={self.std}"
            raise ValueError(msg)
        if not self.lower < self.upper:
            msg = (
                f"TruncatedNormal: lower must be below upper, got lower={self.lower}, "
                f"upper={self.upper}"
            )
            raise ValueError(msg)

    def __call__(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        return _jitted_draw(self, key, tuple(shape), jnp.dtype(dtype))

    def draw(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        return self.from_unit(_unit_uniform(key, shape, dtype), dtype)

    def from_unit(self, unit: jax.Array, dtype: Any) -> jax.Array:
        """The values, elementwise, from ``unit``: U[0, 1) as ``jax.random.uniform`` draws it."""
        sqrt2 = math.sqrt(2.0)
        lo = np.nextafter(np.array(self.lower, dtype), np.array(np.inf, dtype), dtype=dtype)
        hi = np.nextafter(np.array(self.upper, dtype), np.array(-np.inf, dtype), dtype=dtype)
        a, b, root2, clip_lo, clip_hi, std, mean = opaque(
            dtype,
            math.erf(self.lower / sqrt2),
            math.erf(self.upper / sqrt2),
            sqrt2,
            float(lo),
            float(hi),
            self.std,
            self.mean,
        )
        u = jnp.maximum(a, unit * (b - a) + a)
        z = jnp.minimum(jnp.maximum(jax.lax.erf_inv(u) * root2, clip_lo), clip_hi)
        return z * std + mean

    def check_dtype(self, dtype: Any) -> str | None:
        values = [_in_dtype(v, dtype) for v in (self.std, self.mean, self.lower, self.upper)]
        if not all(math.isfinite(v) for v in values):
            return f"std, mean, lower or upper overflows {jnp.dtype(dtype).name}"
        if not values[2] < values[3]:
            return f"lower and upper are equal once rounded to {jnp.dtype(dtype).name}"
        return None

    def label(self) -> str:
        return (
            f"truncated_normal(mean={self.mean}, std={self.std}, lower={self.lower}, "
            f"upper={self.upper})"
        )

    floating_only: ClassVar[bool] = True


@attrs.frozen(kw_only=True)
class Uniform:
    """Draw from U[low, high): ``max(low, low + u * (high - low))``, ``u`` uniform on [0, 1).

    The same formula as ``jax.random.uniform(key, shape, dtype, low, high)``, with ``low`` and
    ``high`` rounded to ``dtype`` first.
    """

    low: float = attrs.field(default=0.0, converter=_float)
    high: float = attrs.field(default=1.0, converter=_float)

    def __attrs_post_init__(self) -> None:
        _check_params("Uniform", low=self.low, high=self.high)
        if not self.low < self.high:
            msg = f"Uniform: low must be below high, got low={self.low}, high={self.high}"
            raise ValueError(msg)

    def __call__(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        return _jitted_draw(self, key, tuple(shape), jnp.dtype(dtype))

    def draw(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        return self.from_unit(_unit_uniform(key, shape, dtype), dtype)

    def from_unit(self, unit: jax.Array, dtype: Any) -> jax.Array:
        """The values, elementwise, from ``unit``: U[0, 1) as ``jax.random.uniform`` draws it."""
        low, high = opaque(dtype, self.low, self.high)
        return jnp.maximum(low, unit * (high - low) + low)

    def check_dtype(self, dtype: Any) -> str | None:
        low, high = _in_dtype(self.low, dtype), _in_dtype(self.high, dtype)
        name = jnp.dtype(dtype).name
        if not all(math.isfinite(v) for v in (low, high, _in_dtype(high - low, dtype))):
            return f"low, high or high - low overflows {name}"
        if not low < high:
            return f"low and high are equal once rounded to {name}"
        return None

    def label(self) -> str:
        return f"uniform(low={self.low}, high={self.high})"

    floating_only: ClassVar[bool] = True


@attrs.frozen(kw_only=True)
class Zeros:
    """All zeros (the key is not used)."""

    def __call__(self, key: jax.Array, shape: Shape, dtype: Any) -> jax.Array:
        del key
        return jnp.zeros(shape, dtype)

    def check_dtype(self, dtype: Any) -> str | None:
        del dtype
        return None

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

    def check_dtype(self, dtype: Any) -> str | None:
        del dtype
        return None

    def label(self) -> str:
        return f"custom({getattr(self.fn, '__qualname__', type(self.fn).__name__)})"

    floating_only: ClassVar[bool] = False


Initializer: TypeAlias = Normal | TruncatedNormal | Uniform | Zeros | Custom
INITIALIZER_TYPES = (Normal, TruncatedNormal, Uniform, Zeros, Custom)


def to_initializer(value: Initializer | InitFunction) -> Initializer:
    """Accept an initializer, or wrap a bare ``fn(key, shape, dtype)`` in :class:`Custom`."""
    if isinstance(value, INITIALIZER_TYPES):
        return value
    if callable(value):
        return Custom(value)
    msg = (
        "init must be Normal, TruncatedNormal, Uniform, Zeros, Custom or a function "
        f"(key, shape, dtype) -> array, "
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
