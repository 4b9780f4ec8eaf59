"""Fan-out's memory bound: all stacks plus the largest group's members, when consuming stacks.

Live bytes are sampled after every member is made (``jax.live_arrays``), by wrapping the real
take function; benchmarks/init_memory.py measures the process's true peak, temporaries included.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import pd_init
import pd_init._plan as plan_module


def _live_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())


@pytest.fixture
def record_live_bytes(monkeypatch):
    samples: list[int] = []
    take = plan_module._take_unsharded

    def recording_take(stack, index):
        out = take(stack, index)
        jax.block_until_ready(out)
        samples.append(_live_bytes())
        return out

    monkeypatch.setattr(plan_module, "_take_unsharded", recording_take)
    return samples


def _specs() -> list[pd_init.ArraySpec]:
    # Three groups of 4 members, 256 KiB each: every stack is 1 MiB.
    return [
        pd_init.ArraySpec(name=f"layers.{i}.{kind}", shape=(256, 256), group=kind)
        for kind in ("q", "k", "v")
        for i in range(4)
    ]


@pytest.mark.parametrize("consume", [True, False])
def test_fan_out_peak_live_bytes(consume, record_live_bytes):
    plan = pd_init.InitPlan(_specs())
    stacks_bytes = sum(g.nbytes for g in plan.groups)
    bound = stacks_bytes + max(g.nbytes for g in plan.groups)
    key = jax.random.key(0)
    reference = plan.init_reference(key=key)
    reference_bytes = sum(a.nbytes for a in reference.values())

    baseline = _live_bytes()
    stacked = plan.init_stacked(key=key)
    fanned = plan.fan_out(stacked, consume=consume)
    peak = max(record_live_bytes) - baseline
    assert len(record_live_bytes) == 12

    if consume:
        assert peak <= bound
        assert _live_bytes() - baseline == stacks_bytes  # only the members are left
    else:
        # Keeping the stacks, every stack and every member coexist: 2x the stacks, over the bound.
        assert peak == 2 * stacks_bytes > bound
    for name, value in fanned.items():
        assert np.array_equal(np.asarray(value), np.asarray(reference[name]))
    assert reference_bytes == stacks_bytes
