"""Component activation density in a run's own outputs: the summary section and a plot.

Both read the last eval record that carries ``density/<site>`` (per-component activation
density, see :class:`pd_train.analysis.statistics.EvalComponentStats`) and ``alive/<site>``:

* :func:`density_section`: summary lines — per kind, how many components are dead, sparse,
  moderate and always on (:func:`density_class`), the median density of the alive ones, and
  the alive count under the references' definition;
* :func:`plot_density`: ``density_per_kind.png`` — per kind, the histogram of log10 density of
  its alive components, the dead ones counted in the panel's title.

Density classes (pd's names; the thresholds are :data:`SPARSE_BELOW` and
:data:`ALWAYS_ON_ABOVE`), for a component's density d on the eval tokens:

* **dead**: d = 0 — never above the threshold on those tokens;
* **sparse**: 0 < d < 0.1 — the components to read first;
* **moderate**: 0.1 <= d <= 0.9;
* **always on**: d > 0.9 — on at almost every token (their top contexts say little).

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

from pd_train.outputs.records import (
    KIND_ORDER,
    Record,
    canonical_sites,
    finite,
    last_with_prefix,
    of_phase,
    site_kind,
)

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

#: A component with 0 < density < SPARSE_BELOW is **sparse**.
SPARSE_BELOW = 0.1
#: A component with density > ALWAYS_ON_ABOVE is **always on**.
ALWAYS_ON_ABOVE = 0.9
#: The classes in the order a reader should look at them.
DENSITY_CLASSES = ("sparse", "moderate", "always on", "dead")


def density_class(density: float) -> str:
    """``"dead"`` (0), ``"sparse"`` (< 0.1), ``"always on"`` (> 0.9) or ``"moderate"``."""
    if density <= 0.0:
        return "dead"
    if density < SPARSE_BELOW:
        return "sparse"
    if density > ALWAYS_ON_ABOVE:
        return "always on"
    return "moderate"


def class_counts(density: np.ndarray) -> dict[str, int]:
    """``{class: number of components}`` of densities [n], every class of
    :data:`DENSITY_CLASSES` present (0 when empty)."""
    d = np.asarray(density, dtype=float).ravel()
    return {
        "sparse": int(np.count_nonzero((d > 0) & (d < SPARSE_BELOW))),
        "moderate": int(np.count_nonzero((d >= SPARSE_BELOW) & (d <= ALWAYS_ON_ABOVE))),
        "always on": int(np.count_nonzero(d > ALWAYS_ON_ABOVE)),
        "dead": int(np.count_nonzero(d <= 0)),
    }


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


def _fmt_threshold(threshold: float | None) -> str:
    return "the threshold (pd.l0_threshold)" if threshold is None else f"{threshold:g}"


def density_section(records: Sequence[Record], *, threshold: float | None = None) -> list[str]:
    """The summary's component lines (empty without an eval record with ``alive/<site>``).

    threshold: the run's ``pd.l0_threshold`` (ci_lower above it counts as active), named in
    the lines; None names the field instead.
    """
    record = last_with_prefix(of_phase(records, "eval"), "alive/")
    if record is None:
        return []
    alive = {k[len("alive/") :]: int(v) for k, v in record.items() if k.startswith("alive/")}
    by_kind = density_by_kind(record)
    tokens = finite(record.get("density_tokens"))
    on = f"{int(tokens)} eval tokens" if tokens else "the eval tokens"
    t = _fmt_threshold(threshold)
    lines = [
        f"components (eval, step {record.get('step')}, {on}; "
        f"density = fraction of tokens with ci_lower > {t}):"
    ]
    if by_kind:
        rows = []
        for kind, values in [*by_kind.items(), ("all", np.concatenate(list(by_kind.values())))]:
            counts = class_counts(values)
            live = values[values > 0]
            median = f"{np.median(live):.3g}" if live.size else "-"
            rows.append([kind, values.size, *(counts[c] for c in DENSITY_CLASSES), median])
        from pd_train.outputs.summary import table

        headers = ["kind", "components", *DENSITY_CLASSES, "median density (alive)"]
        lines += table(headers, rows)
        lines.append(
            f"  sparse: 0 < density < {SPARSE_BELOW:g}; moderate: {SPARSE_BELOW:g} to "
            f"{ALWAYS_ON_ABOVE:g}; always on: above {ALWAYS_ON_ABOVE:g}; dead: 0"
        )
    total = sum(by_kind[k].size for k in by_kind)
    logged = {s for s in alive if f"density/{s}" in record}
    n_alive = sum(alive.values())
    window = f"the last {int(tokens)} tokens" if tokens else "the eval's tokens"
    of_total = f" of {total}" if len(logged) == len(alive) and total else ""
    lines.append(
        f"  alive: {n_alive}{of_total} in {len(alive)} site{'' if len(alive) == 1 else 's'} "
        "(spd's AliveComponentsTracker: "
        f"ci_lower > {t} on at least one of {window})"
    )
    if len(logged) < len(alive):
        unlogged = sum(v for s, v in alive.items() if s not in logged)
        lines.append(
            f"  {len(alive) - len(logged)} of them too large to log per-component density "
            f"({unlogged} alive there) are left out of the table"
        )
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
