"""Component activation density in a run's own outputs: the summary section and a plot.

Both read the last eval record that carries ``density/<site>`` (per-component activation
density, see :class:`pd_train.analysis.statistics.EvalComponentStats`) and ``alive/<site>``:

* :func:`density_section`: summary lines — components alive (density > 0) of all, per kind, and
  the median and largest density of the alive ones;
* :func:`plot_density`: ``density_per_kind.png`` — per kind, the histogram of log10 density of
  its alive components, the dead ones counted in the panel's title.

Sites with more than :data:`~pd_train.analysis.statistics.MAX_LOGGED_COMPONENTS` components log
no density vector; they count in ``alive`` only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pd_train.outputs._records import (
    KIND_ORDER,
    Record,
    canonical_sites,
    last_with_prefix,
    of_phase,
    site_kind,
)

__all__ = ["DENSITY_PLOT", "density_by_kind", "density_section", "plot_density"]

log = logging.getLogger("pd_train.outputs")

DENSITY_PLOT = "density_per_kind.png"


def density_by_kind(record: Record) -> dict[str, np.ndarray]:
    """``{kind: densities of every component of its logged sites}`` of one eval record, kinds in
    canonical order."""
    sites = canonical_sites(k[len("density/") :] for k in record if k.startswith("density/"))
    out: dict[str, list[np.ndarray]] = {}
    for site in sites:
        value = np.asarray(record[f"density/{site}"], dtype=float).ravel()
        out.setdefault(site_kind(site), []).append(value)
    order = {k: i for i, k in enumerate(KIND_ORDER)}
    kinds = sorted(out, key=lambda k: (order.get(k, len(order)), k))
    return {k: np.concatenate(out[k]) for k in kinds}


def density_section(records: Sequence[Record]) -> list[str]:
    """The summary's component lines (empty without an eval record with ``alive/<site>``)."""
    record = last_with_prefix(of_phase(records, "eval"), "alive/")
    if record is None:
        return []
    alive = {k[len("alive/") :]: int(v) for k, v in record.items() if k.startswith("alive/")}
    by_kind = density_by_kind(record)
    lines = [f"components (eval, step {record.get('step')}; alive = density > 0):"]
    total = sum(by_kind[k].size for k in by_kind)
    logged_alive = sum(int(np.count_nonzero(v)) for v in by_kind.values())
    lines.append(f"  {sum(alive.values())} alive components in {len(alive)} sites")
    if total:
        lines.append(f"  logged per component: {logged_alive} of {total} alive")
    for kind, values in by_kind.items():
        live = values[values > 0]
        detail = (
            f", median density {np.median(live):.3g}, max {live.max():.3g}" if live.size else ""
        )
        lines.append(f"  {kind:<10} {live.size} of {values.size} alive{detail}")
    return lines


def plot_density(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """``density_per_kind.png`` from the last eval record with ``density/<site>``; nothing
    (logged) when there is none."""
    record = last_with_prefix(of_phase(records, "eval"), "density/")
    if record is None:
        log.info("plots: no eval records with density/<site>; skipping %s", DENSITY_PLOT)
        return []
    by_kind = density_by_kind(record)
    if not by_kind:
        return []
    from matplotlib.figure import Figure

    n = len(by_kind)
    ncols = min(n, 4)  # wrapped: 7 kinds are two rows, not a 2100-pixel strip
    nrows = -(-n // ncols)
    fig = Figure(figsize=(3.4 * ncols, 2.9 * nrows + 0.5), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    alive_all = np.concatenate([v[v > 0] for v in by_kind.values()])
    low = max(np.log10(alive_all.min()), -8.0) if alive_all.size else -8.0
    bins = np.linspace(low, 0.0, 31)
    for ax, (kind, values) in zip(axes, by_kind.items(), strict=False):
        live = values[values > 0]
        if live.size:
            ax.hist(np.log10(live), bins=bins, color="C0")
        ax.set_title(f"{kind}: {values.size - live.size} dead of {values.size}", fontsize=9)
        ax.set_xlabel("log10 density")
        ax.set_ylabel("components")
        ax.tick_params(labelsize=7)
    fig.suptitle(f"activation density per component (eval, step {record.get('step')})")
    path = Path(out_dir) / DENSITY_PLOT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    tmp.replace(path)
    return [path]
