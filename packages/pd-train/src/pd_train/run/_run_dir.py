"""The run dir: its name, what a run writes there, and what ``--run-dir D`` does with a
directory that already holds a run."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pd_train._output_paths import dated_dir
from pd_train.config.io import ConfigError
from pd_train.config.run import Config, load_config
from pd_train.run._prepare import Prepared

log = logging.getLogger("pd_train")

CONFIG_FILE = "config.yaml"
COMPILE_FILE = "compile.json"
METRICS_FILE = "metrics.jsonl"  # pd_train.outputs.METRICS_FILE (not imported: it pulls plots)


def new_run_dir(config: Config, *, base: Path | None) -> Path:
    """``output_dir/RUN_NAME-TIME`` (:func:`pd_train._output_paths.dated_dir`)."""
    return dated_dir(config.output_dir, config.run_name)


class RunDirError(ValueError):
    """``--run-dir`` names a directory that holds another run (nothing was touched)."""


#: What a run writes into its run dir that a new run must not write over.
RUN_MARKERS = (CONFIG_FILE, METRICS_FILE, "checkpoints")


def resolve_run_dir(prepared: Prepared, run_dir: Path) -> Prepared:
    """Decide what ``pd-train run CONFIG --run-dir RUN_DIR`` does with an existing directory.

    * RUN_DIR holds no run (absent, empty, or none of config.yaml, metrics.jsonl,
      checkpoints/): a new run there.
    * RUN_DIR/config.yaml equals the resolved config (CONFIG with its ``--set`` overrides):
      the same run again — resume from its latest checkpoint (returns ``prepared`` with
      ``resume_dir`` set, as ``--resume RUN_DIR`` would), or, with no checkpoint yet, start it
      from step 0 (a ``pd-train submit`` job's first start, or a restart of one that died before
      its first save; :func:`execute` keeps an earlier attempt's metrics file aside).
    * Anything else — another config, an unreadable config.yaml, checkpoints or metrics without
      a config.yaml — raises :class:`RunDirError` saying what is there and to use ``--resume``
      or another run dir. Nothing is written or removed.

    Every process decides alike: nothing is written into the run dir before all processes have
    joined ``jax.distributed`` (:func:`start_runtime` runs after this).
    """
    from pd_train.config.io import unstructure

    if run_dir.exists() and not run_dir.is_dir():
        msg = f"--run-dir {run_dir} is a file, not a directory"
        raise RunDirError(msg)
    present = [name for name in RUN_MARKERS if (run_dir / name).exists()]
    if not present:
        return prepared
    steps = checkpoint_steps(run_dir)
    holds = ", ".join(
        f"checkpoints at steps {steps}" if name == "checkpoints" and steps else name
        for name in present
    )
    advice = (
        f"to continue that run use `pd-train run --resume {run_dir}` (it reads the run's own "
        "config.yaml); to start a new run choose another --run-dir, or leave it out"
    )
    saved_path = run_dir / CONFIG_FILE
    if not saved_path.is_file():
        msg = f"--run-dir {run_dir} already holds {holds} but no {CONFIG_FILE}; {advice}"
        raise RunDirError(msg)
    try:
        saved, _ = load_config(saved_path)
    except ConfigError as exc:
        msg = (
            f"--run-dir {run_dir} holds a run whose {CONFIG_FILE} cannot be read ({exc}); {advice}"
        )
        raise RunDirError(msg) from None
    if saved != prepared.config:
        diffs = config_differences(unstructure(saved), unstructure(prepared.config))
        shown = "; ".join(f"{path}: {old!r} there, {new!r} here" for path, old, new in diffs[:5])
        more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
        msg = (
            f"--run-dir {run_dir} already holds a run ({holds}) with another config "
            f"({shown}{more}); nothing was changed. {advice[0].upper()}{advice[1:]}"
        )
        raise RunDirError(msg)
    if steps:
        log.info("run dir %s holds this run at step %d: resuming", run_dir, steps[-1])
        return replace(prepared, resume_dir=run_dir)
    return prepared


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Finished checkpoint steps: orbax names a finished step's directory by its number (an
    unfinished save has a temporary suffix)."""
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def config_differences(old: Any, new: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(field path, old, new) for every leaf where two unstructured configs differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in [*old, *(k for k in new if k not in old)]:
            sub = f"{path}.{key}" if path else str(key)
            out += config_differences(old.get(key), new.get(key), sub)
        return out
    sequences = (list, tuple)
    if isinstance(old, sequences) and isinstance(new, sequences) and len(old) == len(new):
        return [
            d
            for i, (a, b) in enumerate(zip(old, new, strict=True))
            for d in config_differences(a, b, f"{path}[{i}]")
        ]
    return [] if old == new else [(path, old, new)]


def keep_compile_record(run_dir: Path) -> None:
    """Move an earlier attempt's compile.json to ``compile-attempt-N.json`` (N = 1, 2, ... in
    the order the attempts ran), so every attempt's compiles stay visible; compile.json is
    always the latest attempt's."""
    record = run_dir / COMPILE_FILE
    if not record.exists():
        return
    n = 1
    while (run_dir / f"compile-attempt-{n}.json").exists():
        n += 1
    os.replace(record, run_dir / f"compile-attempt-{n}.json")


def start_run_dir(run_dir: Path, config: Config, *, resuming: bool) -> None:
    """Process 0's first writes into the run dir: config.yaml (a fresh run), an earlier
    attempt's metrics and compile record moved aside (see :func:`resolve_run_dir`)."""
    from pd_train.config.run import to_yaml

    run_dir.mkdir(parents=True, exist_ok=True)
    if not resuming and not (run_dir / CONFIG_FILE).exists():
        (run_dir / CONFIG_FILE).write_text(to_yaml(config))
    metrics_file = run_dir / METRICS_FILE
    if not resuming and metrics_file.exists():
        # A start from step 0 in a run dir with metrics: an earlier attempt of this run
        # (see resolve_run_dir) that saved no checkpoint. Keep its records, out of the way.
        stamp = f"{datetime.now():%Y%m%d-%H%M%S}"
        kept = run_dir / f"metrics-attempt-{stamp}.jsonl"
        n = 1
        while kept.exists():
            n += 1
            kept = run_dir / f"metrics-attempt-{stamp}-{n}.jsonl"
        os.replace(metrics_file, kept)
        log.warning("run dir %s: an earlier attempt's metrics moved to %s", run_dir, kept.name)
    if resuming:  # another device count than the checkpoint's: not bit-exact; say so
        import jax

        from pd_train.outputs import resume_device_warning

        if (note := resume_device_warning(run_dir, jax.device_count())) is not None:
            log.warning(note)
    keep_compile_record(run_dir)
