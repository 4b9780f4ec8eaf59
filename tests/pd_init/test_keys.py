"""The key scheme: fold the first 4 bytes of SHA-256(name), little-endian, into the root key."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pd_init


def test_name_hash_is_pinned():
    # Pinned values: changing the scheme would silently change every initialized array.
    assert pd_init.name_hash("layers.0.mlp.down_proj.V") == 2575900329
    assert pd_init.name_hash("layers.12981.w") == 3487349623


def test_derive_key_is_fold_in_of_the_name_hash():
    root = jax.random.key(42)
    expected = jax.random.fold_in(root, np.uint32(2575900329))
    got = pd_init.derive_key(root, "layers.0.mlp.down_proj.V")
    assert np.array_equal(jax.random.key_data(got), jax.random.key_data(expected))


def test_a_32_bit_collision_raises_naming_both_arrays():
    # These two names share the first 4 bytes of their SHA-256 (found by a birthday search).
    assert pd_init.name_hash("layers.12981.w") == pd_init.name_hash("layers.85444.w")
    specs = [
        pd_init.ArraySpec(name="layers.12981.w", shape=(2,)),
        pd_init.ArraySpec(name="other", shape=(2,)),
        pd_init.ArraySpec(name="layers.85444.w", shape=(2,)),
    ]
    with pytest.raises(
        pd_init.InitSpecError,
        match=r"arrays 'layers.12981.w' and 'layers.85444.w' derive the same key",
    ):
        pd_init.InitPlan(specs)
    # Either one alone is fine.
    pd_init.InitPlan(specs[:2])
