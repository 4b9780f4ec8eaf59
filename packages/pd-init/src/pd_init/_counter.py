"""Threefry draws as plain elementwise ops: what ``jax.random`` draws, in kernels XLA fuses.

With ``jax_threefry_partitionable`` (which pd-init requires), the threefry bits of element ``i``
of an array of shape ``S`` drawn with ``key`` are ``threefry2x32(key, (hi(i), lo(i)))``, ``i``
the element's row-major flat index in ``S``: nothing else about ``S`` enters. A whole stack
``[n, *S]`` of ``n`` arrays, each with its own key, is therefore ONE elementwise function of
(member key, flat index in ``S``), which XLA compiles to one kernel that writes the stack
directly: no loop over the members, no temporary, and a compile that does not depend on ``n``
or ``S``.

On CPU, JAX lowers its ``threefry2x32`` primitive to a rolled ``while`` loop over the five
rounds of four (every round's state a full-size buffer), which XLA cannot fuse and compiles as
a loop of its own per draw. :func:`threefry2x32` is the same hash (Threefry-2x32, 20 rounds,
the rotation constants and key schedule of Salmon et al. 2011, as JAX uses them) written out in
uint32 adds, rotations and xors; integer arithmetic is exact, so its bits are JAX's bits however
XLA compiles it. pd-init's tests compare every path with its per-array reference (which calls
``jax.random``), so a change of JAX's scheme fails them loudly.

Limits: threefry keys only (``threefry2x32``), every member under 2**32 elements (the counter's
high word is then 0), floating dtypes of 8, 16, 32 or 64 bits.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

MAX_ELEMENTS = 2**32
"""Members of at least this many elements need a counter's high word; they are not counter-drawn."""

_UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def supports(shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether members of ``shape`` and ``dtype`` can be drawn from counters here."""
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


def key_data(key: jax.Array) -> jax.Array:
    """The raw ``uint32[..., 2]`` words of a typed or raw threefry key."""
    return jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key


def threefry2x32(
    k1: jax.Array, k2: jax.Array, x1: jax.Array, x2: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds) of the counter words ``(x1, x2)`` under key ``(k1, k2)``;
    uint32 arrays of one shape (or scalars). Equals ``jax.extend.random.threefry2x32_p``.
    Written in ``jax.lax`` ops (no ``jnp`` dispatch: tracing stays cheap)."""
    add, xor = jax.lax.add, jax.lax.bitwise_xor

    def rotate_left(x: jax.Array, r: int) -> jax.Array:
        left = jax.lax.shift_left(x, np.uint32(r))
        return jax.lax.bitwise_or(left, jax.lax.shift_right_logical(x, np.uint32(32 - r)))

    schedule = (k1, k2, xor(xor(k1, k2), _PARITY))
    x1, x2 = add(x1, schedule[0]), add(x2, schedule[1])
    for block in range(5):  # five blocks of four rounds, a key injection after each
        for r in _ROTATIONS[block % 2]:
            x1 = add(x1, x2)
            x2 = xor(x1, rotate_left(x2, r))
        x1 = add(x1, schedule[(block + 1) % 3])
        x2 = add(add(x2, schedule[(block + 2) % 3]), np.uint32(block + 1))
    return x1, x2


def fold_in(key: jax.Array, data: np.ndarray) -> jax.Array:
    """``jax.random.fold_in(key, d)`` for every ``d`` of ``data`` (uint32 ``[N]``), as raw
    ``uint32[N, 2]`` keys; ``key`` is one typed or raw threefry key."""
    words = key_data(key)
    counter = jnp.asarray(np.asarray(data, dtype=np.uint32))
    k1, k2 = (jax.lax.broadcast(words[i], counter.shape) for i in (0, 1))
    new1, new2 = threefry2x32(k1, k2, jnp.zeros_like(counter), counter)
    return jnp.stack([new1, new2], axis=-1)


def unit_uniform_stack(keys: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """``[n, *shape]`` whose slice ``j`` is ``jax.random.uniform(keys[j], shape, dtype)``;
    ``keys`` raw ``uint32[n, 2]``. One elementwise expression: every element's bits come from
    its member's key and its flat index in ``shape``."""
    dtype = jnp.dtype(dtype)
    full = (keys.shape[0], *shape)
    counter = jnp.zeros(full, jnp.uint32)
    for d, size in enumerate(shape, start=1):  # row-major flat index within the member
        counter = counter * np.uint32(size) + jax.lax.broadcasted_iota(jnp.uint32, full, d)
    k1 = jax.lax.broadcast_in_dim(keys[:, 0], full, (0,))
    k2 = jax.lax.broadcast_in_dim(keys[:, 1], full, (0,))
    bits1, bits2 = threefry2x32(k1, k2, jnp.zeros(full, jnp.uint32), counter)
    return _bits_to_unit(bits1, bits2, dtype)


def _bits_to_unit(bits1: jax.Array, bits2: jax.Array, dtype: np.dtype) -> jax.Array:
    """jax.random.uniform's threefry bits -> [0, 1), step by step (its ``rng_bits`` rules)."""
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
