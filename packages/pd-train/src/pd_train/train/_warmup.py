"""The faithfulness warm-up of a :class:`pd_train.train.Trainer`: N AdamW steps on faithfulness
alone before step 0, its own small jit (lr and weight decay as data). Weight decay is decoupled,
as torch's AdamW (the reference's ``faithfulness_warmup_weight_decay``, 0.1 in its toy
recipes); 0 is plain Adam. Tied kinds (:mod:`pd_train.targets.tied`) stay tied."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import pd_sharding
from pd_train.config.pd import (
    PDConfig,
)
from pd_train.decomposition import Decomposition, site_weights
from pd_train.losses import (
    faithfulness,
)
from pd_train.targets.tied import tie_components
from pd_train.train.state import TrainState


class TrainerWarmup:
    """The warm-up half of the Trainer (mixed into it)."""

    pd: PDConfig
    decomposition: Decomposition
    forward_spec: Any
    layout: Any
    _warmup_tx: optax.GradientTransformation
    _warmup_step: Any
    _warmup_init: Any
    ties: Any

    def abstract_params(self) -> dict[str, Any]:
        raise NotImplementedError

    def abstract_target(self, dtype: Any = jnp.bfloat16) -> Any:
        raise NotImplementedError

    def _run(self, name: str, jit: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _program(self, name: str, jit: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _warmup(
        self, components: Any, opt_state: Any, target: Any, lr: jax.Array, weight_decay: jax.Array
    ) -> tuple[Any, Any, jax.Array]:
        """One AdamW step on faithfulness; ``lr`` and ``weight_decay`` f32 [] are data (the
        same program for any ``pd.faithfulness_warmup.lr`` / ``.weight_decay``; the state has the
        same structure as ``_warmup_tx``'s)."""

        def loss(c: Any) -> jax.Array:
            weights = site_weights(self.forward_spec.target, target, self.decomposition)
            return faithfulness(weights, tie_components(c, self.ties), self.decomposition)

        value, grads = jax.value_and_grad(loss)(components)
        updates, opt_state = self._warmup_optimizer(lr, weight_decay).update(
            grads, opt_state, components
        )
        components = tie_components(optax.apply_updates(components, updates), self.ties)
        return components, opt_state, value

    @staticmethod
    def _warmup_optimizer(lr: Any, weight_decay: Any) -> optax.GradientTransformation:
        """AdamW (decoupled, as torch's: ``weight_decay``·lr·param per step; 0 is Adam) at a
        constant ``lr``; its state's structure does not depend on the values."""
        return optax.adamw(lr, weight_decay=weight_decay)

    def _warmup_opt_shardings(self) -> Any:
        if self.layout is None:
            return None
        components = self.abstract_params()["components"]
        return pd_sharding.opt_state_shardings(
            self._warmup_tx.init,
            components,
            jax.tree_util.tree_map(lambda a: a.sharding, components),
            mesh=self.layout.mesh,
        )

    def lower_warmup(self, target_dtype: Any = jnp.bfloat16) -> Any:
        """Lower one faithfulness-warmup step on abstract inputs (allocates nothing)."""
        components = self.abstract_params()["components"]
        opt_state = jax.eval_shape(self._warmup_tx.init, components)
        shardings = self._warmup_opt_shardings()
        if shardings is not None:
            opt_state = jax.tree_util.tree_map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                opt_state,
                shardings,
            )
        return self._warmup_step.lower(
            components,
            opt_state,
            self.abstract_target(target_dtype),
            *self._warmup_hp(abstract=True),
        )

    def _warmup_hp(self, *, abstract: bool = False) -> tuple[Any, Any]:
        """``pd.faithfulness_warmup.lr`` and ``.weight_decay`` as f32 [] arguments (replicated
        with a mesh)."""
        sharding = self.layout.replicated() if self.layout is not None else None
        if abstract:
            scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=sharding)
            return scalar, scalar
        warmup = self.pd.faithfulness_warmup
        values = []
        for v in (warmup.lr, warmup.weight_decay):
            # From numpy: jnp.asarray of a Python float would compile a convert program.
            values.append(jax.device_put(np.asarray(v, np.float32), sharding))
        return values[0], values[1]

    def faithfulness_warmup(
        self,
        state: TrainState,
        target: Any,
        *,
        steps: int | None = None,
        on_step: Callable[[int, float], None] | None = None,
    ) -> tuple[TrainState, list[float]]:
        """``pd.faithfulness_warmup.steps`` AdamW steps (constant lr) on faithfulness alone,
        updating the components of ``state`` (donated); a small jit of its own. Returns the new
        state and the faithfulness before each step. ``on_step(i, value)`` is called as each
        step finishes (it waits for that step, so a record logged there carries its own time);
        without it the steps are dispatched back to back."""
        steps = self.pd.faithfulness_warmup.steps if steps is None else steps
        if steps == 0:
            return state, []
        components = state.params["components"]
        opt_state = self._run("warmup_init", self._warmup_init, components)
        lr, wd = self._warmup_hp()
        warmup_step = self._program(
            "warmup_step", self._warmup_step, components, opt_state, target, lr, wd
        )
        losses = []
        for i in range(steps):
            components, opt_state, value = warmup_step(components, opt_state, target, lr, wd)
            losses.append(value)
            if on_step is not None:
                on_step(i, float(value))
        params = {**state.params, "components": components}
        return dataclasses.replace(state, params=params), [float(v) for v in losses]
