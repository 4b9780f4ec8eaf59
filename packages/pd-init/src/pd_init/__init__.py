"""pd-init: stacked RNG initialization of many named arrays.

Arrays with the same shape, dtype and initializer (or an explicit group) are drawn together, by a
loop over their name-derived keys inside one jit, into one ``[n, *shape]`` output per group, so
the compile depends on the number of groups, not of arrays. For the built-in initializers the
values equal, bit for bit, those of a per-array jitted init (:meth:`InitPlan.init_reference`)
and of the initializer called alone; see the README's Guarantees for why.

Key scheme: ``key(name) = jax.random.fold_in(root_key, u32(name))`` where ``u32(name)`` is the
first 4 bytes of SHA-256 of the UTF-8 name, little-endian (:func:`name_hash`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
from jax.sharding import Sharding

from pd_init._errors import InitSpecError
from pd_init._initializers import (
    Custom,
    Initializer,
    Normal,
    TruncatedNormal,
    Uniform,
    Zeros,
    opaque,
)
from pd_init._keys import derive_key, name_hash
from pd_init._plan import Group, InitPlan, StackedArrays
from pd_init._spec import ArraySpec

__version__ = "0.1.2"

__all__ = [
    "ArraySpec",
    "Custom",
    "Group",
    "InitPlan",
    "InitSpecError",
    "Initializer",
    "Normal",
    "StackedArrays",
    "TruncatedNormal",
    "Uniform",
    "Zeros",
    "__version__",
    "derive_key",
    "init_per_array",
    "init_reference",
    "init_stacked",
    "name_hash",
    "opaque",
]


def init_stacked(
    specs: Sequence[ArraySpec],
    *,
    key: jax.Array,
    group_shardings: Mapping[str, Sharding] | None = None,
) -> StackedArrays:
    """One jit, one ``[n, *shape]`` output per group. See :class:`InitPlan`."""
    return InitPlan(specs, group_shardings=group_shardings).init_stacked(key=key)


def init_per_array(
    specs: Sequence[ArraySpec],
    *,
    key: jax.Array,
    group_shardings: Mapping[str, Sharding] | None = None,
) -> dict[str, jax.Array]:
    """Stacked init fanned out to ``{name: [*shape]}`` with each spec's sharding."""
    return InitPlan(specs, group_shardings=group_shardings).init_per_array(key=key)


def init_reference(specs: Sequence[ArraySpec], *, key: jax.Array) -> dict[str, jax.Array]:
    """The per-array jitted init (one output per array): the oracle for the stacked init."""
    return InitPlan(specs).init_reference(key=key)
