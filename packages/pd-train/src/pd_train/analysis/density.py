"""Component activation density in a run's own outputs: the density plot, and the names of
the density classes and the summary's section (re-exported from where they live now).

All read the last eval record that carries ``density/<site>`` (per-component activation
density, see :class:`pd_train.analysis.statistics.EvalComponentStats`) and ``alive/<site>``:

* :func:`plot_density`: ``density_per_kind.png`` — per kind, the histogram of log10 density of
  its alive components, the dead ones counted in the panel's title;
* :func:`density_section` (:mod:`pd_train.outputs.summary`): summary lines — per kind, how many
  components are dead, sparse, moderate and always on, the median density of the alive ones,
  and the alive count under the references' definition;
* :func:`density_class`, :func:`class_counts`, :func:`density_by_kind`
  (:mod:`pd_train.outputs.density`): the classes — **dead** (d = 0), **sparse** (0 < d <
  :data:`SPARSE_BELOW`), **moderate**, **always on** (d > :data:`ALWAYS_ON_ABOVE`).

**Alive** is goodfire-ai/spd's definition (``AliveComponentsTracker``): a component is alive if
its ci_lower exceeded the threshold on at least one of the last ``n_examples_until_dead``
examples (tokens, in an LM). pd counts it over one evaluation, so ``n_examples_until_dead`` is
the eval's token count and alive means d > 0 (not dead).

Sites with more than :data:`~pd_train.analysis.statistics.MAX_LOGGED_COMPONENTS` components log
no density vector; they count in ``alive`` only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# The classes live with the outputs (the summary counts them) and the summary's section in
# the summary; both re-exported here, their old home.
from pd_train.outputs.density import (
    ALWAYS_ON_ABOVE,
    DENSITY_CLASSES,
    SPARSE_BELOW,
    class_counts,
    density_by_kind,
    density_class,
)
from pd_train.outputs.records import Record, last_with_prefix, of_phase
from pd_train.outputs.summary import density_section

__all__ = [
    "ALWAYS_ON_ABOVE",
    "DENSITY_CLASSES",
    "DENSITY_PLOT",
    "SPARSE_BELOW",
    "class_counts",
    "density_by_kind",
    "density_class",
    "density_section",
    "plot_density",
]

log = logging.getLogger("pd_train.outputs")

DENSITY_PLOT = "density_per_kind.png"


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
