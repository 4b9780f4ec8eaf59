"""The faithfulness warm-up of a :class:`pd_train.train.Trainer`: N Adam steps on faithfulness
alone before step 0, its own small jit (lr as data)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

import pd_sharding
from pd_train.config import (
    PDConfig,
)
from pd_train.decomposition import Decomposition, site_weights
from pd_train.losses import (
    faithfulness,
)
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

    def abstract_params(self) -> dict[str, Any]:
        raise NotImplementedError

    def abstract_target(self, dtype: Any = jnp.bfloat16) -> Any:
        raise NotImplementedError

    def _run(self, name: str, jit: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _program(self, name: str, jit: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _warmup(
        self, components: Any, opt_state: Any, target: Any, lr: jax.Array
    ) -> tuple[Any, Any, jax.Array]:
        """One Adam step on faithfulness; ``lr`` f32 [] is data (the same program for any
        ``pd.faithfulness_warmup.lr``; the Adam state has the same structure as
        ``_warmup_tx``'s)."""

        def loss(c: Any) -> jax.Array:
            weights = site_weights(self.forward_spec.target, target, self.decomposition)
            return faithfulness(weights, c, self.decomposition)

        value, grads = jax.value_and_grad(loss)(components)
        updates, opt_state = optax.adam(lr).update(grads, opt_state, components)
        return optax.apply_updates(components, updates), opt_state, value

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
            self._warmup_lr(abstract=True),
        )

    def _warmup_lr(self, *, abstract: bool = False) -> Any:
        """``pd.faithfulness_warmup.lr`` as an f32 [] argument (replicated with a mesh)."""
        sharding = self.layout.replicated() if self.layout is not None else None
        if abstract:
            return jax.ShapeDtypeStruct((), jnp.float32, sharding=sharding)
        lr = jnp.asarray(self.pd.faithfulness_warmup.lr, jnp.float32)
        return lr if sharding is None else jax.device_put(lr, sharding)

    def faithfulness_warmup(
        self,
        state: TrainState,
        target: Any,
        *,
        steps: int | None = None,
        on_step: Callable[[int, float], None] | None = None,
    ) -> tuple[TrainState, list[float]]:
        """``pd.faithfulness_warmup.steps`` Adam steps (constant lr) on faithfulness alone,
        updating the components of ``state`` (donated); a small jit of its own. Returns the new
        state and the faithfulness before each step. ``on_step(i, value)`` is called as each
        step finishes (it waits for that step, so a record logged there carries its own time);
        without it the steps are dispatched back to back."""
        steps = self.pd.faithfulness_warmup.steps if steps is None else steps
        if steps == 0:
            return state, []
        components = state.params["components"]
        opt_state = self._run("warmup_init", self._warmup_init, components)
        lr = self._warmup_lr()
        warmup_step = self._program(
            "warmup_step", self._warmup_step, components, opt_state, target, lr
        )
        losses = []
        for i in range(steps):
            components, opt_state, value = warmup_step(components, opt_state, target, lr)
            losses.append(value)
            if on_step is not None:
                on_step(i, float(value))
        params = {**state.params, "components": components}
        return dataclasses.replace(state, params=params), [float(v) for v in losses]
