"""End to end: three arms of a small config compiled ahead of time by a real jax program, each
in its own process and caches, then the isolation proof and the report."""

import json
import os
import sys
from pathlib import Path

import pytest

from pd_probe import arm_paths, check_isolation, run_probe, standard_grid, write_report

PROGRAM = str(Path(__file__).with_name("jax_arm.py"))


@pytest.mark.slow
def test_three_arm_compile_probe(tmp_path, toy):
    grid = standard_grid(
        toy.base,
        validate=toy.validate,
        layers_override=toy.layers_override,
        chunks_override=toy.chunks_override,
        layer_slices=(2,),
        chunk_counts=(4,),
        autotune=(),
        cache=(),
        baseline_meta={"layers": 4, "chunks": 2},
    )
    assert grid.names == ("baseline", "layers_2", "chunks_4")
    # Write every executable to the cache so that isolation is tested on real cache files.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    probe = tmp_path / "probe"
    result = run_probe(
        grid,
        probe,
        command=[sys.executable, PROGRAM, "{config}"],
        mode="compile",
        timeout_s=300,
        path_overrides=lambda paths: {"runtime.cache_dir": str(paths.cache_dir)},
        base_env=env,
    )
    assert {n: s.status for n, s in result.arms.items()} == dict.fromkeys(grid.names, "ok"), (
        result.arms
    )

    expected = {"baseline": (28, 2), "layers_2": (14, 2), "chunks_4": (28, 4)}
    for name, (sites, chunks) in expected.items():
        paths = arm_paths(probe, name)
        record = json.loads(paths.run(1).record.read_text())
        assert record["arm"] == name and record["mode"] == "compile"
        assert record["notes"] == {"sites": sites, "chunks": chunks}
        assert record["jax"]["device_count"] == 8  # the inherited simulated-devices flag
        assert record["cache_dir"] == str(paths.cache_dir)
        for jit in ("init", "step"):
            entry = record["jits"][jit]
            assert entry["first_compile_cache"] == "miss"
            assert entry["compiles"][0]["written"] is True
            assert entry["memory"]["argument_size_in_bytes"] > 0
        assert any(paths.cache_dir.iterdir()), name

    check = check_isolation(probe)
    assert check.ok, check.problems
    assert check.first_compiles["chunks_4"]["step"] == "miss"

    report = write_report(probe)
    table = report.markdown.splitlines()
    assert [line.split(" | ")[0].strip("| ") for line in table[2:]] == list(grid.names)
    assert "| baseline | ok | 4 | 2 |" in table[2] and "(1.00×)" in table[2]
    assert report.png_path.stat().st_size > 0
    assert "Isolation (3 arms run): ok." in report.markdown_path.read_text()
