"""pd-init's stacked init takes pd-sharding's ZeRO-1 shardings for stacked V/U unchanged."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pd_init
import pd_sharding as ps

LAYERS = 4
# d_in, d_out, C. Few and small: a sharded random init compiles for seconds on a loaded CPU.
KINDS = {"down_proj": (32, 16, 16)}


def _specs(
    shardings_for_members: ps.Zero1Layout | None = None, init: object = None
) -> list[pd_init.ArraySpec]:
    """Per-layer V [d_in, C] and U [C, d_out], one explicit group per (kind, factor)."""
    specs = []
    for kind, (d_in, d_out, c) in KINDS.items():
        for factor, shape in (("V", (d_in, c)), ("U", (c, d_out))):
            sharding = None
            if shardings_for_members is not None:
                fn = shardings_for_members.v if factor == "V" else shardings_for_members.u
                sharding = fn(shape, name=f"{kind}.{factor}")
            for layer in range(LAYERS):
                specs.append(
                    pd_init.ArraySpec(
                        name=f"layers.{layer}.{kind}.{factor}",
                        shape=shape,
                        init=init or pd_init.Normal(std=0.02),
                        group=f"{kind}.{factor}",
                        sharding=sharding,
                    )
                )
    return specs


def _stacked_shardings(layout: ps.Zero1Layout) -> dict[str, jax.sharding.NamedSharding]:
    out = {}
    for kind, (d_in, d_out, c) in KINDS.items():
        out[f"{kind}.V"] = layout.v((LAYERS, d_in, c), name=f"{kind}.V")
        out[f"{kind}.U"] = layout.u((LAYERS, c, d_out), name=f"{kind}.U")
    return out


@pytest.mark.slow
def test_stacked_init_takes_layout_shardings_unchanged() -> None:
    layout = ps.Zero1Layout(ps.make_mesh(replicate=2, data=4))
    shardings = _stacked_shardings(layout)
    key = jax.random.key(7)

    sharded = pd_init.init_stacked(_specs(), key=key, group_shardings=shardings)
    plain = pd_init.init_stacked(_specs(), key=key)

    assert set(sharded.stacks) == set(shardings)
    for group, sharding in shardings.items():
        stack = sharded.stacks[group]
        assert stack.sharding == sharding, group
        block = sharding.shard_shape(stack.shape)
        assert all(s.data.shape == block for s in stack.addressable_shards), group
        assert block[1:] != stack.shape[1:], f"{group} should be split, got block {block}"
        np.testing.assert_array_equal(np.asarray(stack), np.asarray(plain.stacks[group]))


@pytest.mark.parametrize(("replicate", "data", "tensor"), [(2, 4, 1), (2, 2, 2)])
def test_member_shardings_stack_to_the_layouts_stacked_sharding(replicate, data, tensor) -> None:
    """Per-layer specs sharded by the layout stack into exactly the layout's stacked sharding."""
    layout = ps.Zero1Layout(ps.make_mesh(replicate=replicate, data=data, tensor=tensor))
    # zeros: this checks where the stacks land, the test above checks values
    stacked = pd_init.init_stacked(_specs(layout, pd_init.Zeros()), key=jax.random.key(7))
    for group, sharding in _stacked_shardings(layout).items():
        assert stacked.stacks[group].sharding == sharding, group
