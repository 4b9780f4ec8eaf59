"""Orbax checkpoints of a decomposition run: two items per step, the last N kept.

``decomposition`` holds what a user of the result needs (V/U and CI-function params);
``training`` holds what only resuming needs (optimizer state, step, run key, data position, and
with a ``persistent_pgd_recon`` term the adversary: its sources and their optimizer state).
Every process calls :meth:`Checkpoints.save` and :meth:`Checkpoints.restore`; orbax writes each
process's shards and coordinates the commit. Restoring takes abstract targets whose leaves
carry shardings on the *current* mesh, so a checkpoint restores onto any device count that
divides the arrays.

Orbax is imported, and its manager started, on first use (a save, a restore, a listing): its
import costs about a second that a run should not spend before its first step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax

ITEMS = ("decomposition", "training")


class CheckpointError(RuntimeError):
    pass


class Checkpoints:
    """The checkpoint directory of one run (``RUN_DIR/checkpoints``); orbax's manager starts
    (and creates the directory) on first use."""

    def __init__(self, directory: str | Path, *, keep_last_n: int = 2) -> None:
        if keep_last_n < 1:
            msg = f"keep_last_n must be >= 1, got {keep_last_n}"
            raise ValueError(msg)
        self.directory = Path(directory).absolute()
        self.keep_last_n = keep_last_n
        self._started: Any = None

    @property
    def _manager(self) -> Any:
        if self._started is None:
            import orbax.checkpoint as ocp

            options = ocp.CheckpointManagerOptions(
                max_to_keep=self.keep_last_n,
                create=True,
                # Saves are synchronous: a SIGTERM save must be on disk before the process
                # exits, and resume-equality tests compare against what was written.
                enable_async_checkpointing=False,
            )
            self._started = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        return self._started

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, *, decomposition: Any, training: Any) -> None:
        """Write both items for ``step`` (a no-op if ``step`` is already saved)."""
        import orbax.checkpoint as ocp

        if step in self._manager.all_steps():
            return
        args = ocp.args.Composite(
            decomposition=ocp.args.StandardSave(decomposition),
            training=ocp.args.StandardSave(training),
        )
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()

    def restore(
        self, *, decomposition: Any, training: Any, step: int | None = None
    ) -> tuple[Any, Any, int]:
        """Restore ``step`` (default: the latest) onto the shardings of the abstract targets.

        ``decomposition`` and ``training`` are pytrees of ``jax.ShapeDtypeStruct`` with
        ``sharding`` set; returns ``(decomposition, training, step)``.
        """
        import orbax.checkpoint as ocp

        if step is None:
            step = self.latest_step()
        if step is None:
            msg = f"no checkpoint in {self.directory}; nothing to resume"
            raise CheckpointError(msg)
        if step not in self._manager.all_steps():
            msg = f"no checkpoint for step {step} in {self.directory}; have {self.steps()}"
            raise CheckpointError(msg)
        args = ocp.args.Composite(
            decomposition=ocp.args.StandardRestore(decomposition),
            training=ocp.args.StandardRestore(training),
        )
        restored = self._manager.restore(step, args=args)
        return restored.decomposition, restored.training, step

    def close(self) -> None:
        if self._started is not None:
            self._started.close()
            self._started = None

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def abstract_like(tree: Any) -> Any:
    """``jax.ShapeDtypeStruct`` leaves (with shardings) mirroring a tree of arrays."""
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)),
        tree,
    )
