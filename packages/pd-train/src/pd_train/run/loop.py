"""The run loop: steps from ``start`` to ``end``, the hooks after each (see
:mod:`pd_train.run.hooks`). It knows nothing of targets, data or files: the step function,
the hooks and the first state come in as arguments, so a toy run and a Llama run share it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pd_train.run.hooks import Hook, StepInfo

#: ``step_fn(state, step) -> (state, metrics)``: runs step ``step`` (0-based) on its batch.
#: With ``steps_per_call`` K > 1: ``step_fn(state, step, n) -> (state, metrics)`` runs the n
#: steps ``step .. step + n - 1`` in one call (a K-step program; n < K only for the last call).
StepFn = Callable[..., tuple[Any, Any]]


def run_loop(
    step_fn: StepFn,
    hooks: Sequence[Hook],
    *,
    state: Any,
    start: int,
    end: int,
    steps_per_call: int = 1,
) -> StepInfo:
    """Run steps ``start .. end - 1`` (stopping early when a hook sets ``StepInfo.stop``),
    ``steps_per_call`` per call of ``step_fn``; after each call, every hook whose cadence is due,
    in order; then every hook's ``close``. Returns the position after the last step run
    (``step``: steps finished)."""
    info = StepInfo(step=start, start=start, end=end, state=state)
    while info.step < end:
        for hook in hooks:
            hook.before(info.step)
        if steps_per_call == 1:
            n = 1
            state, metrics = step_fn(info.state, info.step)
        else:
            n = min(steps_per_call, end - info.step)
            state, metrics = step_fn(info.state, info.step, n)
        info = StepInfo(
            step=info.step + n, start=start, end=end, state=state, metrics=metrics, ran=n
        )
        for hook in hooks:
            if hook.cadence.due(info):
                hook(info)
        if info.stop:
            break
    for hook in hooks:
        hook.close(info)
    return info
