"""Keys from names: an array's key depends only on the root key and the array's name.

Scheme (stable across processes, Python versions and machines):

    name_hash(name) = first 4 bytes of SHA-256(name encoded as UTF-8), read little-endian (uint32)
    key(name)       = jax.random.fold_in(root_key, name_hash(name))

so adding, removing or reordering other arrays never changes an array's values. Two names in one
call whose hashes collide would share a key; that raises instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import jax
import numpy as np

from pd_init._errors import InitSpecError


def name_hash(name: str) -> int:
    """The 32-bit value folded into the root key for the array called ``name``."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "little")


def derive_key(key: jax.Array, name: str) -> jax.Array:
    """The key of the array called ``name`` under root ``key`` (raw uint32[2] or typed key)."""
    return jax.random.fold_in(key, np.uint32(name_hash(name)))


def check_no_collisions(names: Iterable[str]) -> dict[str, int]:
    """Hash every name; raise naming both names if two share a hash. Returns name -> hash."""
    hashes: dict[str, int] = {}
    owner: dict[int, str] = {}
    for name in names:
        value = name_hash(name)
        if value in owner:
            msg = (
                f"arrays {owner[value]!r} and {name!r} derive the same key: their 32-bit name "
                f"hashes collide (0x{value:08x}); rename one of them"
            )
            raise InitSpecError(msg)
        owner[value] = name
        hashes[name] = value
    return hashes
