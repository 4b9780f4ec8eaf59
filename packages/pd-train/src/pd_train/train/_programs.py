"""The train step's jit seen with four arguments: the hyperparameters bound in calls, lowerings
and compiled programs (:meth:`pd_train.train.Trainer.hyperparam_arrays`)."""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np


class HyperparamSource(Protocol):
    """What the wrappers below need of a :class:`pd_train.train.Trainer`: its hyperparameters
    as [] arrays (the values of this step) and as abstract values (for a lowering)."""

    def hyperparam_arrays(self) -> Any: ...

    def abstract_hyperparams(self) -> Any: ...


def scalar_dtype(value: Any) -> Any:
    """f32 for a float, i32 for an int (a hyperparameter's array dtype)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        msg = f"a hyperparameter must be a float or an int, not {value!r}"
        raise TypeError(msg)
    return jnp.int32 if isinstance(value, int) else jnp.float32


def scalar_array(value: Any) -> jax.Array:
    """``value`` as a [] array on the default device, put there from numpy: ``jnp.asarray``
    of a Python scalar runs (and compiles) a ``convert_element_type`` program, one more compile
    on every launch and a cache miss in every fresh cache."""
    return jax.device_put(np.asarray(value, scalar_dtype(value)))


class _WithHyperparams:
    """The jitted ``train_step(state, target, tokens, key, hp)`` seen as
    ``(state, target, tokens, key)``: calls and lowerings get the trainer's
    :meth:`Trainer.hyperparam_arrays` (or their abstract values) as ``hp``. ``.jit`` is the
    five-argument jit."""

    def __init__(self, jit: Any, trainer: HyperparamSource) -> None:
        self.jit = jit
        self._trainer = trainer

    def __call__(self, state: Any, target: Any, tokens: Any, key: Any) -> Any:
        return self.jit(state, target, tokens, key, self._trainer.hyperparam_arrays())

    def lower(self, state: Any, target: Any, tokens: Any, key: Any) -> _LoweredStep:
        hp = self._trainer.abstract_hyperparams()
        return _LoweredStep(self.jit.lower(state, target, tokens, key, hp), self._trainer)


class _LoweredStep:
    """A lowered train step whose ``compile()`` gives a four-argument program (the
    hyperparameters bound); everything else is the ``jax.stages.Lowered``'s (``.lowered``)."""

    def __init__(self, lowered: Any, trainer: HyperparamSource) -> None:
        self.lowered = lowered
        self._trainer = trainer

    def compile(self, *args: Any, **kwargs: Any) -> _CompiledStep:
        return _CompiledStep(self.lowered.compile(*args, **kwargs), self._trainer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lowered, name)


class _CompiledStep:
    """A compiled train step called as ``(state, target, tokens, key)``; everything else is the
    ``jax.stages.Compiled``'s (``.compiled``; call it with ``hp`` as a fifth argument)."""

    def __init__(self, compiled: Any, trainer: HyperparamSource) -> None:
        self.compiled = compiled
        self._trainer = trainer

    def __call__(self, state: Any, target: Any, tokens: Any, key: Any) -> Any:
        return self.compiled(state, target, tokens, key, self._trainer.hyperparam_arrays())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.compiled, name)
