"""Component density in the run's own outputs: the summary's component lines and the
``density_per_kind.png`` plot, from eval records as the evaluator writes them."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from pd_train.analysis.density import DENSITY_PLOT, density_by_kind, density_section, plot_density
from pd_train.outputs import render_summary, write_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _records() -> list[dict]:
    first = {"step": 3, "phase": "eval", "alive/layers.0.mlp.down_proj": 1}
    last = {
        "step": 7,
        "phase": "eval",
        "eval/kl_ci": 0.5,
        # down before q in the file: kinds come out in canonical order anyway.
        "density/layers.1.mlp.down_proj": [0.0, 0.25, 0.5, 0.0],
        "density/layers.0.mlp.down_proj": [0.125, 0.0, 0.0, 0.0],
        "density/layers.1.self_attn.q_proj": [1e-3, 0.0],
        "alive/layers.1.mlp.down_proj": 2,
        "alive/layers.0.mlp.down_proj": 1,
        "alive/layers.1.self_attn.q_proj": 1,
        "alive/layers.2.mlp.down_proj": 5,  # a site too large to log its vector
    }
    return [{"step": 6, "phase": "train", "loss/total": 1.0}, first, last]


def test_density_by_kind_and_the_summary_lines() -> None:
    records = _records()
    by_kind = density_by_kind(records[-1])
    assert list(by_kind) == ["q_proj", "down_proj"]
    np.testing.assert_array_equal(by_kind["down_proj"], [0.125, 0, 0, 0, 0, 0.25, 0.5, 0])
    lines = density_section(records, threshold=0.1)
    assert lines == [
        "components (eval, step 7, the eval tokens; density = fraction of tokens with "
        "ci_lower > 0.1):",
        "  kind       components  sparse  moderate  always on  dead  median density (alive)",
        "  ---------  ----------  ------  --------  ---------  ----  ----------------------",
        "  q_proj              2       1         0          0     1                   0.001",
        "  down_proj           8       0         3          0     5                    0.25",
        "  all                10       1         3          0     6                   0.188",
        "  sparse: 0 < density < 0.1; moderate: 0.1 to 0.9; always on: above 0.9; dead: 0",
        "  alive: 9 in 4 sites (spd's AliveComponentsTracker: ci_lower > 0.1 on at least one "
        "of the eval's tokens)",
        "  1 of them too large to log per-component density (5 alive there) are left out of "
        "the table",
    ]
    assert density_section([records[0]]) == []


def test_run_summary_and_plots_show_density(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = _records()
    text = render_summary(records, tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("  down_proj  "))
    assert row.split() == ["down_proj", "8", "0", "3", "0", "5", "0.25"]
    paths = write_plots(records, tmp_path / "plots")
    assert tmp_path / "plots" / DENSITY_PLOT in paths
    data = (tmp_path / "plots" / DENSITY_PLOT).read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5_000
    caplog.set_level(logging.INFO, logger="pd_train.outputs")
    assert plot_density(records[:2], tmp_path / "none") == []
    assert f"skipping {DENSITY_PLOT}" in caplog.text


def test_slow_eval_recon_plot(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from pd_train.analysis.recon_plot import RECON_PLOT, plot_recon

    record: dict = {"step": 9, "phase": "eval"}
    sites = ["layers.0.mlp.down_proj", "layers.1.self_attn.q_proj", "layers.1.mlp.down_proj"]
    for mask, scale in (("ci", 1.0), ("stochastic", 2.0)):
        for i, s in enumerate(sites):
            record[f"hidden_mse_{mask}/{s}"] = scale * 10.0 ** -(i + 1)
        for layer in range(2):
            record[f"attn_kl_{mask}/layers.{layer}"] = scale * layer * 0.01
    records = [*_records(), record]
    paths = write_plots(records, tmp_path / "plots")
    assert tmp_path / "plots" / RECON_PLOT in paths
    data = (tmp_path / "plots" / RECON_PLOT).read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5_000
    caplog.set_level(logging.INFO, logger="pd_train.outputs")
    assert plot_recon(_records(), tmp_path / "none") == []
    assert f"skipping {RECON_PLOT}" in caplog.text
