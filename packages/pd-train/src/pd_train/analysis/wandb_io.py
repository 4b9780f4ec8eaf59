"""A run's figures and files in Weights & Biases, and a decomposition loaded back from W&B.

What the tracker (:mod:`pd_train.analysis.tracking`) sends beside the scalars:

* **figures**: at each eval the plots of :mod:`pd_train.outputs` that show the last eval (L0 per
  site and over training, CI histograms, activation density per kind, recon per site at a slow
  eval) are rendered from the records up to that step and logged as images under
  ``eval/figures/<name>`` (``eval/figures/l0_per_site``, ``eval/figures/ci_hist_00``, …) at the
  eval's step, so W&B's media panel steps through them. ``pd-train track`` also logs the PNGs
  already under ``RUN_DIR/plots/`` that these renders do not cover (the loss curves, a toy
  run's permuted-CI and direction plots) under ``figures/<name>``.
* **the decomposition**: one artifact of type ``model`` named ``pd-<W&B run id>`` (aliases
  ``latest`` and ``step-<N>``) holding the run dir as :func:`run_files` lists it:
  ``config.yaml``, ``metrics.jsonl``, the summaries, ``plots/*.png`` and the latest finished
  checkpoint ``checkpoints/<N>/`` without its ``training`` item (optimizer state: only
  resuming needs it). A resumed run logs a new version at its end.

Loading back (:func:`pull`): ``wandb:ENTITY/PROJECT/runs/RUN_ID`` (also ``ENTITY/PROJECT/RUN_ID``
and ``https://wandb.ai/ENTITY/PROJECT/runs/RUN_ID``, the references spd accepts) downloads the
run's newest ``pd-<id>`` artifact with ``wandb.Api`` into a run dir that ``pd-train analyze``
and ``pd-train report`` read; they accept the reference in place of RUN_DIR and pull first.
Without a server, an offline run directory (``…/wandb/offline-run-<time>-<id>``) is read
directly: its ``run-<id>.wandb`` log holds the artifact's manifest (each file's path, size,
MD5 and the staged copy W&B keeps until ``wandb sync`` uploads it), and the staged files are
copied into the run dir, each checked against the manifest's size and digest.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "ARTIFACT_TYPE",
    "PullError",
    "WandbRef",
    "artifact_name",
    "is_wandb_ref",
    "log_run_artifact",
    "offline_records",
    "parse_wandb_ref",
    "pull",
    "render_eval_figures",
    "run_dir_of",
    "run_files",
]

log = logging.getLogger("pd_train.analysis")

ARTIFACT_TYPE = "model"
#: The plots (by function name in :data:`pd_train.outputs.plots.PLOTS`) that show the last
#: eval: rendered at each eval step. Loss and eval curves are W&B's own line charts.
EVAL_PLOTS = ("plot_l0", "plot_ci_histograms", "plot_density", "plot_recon")
#: Where a pulled run dir records what it was pulled from.
PULLED_FILE = "pulled.json"
#: Files of a run dir that go into its artifact (beside plots/ and the latest checkpoint).
RUN_DIR_FILES = ("config.yaml", "metrics.jsonl", "summary.txt", "summary.json")
#: A checkpoint's item that only resuming needs; left out of the artifact.
TRAINING_ITEM = "training"


class PullError(RuntimeError):
    """A run could not be loaded back from W&B (bad reference, no artifact, a bad file)."""


def artifact_name(run_id: str) -> str:
    return f"pd-{run_id}"


# --- figures -------------------------------------------------------------------------------


#: The tracker's figure thread (its notes of plots skipped for want of data stay quiet).
FIGURE_THREAD = "pd-wandb-figures"


class _QuietFigureThread(logging.Filter):
    """Drops the plot modules' info lines (``plots: no ... records; skipping``) logged from
    the figure thread: at every eval they would interleave with the run's progress."""

    def filter(self, record: logging.LogRecord) -> bool:
        thread = record.threadName or ""
        return record.levelno >= logging.WARNING or not thread.startswith(FIGURE_THREAD)


_QUIET = _QuietFigureThread()


def render_eval_figures(records: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """The :data:`EVAL_PLOTS` of ``records`` (each shows the last eval among them) as PNGs in
    ``out_dir``; a plot that fails or has no data is skipped (as ``write_plots`` does)."""
    from pd_train.outputs.plots import write_plots

    plots_log = logging.getLogger("pd_train.outputs")
    if _QUIET not in plots_log.filters:
        plots_log.addFilter(_QUIET)
    failure = "tracking: figure %s failed; not logged"
    return write_plots(records, out_dir, names=EVAL_PLOTS, failure=failure, logger=log)


def is_eval_figure(name: str) -> bool:
    """Whether the PNG file ``name`` (of ``RUN_DIR/plots``) is one that
    :func:`render_eval_figures` makes (logged at the evals already)."""
    from pd_train.analysis.density import DENSITY_PLOT
    from pd_train.analysis.recon_plot import RECON_PLOT
    from pd_train.outputs.plots import CI_HIST, L0_CURVES, L0_PER_SITE

    ci_prefix = CI_HIST.split("{")[0]
    return name in (L0_PER_SITE, L0_CURVES, DENSITY_PLOT, RECON_PLOT) or (
        name.startswith(ci_prefix) and name.endswith(".png")
    )


def images(paths: Sequence[Path], prefix: str) -> dict[str, Any]:
    """``{prefix/<file stem>: wandb.Image}`` of PNG files (W&B copies each file when the dict is
    logged)."""
    import wandb  # type: ignore[import-not-found,unused-ignore]  # the optional extra

    return {f"{prefix}/{p.stem}": wandb.Image(str(p)) for p in sorted(paths)}


# --- the artifact --------------------------------------------------------------------------


def latest_checkpoint(run_dir: Path) -> int | None:
    """The newest finished checkpoint step of ``run_dir`` (orbax names a finished step's
    directory by its number), or None."""
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return None
    steps = [int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit()]
    return max(steps, default=None)


def run_files(run_dir: Path) -> tuple[list[tuple[Path, str]], int | None]:
    """``([(file, name in the artifact)], checkpoint step)``: the run dir's config, records,
    summaries, ``plots/*.png`` and the latest finished checkpoint without its training item,
    each under its path relative to the run dir."""
    files = [(run_dir / n, n) for n in RUN_DIR_FILES if (run_dir / n).is_file()]
    plots = run_dir / "plots"
    if plots.is_dir():
        files += [(p, f"plots/{p.name}") for p in sorted(plots.glob("*.png")) if p.is_file()]
    step = latest_checkpoint(run_dir)
    if step is not None:
        root = run_dir / "checkpoints" / str(step)
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and rel.parts[0] != TRAINING_ITEM:
                files.append((path, f"checkpoints/{step}/{rel.as_posix()}"))
    return files, step


def log_run_artifact(run: Any, run_dir: Path, *, copy: bool) -> tuple[str, int | None]:
    """Log ``run_dir``'s :func:`run_files` as the ``pd-<run id>`` model artifact of the W&B
    ``run``; returns ``(artifact name, checkpoint step)``. ``copy``: W&B stages a copy of each
    file (needed offline, where the upload waits for ``wandb sync`` and a later save may delete
    an old checkpoint); online the files are uploaded in place before the run finishes."""
    import wandb  # type: ignore[import-not-found,unused-ignore]  # the optional extra

    files, step = run_files(run_dir)
    name = artifact_name(str(run.id))
    artifact = wandb.Artifact(
        name,
        type=ARTIFACT_TYPE,
        description=f"pd decomposition run dir {run_dir.name}",
        metadata={"checkpoint_step": step, "run_dir": run_dir.name},
    )
    for path, rel in files:
        artifact.add_file(str(path), name=rel, policy="mutable" if copy else "immutable")
    aliases = ["latest"] + ([f"step-{step}"] if step is not None else [])
    run.log_artifact(artifact, aliases=aliases)
    return name, step


# --- references ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WandbRef:
    entity: str
    project: str
    run_id: str

    @property
    def path(self) -> str:
        return f"{self.entity}/{self.project}/{self.run_id}"


_PART = r"([^/\s:]+)"
_RUN_ID = r"([A-Za-z0-9_-]+)"
_REFS = (
    re.compile(rf"^{_PART}/{_PART}/{_RUN_ID}$"),
    re.compile(rf"^{_PART}/{_PART}/runs/{_RUN_ID}$"),
    re.compile(rf"^https?://[^/]+/{_PART}/{_PART}/runs/{_RUN_ID}(?:[/?#].*)?$"),
)
REF_FORMS = (
    "wandb:ENTITY/PROJECT/runs/RUN_ID, wandb:ENTITY/PROJECT/RUN_ID or "
    "https://wandb.ai/ENTITY/PROJECT/runs/RUN_ID"
)


def is_wandb_ref(text: str) -> bool:
    """Whether ``text`` means a W&B run (``wandb:…`` or a W&B URL) rather than a local path."""
    return text.startswith(("wandb:", "https://wandb.ai/", "http://wandb.ai/"))


def parse_wandb_ref(text: str) -> WandbRef:
    """``wandb:ENTITY/PROJECT/runs/RUN_ID`` (or ``wandb:ENTITY/PROJECT/RUN_ID``, or the run's
    URL) → :class:`WandbRef`; PullError naming the forms otherwise."""
    body = text.strip().removeprefix("wandb:")
    for pattern in _REFS:
        if m := pattern.match(body):
            return WandbRef(*m.groups())
    msg = f"got {text!r}; a W&B run is named {REF_FORMS}"
    raise PullError(msg)


# --- the offline log -----------------------------------------------------------------------

_BLOCK = 32768  # LevelDB log framing: 32 KiB blocks
_CHUNK_HEADER = 7  # crc32 (4), length (2), type (1): 1 full, 2 first, 3 middle, 4 last
_FILE_HEADER = 7  # ":W&B", a version (2), a magic byte


def offline_records(path: Path) -> Iterator[Any]:
    """The protobuf ``Record``\\ s of an offline run's ``run-<id>.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb  # type: ignore[import-not-found,unused-ignore]

    data = path.read_bytes()
    if data[:4] != b":W&B":
        msg = f"{path} is not a W&B run log (no ':W&B' header)"
        raise PullError(msg)
    pos, buf = _FILE_HEADER, b""
    while pos + _CHUNK_HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _CHUNK_HEADER:
            pos += _BLOCK - pos % _BLOCK  # a block's tail too short for a header is padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _CHUNK_HEADER])
        buf += data[pos + _CHUNK_HEADER : pos + _CHUNK_HEADER + length]
        pos += _CHUNK_HEADER + length
        if kind in (1, 4):
            record = pb.Record()  # type: ignore[attr-defined,unused-ignore]
            record.ParseFromString(buf)
            buf = b""
            yield record


def _offline_log(directory: Path) -> Path:
    logs = sorted(directory.glob("run-*.wandb"))
    if not logs:
        msg = (
            f"{directory}: no run-<id>.wandb file; give an offline run directory "
            "(RUN_DIR/tracking/wandb/offline-run-<time>-<id>) or a W&B run as " + REF_FORMS
        )
        raise PullError(msg)
    return logs[-1]


def _attempts(directory: Path) -> list[Path]:
    """The run logs of ``directory``'s W&B run, oldest first: each sync or resume of a run
    writes another ``offline-run-<time>-<id>`` directory beside the first."""
    log_file = _offline_log(directory)
    run_id = log_file.stem.removeprefix("run-")
    siblings = directory.parent.glob(f"*-{run_id}")
    logs = [d / log_file.name for d in siblings if (d / log_file.name).is_file()]
    return sorted(logs, key=lambda p: p.parent.name) or [log_file]  # names start with the time


def _offline_artifact(directory: Path) -> Any:
    """The last ``pd-<id>`` model artifact record of an offline run (over all its attempts)."""
    found = None
    for log_file in _attempts(directory):
        for record in offline_records(log_file):
            if record.WhichOneof("record_type") != "artifact":
                continue
            art = record.artifact
            if art.type == ARTIFACT_TYPE and art.name == artifact_name(art.run_id):
                found = art
    if found is None:
        msg = (
            f"{directory}: the offline run logged no {artifact_name('<id>')} artifact "
            "(pd-train logs it when the run ends, or `pd-train track` does)"
        )
        raise PullError(msg)
    return found


def _md5_b64(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return base64.b64encode(digest.digest()).decode()


def _copy_offline(artifact: Any, dest: Path) -> None:
    """Copy each manifest entry's staged file to ``dest/<path>``, checked against its size and
    MD5 (the manifest's base64 digest)."""
    for entry in artifact.manifest.contents:
        rel = Path(entry.path)
        if not entry.path or rel.is_absolute() or ".." in rel.parts:
            msg = (
                f"{entry.path!r}: the artifact's manifest names a file outside the run dir; "
                "not a pd artifact (nothing copied)"
            )
            raise PullError(msg)
        staged = Path(entry.local_path)
        if not entry.local_path or not staged.is_file():
            msg = (
                f"{entry.path}: W&B's staged copy {entry.local_path or '(none)'} is gone "
                "(uploaded by `wandb sync` and removed, or WANDB_DATA_DIR differs); pull the "
                f"synced run as {REF_FORMS}"
            )
            raise PullError(msg)
        target = dest / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(staged, target)
        if target.stat().st_size != entry.size or _md5_b64(target) != entry.digest:
            msg = f"{entry.path}: the staged copy does not match the artifact's manifest"
            raise PullError(msg)


# --- pulling -------------------------------------------------------------------------------


def _default_out(run_id: str) -> Path:
    return Path.cwd() / "outputs" / f"wandb-{run_id}"


def _already(out: Path, source: str, digest: str) -> bool:
    """Whether ``out`` holds this very artifact version already (reused, not downloaded)."""
    marker = out / PULLED_FILE
    if not marker.is_file():
        return False
    try:
        pulled = json.loads(marker.read_text())
    except ValueError:
        return False
    return bool(pulled.get("source") == source and pulled.get("digest") == digest)


def _into(out: Path, fill: Any, info: dict[str, Any]) -> Path:
    """Fill a temp dir beside ``out`` with ``fill(tmp)`` and move it into place: a failed pull
    leaves nothing half-written. ``out`` must be absent or empty, or a pull of another version
    (replaced)."""
    pulled_before = (out / PULLED_FILE).is_file()
    if out.exists() and not pulled_before and (not out.is_dir() or any(out.iterdir())):
        msg = f"{out} exists and is not a pulled run dir; give another --out"
        raise PullError(msg)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        fill(tmp)
        if not (tmp / "config.yaml").is_file():
            msg = f"{info['source']}: the artifact holds no config.yaml; not a pd run"
            raise PullError(msg)
        (tmp / PULLED_FILE).write_text(json.dumps(info, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _wandb() -> Any:
    try:
        import wandb  # type: ignore[import-not-found,unused-ignore]  # the optional extra
    except ImportError:
        msg = "loading a run from W&B needs wandb: pip install 'pd-train[wandb]'"
        raise PullError(msg) from None
    return wandb


#: WANDB_MODE values under which wandb.Api() cannot reach a server.
_NO_SERVER_MODES = ("offline", "disabled", "dryrun")


def _pull_online(ref: WandbRef, out: Path | None) -> Path:
    mode = os.environ.get("WANDB_MODE", "")
    if mode in _NO_SERVER_MODES:
        msg = (
            f"wandb:{ref.path}: WANDB_MODE={mode} reaches no W&B server; pull the run's offline "
            "directory instead (RUN_DIR/tracking/wandb/offline-run-<time>-<id>), or unset "
            "WANDB_MODE"
        )
        raise PullError(msg)
    wandb = _wandb()
    try:
        run = wandb.Api().run(ref.path)
        found = [
            a
            for a in run.logged_artifacts()
            if a.type == ARTIFACT_TYPE and a.name.split(":")[0] == artifact_name(ref.run_id)
        ]
    except Exception as exc:  # wandb.errors.CommError and friends: no server, no such run
        msg = f"wandb:{ref.path}: {type(exc).__name__}: {exc}"
        raise PullError(msg) from exc
    if not found:
        msg = (
            f"wandb:{ref.path} logged no {artifact_name(ref.run_id)} artifact (pd-train logs "
            "it when the run ends with tracking.wandb.checkpoint: final, or `pd-train track`)"
        )
        raise PullError(msg)
    artifact = max(found, key=lambda a: int(str(a.version).lstrip("v") or 0))
    out = out or _default_out(ref.run_id)
    source = f"wandb:{ref.path}"
    if _already(out, source, artifact.digest):
        return out
    info = {"source": source, "artifact": artifact.name, "digest": artifact.digest}
    return _into(out, lambda tmp: artifact.download(root=str(tmp)), info)


def _pull_offline(directory: Path, out: Path | None) -> Path:
    _wandb()
    artifact = _offline_artifact(directory)
    out = out or _default_out(artifact.run_id)
    source = str(directory.absolute())
    if _already(out, source, artifact.digest):
        return out
    info = {
        "source": source,
        "artifact": f"{artifact.name} (offline)",
        "digest": artifact.digest,
        "project": artifact.project,
    }
    return _into(out, lambda tmp: _copy_offline(artifact, tmp), info)


def pull(source: str, out: Path | None = None) -> Path:
    """The run dir of the decomposition that ``source`` logged: a W&B run (``wandb:ENTITY/
    PROJECT/runs/RUN_ID``, through the W&B server) or an offline run directory (read from its
    files, no server), into ``out`` (default ``./outputs/wandb-<RUN_ID>``). A run dir pulled
    before from the same artifact version is reused; PullError says what is wrong."""
    if is_wandb_ref(source):
        return _pull_online(parse_wandb_ref(source), out)
    directory = Path(source)
    if directory.is_dir():
        return _pull_offline(directory, out)
    msg = (
        f"got {source!r}: not a directory; give an offline run directory "
        f"(RUN_DIR/tracking/wandb/offline-run-<time>-<id>) or a W&B run as {REF_FORMS}"
    )
    raise PullError(msg)


def run_dir_of(text: str | Path) -> Path:
    """RUN_DIR as ``pd-train analyze``/``report`` take it: a local path as is; a W&B run
    reference pulled first (:func:`pull`, reused when pulled before), its run dir printed."""
    if isinstance(text, Path) or not is_wandb_ref(text):
        return Path(text)
    out = pull(text)
    with contextlib.suppress(OSError):
        print(f"pd-train: {text} is the run dir {out}", flush=True)
    return out
