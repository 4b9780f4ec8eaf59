"""PNG plots of a run's metric records (matplotlib's Agg renderer, no pyplot state).

Every function takes the records (as :func:`read_metrics` returns them) and an output directory
and returns the paths it wrote; a plot whose data is missing is skipped with a logged note.
:func:`write_plots` runs them all and never raises, so plotting cannot end a run.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from pd_train.outputs.records import (
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


#: A y axis goes logarithmic only when its positive values span more than this factor: a
#: cross-entropy between 2.78 and 2.85 reads on a linear axis, a loss falling from 1e3 to 1e-2
#: on a log one.
LOG_SCALE_MIN_RATIO = 30.0


def _scale_y(ax: Axes, values: Sequence[float]) -> None:
    """Log-y where the values are positive and span a wide range, else linear."""
    vals = [v for v in values if math.isfinite(v)]
    if vals and min(vals) > 0 and max(vals) / min(vals) > LOG_SCALE_MIN_RATIO:
        ax.set_yscale("log")


def _legend_outside(ax: Axes, **kwargs: Any) -> None:
    """The legend to the right of the axes, never over the data."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, **kwargs)


def _rolling_mean(steps: Sequence[int], values: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """A centered moving average (no lag), over about 1/25 of the points."""
    window = max(5, len(values) // 25) | 1
    smooth = np.convolve(values, np.ones(window) / window, mode="valid")
    start = window // 2
    return np.asarray(steps)[start : start + smooth.size], smooth


#: Eval metrics drawn together on one axis, one line per mask (``eval/ce_clean`` beside the
#: masked cross-entropies): the prefix, the y label.
_FAMILIES = (
    ("eval/ce_", "cross-entropy (nats)"),
    ("eval/kl_", "KL(clean ‖ masked) (nats)"),
    ("eval/hidden_mse_", "hidden-activation MSE"),
    ("eval/attn_kl_", "attention-pattern KL (nats)"),
)


def _panels(keys: Sequence[str]) -> list[tuple[str, str, list[str]]]:
    """(title, y label, keys) per panel: a family of masks on one panel, any other key alone."""
    panels: list[tuple[str, str, list[str]]] = []
    done: set[str] = set()
    for key in keys:
        if key in done:
            continue
        family = next(((p, label) for p, label in _FAMILIES if key.startswith(p)), None)
        if family is None:
            ylabel = "loss" if key.startswith("loss/") else key.rsplit("/", 1)[-1]
            panels.append((key, ylabel, [key]))
            done.add(key)
            continue
        prefix, label = family
        members = [k for k in keys if k.startswith(prefix)]
        members.sort(key=lambda k: (not k.endswith("_clean"), keys.index(k)))
        panels.append((prefix.rstrip("_") + "_*", label, members))
        done.update(members)
    return panels


def _curve_grid(records: Sequence[Record], keys: Sequence[str], title: str, path: Path) -> Path:
    panels = _panels(keys)
    nrows, ncols = _grid(len(panels), 2 if any(len(m) > 1 for *_, m in panels) else 3)
    fig = _figure(5.2 * ncols, 3.2 * nrows)
    fig.suptitle(title)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (name, ylabel, members) in zip(axes, panels, strict=False):
        drawn: list[float] = []
        for i, key in enumerate(members):
            steps, values = series(records, key)
            drawn += values
            clean = key.endswith("_clean")
            color = "black" if clean else f"C{i % 10}"
            label = key.rsplit("/", 1)[-1].split("_", 1)[-1] if len(members) > 1 else None
            # Noisy stochastic losses: the raw curve faint, a moving average on top.
            smooth = len(values) >= 20
            few = len(values) <= 50  # e.g. evals: show the points themselves
            ax.plot(
                steps,
                values,
                color=color,
                lw=0.8,
                ls="--" if clean else "-",
                alpha=0.35 if smooth else 1.0,
                marker="o" if few and not clean else None,
                ms=3,
                label=None if smooth else label,
            )
            if smooth:
                ax.plot(*_rolling_mean(steps, values), color=color, lw=1.5, label=label)
        _scale_y(ax, drawn)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel(ylabel)
        _step_axis(ax)
        ax.grid(True, alpha=0.3)
        if len(members) > 1:
            _legend_outside(ax, title="mask")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    return _save(fig, path)


def _numeric_keys(records: Sequence[Record], prefix: str) -> list[str]:
    return [k for k in keys_with_prefix(records, prefix) if series(records, k)[0]]


def plot_loss_curves(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """``loss_curves.png``: every ``loss/*`` key of the train records against step, one panel
    each (``loss/total`` first), log-y only where the values span a wide range."""
    train = of_phase(records, "train")
    keys = _numeric_keys(train, "loss/")
    if not keys:
        log.info("plots: no train records with loss/* values; skipping %s", LOSS_CURVES)
        return []
    keys.sort(key=lambda k: k != "loss/total")
    return [_curve_grid(train, keys, "training losses", Path(out_dir) / LOSS_CURVES)]


def plot_eval_curves(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """``eval_curves.png``: the eval records against step, each family of masks on one axis
    (every ``eval/ce_*`` with ``ce_clean`` dashed black, every ``eval/kl_*``, ...), legends
    beside the axes, linear y unless the values span a wide range."""
    evals = of_phase(records, "eval")
    keys = _numeric_keys(evals, "eval/")
    if not keys:
        log.info("plots: no eval records with eval/* values; skipping %s", EVAL_CURVES)
        return []
    return [_curve_grid(evals, keys, "evaluation", Path(out_dir) / EVAL_CURVES)]


def plot_l0(records: Sequence[Record], out_dir: str | Path, *, max_curves: int = 8) -> list[Path]:
    """``l0_per_site.png``: the last eval's L0 per site (train's when no eval has L0) as bars in
    canonical order, colored by kind; ``l0_curves.png``: the mean L0 of each kind's sites and
    of all sites against step, the legend beside the axes."""
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
        ax.set_xlabel("site")
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
        _legend_outside(ax, title="kind")
    _scale_y(ax, values)
    ax.set_ylabel("L0 (active components)")
    ax.set_xlim(-0.6, len(sites) - 0.4)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(
        f"L0 per site ({phase}, step {record.get('step')}): "
        f"mean {np.mean(values):.4g}, total {np.sum(values):.6g}"
    )
    return _save(fig, path)


def _l0_curves(rs: list[Record], sites: list[str], phase: str, max_curves: int, path: Path) -> Path:
    """The mean L0 of each kind's sites (every site counted, colored as in the bars) and the
    mean over all sites, against step. ``max_curves`` is kept for callers; kinds are few."""
    fig = _figure(8.5, 4.5)
    ax = fig.subplots()
    all_values: list[float] = []
    kinds = [k for k in KIND_ORDER if any(site_kind(s) == k for s in sites)]
    kinds += sorted({site_kind(s) for s in sites} - set(kinds))
    groups = [(k, [s for s in sites if site_kind(s) == k]) for k in kinds]
    groups.append(("all sites", sites))
    for kind, members in groups:
        steps, means = _mean_series(rs, members)
        last = kind == "all sites"
        ax.plot(
            steps,
            means,
            color="black" if last else _KIND_COLORS.get(kind, "C7"),
            lw=2.2 if last else 1.2,
            marker="o" if len(means) <= 50 and not last else None,
            ms=3,
            label=f"{kind} ({len(members)} sites)",
        )
        all_values += means
    _scale_y(ax, all_values)
    _step_axis(ax)
    ax.set_ylabel("L0 (mean over the sites)")
    ax.set_title(f"L0 over steps ({phase}): mean per kind")
    ax.grid(True, alpha=0.3)
    _legend_outside(ax, title="kind")
    return _save(fig, path)


def _mean_series(rs: list[Record], sites: list[str]) -> tuple[list[int], list[float]]:
    """(steps, mean L0 over ``sites``) of the records where every site has a finite L0."""
    steps: list[int] = []
    means: list[float] = []
    for r in rs:
        vals = [finite(r.get(f"l0/{s}")) for s in sites]
        if isinstance(r.get("step"), int) and all(v is not None for v in vals):
            steps.append(r["step"])
            means.append(float(np.mean([v for v in vals if v is not None])))
    return steps, means


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
        left=0.08,
        right=0.98,
        bottom=0.08,
        top=1 - 0.6 / (2.0 * nrows + 0.6),
        hspace=0.75,
        wspace=0.4,
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
        log_y = counts.max() > 0
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_minor_locator(NullLocator())
        ax.set_title(site, fontsize=8)
        ax.set_xlabel("CI (lower)", fontsize=7, labelpad=1)
        ax.set_ylabel("positions (log)" if log_y else "positions", fontsize=7, labelpad=1)
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


def write_plots(
    records: Sequence[Record],
    out_dir: str | Path,
    *,
    names: Collection[str] | None = None,
    failure: str = "plots: %s failed; skipped",
    logger: logging.Logger = log,
) -> list[Path]:
    """All plots (or those of :data:`PLOTS` whose function is named in ``names``) into
    ``out_dir`` (usually ``RUN_DIR/plots``); a plot that fails is logged (``failure`` % its
    name, on ``logger``) and skipped, never raised."""
    paths: list[Path] = []
    for plot in PLOTS:
        if names is not None and plot.__name__ not in names:
            continue
        try:
            paths += plot(records, out_dir)
        except Exception:
            logger.warning(failure, plot.__name__, exc_info=True)
    return paths
