"""PNG plots of a run's metric records (matplotlib's Agg renderer, no pyplot state).

Every function takes the records (as :func:`read_metrics` returns them) and an output directory
and returns the paths it wrote; a plot whose data is missing is skipped with a logged note.
:func:`write_plots` runs them all and never raises, so plotting cannot end a run.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pd_train.outputs._records import (
    KIND_ORDER,
    Record,
    canonical_sites,
    finite,
    keys_with_prefix,
    l0_source,
    last_with_prefix,
    of_phase,
    series,
    site_kind,
    site_layer,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

log = logging.getLogger("pd_train.outputs")

LOSS_CURVES = "loss_curves.png"
EVAL_CURVES = "eval_curves.png"
L0_PER_SITE = "l0_per_site.png"
L0_CURVES = "l0_curves.png"
CI_HIST = "ci_hist_{:02d}.png"

_KIND_COLORS = dict(zip(KIND_ORDER, ("C0", "C1", "C2", "C3", "C4", "C5", "C6"), strict=True))


def _figure(
    width: float, height: float, *, layout: Literal["constrained"] | None = "constrained"
) -> Figure:
    # matplotlib is imported on first use: importing it takes seconds, and the run loop
    # imports this package before step 0.
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout=layout)


def _save(fig: Figure, path: Path) -> Path:
    """Write through a temp file so a killed run never leaves a truncated PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as f:
            fig.savefig(f, format="png", dpi=100)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _grid(n: int, ncols: int) -> tuple[int, int]:
    ncols = min(ncols, n)
    return math.ceil(n / ncols), ncols


def _step_axis(ax: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")


def _log_y_if_positive(ax: Axes, values: Sequence[float]) -> None:
    if values and min(values) > 0:
        ax.set_yscale("log")


def _rolling_mean(steps: Sequence[int], values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """A centered moving average (no lag), over about 1/25 of the points."""
    window = max(5, len(values) // 25) | 1
    smooth = np.convolve(values, np.ones(window) / window, mode="valid")
    start = window // 2
    return np.asarray(steps)[start : start + smooth.size], smooth


def _curve_grid(records: Sequence[Record], keys: Sequence[str], title: str, path: Path) -> Path:
    nrows, ncols = _grid(len(keys), 3)
    fig = _figure(4.2 * ncols, 3.0 * nrows)
    fig.suptitle(title)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, key in zip(axes, keys, strict=False):
        steps, values = series(records, key)
        # Noisy stochastic losses: the raw curve faint, a moving average on top.
        smooth = len(values) >= 20
        few = len(values) <= 50  # e.g. evals: show the points themselves
        ax.plot(
            steps,
            values,
            color="C0",
            lw=0.8,
            alpha=0.35 if smooth else 1.0,
            marker="o" if few else None,
            ms=3,
        )
        if smooth:
            ax.plot(*_rolling_mean(steps, values), color="C0", lw=1.5)
        _log_y_if_positive(ax, values)
        ax.set_title(key, fontsize=10)
        _step_axis(ax)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    return _save(fig, path)


def _numeric_keys(records: Sequence[Record], prefix: str) -> list[str]:
    return [k for k in keys_with_prefix(records, prefix) if series(records, k)[0]]


def plot_loss_curves(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """``loss_curves.png``: every ``loss/*`` key of the train records against step, one panel
    each (``loss/total`` first), log-y where all values are positive."""
    train = of_phase(records, "train")
    keys = _numeric_keys(train, "loss/")
    if not keys:
        log.info("plots: no train records with loss/* values; skipping %s", LOSS_CURVES)
        return []
    keys.sort(key=lambda k: k != "loss/total")
    return [_curve_grid(train, keys, "training losses", Path(out_dir) / LOSS_CURVES)]


def plot_eval_curves(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """``eval_curves.png``: every ``eval/*`` key (CE, KL, ...) of the eval records against step."""
    evals = of_phase(records, "eval")
    keys = _numeric_keys(evals, "eval/")
    if not keys:
        log.info("plots: no eval records with eval/* values; skipping %s", EVAL_CURVES)
        return []
    return [_curve_grid(evals, keys, "evaluation", Path(out_dir) / EVAL_CURVES)]


def plot_l0(records: Sequence[Record], out_dir: str | Path, *, max_curves: int = 8) -> list[Path]:
    """``l0_per_site.png``: the last eval's L0 per site (train's when no eval has L0) as bars in
    canonical order, colored by kind; ``l0_curves.png``: the mean over sites and up to
    ``max_curves`` sites spread over the canonical order, against step."""
    source = l0_source(records)
    if source is None:
        log.info("plots: no records with l0/<site> values; skipping %s", L0_PER_SITE)
        return []
    phase, rs = source
    last = rs[-1]
    sites = canonical_sites(k[3:] for k in last if k.startswith("l0/"))
    sites = [s for s in sites if finite(last[f"l0/{s}"]) is not None]
    if not sites:
        log.info("plots: the last %s record's L0 values are not finite; skipping L0", phase)
        return []
    out_dir = Path(out_dir)
    return [
        _l0_bars(last, sites, phase, out_dir / L0_PER_SITE),
        _l0_curves(rs, sites, phase, max_curves, out_dir / L0_CURVES),
    ]


def _l0_bars(record: Record, sites: list[str], phase: str, path: Path) -> Path:
    values = [float(record[f"l0/{s}"]) for s in sites]
    kinds = [site_kind(s) for s in sites]
    fig = _figure(min(max(8, 3 + 0.12 * len(sites)), 30), 4.5)
    ax = fig.subplots()
    x = np.arange(len(sites))
    ax.bar(x, values, width=0.85, color=[_KIND_COLORS.get(k, "C7") for k in kinds])
    if len(sites) <= 32:
        ax.set_xticks(x, sites, rotation=90, fontsize=7)
    else:
        # Too many bars to name: one tick per layer (thinned to at most 32 labels).
        firsts = [
            i for i, s in enumerate(sites) if i == 0 or site_layer(s) != site_layer(sites[i - 1])
        ]
        every = math.ceil(len(firsts) / 32)
        ticks = firsts[::every]
        ax.set_xticks(ticks, [str(site_layer(sites[i])) for i in ticks], fontsize=7)
        ax.set_xlabel("layer")
    present = [k for k in KIND_ORDER if k in kinds]
    for k in present:
        ax.bar([0], [0], color=_KIND_COLORS[k], label=k)  # legend entries only
    if present:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _log_y_if_positive(ax, values)
    ax.set_ylabel("L0 (active components)")
    ax.set_xlim(-0.6, len(sites) - 0.4)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(
        f"L0 per site ({phase}, step {record.get('step')}): "
        f"mean {np.mean(values):.4g}, total {np.sum(values):.6g}"
    )
    return _save(fig, path)


def _l0_curves(rs: list[Record], sites: list[str], phase: str, max_curves: int, path: Path) -> Path:
    fig = _figure(8, 4.5)
    ax = fig.subplots()
    all_values: list[float] = []
    picks = np.unique(np.linspace(0, len(sites) - 1, num=min(max_curves, len(sites))).round())
    for i in picks.astype(int):
        steps, values = series(rs, f"l0/{sites[i]}")
        ax.plot(
            steps, values, lw=1.0, label=sites[i], marker="o" if len(values) <= 50 else None, ms=3
        )
        all_values += values
    mean_steps: list[int] = []
    means: list[float] = []
    for r in rs:
        vals = [finite(r.get(f"l0/{s}")) for s in sites]
        if isinstance(r.get("step"), int) and all(v is not None for v in vals):
            mean_steps.append(r["step"])
            means.append(float(np.mean([v for v in vals if v is not None])))
    ax.plot(mean_steps, means, color="black", lw=2.2, label="mean over sites")
    _log_y_if_positive(ax, all_values + means)
    _step_axis(ax)
    ax.set_ylabel("L0")
    ax.set_title(f"L0 over steps ({phase})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def _histogram(value: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """(counts [B], edges [B+1]) from ``{"counts": [...], "edges": [...]}``, or None."""
    if not isinstance(value, dict) or "counts" not in value or "edges" not in value:
        return None
    try:
        counts = np.asarray(value["counts"], dtype=float)
        edges = np.asarray(value["edges"], dtype=float)
    except (TypeError, ValueError):
        return None
    if counts.ndim != 1 or edges.shape != (counts.size + 1,) or counts.size == 0:
        return None
    if not (np.all(np.isfinite(counts)) and np.all(np.isfinite(edges))):
        return None
    return counts, edges


def plot_ci_histograms(
    records: Sequence[Record], out_dir: str | Path, *, per_figure: int = 28
) -> list[Path]:
    """``ci_hist_NN.png``: the last eval's ``ci_hist/<site>`` histograms
    (``{"edges": [B+1], "counts": [B]}``), one log-y panel per site in canonical order, one
    column per kind (so a row is a layer when every layer has the same kinds), at most
    ``per_figure`` panels (rounded down to whole rows, at least one) per file."""
    if per_figure < 1:
        msg = f"per_figure must be >= 1, got {per_figure}"
        raise ValueError(msg)
    record = last_with_prefix(of_phase(records, "eval"), "ci_hist/")
    if record is None:
        log.info("plots: no eval records with ci_hist/<site>; skipping CI histograms")
        return []
    hists: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for site in canonical_sites(k[len("ci_hist/") :] for k in record if k.startswith("ci_hist/")):
        hist = _histogram(record[f"ci_hist/{site}"])
        if hist is None:
            log.info("plots: ci_hist/%s is not {edges: [B+1], counts: [B]}; skipped", site)
        else:
            hists[site] = hist
    sites = list(hists)
    if not sites:
        return []
    ncols = min(len({site_kind(s) for s in sites}), len(KIND_ORDER))
    per_file = max(ncols, per_figure // ncols * ncols)
    paths = []
    for f, first in enumerate(range(0, len(sites), per_file)):
        chunk = sites[first : first + per_file]
        paths.append(_ci_figure(hists, chunk, ncols, record, (first, len(sites)), out_dir, f))
    return paths


def _ci_figure(
    hists: dict[str, tuple[np.ndarray, np.ndarray]],
    chunk: list[str],
    ncols: int,
    record: Record,
    position: tuple[int, int],
    out_dir: str | Path,
    index: int,
) -> Path:
    nrows, ncols = _grid(len(chunk), ncols)
    # A fixed layout and no minor log ticks: layout engines and log minor ticks are most of the
    # rendering time with hundreds of panels.
    fig = _figure(2.6 * ncols, 2.0 * nrows + 0.6, layout=None)
    fig.subplots_adjust(
        left=0.06, right=0.98, bottom=0.06, top=1 - 0.6 / (2.0 * nrows + 0.6), hspace=0.55
    )
    first, total = position
    fig.suptitle(
        f"CI histograms (eval, step {record.get('step')}), "
        f"sites {first + 1}–{first + len(chunk)} of {total}"
    )
    from matplotlib.ticker import NullLocator

    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, site in zip(axes, chunk, strict=False):
        counts, edges = hists[site]
        ax.stairs(counts, edges, fill=True, color="C0")
        if counts.max() > 0:
            ax.set_yscale("log")
            ax.yaxis.set_minor_locator(NullLocator())
        ax.set_title(site, fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[len(chunk) :]:
        ax.set_visible(False)
    return _save(fig, Path(out_dir) / CI_HIST.format(index))


def plot_density(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """``density_per_kind.png``: :func:`pd_train.analysis.density.plot_density`."""
    from pd_train.analysis.density import plot_density as plot

    return plot(records, out_dir)


def plot_recon(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """``recon_per_site.png``: :func:`pd_train.analysis.recon_plot.plot_recon`."""
    from pd_train.analysis.recon_plot import plot_recon as plot

    return plot(records, out_dir)


PLOTS = (
    plot_loss_curves,
    plot_eval_curves,
    plot_l0,
    plot_ci_histograms,
    plot_density,
    plot_recon,
)


def write_plots(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """All plots into ``out_dir`` (usually ``RUN_DIR/plots``); a plot that fails is logged and
    skipped, never raised."""
    paths: list[Path] = []
    for plot in PLOTS:
        try:
            paths += plot(records, out_dir)
        except Exception:
            log.warning("plots: %s failed; skipped", plot.__name__, exc_info=True)
    return paths
