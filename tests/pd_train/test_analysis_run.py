"""``pd-train analyze`` on real tiny runs: the component table, a mid-run checkpoint, the
analysis of a resumed run against the uninterrupted one, and bad input (exit 2, nothing written)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pd_train.analysis import analysis_path, analyze_run, read_table
from pd_train.assets import tiny_vocab
from pd_train.cli import main
from pd_train.outputs import read_metrics

from ._analysis_runs import Runs, tiny_runs

SETTINGS = {"n_batches": 2, "top_k": 3, "window": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return tiny_runs(tmp_path_factory)


def _comparable(table: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    arrow = table.to_arrow()
    meta = dict(table.metadata)
    for key in ("run_dir", "harvest_seconds"):
        meta.pop(key)
    return arrow.to_pydict(), meta


def test_analyze_cli_writes_the_component_table(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = runs.uninterrupted
    code = main(["analyze", str(run_dir), "--n-batches", "2", "--top-k", "3", "--window", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    path = analysis_path(run_dir, 4)
    assert path.is_file() and str(path) in out
    pd = pytest.importorskip("pandas")
    frame = pd.read_parquet(path)  # pandas opens it as it is
    table, meta = read_table(path)
    assert len(frame) == table.num_rows == meta["n_alive"] > 0
    assert meta["checkpoint_step"] == 4
    assert meta["n_tokens"] == 2 * 8 * 16
    assert meta["threshold"] == 0.1  # the run's pd.l0_threshold
    assert {site: m["C"] for site, m in meta["sites"].items()} == {
        "layers.0.mlp.down_proj": 16,
        "layers.1.self_attn.q_proj": 8,
        "layers.1.mlp.down_proj": 16,
    }
    assert sum(m["alive"] for m in meta["sites"].values()) == len(frame)
    # Canonical site order, components ascending within a site.
    assert list(dict.fromkeys(frame["site"])) == [
        s
        for s in ("layers.0.mlp.down_proj", "layers.1.self_attn.q_proj", "layers.1.mlp.down_proj")
        if meta["sites"][s]["alive"]
    ]
    np.testing.assert_allclose(frame["density"], frame["n_active"] / meta["n_tokens"])
    assert (frame["density"] > 0).all() and (frame["density"] <= 1).all()
    assert (frame["mean_ci"] >= 0).all() and (frame["mean_ci"] <= 1).all()
    vocab = set(tiny_vocab())
    for _, row in frame.iterrows():
        top = np.asarray(row["top_ci"])
        assert 1 <= len(top) <= 3 and (top > 0.1).all() and (np.diff(top) <= 0).all()
        # Each context: the activating token's own CI is the top value; tokens are vocabulary words.
        for k, center in enumerate(row["top_center"]):
            assert row["top_token_ci"][k][center] == pytest.approx(top[k])
            assert set(row["top_tokens"][k]) <= vocab
            assert len(row["top_tokens"][k]) == len(row["top_token_ids"][k]) <= 5
            assert f"⟦{row['top_tokens'][k][center]}⟧" in row["top_text"][k]


def test_analysis_of_a_resumed_run_equals_the_uninterrupted_one(runs: Runs) -> None:
    straight = analyze_run(runs.uninterrupted, progress=False, **SETTINGS)
    resumed = analyze_run(runs.resumed, progress=False, **SETTINGS)
    assert _comparable(resumed) == _comparable(straight)
    # Mid-run checkpoint: step 2 of the uninterrupted run is another decomposition.
    mid = analyze_run(runs.uninterrupted, checkpoint=2, progress=False, **SETTINGS)
    assert mid.metadata["checkpoint_step"] == 2
    assert mid.columns["mean_ci"] != straight.columns["mean_ci"]


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("case", "args", "message"),
    [
        ("missing", [], "does not exist"),
        ("no_checkpoint", [], "no checkpoint yet"),
        ("bad_config", [], "pd.steps"),
        ("ok", ["--checkpoint", "3"], "--checkpoint: got 3; run dir"),
        ("ok", ["--top-k", "0", "--threshold", "1.5"], "--top-k: got 0"),
    ],
)
def test_analyze_bad_input_exits_2_and_writes_nothing(
    runs: Runs,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    args: list[str],
    message: str,
) -> None:
    run_dir = tmp_path / "run"
    if case != "missing":
        run_dir.mkdir()
        shutil.copy(runs.uninterrupted / "config.yaml", run_dir / "config.yaml")
    if case in ("bad_config", "ok"):
        shutil.copytree(runs.uninterrupted / "checkpoints", run_dir / "checkpoints")
    if case == "bad_config":
        text = (run_dir / "config.yaml").read_text().replace("steps: 4", "steps: -4")
        (run_dir / "config.yaml").write_text(text)
    before = _listing(tmp_path)
    assert main(["analyze", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    if "--top-k" in args:
        assert "--threshold: got 1.5" in err  # every bad flag named at once
    assert _listing(tmp_path) == before


def test_eval_records_component_density_mean_ci_and_l0_groups(runs: Runs) -> None:
    """The run's eval records carry per-component density and mean CI and grouped L0, and they
    agree with the eval's own per-site L0 (computed separately, by pd_train.losses.l0)."""
    evals = [r for r in read_metrics(runs.uninterrupted) if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [1, 3]
    sites = ("layers.0.mlp.down_proj", "layers.1.self_attn.q_proj", "layers.1.mlp.down_proj")
    for record in evals:
        for site in sites:
            density = np.asarray(record[f"density/{site}"])
            assert density.shape == ((8,) if "q_proj" in site else (16,))
            assert density.sum() == pytest.approx(record[f"l0/{site}"], rel=1e-5)
            assert record[f"alive/{site}"] == np.count_nonzero(density)
            mean = np.asarray(record[f"ci_mean/{site}"])
            assert ((mean >= 0) & (mean <= 1)).all() and (mean[density == 0] <= 0.1).all()
        assert record["l0_group/total"] == pytest.approx(
            sum(record[f"l0/{s}"] for s in sites), rel=1e-5
        )
        assert record["l0_group/layer.1"] == pytest.approx(
            record["l0/layers.1.self_attn.q_proj"] + record["l0/layers.1.mlp.down_proj"], rel=1e-5
        )
        assert record["l0_group/kind.down_proj"] == pytest.approx(
            record["l0/layers.0.mlp.down_proj"] + record["l0/layers.1.mlp.down_proj"], rel=1e-5
        )


def test_slow_eval_writes_recon_metrics_only_on_its_steps(runs: Runs) -> None:
    """``cadence.slow_eval_every: 4`` with evals at steps 2 and 4: only the step-4 eval (record
    step 3) carries hidden-activation and attention-pattern recon; the resumed run's equals the
    uninterrupted run's."""
    sites = ("layers.0.mlp.down_proj", "layers.1.self_attn.q_proj", "layers.1.mlp.down_proj")
    recon = ("hidden_mse_", "attn_kl_", "eval/hidden_mse_", "eval/attn_kl_")
    last = {}
    for run_dir in (runs.uninterrupted, runs.resumed):
        evals = {r["step"]: r for r in read_metrics(run_dir) if r["phase"] == "eval"}
        assert sorted(evals) == [1, 3]
        assert not [k for k in evals[1] if k.startswith(recon)]
        record = evals[3]
        keys = {k for k in record if k.startswith(recon)}
        expected = {
            f"eval/{m}_{mask}" for m in ("hidden_mse", "attn_kl") for mask in ("ci", "stochastic")
        }
        for mask in ("ci", "stochastic"):
            expected |= {f"hidden_mse_{mask}/{s}" for s in sites}
            expected |= {f"attn_kl_{mask}/layers.{i}" for i in range(4)}
            # Layer 0's attention comes before every decomposed site: the same in both models.
            assert record[f"attn_kl_{mask}/layers.0"] == 0.0
            assert record[f"attn_kl_{mask}/layers.1"] > 0.0
            assert all(record[f"hidden_mse_{mask}/{s}"] > 0.0 for s in sites)
        assert keys == expected
        last[run_dir] = {k: record[k] for k in keys}
    for key, value in last[runs.uninterrupted].items():
        assert last[runs.resumed][key] == pytest.approx(value, rel=1e-5, abs=1e-9), key
