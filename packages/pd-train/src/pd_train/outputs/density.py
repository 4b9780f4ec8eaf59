"""Component activation density classes, read from an eval record's ``density/<site>``
vectors (per-component activation density, see
:class:`pd_train.analysis.statistics.EvalComponentStats`).

Density classes (pd's names; the thresholds are :data:`SPARSE_BELOW` and
:data:`ALWAYS_ON_ABOVE`), for a component's density d on the eval tokens:

* **dead**: d = 0 — never above the threshold on those tokens;
* **sparse**: 0 < d < 0.1 — the components to read first;
* **moderate**: 0.1 <= d <= 0.9;
* **always on**: d > 0.9 — on at almost every token (their top contexts say little).

The end-of-run summary (:mod:`pd_train.outputs.summary`) counts them, the density plot and the
report (:mod:`pd_train.analysis`) draw and sort by them.
"""

from __future__ import annotations

import numpy as np

from pd_train.outputs.records import KIND_ORDER, Record, canonical_sites, site_kind

__all__ = [
    "ALWAYS_ON_ABOVE",
    "DENSITY_CLASSES",
    "SPARSE_BELOW",
    "class_counts",
    "density_by_kind",
    "density_class",
]

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
