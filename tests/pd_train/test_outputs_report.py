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
    plot_ci_histograms,
    plot_l0,
    plot_loss_curves,
    read_metrics,
    render_summary,
    write_plots,
)
from pd_train.outputs import plots as _plots
from pd_train.outputs.records import canonical_sites

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
    assert "final losses (train, step 39; min: the least of the logged steps):" in text
    row = next(line for line in lines if line.strip().startswith("total "))
    assert row.split()[1] == f"{last['loss/total']:.4g}"
    assert next(line for line in lines if "faithfulness" in line).split()[1] == (
        f"{last['loss/faithfulness']:.4g}"
    )

    l0 = [l0_of(i, 40) for i in range(len(sites))]
    assert "L0 per site (eval, step 40, 4 sites; mean number of active components per token):" in (
        text
    )
    # One row per layer, one column per kind (q_proj, down_proj), 3 significant digits.
    grid = {line.split()[1]: line.split()[2:] for line in lines if line.startswith("  layer ")}
    assert grid == {
        str(layer): [
            f"{l0_of(sites.index(site(layer, k)), 40):.3g}" for k in ("q_proj", "down_proj")
        ]
        for layer in range(2)
    }
    assert "what was found" not in text  # no CE with CI masks, no density: nothing to state
    assert f"mean L0 {np.mean(l0):.4g}, total L0 {np.sum(l0):.7g}" in text

    assert (
        "eval (step 40; ce_<mask>: cross entropy in nats/token, kl_<mask>: KL(clean || masked) "
        "in nats/token):" in text
    )
    for key, value in (("ce_unmasked", 2.5), ("kl_rounded", 0.125)):
        assert next(line for line in lines if line.strip().startswith(key)).split()[1] == str(value)
    assert "kl_ci_masked" in text

    out = {line.split()[0]: line.split()[1:] for line in lines if str(tmp_path) in line}
    assert out[f"{tmp_path}/metrics.jsonl"] == []
    assert out[f"{tmp_path}/plots/"] == ["1", "PNG"]
    assert out[f"{tmp_path}/checkpoints/"] == ["steps", "20,", "40"]
    assert out[f"{tmp_path}/config.yaml"] == []
    assert out[f"{tmp_path}/compile.json"] == ["(missing)"]
    assert ["path", "holds"] in [line.split() for line in lines]  # both columns named


def test_summary_of_a_full_decomposition_shows_l0_per_site_as_a_grid(tmp_path: Path) -> None:
    """28 Llama sites: one row per layer, one column per kind, every site's own L0."""
    n_layers = 4
    sites = [site(layer, k) for layer in range(n_layers) for k in KINDS]
    record: dict[str, Any] = {"step": 10, "phase": "eval"}
    record.update(
        {f"l0/{s}": 10.0 * int(s.split(".")[1]) + KINDS.index(s.rsplit(".", 1)[1]) for s in sites}
    )
    text = render_summary([record], tmp_path)
    lines = text.splitlines()
    heading = "L0 per site (eval, step 10, 28 sites; mean number of active components per token):"
    header = lines[lines.index(heading) + 1]
    assert header.split() == list(KINDS)
    grid = [line.split() for line in lines if line.startswith("  layer ")]
    assert grid == [
        ["layer", str(layer), *(f"{10 * layer + k:.3g}" for k in range(len(KINDS)))]
        for layer in range(n_layers)
    ]
    assert "mean L0 18, total L0 504" in text  # Σ = 7·(0+10+20+30) + 4·(0+...+6)


def test_summary_of_many_sites_not_named_like_llama_groups_l0_by_kind(tmp_path: Path) -> None:
    names = [f"block{i}.{kind}" for i in range(5) for kind in ("a", "b", "c", "d", "e")]
    record: dict[str, Any] = {"step": 10, "phase": "eval"}
    record.update({f"l0/{s}": float("abcde".index(s[-1]) + 1) for s in names})
    text = render_summary([record], tmp_path)
    assert names[0] not in text  # 25 > 24 sites: no per-site rows
    lines = text.splitlines()
    for k, kind in enumerate("abcde"):
        row = next(line for line in lines if line.startswith(f"  {kind} "))
        assert row.split() == [kind, "5", f"{k + 1:.4g}", f"{k + 1:.4g}", f"{k + 1:.4g}"]
    assert "mean L0 3, total L0 75" in text


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


def _ci_fixture_record() -> dict[str, Any]:
    """An eval record made by the real reductions from a CI fixture whose classes are counted by
    hand: threshold 0.1, two eval batches of B=2 × T=10 tokens (the same CI twice: 40 tokens,
    each count doubled, so density = count in one batch / 20)."""
    import jax.numpy as jnp

    from pd_train.analysis import EvalComponentStats, component_counts
    from pd_train.config.pd import DecompositionTarget
    from pd_train.decomposition import build_decomposition

    from ._tiny import TINY

    model = TINY
    dec = build_decomposition(
        model,
        [
            DecompositionTarget(module_pattern="layers.*.self_attn.q_proj", C=3),
            DecompositionTarget(module_pattern="layers.1.mlp.down_proj", C=5),
        ],
    )
    q = np.zeros((2, 20, 3), np.float32)  # [layer, token, C], tokens as B·T = 2·10
    q[0, :, 0] = 0.7  # all 20 tokens: density 1 → always on
    q[0, 3, 1] = 0.9  # 1 token: 0.05 → sparse
    q[0, :, 2] = 0.1  # never *above* 0.1 → dead
    q[1, :2, 0] = 0.5  # 2 tokens: 0.1 → moderate (not below 0.1)
    q[1, :18, 1] = 0.4  # 18 tokens: 0.9 → moderate (not above 0.9)
    q[1, :19, 2] = 0.2  # 19 tokens: 0.95 → always on
    d = np.zeros((1, 20, 5), np.float32)
    # component 0: never on → dead
    d[0, 7, 1] = 0.11  # 1 token: 0.05 → sparse
    d[0, 0, 2] = 1.0  # 1 token: 0.05 → sparse
    d[0, 5:10, 3] = 0.3  # 5 tokens: 0.25 → moderate
    d[0, :, 4] = 0.09  # below the threshold everywhere → dead
    ci = {"q_proj": q.reshape(2, 2, 10, 3), "down_proj": d.reshape(1, 2, 10, 5)}
    stats = EvalComponentStats(dec)
    for _ in range(2):
        counts = component_counts({k: jnp.asarray(v) for k, v in ci.items()}, 0.1)
        stats.add(counts, n_tokens=20)
    record: dict[str, Any] = {"step": 300, "phase": "eval", **stats.record()}
    # L0 per site = Σ_c density, by hand: q0 1 + .05; q1 .1 + .9 + .95; down1 .05 + .05 + .25.
    l0 = {"layers.0.self_attn.q_proj": 1.05, "layers.1.self_attn.q_proj": 1.95}
    l0["layers.1.mlp.down_proj"] = 0.35
    record.update({f"l0/{s}": v for s, v in l0.items()})
    record.update(
        {
            "eval/ce_clean": 2.0,
            "eval/ce_ci": 2.1,
            "eval/ce_ones": 2.0,
            "eval/ce_stochastic": 2.05,
            "eval/ce_rounded": 2.5,
        }
    )
    return record


def _unwrap(lines: list[str]) -> list[str]:
    """Sentences wrapped over lines (continuations indented by 4) back on one line each."""
    out: list[str] = []
    for line in lines:
        if line.startswith("    ") and out:
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return out


def test_summary_states_what_was_found_from_a_ci_fixture(tmp_path: Path) -> None:
    """Sparse / moderate / always-on / dead counts, alive, L0 and CE gaps against the fixture's
    hand counts: 11 components, sparse q0c1 d1c1 d1c2, moderate q1c0 q1c1 d1c3, always on q0c0
    q1c2, dead q0c2 d1c0 d1c4."""
    (tmp_path / "config.yaml").write_text("pd:\n  l0_threshold: 0.1\n")
    record = _ci_fixture_record()
    assert record["density_tokens"] == 40
    text = render_summary([record], tmp_path)
    print(text)
    lines = text.splitlines()
    start = lines.index("what was found (eval, step 300):")
    assert all(len(line) <= 100 for line in lines[start : start + 12])
    assert _unwrap(lines)[start + 1 : start + 7] == [
        "  cross entropy (nats/token): clean 2; with the CI masks (each component scaled by its "
        "CI) 2.1 (+0.1, +5.0 %)",
        "  other masks: ones (every component at 1: V@U vs W) 2 (+0, +0.0 %); stochastic (the "
        "training's random masks) 2.05 (+0.05, +2.5 %); rounded (ci_lower > threshold as 1, else "
        "0) 2.5 (+0.5, +25.0 %)",
        "  components: 11 in 3 sites: 3 sparse (density < 0.1), 3 moderate, 2 always on "
        "(density > 0.9), 3 dead (never ci_lower > 0.1)",
        "  alive: 8 of 11 (spd's definition: ci_lower > 0.1 on at least one of the last 40 tokens)",
        "  L0: 3.35 active components per token over all 3 sites (of 11); 1.12 per site on average",
        "  reading: not sparse yet: 38 % of the alive components are sparse and 2 always on (a result "
        "worth reading has most sparse, few always on); train longer, raise the "
        "importance_minimality coeff or lower its pnorm_end",
    ]
    heading = "L0 per site (eval, step 300, 3 sites; mean number of active components per token):"
    assert start < lines.index(heading)
    # The per-kind table: medians of the alive densities by hand (q: .05 .1 .9 .95 1 → .9;
    # down: .05 .05 .25 → .05; all eight: (.1 + .25) / 2).
    section = lines[next(i for i, line in enumerate(lines) if line.startswith("components (")) :]
    assert section[0] == (
        "components (eval, step 300, 40 eval tokens; density = fraction of tokens with "
        "ci_lower > 0.1):"
    )
    rows = {line.split()[0]: line.split()[1:] for line in section[1:] if line.startswith("  ")}
    assert rows["q_proj"] == ["6", "1", "2", "2", "1", "0.9"]
    assert rows["down_proj"] == ["5", "2", "1", "0", "2", "0.05"]
    assert rows["all"] == ["11", "3", "3", "2", "3", "0.175"]
    assert (
        "  alive: 8 of 11 in 3 sites (spd's AliveComponentsTracker: ci_lower > 0.1 on at least "
        "one of the last 40 tokens)" in lines
    )
    # L0 per site as a layer × kind grid.
    grid = [line.split() for line in lines if line.startswith("  layer ")]
    assert grid == [["layer", "0", "1.05", "-"], ["layer", "1", "1.95", "0.35"]]


def test_summary_calls_a_sparse_decomposition_sparse(tmp_path: Path) -> None:
    """At least half of the alive components sparse and at most 1 in 20 always on: the summary
    says so (dead ones do not count against it)."""
    record = {
        "step": 5,
        "phase": "eval",
        "alive/layers.0.mlp.down_proj": 39,
        "density/layers.0.mlp.down_proj": [0.01] * 20 + [0.5] * 18 + [0.95] + [0.0] * 21,
    }
    text = "\n".join(_unwrap(render_summary([record], tmp_path).splitlines()))
    assert (
        "  components: 60 in 1 site: 20 sparse (density < 0.1), 18 moderate, 1 always on " in text
    )
    assert "  reading: sparse: 51 % of the alive components fire on under 10 % of tokens" in text
    record["density/layers.0.mlp.down_proj"][20] = (
        0.95  # a moderate one always on: 2 of 39, too many
    )
    text = "\n".join(_unwrap(render_summary([record], tmp_path).splitlines()))
    assert (
        "  reading: not sparse yet: 51 % of the alive components are sparse and 2 always on" in text
    )
    assert "(never ci_lower > pd.l0_threshold)" in text  # no config.yaml: the field is named
