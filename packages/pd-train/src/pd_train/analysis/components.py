"""``pd-train analyze``: a run's alive components, how often each fires, and where.

:func:`analyze_run` loads a run dir's config and one of its checkpoints (the latest by default;
any saved step, also while the run is still going), harvests N batches of the run's eval data
(:class:`~pd_train.analysis.harvest.Harvester`), and returns the component table;
:func:`write_table` writes it as Parquet (pyarrow), which pandas and polars open directly.

One row per alive component: at least one harvested token with ci_lower above the threshold
(goodfire-ai/spd's ``AliveComponentsTracker`` definition — fired within the last
``n_examples_until_dead`` tokens — with that window = the harvested tokens). Dead components
have no row; the metadata counts them per site. The report groups the rows by density class
(:func:`pd_train.analysis.density.density_class`: sparse, moderate, always on):

==================  ===================  =====================================================
column              type                 meaning
==================  ===================  =====================================================
site                string               ``layers.3.mlp.down_proj``
layer, kind         int32, string        the site's layer and kind
component           int32                index c in the site's V[:, c] ⊗ U[c, :]
density             float64              fraction of tokens with ci_lower > threshold
mean_ci             float64              mean ci_lower over all tokens
n_active            int64                tokens with ci_lower > threshold
top_ci              list<float32>        the top-k ci_lower values above threshold, descending
top_batch/row/pos   list<int32>          where each is: eval batch, row, position
top_center          list<int32>          index of the activating token in its context
top_token_ids       list<list<int32>>    the context: position − window … + window (clipped
                                         to the sequence)
top_tokens          list<list<string>>   the same, decoded with the target's vocabulary
                                         (``#id`` without one)
top_token_ci        list<list<float32>>  this component's ci_lower at every context token
top_text            list<string>         the decoded context, activating token in ⟦ ⟧
==================  ===================  =====================================================

The file's schema metadata (key ``pd_train.analysis``, JSON) holds the run dir, checkpoint step,
batches, tokens, threshold, top-k, window, the vocabulary's source and, per site, C and the
number of alive components (dead ones have no row).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pd_train.analysis.harvest import HarvestResult
from pd_train.analysis.vocab import Vocabulary, load_vocabulary

__all__ = [
    "METADATA_KEY",
    "AnalysisError",
    "ComponentTable",
    "analysis_path",
    "analyze_run",
    "build_table",
    "read_table",
    "run_dir_problem",
    "write_table",
]

METADATA_KEY = b"pd_train.analysis"
ANALYSIS_DIR = "analysis"


class AnalysisError(ValueError):
    """Bad input to ``analyze`` (a run dir without a checkpoint, a bad flag); nothing written."""


@dataclass
class ComponentTable:
    """The analysis as columns (see the module docstring) plus its metadata."""

    columns: dict[str, list[Any]]
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["site"])

    def to_arrow(self) -> Any:
        import pyarrow as pa

        types = {
            "site": pa.string(),
            "layer": pa.int32(),
            "kind": pa.string(),
            "component": pa.int32(),
            "density": pa.float64(),
            "mean_ci": pa.float64(),
            "n_active": pa.int64(),
            "top_ci": pa.list_(pa.float32()),
            "top_batch": pa.list_(pa.int32()),
            "top_row": pa.list_(pa.int32()),
            "top_pos": pa.list_(pa.int32()),
            "top_center": pa.list_(pa.int32()),
            "top_token_ids": pa.list_(pa.list_(pa.int32())),
            "top_tokens": pa.list_(pa.list_(pa.string())),
            "top_token_ci": pa.list_(pa.list_(pa.float32())),
            "top_text": pa.list_(pa.string()),
        }
        schema = pa.schema(
            [pa.field(name, t) for name, t in types.items()],
            metadata={METADATA_KEY: json.dumps(self.metadata).encode()},
        )
        arrays = [pa.array(self.columns[name], type=t) for name, t in types.items()]
        return pa.Table.from_arrays(arrays, schema=schema)


def _check_flags(n_batches: int, top_k: int, threshold: float | None, window: int) -> None:
    problems = []
    if n_batches < 1:
        problems.append(f"--n-batches: got {n_batches}; must be >= 1")
    if top_k < 1:
        problems.append(f"--top-k: got {top_k}; must be >= 1")
    if threshold is not None and not 0.0 <= threshold < 1.0:
        problems.append(
            f"--threshold: got {threshold}; must be in [0, 1) (ci_lower lies in [0, 1])"
        )
    if window < 0:
        problems.append(f"--window: got {window}; must be >= 0")
    if problems:
        raise AnalysisError("; ".join(problems))


def run_dir_problem(run_dir: Path, config_file: str) -> str | None:
    """Why ``run_dir`` is not a run dir (not a directory, no ``config_file`` in it), or None."""
    if not run_dir.is_dir():
        what = "is not a directory" if run_dir.exists() else "does not exist"
        return f"run dir {run_dir} {what}"
    if not (run_dir / config_file).is_file():
        return f"run dir {run_dir}: no {config_file}; not a run dir"
    return None


def _check_run_dir(run_dir: Path, checkpoint: int | None) -> int:
    """The checkpoint step to analyze; AnalysisError when the run dir cannot give one."""
    from pd_train.run import CONFIG_FILE, checkpoint_steps

    problem = run_dir_problem(run_dir, CONFIG_FILE)
    if problem is not None:
        raise AnalysisError(problem)
    steps = checkpoint_steps(run_dir)
    if not steps:
        msg = (
            f"run dir {run_dir}: no checkpoint yet (checkpoints/ holds no finished step); "
            "analyze needs a saved decomposition (cadence.save_every, or the end of the run)"
        )
        raise AnalysisError(msg)
    if checkpoint is None:
        return steps[-1]
    if checkpoint not in steps:
        msg = f"--checkpoint: got {checkpoint}; run dir {run_dir} has checkpoints at steps {steps}"
        raise AnalysisError(msg)
    return checkpoint


def analysis_path(run_dir: Path, step: int) -> Path:
    """Where ``analyze`` writes by default: ``RUN_DIR/analysis/components-step{step}.parquet``."""
    return run_dir / ANALYSIS_DIR / f"components-step{step:08d}.parquet"


def analyze_run(
    run_dir: str | Path,
    *,
    checkpoint: int | None = None,
    n_batches: int = 16,
    top_k: int = 10,
    threshold: float | None = None,
    window: int = 8,
    progress: bool = True,
    placement: Any = None,
) -> ComponentTable:
    """Harvest ``n_batches`` eval batches with the decomposition of ``run_dir`` at step
    ``checkpoint`` (default: the latest) and return the component table.

    threshold: ci_lower above it counts as active (default: the run's ``pd.l0_threshold``).
    window: context tokens on each side of an activation. placement: this process's
    :class:`pd_train.run.distributed.Placement` (default one process): with several, every process
    reads its rows of each eval batch into the global batch (as ``pd-train run`` does), and
    every process gets the same table (the caller writes it on process 0 only). Raises
    :class:`AnalysisError` for a run dir without a config or checkpoint, and ``ConfigError``
    for a config it cannot read, before anything is computed.
    """
    from pd_train.run import CONFIG_FILE, prepare, start_runtime
    from pd_train.run.data import Batches, TokenDataset
    from pd_train.run.distributed import Placement

    run_dir = Path(run_dir)
    _check_flags(n_batches, top_k, threshold, window)
    step = _check_run_dir(run_dir, checkpoint)
    prepared = prepare(run_dir / CONFIG_FILE)
    config = prepared.config
    vocab = load_vocabulary(prepared.checkpoint)
    if threshold is None:
        threshold = float(config.pd.l0_threshold)
        if not 0.0 <= threshold < 1.0:
            msg = f"pd.l0_threshold is {threshold}; give --threshold in [0, 1)"
            raise AnalysisError(msg)
    placement = placement or Placement()
    rt = start_runtime(prepared, placement)
    trainer = rt.trainer
    target = _load_target(prepared, trainer)
    params = _restore_params(run_dir / "checkpoints", step, trainer.abstract_state().params)
    eval_data = TokenDataset(
        prepared.eval_path,  # type: ignore[arg-type]
        seq_len=config.data.seq_len,
        dtype=config.data.dtype,
        vocab_size=prepared.model.vocab_size,
    )

    # The eval stream of the run (the same seed as its evaluations): this process's rows of
    # each global batch for the harvest; whole batches for the contexts.
    def stream(process_index: int, process_count: int) -> Batches:
        return Batches(
            eval_data,
            batch_size=config.pd.batch_size,
            seed=config.seed + 1,
            process_index=process_index,
            process_count=process_count,
        )

    from pd_train.analysis.harvest import Harvester

    harvester = Harvester(trainer, threshold=threshold, top_k=top_k, window=window)
    local = stream(placement.process_id, placement.num_processes)
    result = harvester.run(
        params,
        target,
        local.batch,
        n_batches=n_batches,
        mesh=rt.mesh,
        progress=progress and placement.is_primary,
    )
    table = build_table(result, trainer.decomposition, stream(0, 1).batch, vocab=vocab)
    table.metadata.update(run_dir=str(run_dir.absolute()), checkpoint_step=step)
    return table


def _restore_params(directory: Path, step: int, abstract_params: Any) -> Any:
    """The ``decomposition`` item of checkpoint ``step`` onto the trainer's shardings (the
    ``training`` item, optimizer state included, is not read)."""
    import orbax.checkpoint as ocp

    from pd_train.run.checkpoints import ITEMS

    options = ocp.CheckpointManagerOptions(create=False)
    with ocp.CheckpointManager(directory.absolute(), options=options, item_names=ITEMS) as manager:
        args = ocp.args.Composite(
            decomposition=ocp.args.StandardRestore({"params": abstract_params})
        )
        restored = manager.restore(step, args=args)
    return restored.decomposition["params"]


def _load_target(prepared: Any, trainer: Any) -> Any:
    """The frozen target, as :func:`pd_train.run.execute` loads it (one loader for both)."""
    import jax

    from pd_train.run import load_target, target_dtype

    dtype = target_dtype(prepared.config)
    shardings = jax.tree.map(lambda a: a.sharding, trainer.abstract_target(dtype))
    return load_target(prepared, shardings=shardings, dtype=dtype)


#: The table's columns: one value per component, then its top contexts (one list entry each).
_COMPONENT_COLUMNS = (
    "site",
    "layer",
    "kind",
    "component",
    "density",
    "mean_ci",
    "n_active",
    "top_ci",
)
_CONTEXT_COLUMNS = (
    "top_batch",
    "top_row",
    "top_pos",
    "top_center",
    "top_token_ids",
    "top_tokens",
    "top_token_ci",
    "top_text",
)


def build_table(
    result: HarvestResult,
    decomposition: Any,
    batch: Any,
    *,
    vocab: Vocabulary | None,
) -> ComponentTable:
    """The component table of a harvest: one row per alive component in canonical site order.

    batch(i) → token rows [B, T] of eval batch i (read again, one batch at a time, for the
    contexts).
    """
    entries, rows_out, sites_meta = _alive_components(result, decomposition)
    contexts = _contexts(entries, batch, result.window)
    columns: dict[str, list[Any]] = {name: [] for name in (*_COMPONENT_COLUMNS, *_CONTEXT_COLUMNS)}
    for row in rows_out:
        for name in _COMPONENT_COLUMNS:
            columns[name].append(row[name])
        for name, value in _context_cells(row, entries, contexts, result.window, vocab).items():
            columns[name].append(value)
    metadata = {
        "n_batches": result.n_batches,
        "batch_shape": list(result.batch_shape),
        "n_tokens": result.n_tokens,
        "threshold": result.threshold,
        "top_k": result.top_k,
        "window": result.window,
        "vocabulary": vocab.source if vocab else None,
        "sites": sites_meta,
        "n_components": sum(m["C"] for m in sites_meta.values()),
        "n_alive": sum(m["alive"] for m in sites_meta.values()),
        "harvest_seconds": result.seconds,
    }
    return ComponentTable(columns=columns, metadata=metadata)


def _alive_components(
    result: HarvestResult, decomposition: Any
) -> tuple[list[tuple[int, int, int]], list[dict[str, Any]], dict[str, dict[str, int]]]:
    """(every top-k entry above threshold of every alive component as (batch, row, pos), one
    row per alive component (its values, its entries' range, their CI windows), per site its
    C and number alive)."""
    n_tokens = result.n_tokens
    entries: list[tuple[int, int, int]] = []
    rows_out: list[dict[str, Any]] = []
    sites_meta: dict[str, dict[str, int]] = {}
    for site in decomposition.sites:
        st = result.state[site.kind]
        active = st["active"][site.index]
        ci_sum = st["ci_sum"][site.index]
        alive = np.flatnonzero(active > 0)
        sites_meta[site.name] = {"C": int(active.shape[0]), "alive": int(alive.size)}
        for c in alive:
            values = st["top_ci"][site.index, c]
            keep = values > result.threshold
            where = st["top_where"][site.index, c][keep]
            windows = st["top_window"][site.index, c][keep]
            first = len(entries)
            entries.extend((int(b), int(r), int(t)) for b, r, t in where)
            rows_out.append(
                {
                    "site": site.name,
                    "layer": site.layer,
                    "kind": site.kind,
                    "component": int(c),
                    "density": float(active[c]) / n_tokens,
                    "mean_ci": float(ci_sum[c]) / n_tokens,
                    "n_active": int(active[c]),
                    "top_ci": [float(v) for v in values[keep]],
                    "_entries": range(first, len(entries)),
                    "_windows": windows,
                }
            )
    return entries, rows_out, sites_meta


def _context_cells(
    row: dict[str, Any],
    entries: Sequence[tuple[int, int, int]],
    contexts: Sequence[tuple[int, int, list[int]]],
    window: int,
    vocab: Vocabulary | None,
) -> dict[str, list[Any]]:
    """One component's :data:`_CONTEXT_COLUMNS` cells: per top entry its place, its context's
    tokens (the entry's token marked ⟦·⟧ in the text) and their CI."""
    picked = [entries[e] for e in row["_entries"]]
    cells: dict[str, list[Any]] = {
        "top_batch": [b for b, _, _ in picked],
        "top_row": [r for _, r, _ in picked],
        "top_pos": [t for _, _, t in picked],
        **{name: [] for name in _CONTEXT_COLUMNS[3:]},
    }
    for e, win in zip(row["_entries"], row["_windows"], strict=True):
        start, center, token_ids = contexts[e]
        # win covers pos − window … pos + window; the context starts at max(0, pos − window).
        offset = start - (entries[e][2] - window)
        pieces = [vocab.token(t) if vocab else f"#{t}" for t in token_ids]
        marked = [f"⟦{p}⟧" if i == center else p for i, p in enumerate(pieces)]
        cells["top_center"].append(center)
        cells["top_token_ids"].append(token_ids)
        cells["top_tokens"].append(pieces)
        cells["top_token_ci"].append([float(v) for v in win[offset : offset + len(token_ids)]])
        cells["top_text"].append(vocab.join(marked) if vocab else " ".join(marked))
    return cells


def _contexts(
    entries: Sequence[tuple[int, int, int]], batch: Any, window: int
) -> list[tuple[int, int, list[int]]]:
    """Per entry (batch, row, pos): (start, center, token ids of pos − window … pos + window,
    clipped to the row). Each batch is read once, in order."""
    out: list[tuple[int, int, list[int]] | None] = [None] * len(entries)
    by_batch: dict[int, list[int]] = {}
    for i, (b, _, _) in enumerate(entries):
        by_batch.setdefault(b, []).append(i)
    for b in sorted(by_batch):
        rows = np.asarray(batch(b))
        length = rows.shape[1]
        for i in by_batch[b]:
            _, r, t = entries[i]
            start, stop = max(0, t - window), min(length, t + window + 1)
            out[i] = (start, t - start, [int(x) for x in rows[r, start:stop]])
    return out  # type: ignore[return-value]


def write_table(table: ComponentTable, path: str | Path) -> Path:
    """Write ``table`` as Parquet at ``path`` (through a temp file: never half-written)."""
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        pq.write_table(table.to_arrow(), tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_table(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """``(pyarrow.Table, metadata)`` of an analysis file."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    meta = table.schema.metadata or {}
    return table, json.loads(meta.get(METADATA_KEY, b"{}"))
