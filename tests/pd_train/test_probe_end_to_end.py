"""``pd-train probe`` end to end: real ``pd-train compile`` / ``pd-train run`` processes, one
per arm, each in its own caches; the report, the isolation proof and (steps mode) identical
losses of the scan and unrolled chunk loops."""

from __future__ import annotations

import csv
import json
import os

import pytest
import yaml

from pd_probe import arm_paths, check_isolation
from pd_train.cli import probe as probe_cli

from ._probe import SMALL

JITS = ("init_params", "opt_init", "train_step")


@pytest.fixture
def small_config(tmp_path, monkeypatch):
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL))
    # Arms inherit this: cheaper LLVM work, same programs (the test checks the pipeline, not
    # the speed).
    flags = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip())
    return path


@pytest.mark.slow
def test_three_arm_compile_probe(small_config, tmp_path, capsys):
    out = tmp_path / "probe"
    argv = [str(small_config), "--arms", "chunks_1,chunk_loop_unroll", "--out", str(out)]
    code = probe_cli.main([*argv, "--simulate-devices", "2", "--timeout", "600"])
    printed = capsys.readouterr().out
    assert code == 0, printed

    names = ("baseline", "chunks_1", "chunk_loop_unroll")
    grid = json.loads((out / "grid.json").read_text())
    assert [a["name"] for a in grid["arms"]] == list(names)
    for name in names:
        assert f"| {name} | ok |" in printed
    assert "isolation: ok" in printed

    # The report, in all three forms.
    rows = list(csv.DictReader((out / "report.csv").open()))
    assert {(r["arm"], r["jit"]) for r in rows if r["phase"] == "True"} == {
        (a, j) for a in names for j in JITS
    }
    assert (out / "compile_seconds.png").stat().st_size > 0
    assert "| chunks_1 | ok |" in (out / "report.md").read_text()

    # Each arm compiled its own config, on the simulated devices, into its own cache.
    inodes = {}
    for name in names:
        paths = arm_paths(out, name)
        config = json.loads(paths.config.read_text())
        assert config["runtime"]["compile_cache"]["dir"] == str(paths.cache_dir)
        record = json.loads(paths.run(1).record.read_text())
        assert record["cache_dir"] == str(paths.cache_dir)
        assert record["jax"]["device_count"] == 2
        for jit in JITS:
            entry = record["jits"][jit]
            assert entry["first_compile_cache"] == "miss", (name, jit)
            assert entry["compiles"][0]["written"] is True, (name, jit)
            assert entry["total_seconds"] > 0
        files = [p for p in paths.cache_dir.rglob("*") if p.is_file()]
        assert files, name
        inodes[name] = {(p.stat().st_dev, p.stat().st_ino) for p in files}
    assert not inodes["baseline"] & inodes["chunks_1"]
    assert not inodes["baseline"] & inodes["chunk_loop_unroll"]
    assert check_isolation(out).ok

    def arm_config(name):
        return json.loads(arm_paths(out, name).config.read_text())["pd"]

    assert arm_config("chunks_1")["loss_metrics"][1]["sites_per_chunk"] == 3
    assert arm_config("chunk_loop_unroll")["recon"]["chunk_loop"] == "unroll"
    assert arm_config("baseline")["recon"]["chunk_loop"] == "scan"


@pytest.mark.slow
def test_steps_probe_scan_and_unroll_log_identical_losses(small_config, tmp_path, capsys):
    out = tmp_path / "probe"
    argv = [str(small_config), "--mode", "steps", "--max-steps", "2", "--out", str(out)]
    code = probe_cli.main(
        [*argv, "--arms", "chunk_loop_scan,chunk_loop_unroll", "--simulate-devices", "2"]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "- chunk_loop (chunk_loop_scan, chunk_loop_unroll): identical: 6 loss values" in printed
    report = (out / "report.md").read_text()
    assert "chunk_loop (chunk_loop_scan, chunk_loop_unroll): identical" in report
    # The run's compile record became the probe's record (isolation is judged on it).
    record = json.loads(arm_paths(out, "chunk_loop_unroll").run(1).record.read_text())
    assert record["jits"]["train_step"]["first_compile_cache"] == "miss"
    metrics = arm_paths(out, "chunk_loop_unroll").run(1).metrics.read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [0, 1]
