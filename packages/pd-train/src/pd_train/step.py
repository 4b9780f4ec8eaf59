"""The train step's public names, kept where they were: the Trainer now lives in
:mod:`pd_train.train` (state, init and shardings apart from the step)."""

from __future__ import annotations

from pd_train.train import GROUPS, Trainer, TrainState, step_key

__all__ = ["GROUPS", "TrainState", "Trainer", "step_key"]
