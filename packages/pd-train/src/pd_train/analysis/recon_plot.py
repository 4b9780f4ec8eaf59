"""``recon_per_site.png``: the last slow eval's hidden-activation recon per site and
attention-pattern recon per layer (see :mod:`pd_train.analysis.recon_eval`).

Left: ``hidden_mse_{ci,stochastic}/<site>`` as bars in canonical site order (log y); right:
``attn_kl_{ci,stochastic}/layers.<i>`` against the layer (Llama targets; absent otherwise).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pd_train.analysis.recon_eval import RECON_MASKS
from pd_train.outputs.records import Record, canonical_sites, last_with_prefix, of_phase

__all__ = ["RECON_PLOT", "plot_recon"]

log = logging.getLogger("pd_train.outputs")

RECON_PLOT = "recon_per_site.png"
_LAYER = re.compile(r"^layers\.(\d+)$")


def plot_recon(records: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """The plot from the last eval record with ``hidden_mse_ci/<site>``; nothing (logged) when
    no eval computed the slow-eval metrics."""
    record = last_with_prefix(of_phase(records, "eval"), "hidden_mse_ci/")
    if record is None:
        log.info("plots: no slow-eval records with hidden_mse_ci/<site>; skipping %s", RECON_PLOT)
        return []
    prefix = "hidden_mse_ci/"
    sites = canonical_sites(k[len(prefix) :] for k in record if k.startswith(prefix))
    layers = sorted(
        int(m.group(1))
        for k in record
        if k.startswith("attn_kl_ci/") and (m := _LAYER.match(k[len("attn_kl_ci/") :]))
    )
    from matplotlib.figure import Figure

    panels = 2 if layers else 1
    fig = Figure(figsize=(max(6.0, 0.25 * len(sites)) + 4.0 * (panels - 1), 3.6))
    fig.set_layout_engine("constrained")
    axes = fig.subplots(1, panels, squeeze=False).ravel()
    x = np.arange(len(sites))
    width = 0.8 / len(RECON_MASKS)
    for i, mask in enumerate(RECON_MASKS):
        values = [float(record.get(f"hidden_mse_{mask}/{s}", np.nan)) for s in sites]
        axes[0].bar(x + (i - 0.5) * width, values, width, label=mask)
    if any(float(record.get(f"hidden_mse_{m}/{s}", 0)) > 0 for m in RECON_MASKS for s in sites):
        axes[0].set_yscale("log")
    axes[0].set_xticks(x, sites, rotation=90, fontsize=max(3, min(7, 400 // max(len(sites), 1))))
    axes[0].set_title("hidden-activation recon (MSE of each site's output)", fontsize=9)
    axes[0].legend(fontsize=7)
    if layers:
        for mask in RECON_MASKS:
            values = [float(record.get(f"attn_kl_{mask}/layers.{i}", np.nan)) for i in layers]
            axes[1].plot(layers, values, marker="o", label=mask)
        axes[1].set_xticks(layers)
        axes[1].set_xlabel("layer")
        axes[1].set_title("attention-pattern recon (KL per layer)", fontsize=9)
        axes[1].legend(fontsize=7)
    fig.suptitle(f"slow eval, step {record.get('step')}")
    path = Path(out_dir) / RECON_PLOT
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    tmp.replace(path)
    return [path]
