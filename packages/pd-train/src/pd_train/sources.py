"""Random sources and the masks they make.

A source r has C + 1 channels per position: r[..., :C] mixes into the component mask, the last
channel is the delta mask δ. ``continuous``: r ~ U[0, 1); ``binomial``: the component
channels r ∈ {0, 1} with probability 1/2 each, the delta channel δ ~ U[0, 1) as under
``continuous`` (both reference implementations draw the delta mask uniformly in either mode).
Under ``binomial`` the lower CI is also jittered before its squash (:func:`jitter_lower`), as
spd does.

Two fixed sources serve evaluation: ``zeros`` (m = ci_lower, δ = 0) and ``components_ones``
(m = 1, δ = 0: every component, no delta).

How a uniform draw is computed (``draws``, ``pd.recon.random_draws``), the same bits either way:
``jax``: ``jax.random.uniform``; XLA:CPU lowers its Threefry-2x32 hash as a rolled loop of five
iterations, so a [4096, 21] draw costs ~0.7 ms of CPU. ``blocked`` (:func:`uniform`): the same
hash of the same counters (jax's partitionable Threefry: the key's two words, the element's
row-major index as the 64-bit counter) written out as 20 rounds, in a ``lax.scan`` over at least
two blocks of the flat index, so XLA:CPU computes each draw once into its buffer (written out
without the loop, XLA fuses the hash into every consumer of the draw, forward and backward, and
computes it again in each: measured 5-6x the work); ~2.6x cheaper a draw on CPU. A scan over
the flat index is not batch-partitionable: traced under a mesh with a data axis
(:func:`pd_train._row_shards.row_shard_axis`, a data-parallel toy step) each device draws the flat
indices of its own rows (a ``shard_map``; the same bits); otherwise the program is one
device's. Where the key is not a Threefry key, ``jax_threefry_partitionable`` is off, or the dtype
is not float32, ``blocked`` draws as ``jax`` does.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from pd_train._row_shards import row_shard_axis
from pd_train.squash import unit_clip

__all__ = [
    "DRAW_BLOCK",
    "JITTER_FOLD",
    "RANDOM_DRAWS",
    "jitter_lower",
    "jitter_lower_ci",
    "masks",
    "sample_source",
    "threefry2x32",
    "uniform",
]

#: Folded into the step key (or an eval batch key) for the binomial CI jitter's draw; far from
#: the loss-term indices folded into the same key.
JITTER_FOLD = 0x6A17_7E42

Sampling = Literal["continuous", "binomial"]
RandomDraws = Literal["jax", "blocked"]
#: The values of ``draws`` (``pd.recon.random_draws``).
RANDOM_DRAWS: tuple[str, ...] = ("jax", "blocked")
#: Elements per block of a ``blocked`` draw (at least two blocks a draw).
DRAW_BLOCK = 1 << 16

#: Threefry-2x32's rotations (Salmon et al. 2011), the even and the odd groups of four rounds.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def threefry2x32(
    k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 with 20 rounds of the counter words (x0, x1) under the key words (k0,
    k1), all uint32 (broadcasting): five groups of four rounds, the key schedule injected after
    each group. Written out (no loop): the values of JAX's ``threefry2x32`` primitive."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for group in range(5):
        for r in _ROTATIONS[group % 2]:
            x0 = x0 + x1
            x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
            x1 = x0 ^ x1
        x0 = x0 + ks[(group + 1) % 3]
        x1 = x1 + ks[(group + 2) % 3] + np.uint32(group + 1)
    return x0, x1


def _unit_float(bits: jax.Array) -> jax.Array:
    """uint32 bits -> float32 in [0, 1): the top 23 bits as the mantissa of [1, 2), minus 1
    (``jax.random.uniform``'s map)."""
    one = np.array(1.0, np.float32).view(np.uint32)
    floats = jax.lax.bitcast_convert_type((bits >> np.uint32(9)) | one, jnp.float32)
    return jnp.maximum(np.float32(0.0), floats - np.float32(1.0))


def _blocked_applies(key: jax.Array, n: int, dtype: Any) -> bool:
    partitionable = bool(getattr(jax.config, "jax_threefry_partitionable"))  # noqa: B009
    if jnp.dtype(dtype) != jnp.float32 or n >= 2**32 or not partitionable:
        return False
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(key)) in ("threefry2x32", "PRNGSpec('threefry2x32')")
    return key.dtype == jnp.uint32 and key.shape == (2,)  # a raw (legacy) threefry key


def uniform(
    key: jax.Array,
    shape: tuple[int, ...],
    dtype: Any = jnp.float32,
    *,
    draws: RandomDraws | str = "jax",
) -> jax.Array:
    """U[0, 1) of ``shape``: the bits of ``jax.random.uniform(key, shape, dtype)``, computed
    as ``draws`` says (the module's docstring): ``jax`` or ``blocked``."""
    if draws not in RANDOM_DRAWS:
        msg = f"draws must be one of {', '.join(RANDOM_DRAWS)}, got {draws!r}"
        raise ValueError(msg)
    n = math.prod(shape)
    if draws == "jax" or n == 0 or not _blocked_applies(key, n, dtype):
        return jax.random.uniform(key, shape, dtype)
    words = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    axis = row_shard_axis(shape[0]) if len(shape) > 1 else None
    if axis is None:
        return _blocked_bits(words, 0, n).reshape(shape)
    devices = jax.sharding.get_abstract_mesh().shape[axis]

    def local(words: jax.Array) -> jax.Array:
        """This device's rows: the flat indices [d·n/devices, (d+1)·n/devices)."""
        offset = jax.lax.axis_index(axis).astype(jnp.uint32) * np.uint32(n // devices)
        rows = _blocked_bits(words, offset, n // devices)
        return rows.reshape(shape[0] // devices, *shape[1:])

    spec = jax.sharding.PartitionSpec
    return jax.shard_map(local, in_specs=spec(), out_specs=spec(axis), check_vma=False)(words)


def _blocked_bits(words: jax.Array, offset: Any, n: int) -> jax.Array:
    """The ``blocked`` draw's U[0, 1) of the flat indices offset .. offset + n - 1 [n]: a
    ``lax.scan`` over at least two blocks."""
    n_blocks = max(2, -(-n // DRAW_BLOCK))
    size = -(-n // n_blocks)

    def block(_: None, i: jax.Array) -> tuple[None, jax.Array]:
        lo = jax.lax.iota(jnp.uint32, size) + i * np.uint32(size)
        lo = lo if isinstance(offset, int) and offset == 0 else lo + offset
        a, b = threefry2x32(words[0], words[1], jnp.zeros_like(lo), lo)
        return None, _unit_float(a ^ b)

    _, out = jax.lax.scan(block, None, jnp.arange(n_blocks, dtype=jnp.uint32))
    return out.reshape(-1)[:n]


def sample_source(
    sampling: Sampling | str,
    shape: tuple[int, ...],
    *,
    key: jax.Array,
    dtype: Any = jnp.float32,
    draws: RandomDraws | str = "jax",
) -> jax.Array:
    """A source of ``shape`` ([..., C + 1]) in ``dtype``; its uniform draws computed as
    ``draws`` says (the same bits either way: the module's docstring)."""
    if sampling == "continuous":
        return uniform(key, shape, jnp.float32, draws=draws).astype(dtype)
    if sampling == "binomial":
        comp_key, delta_key = jax.random.split(key)
        comp_shape = (*shape[:-1], shape[-1] - 1)
        if draws == "jax":
            components = jax.random.bernoulli(comp_key, 0.5, comp_shape)
        else:  # jax.random.bernoulli(comp_key, 0.5, ...)'s values: U[0, 1) < 0.5
            components = uniform(comp_key, comp_shape, draws=draws) < 0.5
        delta = uniform(delta_key, (*shape[:-1], 1), jnp.float32, draws=draws)
        return jnp.concatenate([components.astype(dtype), delta.astype(dtype)], axis=-1)
    if sampling == "zeros":
        return jnp.zeros(shape, dtype)
    if sampling == "components_ones":
        return jnp.concatenate(
            [jnp.ones((*shape[:-1], shape[-1] - 1), dtype), jnp.zeros((*shape[:-1], 1), dtype)],
            axis=-1,
        )
    msg = (
        f"sampling must be 'continuous' or 'binomial' (or 'zeros', 'components_ones' for "
        f"evaluation), got {sampling!r}"
    )
    raise ValueError(msg)


def jitter_lower(pre: jax.Array, *, key: jax.Array) -> jax.Array:
    """``1.05·pre − 0.05·u``, u ~ U[0, 1) per element (any shape, pre's dtype): the binomial
    mode's jitter of the CI pre-activations that feed the *lower* squash (spd's
    ``calc_causal_importances``: one fresh draw per CI evaluation, shared by every mask built
    from it; the upper squash reads the unjittered pre-activations)."""
    u = jax.random.uniform(key, pre.shape, jnp.float32)
    return (1.05 * pre.astype(jnp.float32) - 0.05 * u).astype(pre.dtype)


def jitter_lower_ci(pre: Mapping[str, jax.Array], *, key: jax.Array) -> dict[str, jax.Array]:
    """:func:`jitter_lower` per kind ({kind: [n_k, B, T, C]}), each kind's draw from
    ``fold_in(key, crc32(kind))`` (keys from names)."""
    return {
        k: jitter_lower(v, key=jax.random.fold_in(key, zlib.crc32(k.encode()) & 0x7FFFFFFF))
        for k, v in pre.items()
    }


def masks(ci_lower: jax.Array, source: jax.Array) -> tuple[jax.Array, jax.Array]:
    """m = ci_lower + (1 − ci_lower)·r[..., :C] [..., C] and δ = r[..., C] [...].

    ci_lower [..., C]; source [..., C + 1]. ci_lower is clipped to [0, 1] here with a
    straight-through gradient (:func:`pd_train.squash.unit_clip`: no change for a clipped
    ci_lower), so the train step can pass its pre-activations under
    :func:`pd_train.squash.lower_leaky_hard_deferred` without materializing the clip.
    """
    ci = unit_clip(ci_lower)
    r = source.astype(ci.dtype)
    return ci + (1 - ci) * r[..., :-1], r[..., -1]
