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

import json
from pathlib import Path
from typing import Any

import jax

ITEMS = ("decomposition", "training")


class CheckpointError(RuntimeError):
    pass


class Checkpoints:
    """The checkpoint directory of one run (``RUN_DIR/checkpoints``); orbax's manager starts
    (and creates the directory) on first use. ``writer``: the run's own (it removes partial
    saves an earlier attempt left when the manager starts); readers leave the directory as
    it is."""

    def __init__(
        self, directory: str | Path, *, keep_last_n: int = 2, writer: bool = False
    ) -> None:
        if keep_last_n < 1:
            msg = f"keep_last_n must be >= 1, got {keep_last_n}"
            raise ValueError(msg)
        self.directory = Path(directory).absolute()
        self.keep_last_n = keep_last_n
        self.writer = writer
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
                # The run (``writer``, which holds the run dir's lock) removes a partial save
                # an earlier attempt left (a failed save's late writes can recreate it after
                # that run removed it); a reader (analyze) never removes a live run's save.
                cleanup_tmp_directories=self.writer,
            )
            self._started = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)
        return self._started

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(
        self,
        step: int,
        *,
        decomposition: Any,
        training: Any,
        custom_metadata: dict[str, Any] | None = None,
    ) -> None:
        """Write both items for ``step`` (a no-op if ``step`` is already saved);
        ``custom_metadata`` (JSON values) is committed with them (:meth:`custom_metadata`)."""
        import orbax.checkpoint as ocp

        if step in self._manager.all_steps():
            return
        args = ocp.args.Composite(
            decomposition=ocp.args.StandardSave(decomposition),
            training=ocp.args.StandardSave(training),
        )
        self._manager.save(step, args=args, force=True, custom_metadata=custom_metadata)
        self._manager.wait_until_finished()

    def custom_metadata(self, step: int) -> dict[str, Any]:
        """The ``custom_metadata`` saved with ``step`` ({} if none); a damaged metadata file is
        a :class:`CheckpointError` naming it."""
        path = self.directory / str(step) / "_CHECKPOINT_METADATA"
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            msg = f"{path} cannot be read ({type(exc).__name__}: {exc}); the checkpoint is damaged"
            raise CheckpointError(msg) from None
        custom = data.get("custom_metadata") if isinstance(data, dict) else None
        return custom if isinstance(custom, dict) else {}

    def item_arrays(self, step: int, item: str) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{array path: (shape, dtype)}`` of one item of ``step``, read from its metadata (no
        array is read); paths join the tree's keys with dots (``params.V.q_proj``). A missing
        or damaged item is a :class:`CheckpointError` naming the file."""
        import orbax.checkpoint as ocp

        directory = self.directory / str(step) / item
        metadata_file = directory / "_METADATA"
        if not metadata_file.is_file():
            msg = f"{metadata_file} is missing; the checkpoint is damaged or incomplete"
            raise CheckpointError(msg)
        try:
            json.loads(metadata_file.read_text())
            metadata = ocp.StandardCheckpointer().metadata(directory)
        except Exception as exc:  # orbax raises many kinds on a damaged file
            msg = (
                f"{metadata_file} cannot be read ({type(exc).__name__}: {exc}); the checkpoint "
                "is damaged"
            )
            raise CheckpointError(msg) from None
        tree = getattr(metadata, "item_metadata", metadata)
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {
            tree_path_name(path): (tuple(leaf.shape), str(leaf.dtype))
            for path, leaf in leaves
            if hasattr(leaf, "shape")
        }

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
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as exc:  # tensorstore and orbax raise many kinds on damaged data
            msg = (
                f"checkpoint {self.directory / str(step)} cannot be restored "
                f"({type(exc).__name__}: {str(exc)[:500]}); the checkpoint is damaged or does "
                "not match the run's state"
            )
            raise CheckpointError(msg) from exc
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


def tree_path_name(path: Any) -> str:
    """A pytree key path as dot-joined names (``opt_state.0.mu.V.q_proj``)."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)
