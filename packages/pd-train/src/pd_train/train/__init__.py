"""The Trainer: the decomposition of one target, its state and its jitted step.

==================  ==========================================================================
module              what it owns
==================  ==========================================================================
``state``           :class:`TrainState`, the optimizer groups, the step key
``trainer``         :class:`Trainer`: terms, hyperparameters as data, the loss, the step, AOT
``_layout``         params / optimizer state / train state: specs, init jits, shardings
``_warmup``         the faithfulness warm-up before step 0
``_programs``       the jitted step with its hyperparameters bound (calls, lower, compile)
==================  ==========================================================================
"""

from __future__ import annotations

from pd_train.train.state import GROUPS, TrainState, step_key
from pd_train.train.trainer import Trainer

__all__ = ["GROUPS", "TrainState", "Trainer", "step_key"]
