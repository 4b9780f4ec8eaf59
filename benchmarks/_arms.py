"""Arms of a step benchmark timed side by side: each arm's K-step program called in turn."""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from typing import Any

import jax


def time_alternating(
    built: dict[Hashable, tuple[Any, Any, Any]],
    *,
    k: int,
    calls: int,
    repeats: int,
    best_by: str,
) -> tuple[Mapping[Hashable, tuple[float, float]], Mapping[Hashable, float]]:
    """``built[arm] = (program, state, weights)``, ``program(state, weights) -> (state, metrics)``
    running ``k`` steps: ``repeats`` rounds, each arm in turn ``calls`` calls (the arms alternate,
    so the machine's load falls on all alike; ``built`` is updated with each arm's last state).
    Returns per arm the best round's ``(wall_ms, cpu_ms)`` a step (best by ``best_by``, ``"wall"``
    or ``"cpu"``) and the last ``loss/total``."""
    first = 0 if best_by == "wall" else 1
    best: dict[Hashable, tuple[float, float]] = {a: (float("inf"),) * 2 for a in built}
    loss: dict[Hashable, float] = {}
    for _ in range(repeats):
        for arm in built:
            program, state, weights = built[arm]
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(calls):
                state, metrics = program(state, weights)
                jax.block_until_ready(metrics)
            cpu_ms = (time.process_time() - cpu) / (k * calls) * 1e3
            wall_ms = (time.perf_counter() - wall) / (k * calls) * 1e3
            if (wall_ms, cpu_ms)[first] < best[arm][first]:
                best[arm] = (wall_ms, cpu_ms)
            built[arm] = (program, state, weights)
            loss[arm] = float(metrics["loss/total"][-1])
    return best, loss
