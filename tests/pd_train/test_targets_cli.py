"""``pd-train run builtin:tms_5_2`` / ``pd-train pretrain``: the toy runner behind the pd-train CLI
(a few steps only; recovery itself is asserted in test_tms.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pd_train.cli import main
from pd_train.cli.toy import is_toy_config, load_toy_config


def test_run_builtin_toy_writes_the_run_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = ["run", "builtin:tms_5_2", "--run-dir", str(run_dir), "--max-steps", "3"]
    recipe = ["--set", "pd.steps=50", "--set", "pd.batch_size=32", "--set", "log_every=2"]
    recipe += ["--set", "steps_per_call=1", "--set", "pd.faithfulness_warmup.steps=2"]
    recipe += ["--set", "pd.decomposition_targets[0].C=12"]  # the recipe can change
    code = main([*argv, *recipe])
    assert code == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["phase"] == "train"]
    assert [r["step"] for r in train] == [0, 2]  # loss records every 2 steps + the last
    assert all("loss/total" in r for r in train)
    assert [r["step"] for r in records if r["phase"] == "warmup"] == [0, 1]
    final = records[-1]
    assert final["phase"] == "eval" and final["step"] == 2
    for site in ("layers.0.linear1", "layers.0.linear2"):
        assert 0 <= final[f"gt/alive/{site}"] <= 12  # the reference's, on a data window
        assert 0 <= final[f"gt/alive_one_hot/{site}"] <= 12
        assert final[f"gt/identity_ci_error/{site}"] >= 0.0  # the reference's count
    assert 0.0 <= final["gt/mmcs"] <= 1.0 and final["gt/ml2r"] >= 0.0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3
    assert len(summary["one_hot_ci"]["layers.0.linear1"]) == 5  # one row per feature
    assert len(summary["one_hot_ci"]["layers.0.linear1"][0]) == 12  # C from --set
    text = (run_dir / "summary.txt").read_text()
    assert "IdentityCIError" in text and "MMCS" in text
    for png in ("tms_5_2_permuted_ci.png", "tms_5_2_directions.png", "tms_5_2_uv.png"):
        assert (run_dir / "plots" / png).read_bytes()[:4] == b"\x89PNG"
    # The run dir's config.yaml is itself a toy config (run again as a file).
    saved = run_dir / "config.yaml"
    assert is_toy_config(str(saved))
    assert load_toy_config(str(saved)) == yaml.safe_load(saved.read_text())
    pd = load_toy_config(str(saved))["pd"]
    assert (pd["steps"], pd["batch_size"]) == (50, 32)
    assert pd["decomposition_targets"] == [{"module_pattern": "layers.*", "C": 12}]
    assert pd["loss_metrics"][1]["coeff"] == 3e-3  # the rest of the built-in recipe
    # A non-empty run dir is refused (exit 2), the run left as it was.
    before = (run_dir / "metrics.jsonl").read_text()
    assert main(argv) == 2
    assert (run_dir / "metrics.jsonl").read_text() == before


@pytest.mark.parametrize(
    ("yaml_text", "overrides", "field"),
    [
        ("toy: tms_5_2\ntarget: {type: resnet}\n", [], "target.type"),
        ("toy: tms_5_2\n", ["target.n_features=7"], "target.n_features"),
        ("toy: tms_5_2\n", ["pd.lr=0.1"], "pd.lr"),
        ("toy: tms_5_2\n", ["pd.steps=0"], "pd.steps"),
        ("toy: tms_5_2\n", ["pd.decomposition_targets[0].C=0"], "pd.decomposition_targets[0].C"),
        ("toy: tms_5_2\n", ["pd.loss_metrics[0].coeff=-1"], "pd.loss_metrics[0].coeff"),
        ("toy: tms_5_2\n", ["pd.components.lr=fast"], "pd.components.lr"),
        (
            "toy: tms_5_2\npd: {decomposition_targets: [{module_pattern: layers.1.*, C: 4}]}\n",
            [],
            "pd.decomposition_targets[0].module_pattern",
        ),
        ("toy: resid_mlp1\n", ["target.type=tms"], "target.type"),
        ("toy: resid_mlp1\n", ["target.d_mlp=10"], "target.d_mlp"),
        ("toy: tms_5_2\nsteps: 3\n", [], "steps"),
        ("toy: tms_9_9\n", [], "toy"),
        ("toy: tms_5_2\n", ["compile_cache.enabled=yes"], "compile_cache.enabled"),
        ("toy: tms_5_2\n", ["compile_cache.dir=3"], "compile_cache.dir"),
        ("toy: tms_5_2\ncompile_cache: {dir: ''}\n", [], "compile_cache.dir"),
        ("toy: tms_5_2\ncompile_cache: {path: /tmp/c}\n", [], "compile_cache.path"),
        ("toy: tms_5_2\ncompile_cache: /tmp/c\n", [], "compile_cache"),
    ],
)
def test_bad_toy_configs_name_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    yaml_text: str,
    overrides: list[str],
    field: str,
) -> None:
    config = tmp_path / "toy.yaml"
    config.write_text(yaml_text)
    run_dir = tmp_path / "run"
    argv = ["run", str(config), "--run-dir", str(run_dir)]
    for o in overrides:
        argv += ["--set", o]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"  {field}: " in err
    assert not run_dir.exists()  # nothing written


def test_pretrain_refuses_a_non_toy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrain", "builtin:default"]) == 2
    assert "no built-in toy 'default'" in capsys.readouterr().err


def test_pretrain_check_takes_no_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "w.npz"
    assert main(["pretrain", "builtin:tms_5_2", "--check", "--out", str(out)]) == 2
    assert "--check writes nothing" in capsys.readouterr().err
    assert not out.exists()


def test_compile_takes_a_toy_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "builtin:tms_5_2", "--set", "pd.batch_size=4"]) == 0
    out = capsys.readouterr().out
    for jit in ("init_params", "opt_init", "train_step"):
        assert f"| {jit} |" in out
    assert main(["compile", "builtin:tms_5_2", "--set", "pd.decomposition_targets[0].C=0"]) == 2
    assert "pd.decomposition_targets[0].C" in capsys.readouterr().err


def test_pretrain_check_matches_within_float_rounding_and_refuses_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--check`` passes the shipped weights bit for bit or within 0.1 of each array's scale
    (another CPU's rounding, amplified by training) and fails beyond; it writes nothing either
    way."""
    import numpy as np

    from pd_train.targets import toys

    shipped = toys.flat_weights(toys.load_weights(toys.toy_weights_path("tms_5_2")))
    scale = float(np.abs(shipped["layers.linear1"]).max())

    def check_against(delta: float) -> tuple[int, str]:
        moved = dict(shipped)
        moved["layers.linear1"] = shipped["layers.linear1"] + np.float32(delta * scale)
        path = tmp_path / f"moved_{delta:g}.npz"
        np.savez(path, **moved)
        monkeypatch.setattr(toys, "toy_weights_path", lambda name: path)
        before = path.read_bytes()
        code = main(["pretrain", "builtin:tms_5_2", "--check"])
        assert path.read_bytes() == before  # --check writes nothing
        return code, capsys.readouterr().out

    code, out = check_against(3e-2)  # what another instruction set's rounding did (resid_mlp1)
    assert code == 0, out
    assert "matches the shipped weights" in out and "within 0.1" in out
    code, out = check_against(0.5)  # another seed moves them by ~1.5
    assert code == 1, out
    assert "DIFFERS from the shipped weights" in out and "over 0.1" in out
