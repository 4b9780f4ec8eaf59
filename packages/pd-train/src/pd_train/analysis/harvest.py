"""Harvest: per component, activation density, mean CI and the top-k activating positions over
many batches, in one jitted, sharded loop whose memory does not grow with the number of batches.

The state is a fixed-size tree per kind (n_k sites, C components, K = top_k, W = 2·window + 1):

* ``active`` [n_k, C] int32 — tokens with ci_lower > threshold;
* ``ci_sum`` [n_k, C] float32 — Σ ci_lower;
* ``top_ci`` [n_k, C, K] float32 — the K largest ci_lower seen, descending (−inf: none yet);
* ``top_where`` [n_k, C, K, 3] int32 — (batch, row, position) of each (−1: none);
* ``top_window`` [n_k, C, K, W] float32 — ci_lower of the same component at positions
  position − window … position + window of that row (NaN outside the sequence), so a report can
  shade every token of a context by CI without keeping any batch.

Per batch and site (``lax.map`` over each kind's stack, so temporaries exist for one site at a
time), the top K of each component comes in two stages that keep the work where the batch
lives: ``lax.top_k`` over each row's positions (the batch axis stays sharded), then over the
B·K row winners; the batch's top K is merged with the running top K by one more ``lax.top_k``
over the 2K candidates. ``lax.top_k`` puts the lower index first among equal values, and the
running entries come before the new ones, so ties go to the earliest (batch, row, position):
the result is exactly "sort every position by (−ci, batch, row, position), keep K".
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.analysis.statistics import ci_lower_of, component_counts

__all__ = ["HarvestResult", "Harvester", "harvest_update", "init_harvest_state"]

State = dict[str, dict[str, Any]]


def init_harvest_state(
    decomposition: Any, *, top_k: int, window: int, sharding: Any = None
) -> State:
    """The empty state {kind: {...}} (see the module docstring) for a decomposition's kinds;
    placed with ``sharding`` (e.g. replicated on the mesh) when given."""
    width = 2 * window + 1

    def empty() -> State:
        state: State = {}
        for layout in decomposition.kinds:
            n, c = len(layout.layers), layout.C
            state[layout.kind] = {
                "active": jnp.zeros((n, c), jnp.int32),
                "ci_sum": jnp.zeros((n, c), jnp.float32),
                "top_ci": jnp.full((n, c, top_k), -jnp.inf, jnp.float32),
                "top_where": jnp.full((n, c, top_k, 3), -1, jnp.int32),
                "top_window": jnp.full((n, c, top_k, width), jnp.nan, jnp.float32),
            }
        return state

    # Made on the devices by a jit: a host array with NaNs cannot be device_put onto several
    # processes (their equality check fails on NaN != NaN).
    return jax.jit(empty, out_shardings=sharding)()


def _batch_top_k(
    ci: jax.Array, batch_index: jax.Array, *, top_k: int, window: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The top ``top_k`` of one kind's batch: ci [n, B, T, C] → values [n, C, K], where
    [n, C, K, 3] (batch, row, position) and windows [n, C, K, 2·window + 1]."""
    n, rows, length, c = ci.shape
    ct = jnp.moveaxis(ci.astype(jnp.float32), 3, 1)  # [n, C, B, T]
    # Stage 1, per row (the sharded batch axis stays put): the row's top k1 positions and the
    # ci of the same component around each.
    k1 = min(top_k, length)
    v1, t1 = jax.lax.top_k(ct, k1)  # [n, C, B, k1]
    offsets = jnp.arange(-window, window + 1)
    around = t1[..., None] + offsets  # [n, C, B, k1, W]
    inside = (around >= 0) & (around < length)
    flat = jnp.clip(around, 0, length - 1).reshape(n, c, rows, -1)
    w1 = jnp.take_along_axis(ct, flat, axis=-1).reshape(around.shape)
    w1 = jnp.where(inside, w1, jnp.nan)
    # Stage 2, over the B·k1 row winners (row-major: ties keep the lower row, then position).
    k2 = min(top_k, rows * k1)
    v2, i2 = jax.lax.top_k(v1.reshape(n, c, rows * k1), k2)
    row = (i2 // k1).astype(jnp.int32)
    pos = jnp.take_along_axis(t1.reshape(n, c, rows * k1), i2, axis=-1).astype(jnp.int32)
    win = jnp.take_along_axis(w1.reshape(n, c, rows * k1, -1), i2[..., None], axis=2)
    where = jnp.stack([jnp.broadcast_to(batch_index, row.shape).astype(jnp.int32), row, pos], -1)
    if k2 < top_k:  # fewer positions in a batch than K: pad with "none"
        pad = top_k - k2
        v2 = jnp.pad(v2, ((0, 0), (0, 0), (0, pad)), constant_values=-jnp.inf)
        where = jnp.pad(where, ((0, 0), (0, 0), (0, pad), (0, 0)), constant_values=-1)
        win = jnp.pad(win, ((0, 0), (0, 0), (0, pad), (0, 0)), constant_values=jnp.nan)
    return v2, where, win


def harvest_update(
    state: State,
    ci_lower: dict[str, jax.Array],
    batch_index: jax.Array,
    *,
    threshold: float,
    top_k: int,
    window: int,
) -> State:
    """Fold one batch's ``ci_lower`` {kind: [n_k, B, T, C]} into the state (traceable).

    batch_index: int32 [], the batch's number (recorded in ``top_where``).
    """
    counts = component_counts(ci_lower, threshold)
    new: State = {}
    for kind, ci in ci_lower.items():
        old = state[kind]
        # One site at a time (lax.map over the kind's stack): the transposed copy and top_k's
        # sort buffers then exist for one site, not the whole kind (at Llama-8B shapes the
        # difference is hundreds of GiB of temporaries per device).
        values, where, windows = jax.lax.map(
            lambda site_ci: tuple(
                a[0] for a in _batch_top_k(site_ci[None], batch_index, top_k=top_k, window=window)
            ),
            ci,
        )
        cand = jnp.concatenate([old["top_ci"], values], axis=-1)  # running first: ties → older
        best, pick = jax.lax.top_k(cand, top_k)
        cand_where = jnp.concatenate([old["top_where"], where], axis=2)
        cand_win = jnp.concatenate([old["top_window"], windows], axis=2)
        new[kind] = {
            "active": old["active"] + counts["active"][kind],
            "ci_sum": old["ci_sum"] + counts["ci_sum"][kind],
            "top_ci": best,
            "top_where": jnp.take_along_axis(cand_where, pick[..., None], axis=2),
            "top_window": jnp.take_along_axis(cand_win, pick[..., None], axis=2),
        }
    return new


@dataclasses.dataclass(frozen=True)
class HarvestResult:
    """What a harvest found (host numpy arrays): ``state`` {kind: {...}} as in the module
    docstring, over ``n_batches`` batches of shape ``batch_shape`` [B, T]."""

    state: dict[str, dict[str, np.ndarray]]
    n_batches: int
    batch_shape: tuple[int, int]
    threshold: float
    top_k: int
    window: int
    seconds: float

    @property
    def n_tokens(self) -> int:
        return self.n_batches * self.batch_shape[0] * self.batch_shape[1]


class Harvester:
    """The harvest loop of one trainer: ``harvester.run(params, target, batches, n_batches=N)``.

    One jit, ``harvest_step(state, params, target, tokens [B, T], batch_index) -> state``, with
    the state donated and (on a mesh) replicated; tokens batch-sharded like the train step's.
    """

    def __init__(self, trainer: Any, *, threshold: float, top_k: int, window: int) -> None:
        if top_k < 1:
            msg = f"top_k is {top_k}; must be >= 1"
            raise ValueError(msg)
        if window < 0:
            msg = f"window is {window}; must be >= 0"
            raise ValueError(msg)
        self.trainer = trainer
        self.threshold = float(threshold)
        self.top_k = top_k
        self.window = window
        layout = trainer.layout
        self._replicated = layout.replicated() if layout is not None else None

        def harvest_step(
            state: State, params: Any, target: Any, tokens: jax.Array, batch_index: jax.Array
        ) -> State:
            ci = ci_lower_of(trainer, params, target, tokens)
            return harvest_update(
                state, ci, batch_index, threshold=self.threshold, top_k=top_k, window=window
            )

        kwargs: dict[str, Any] = {"donate_argnums": 0}
        if self._replicated is not None:
            kwargs["out_shardings"] = self._replicated
        self._step = jax.jit(
            harvest_step, compiler_options=trainer.compiler_options or None, **kwargs
        )

    def init_state(self) -> State:
        return init_harvest_state(
            self.trainer.decomposition,
            top_k=self.top_k,
            window=self.window,
            sharding=self._replicated,
        )

    def _index(self, i: int) -> jax.Array:
        index = np.asarray(i, np.int32)
        if self._replicated is None:
            return jnp.asarray(index)
        return jax.device_put(index, self._replicated)

    def lower(self, *, batch_size: int, seq_len: int, target_dtype: Any = jnp.bfloat16) -> Any:
        """Lower the harvest jit on abstract inputs (allocates nothing)."""
        trainer = self.trainer
        shape = (batch_size, seq_len)
        tokens = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=trainer.batch_sharding(shape))
        state = jax.eval_shape(self.init_state)
        index = jax.ShapeDtypeStruct((), jnp.int32, sharding=self._replicated)
        if self._replicated is not None:
            state = jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=self._replicated), state
            )
        return self._step.lower(
            state,
            trainer.abstract_state().params,
            trainer.abstract_target(target_dtype),
            tokens,
            index,
        )

    def run(
        self,
        params: Any,
        target: Any,
        batch: Callable[[int], np.ndarray],
        *,
        n_batches: int,
        mesh: Any = None,
        progress: bool = True,
    ) -> HarvestResult:
        """Harvest ``batch(0) … batch(n_batches − 1)`` (each [B, T] token rows on the host;
        with several processes, this process's rows of the global batch, assembled on ``mesh``).

        One batch is in flight at a time: the next batch is read on the host while the device
        works, then the loop waits, so neither device nor host memory grows with ``n_batches``.
        """
        import pd_sharding

        if n_batches < 1:
            msg = f"n_batches is {n_batches}; must be >= 1"
            raise ValueError(msg)

        def place(rows: np.ndarray) -> jax.Array:
            rows = np.asarray(rows, np.int32)
            if mesh is None:
                return jnp.asarray(rows)
            return pd_sharding.global_batch(rows, mesh)

        tokens = place(np.asarray(batch(0)))
        shape = (int(tokens.shape[0]), int(tokens.shape[1]))  # the global batch
        if n_batches * shape[0] * shape[1] >= 2**31:
            msg = f"n_batches {n_batches} × batch {shape} is 2**31 tokens or more; use fewer"
            raise ValueError(msg)
        bar = _Bar(n_batches, tokens_per_batch=shape[0] * shape[1], enabled=progress)
        started = time.perf_counter()
        state = self.init_state()
        for i in range(n_batches):
            state = self._step(state, params, target, tokens, self._index(i))
            if i + 1 < n_batches:
                tokens = place(batch(i + 1))  # host work overlaps the device's
            jax.block_until_ready(state)
            bar.update(i + 1)
        bar.close()
        host = jax.device_get(state)
        return HarvestResult(
            state={k: {n: np.asarray(a) for n, a in v.items()} for k, v in host.items()},
            n_batches=n_batches,
            batch_shape=shape,
            threshold=self.threshold,
            top_k=self.top_k,
            window=self.window,
            seconds=time.perf_counter() - started,
        )


class _Bar:
    """A tqdm bar on a terminal, else one plain line about every 10 % (stderr)."""

    def __init__(self, total: int, *, tokens_per_batch: int, enabled: bool) -> None:
        self.total = total
        self.tokens = tokens_per_batch
        self.enabled = enabled
        self.started = time.perf_counter()
        self.every = max(1, total // 10)
        self._bar: Any = None
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, unit="batch", file=sys.stderr, dynamic_ncols=True)

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
            return
        now = time.perf_counter()
        if done == 1:  # the rate leaves out the first batch, which includes the compile
            self.started = now
        if done % self.every == 0 or done == self.total:
            line = f"analyze: batch {done}/{self.total} ({100 * done // self.total}%)"
            if done > 1:
                line += (
                    f" | {(done - 1) * self.tokens / max(now - self.started, 1e-9):,.0f} tokens/s"
                )
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
