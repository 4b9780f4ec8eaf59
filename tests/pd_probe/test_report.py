"""The report from fixture records: markdown, CSV and PNG."""

import csv
import io
import json
import struct

import pytest

from pd_probe import load_rows, write_report


def _jit(seconds, *, phase=True, cache="miss", peak=None):
    # Split like a real record: a little tracing and lowering, the rest backend compile.
    trace, lower = 0.1 * seconds, 0.2 * seconds
    return {
        "phase": phase,
        "trace_seconds": trace,
        "lower_seconds": lower,
        "compile_seconds": seconds - trace - lower,
        "total_seconds": seconds,
        "wall_seconds": seconds + 0.01,
        "first_compile_cache": cache,
        "cache_hits": int(cache == "hit"),
        "cache_misses": int(cache == "miss"),
        "compiles": [{"module": "jit(x)", "seconds": seconds, "cache": cache, "written": True}],
        "memory": None if peak is None else {"peak_memory_in_bytes": peak, "temp_size_in_bytes": 7},
    }


def _record(arm, init_s, step_s, *, run=1, cache="miss"):
    return {
        "schema": "pd-probe/arm-record/1",
        "arm": arm,
        "run": run,
        "mode": "compile",
        "peak_rss_bytes": 3 * 2**30,
        "jits": {
            "init": _jit(init_s, cache=cache, peak=1000),
            "step": _jit(step_s, cache=cache),
            "convert_element_type": _jit(0.01, phase=False, cache=cache),
        },
        "notes": {},
        "error": None,
    }


ARMS = [
    ("baseline", {"layers": 32, "chunks": 4}, (4.0, 20.0)),
    ("layers_2", {"layers": 2}, (1.0, 5.0)),
    ("layers_8", {"layers": 8}, (2.0, 10.0)),
    ("layers_32", {"layers": 32}, None),  # alias of baseline
    ("chunks_1", {"chunks": 1}, (4.0, 8.0)),
    ("chunks_8", {"chunks": 8}, (4.0, 40.0)),
    ("cache_on", {"cache": "on"}, (4.4, 22.0)),
    ("broken", {}, None),
]


@pytest.fixture
def probe(tmp_path):
    probe = tmp_path / "probe"
    grid = {
        "baseline": "baseline",
        "mode": "compile",
        "arms": [{"name": name, "meta": meta} for name, meta, _ in ARMS],
        "aliases": {"layers_32": "baseline"},
    }
    probe.mkdir()
    (probe / "grid.json").write_text(json.dumps(grid))
    for name, _, seconds in ARMS:
        root = probe / "arms" / name
        if seconds is not None:
            (root / "run-1").mkdir(parents=True)
            (root / "run-1" / "record.json").write_text(json.dumps(_record(name, *seconds)))
            status = {"name": name, "status": "ok", "error": None}
            (root / "status.json").write_text(json.dumps(status))
    warm = _record("cache_on", 0.8, 1.0, run=2, cache="hit")
    (probe / "arms" / "cache_on" / "run-2").mkdir()
    (probe / "arms" / "cache_on" / "run-2" / "record.json").write_text(json.dumps(warm))
    broken = {
        "name": "broken",
        "status": "failed",
        "error": "run 1: exit code 1; stderr tail:\nOOM",
    }
    (probe / "arms" / "broken").mkdir(parents=True)
    (probe / "arms" / "broken" / "status.json").write_text(json.dumps(broken))
    return probe


def test_rows_follow_grid_with_aliases_and_warm_runs(probe):
    _, rows = load_rows(probe)
    labels = [(r.label, r.status) for r in rows]
    assert labels == [
        ("baseline", "ok"),
        ("layers_2", "ok"),
        ("layers_8", "ok"),
        ("layers_32", "= baseline"),
        ("chunks_1", "ok"),
        ("chunks_8", "ok"),
        ("cache_on", "ok"),
        ("cache_on (run 2)", "ok"),
        ("broken", "failed"),
    ]


def test_markdown_table(probe):
    report = write_report(probe)
    lines = report.markdown.splitlines()
    assert lines[0] == (
        "| arm | status | layers | chunks | cache | init s (×base) | step s (×base) "
        "| all jits s | peak RSS GiB |"
    )
    assert (
        "| baseline | ok | 32 | 4 |  | 4.00 (1.00×) | 20.00 (1.00×) | 24.01 (1.00×) | 3.00 |"
        in lines
    )
    assert (
        "| layers_2 | ok | 2 |  |  | 1.00 (0.25×) | 5.00 (0.25×) | 6.01 (0.25×) | 3.00 |" in lines
    )
    assert (
        "| layers_32 | = baseline | 32 |  |  | 4.00 (1.00×) | 20.00 (1.00×) | 24.01 (1.00×) | 3.00 |"
        in lines
    )
    assert (
        "| chunks_8 | ok |  | 8 |  | 4.00 (1.00×) | 40.00 (2.00×) | 44.01 (1.83×) | 3.00 |" in lines
    )
    assert (
        "| cache_on (run 2) | ok |  |  | on | 0.80 (0.20×, cache hit) "
        "| 1.00 (0.05×, cache hit) | 1.81 (0.08×) | 3.00 |" in lines
    )
    assert "| broken | failed |  |  |  | – | – | – | – |" in lines
    text = report.markdown_path.read_text()
    assert report.markdown in text
    assert "- `broken`: failed: run 1: exit code 1; stderr tail: … OOM" in text
    assert "Isolation (7 arms run): ok." in text


def test_csv_long_format(probe):
    report = write_report(probe)
    rows = list(csv.DictReader(io.StringIO(report.csv_path.read_text())))
    by = {(r["arm"], r["run"], r["jit"]): r for r in rows}
    step8 = by[("chunks_8", "1", "step")]
    assert float(step8["total_s"]) == 40.0
    assert float(step8["ratio_to_baseline"]) == 2.0
    assert float(step8["trace_s"]) == pytest.approx(4.0)
    assert step8["meta_chunks"] == "8" and step8["meta_layers"] == ""
    assert step8["first_compile_cache"] == "miss"
    assert by[("cache_on", "2", "init")]["first_compile_cache"] == "hit"
    assert by[("baseline", "1", "init")]["xla_peak_memory_bytes"] == "1000"
    assert by[("baseline", "1", "convert_element_type")]["phase"] == "False"
    assert by[("layers_32", "1", "step")]["alias_of"] == "baseline"
    assert by[("broken", "1", "")]["status"] == "failed"
    # 7 runs with records (+1 alias) × 3 jits, and one row for the failed arm.
    assert len(rows) == 8 * 3 + 1


def test_png_is_written(probe):
    report = write_report(probe)
    data = report.png_path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1000, 400)
    assert len(data) > 10_000
