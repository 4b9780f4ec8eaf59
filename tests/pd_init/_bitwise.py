"""Bit-for-bit comparison of arrays (NaN payloads and signed zeros included)."""

from __future__ import annotations

import jax
import numpy as np


def _bits(x: jax.Array) -> np.ndarray:
    return np.asarray(x).view(np.uint8)


def _assert_bitwise(a: jax.Array, b: jax.Array, what: str) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, what
    differ = int(np.sum(np.asarray(a) != np.asarray(b)))
    assert np.array_equal(_bits(a), _bits(b)), f"{what}: {differ} elements differ"
