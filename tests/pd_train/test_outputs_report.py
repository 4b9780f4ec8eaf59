"""Plots and the end-of-run summary, from synthetic metric records written through MetricsLog."""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pd_train.outputs import (
    MetricsLog,
    _plots,
    plot_ci_histograms,
    plot_l0,
    plot_loss_curves,
    read_metrics,
    render_summary,
    write_plots,
)
from pd_train.outputs._records import canonical_sites

KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def site(layer: int, kind: str) -> str:
    block = "mlp" if kind in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return f"layers.{layer}.{block}.{kind}"


def l0_of(i: int, step: int) -> float:
    return 100.0 / (1 + step / 10) + i


def write_run(
    run_dir: Path, sites: list[str], *, steps: int = 40, eval_every: int = 20
) -> list[dict[str, Any]]:
    """A run's metrics.jsonl: warmup, train losses every step, evals with CE/KL, L0, CI hists."""
    rng = np.random.default_rng(0)
    with MetricsLog(run_dir, is_primary=True) as log:
        for w in range(3):
            log.log(w, "warmup", {"loss/faithfulness": 1e-3 / (w + 1)})
        for step in range(steps):
            decay = np.exp(-step / 20)
            log.log(
                step,
                "train",
                {
                    "loss/faithfulness": np.float32(1e-4 * decay),
                    "loss/stochastic_recon": 0.5 * decay + 0.01 * rng.random(),
                    "loss/importance_minimality": 50.0 * decay + 1.0,
                    "loss/total": 2.0 * decay,
                    "grad_norm/components": 1.0,
                },
            )
            if (step + 1) % eval_every == 0:
                record: dict[str, Any] = {
                    "eval/ce_unmasked": 2.5,
                    "eval/kl_ci_masked": 0.25 * decay,
                    "eval/kl_rounded": 0.125,
                }
                for i, s in enumerate(sites):
                    record[f"l0/{s}"] = l0_of(i, step + 1)
                    counts = rng.integers(0, 100, size=10)
                    record[f"ci_hist/{s}"] = {"edges": np.linspace(0, 1, 11), "counts": counts}
                log.log(step + 1, "eval", record)
    return read_metrics(run_dir)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_canonical_order_is_layer_then_kind() -> None:
    shuffled = [
        site(10, "q_proj"),
        site(2, "down_proj"),
        site(2, "q_proj"),
        "embed",
        site(2, "o_proj"),
    ]
    assert canonical_sites(shuffled) == [
        site(2, "q_proj"),
        site(2, "o_proj"),
        site(2, "down_proj"),
        site(10, "q_proj"),
        "embed",
    ]


def test_write_plots_writes_every_plot_as_a_png(tmp_path: Path) -> None:
    sites = [site(layer, k) for layer in range(2) for k in ("q_proj", "up_proj", "down_proj")]
    records = write_run(tmp_path, sites)
    paths = write_plots(records, tmp_path / "plots")
    assert [p.name for p in paths] == [
        "loss_curves.png",
        "eval_curves.png",
        "l0_per_site.png",
        "l0_curves.png",
        "ci_hist_00.png",
    ]
    assert sorted((tmp_path / "plots").iterdir()) == sorted(paths)  # no temp files left
    for path in paths:
        width, height = png_size(path)
        assert width > 300 and height > 200
        assert path.stat().st_size > 5_000  # drawn, not blank


def test_ci_histograms_are_split_over_files_in_whole_rows(tmp_path: Path) -> None:
    sites = [site(layer, k) for layer in range(3) for k in ("q_proj", "down_proj")]
    records = write_run(tmp_path, sites, steps=20, eval_every=20)
    # Two kinds → two columns; 5 panels per file round down to 4 (two layers): 4 + 2 panels.
    paths = plot_ci_histograms(records, tmp_path / "plots", per_figure=5)
    assert [p.name for p in paths] == ["ci_hist_00.png", "ci_hist_01.png"]
    (w0, h0), (w1, h1) = png_size(paths[0]), png_size(paths[1])
    assert w0 == w1 and h0 > h1  # two rows, then one


def test_plots_skip_missing_or_malformed_data_with_a_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pd_train.outputs")
    assert write_plots([], tmp_path / "empty") == []
    assert not (tmp_path / "empty").exists()
    assert "skipping loss_curves.png" in caplog.text
    assert "skipping CI histograms" in caplog.text

    records = [
        {"step": 0, "phase": "train", "loss/total": "oops"},  # not a number: no curve
        {"step": 1, "phase": "eval", "l0/layers.0.mlp.up_proj": float("nan")},
        {
            "step": 1,
            "phase": "eval",
            "ci_hist/layers.0.mlp.up_proj": {"edges": [0, 1], "counts": [1, 2]},  # B+1 != 3
            "ci_hist/layers.0.mlp.down_proj": [1, 2, 3],
        },
    ]
    caplog.clear()
    assert write_plots(records, tmp_path / "plots") == []
    assert "ci_hist/layers.0.mlp.up_proj is not {edges: [B+1], counts: [B]}" in caplog.text
    assert "ci_hist/layers.0.mlp.down_proj is not" in caplog.text
    assert "L0 values are not finite" in caplog.text


def test_write_plots_survives_a_failing_plot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [{"step": s, "phase": "train", "loss/total": 1.0 / (s + 1)} for s in range(5)]

    def broken(records: object, out_dir: object) -> list[Path]:
        raise RuntimeError("disk full")

    monkeypatch.setattr(_plots, "PLOTS", (broken, plot_loss_curves, plot_l0))
    paths = write_plots(records, tmp_path)
    assert [p.name for p in paths] == ["loss_curves.png"]
    assert "broken failed" in caplog.text and "disk full" in caplog.text


def test_summary_reports_losses_l0_eval_and_outputs(tmp_path: Path) -> None:
    sites = [site(layer, k) for layer in range(2) for k in ("q_proj", "down_proj")]
    records = write_run(tmp_path, sites)
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "loss_curves.png").write_bytes(PNG_SIGNATURE)
    (tmp_path / "checkpoints" / "20").mkdir(parents=True)
    (tmp_path / "checkpoints" / "40").mkdir()
    (tmp_path / "config.yaml").write_text("seed: 0\n")

    text = render_summary(records, tmp_path, extra={"run name": "tiny"}, wall_time_s=3725)
    print(text)
    lines = text.splitlines()
    assert lines[0] == "pd-train summary"
    assert "  run name      tiny" in lines and "  wall time     1h02m" in lines
    assert "  steps logged  0..39 (40 records)" in lines

    last = records[-2]  # the last train record (the eval at step 40 follows it)
    assert last["phase"] == "train" and last["step"] == 39
    assert "final losses (train, step 39):" in text
    row = next(line for line in lines if line.strip().startswith("total "))
    assert row.split()[1] == f"{last['loss/total']:.4g}"
    assert next(line for line in lines if "faithfulness" in line).split()[1] == (
        f"{last['loss/faithfulness']:.4g}"
    )

    l0 = [l0_of(i, 40) for i in range(len(sites))]
    assert "L0 per site (eval, step 40, 4 sites):" in text
    for i, s in enumerate(canonical_sites(sites)):
        assert next(line for line in lines if line.strip().startswith(s)).split()[1] == (
            f"{l0_of(sites.index(s), 40):.4g}"
        ), i
    assert f"mean L0 {np.mean(l0):.4g}, total L0 {np.sum(l0):.7g}" in text

    assert "eval (step 40):" in text
    for key, value in (("ce_unmasked", 2.5), ("kl_rounded", 0.125)):
        assert next(line for line in lines if line.strip().startswith(key)).split()[1] == str(value)
    assert "kl_ci_masked" in text

    out = {line.split()[0]: line.split()[1:] for line in lines if str(tmp_path) in line}
    assert out[f"{tmp_path}/metrics.jsonl"] == []
    assert out[f"{tmp_path}/plots/"] == ["1", "PNG"]
    assert out[f"{tmp_path}/checkpoints/"] == ["steps", "20,", "40"]
    assert out[f"{tmp_path}/config.yaml"] == []
    assert out[f"{tmp_path}/compile.json"] == ["(missing)"]


def test_summary_of_a_large_decomposition_groups_l0_by_kind(tmp_path: Path) -> None:
    n_layers = 4
    sites = [site(layer, k) for layer in range(n_layers) for k in KINDS]
    record: dict[str, Any] = {"step": 10, "phase": "eval"}
    record.update({f"l0/{s}": float(KINDS.index(s.rsplit(".", 1)[1]) + 1) for s in sites})
    text = render_summary([record], tmp_path)
    assert "L0 per site (eval, step 10, 28 sites):" in text
    assert site(0, "q_proj") not in text  # no per-site rows
    lines = text.splitlines()
    for k, kind in enumerate(KINDS):
        assert next(line for line in lines if line.strip().startswith(kind + " ")).split() == [
            kind,
            str(n_layers),
            f"{k + 1:.4g}",
            f"{k + 1:.4g}",
            f"{k + 1:.4g}",
        ]
    assert "mean L0 4, total L0 112" in text


def test_summary_of_a_run_that_logged_nothing(tmp_path: Path) -> None:
    text = render_summary([], tmp_path)
    assert "final losses: none logged" in text
    assert "L0: none logged" in text
    assert "eval (" not in text
    assert f"{tmp_path}/metrics.jsonl  (missing)" in text


def test_summary_states_the_last_step_run_not_the_last_logged(tmp_path: Path) -> None:
    """A run logs every 10 steps but stops (SIGTERM) after step 33 of a resumed attempt: the
    summary names step 33 and its checkpoint (34), and the attempt's own range."""
    sites = [site(0, "q_proj")]
    records = [
        r
        for r in write_run(tmp_path, sites)
        if r["step"] <= 33 and (r["phase"] != "train" or r["step"] % 10 == 9)
    ]
    text = render_summary(records, tmp_path, last_step=33, attempt_first_step=20)
    lines = text.splitlines()
    assert any(
        line.split(None, 3)[:3] == ["last", "step", "run"]
        and line.split(None, 3)[3].startswith(
            "33 (0-based as in metrics.jsonl; its checkpoint is named 34)"
        )
        for line in lines
    ), text
    assert any("steps 20..33, resumed from checkpoint 20" in line for line in lines), text
    logged = max(r["step"] for r in records if r["phase"] == "train")
    assert logged == 29  # the point: the last logged step is not the last step run
