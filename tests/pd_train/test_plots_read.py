"""Plots a person reads at a glance (issue 31, item 9), checked on the artists matplotlib drew,
not on pixels: linear scales where a range is narrow, masks overlaid with clean on one axis,
legends outside the data, labelled axes, wrapped panels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure

from pd_train.analysis.density import plot_density
from pd_train.outputs import MetricsLog, plot_ci_histograms, plot_l0, read_metrics
from pd_train.outputs.plots import plot_eval_curves, plot_loss_curves

KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SITES = [
    f"layers.{layer}.{'mlp' if kind in KINDS[4:] else 'self_attn'}.{kind}"
    for layer in range(4)
    for kind in KINDS
]


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every figure saved while the test runs (the PNGs are still written)."""
    saved: list[Figure] = []
    original = Figure.savefig

    def savefig(self: Figure, *args: Any, **kwargs: Any) -> Any:
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved


def _records(tmp_path: Path) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    with MetricsLog(tmp_path / "run", is_primary=True) as log:
        for step in range(60):
            log.log(step, "train", {"loss/total": 100 * np.exp(-step / 5) + 0.01, "loss/kl": 0.5})
            if step % 10 == 9:
                record: dict[str, Any] = {
                    # The range: cross-entropies between 2.78 and 2.85.
                    "eval/ce_clean": 2.78,
                    "eval/ce_ci_masked": 2.85 - step * 1e-4,
                    "eval/ce_stochastic": 2.83,
                    "eval/kl_ci_masked": 0.05,
                    "eval/kl_stochastic": 0.04,
                }
                for i, s in enumerate(SITES):
                    record[f"l0/{s}"] = 10.0 + i / 10 + 50 / (step + 1)
                    counts = rng.integers(0, 100, size=10)
                    record[f"ci_hist/{s}"] = {"edges": np.linspace(0, 1, 11), "counts": counts}
                    record[f"density/{s}"] = list(rng.random(8) * 0.3)
                log.log(step + 1, "eval", record)
    return read_metrics(tmp_path / "run")


def _legend_outside(ax: Any) -> bool:
    """The legend's box lies right of the axes' box (in figure pixels), not over the data."""
    legend = ax.get_legend()
    assert legend is not None, ax.get_title()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(ax.figure).get_renderer()
    ax.figure.draw_without_rendering()  # the layout as saved
    return legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def test_masks_share_one_axis_with_clean_on_a_linear_scale(
    tmp_path: Path, figures: list[Figure]
) -> None:
    assert plot_eval_curves(_records(tmp_path), tmp_path / "plots")
    (fig,) = figures
    axes = [ax for ax in fig.axes if ax.get_visible()]
    ce = next(ax for ax in axes if ax.get_ylabel().startswith("cross-entropy"))
    labels = [line.get_label() for line in ce.get_lines()]
    assert labels == ["clean", "ci_masked", "stochastic"], labels
    assert ce.get_yscale() == "linear"  # 2.78-2.85 is no range for a log axis
    assert ce.get_lines()[0].get_linestyle() == "--"
    assert _legend_outside(ce)
    kl = next(ax for ax in axes if ax.get_ylabel().startswith("KL"))
    assert [line.get_label() for line in kl.get_lines()] == ["ci_masked", "stochastic"]
    assert len(axes) == 2  # two families, not one panel per mask
    for ax in axes:
        assert ax.get_xlabel() == "step"


def test_a_loss_over_decades_is_log_scaled_and_a_flat_one_is_not(
    tmp_path: Path, figures: list[Figure]
) -> None:
    assert plot_loss_curves(_records(tmp_path), tmp_path / "plots")
    (fig,) = figures
    scales = {ax.get_title(): ax.get_yscale() for ax in fig.axes if ax.get_visible()}
    assert scales == {"loss/total": "log", "loss/kl": "linear"}
    for ax in fig.axes:
        if ax.get_visible():
            assert ax.get_xlabel() == "step" and ax.get_ylabel() == "loss"


def test_l0_curves_explain_every_site_with_the_legend_beside_the_data(
    tmp_path: Path, figures: list[Figure]
) -> None:
    assert len(plot_l0(_records(tmp_path), tmp_path / "plots")) == 2
    bars, curves = figures
    (ax,) = curves.axes
    labels = [line.get_label() for line in ax.get_lines()]
    # One curve per kind, each saying how many sites it averages, and the mean of all 28.
    assert labels == [f"{kind} (4 sites)" for kind in KINDS] + ["all sites (28 sites)"]
    assert _legend_outside(ax)
    assert ax.get_xlabel() == "step" and ax.get_ylabel()
    (bar_ax,) = bars.axes
    assert _legend_outside(bar_ax)
    assert bar_ax.get_xlabel() == "site" and bar_ax.get_ylabel().startswith("L0")
    assert bar_ax.get_yscale() == "linear"


def test_ci_histogram_panels_have_labelled_axes(tmp_path: Path, figures: list[Figure]) -> None:
    assert plot_ci_histograms(_records(tmp_path), tmp_path / "plots")
    for fig in figures:
        for ax in fig.axes:
            if ax.get_visible():
                assert ax.get_xlabel() == "CI (lower)"
                assert ax.get_ylabel() == (
                    "positions (log)" if ax.get_yscale() == "log" else "positions"
                )


def test_the_density_plot_wraps_its_kinds_into_rows(tmp_path: Path, figures: list[Figure]) -> None:
    assert plot_density(_records(tmp_path), tmp_path / "plots")
    (fig,) = figures
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 7
    rows = {round(ax.get_position().y0, 3) for ax in visible}
    assert len(rows) == 2, rows  # 4 + 3, not a strip of 7
    width, height = fig.get_size_inches() * fig.dpi
    assert width / height < 3, (width, height)
    for ax in visible:
        assert ax.get_xlabel() == "log10 density" and ax.get_ylabel() == "components"
