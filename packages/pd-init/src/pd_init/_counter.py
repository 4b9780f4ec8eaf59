"""Unit uniforms from (key, flat index): what ``jax.random.uniform`` draws, for many arrays at once.

With ``jax_threefry_partitionable`` (which pd-init requires), the threefry bits of element ``i``
of an array of shape ``S`` drawn with ``key`` are ``threefry2x32(key, (hi(i), lo(i)))``, ``i``
the element's row-major flat index in ``S``: nothing else about ``S`` enters. Arrays of shapes
``[*lead, w_g]`` (same leading dims, any last dim) can therefore be drawn by ONE threefry kernel
over ``[*lead, Σ w_g]``: the columns of array ``g`` get ``g``'s key and, as counter, the flat
index the element has in ``g``'s own shape, ``row · w_g + column offset``. Each array's slice of
the result equals ``jax.random.uniform(key_g, (*lead, w_g), dtype)`` bit for bit (pd-init's tests
check this against its per-array reference, so a change of JAX's scheme fails them loudly).

Limits: threefry keys only (``threefry2x32``), every array under 2**32 elements (the counter's
high word is then 0), floating dtypes of 8, 16, 32 or 64 bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry2x32_p

MAX_ELEMENTS = 2**32
"""Arrays of at least this many elements need a counter's high word; they are not merged."""

_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}


def supports(shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether an array of ``shape`` and ``dtype`` can be drawn from counters here."""
    if not jnp.issubdtype(dtype, jnp.floating) or len(shape) == 0:
        return False
    if jnp.finfo(dtype).bits not in _UINT:
        return False
    return int(np.prod(shape, dtype=np.int64)) < MAX_ELEMENTS


def is_threefry(key: jax.Array) -> bool:
    """Whether ``key`` (typed or raw ``uint32[..., 2]``) is a threefry2x32 key."""
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return "threefry" in str(jax.random.key_impl(key))
    return bool(key.dtype == jnp.uint32 and key.shape[-1:] == (2,)) and (
        jax.config.jax_default_prng_impl == "threefry2x32"  # type: ignore[attr-defined]
    )


def unit_uniform_columns(
    keys: jax.Array, lead: tuple[int, ...], widths: Sequence[int], dtype: Any
) -> jax.Array:
    """``[*lead, Σ widths]``: columns ``[s_g, s_g + widths[g])`` hold
    ``jax.random.uniform(keys[g], (*lead, widths[g]), dtype)``; ``keys`` has one threefry key
    per array (typed ``[G]`` or raw ``uint32[G, 2]``)."""
    dtype = jnp.dtype(dtype)
    data = jax.random.key_data(keys) if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) else keys
    width = np.asarray(widths, dtype=np.int64)
    column_array = np.repeat(np.arange(len(width)), width)  # column -> its array
    starts = np.concatenate([[0], np.cumsum(width)[:-1]])
    offset = (np.arange(column_array.size) - starts[column_array]).astype(np.uint32)
    shape = (*lead, column_array.size)
    row = jnp.zeros(shape, jnp.uint32)
    for d, size in enumerate(lead):  # row-major index over the leading dims
        row = row * np.uint32(size) + jax.lax.broadcasted_iota(jnp.uint32, shape, d)
    counter = row * jnp.asarray(width.astype(np.uint32)[column_array]) + jnp.asarray(offset)
    k1 = jnp.broadcast_to(data[:, 0][column_array], shape)
    k2 = jnp.broadcast_to(data[:, 1][column_array], shape)
    bits1, bits2 = threefry2x32_p.bind(k1, k2, jnp.zeros(shape, jnp.uint32), counter)

    # jax.random.uniform's bits -> [0, 1), step by step.
    finfo = jnp.finfo(dtype)
    nbits, nmant = finfo.bits, finfo.nmant
    rng_bits = 8 if nmant < 8 else nbits
    if rng_bits == 64:
        bits = (bits1.astype(np.uint64) << np.uint64(32)) | bits2.astype(np.uint64)
    elif rng_bits == 32:
        bits = bits1 ^ bits2
    else:
        bits = (bits1 ^ bits2).astype(_UINT[rng_bits])
    uint = _UINT[nbits]
    bits = bits.astype(uint)
    float_bits = jax.lax.shift_right_logical(bits, jnp.asarray(rng_bits - nmant, uint))
    float_bits = float_bits | jnp.asarray(np.array(1.0, dtype).view(uint), uint)
    return jax.lax.bitcast_convert_type(float_bits, dtype) - jnp.asarray(1.0, dtype)
