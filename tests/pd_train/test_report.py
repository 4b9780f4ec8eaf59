"""``pd-train report``: the static HTML page of a real tiny run, loaded in a real headless
Chromium (Debian's package) over the DevTools protocol: no console errors, the table's rows,
sorting, filtering, a component's contexts, and a screenshot."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from pd_train.analysis import analyze_run, read_table, write_table
from pd_train.analysis.density import density_class
from pd_train.analysis.report import component_order, render_report, selectivity
from pd_train.cli import main

from ._analysis_runs import Runs, tiny_runs
from ._chromium import Browser, find_chromium


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Runs, Path, Path]:
    """(runs, analysis file, report.html) of the uninterrupted run."""
    runs = tiny_runs(tmp_path_factory)
    out = tmp_path_factory.mktemp("report")
    table = analyze_run(runs.uninterrupted, n_batches=2, top_k=3, window=2, progress=False)
    analysis = write_table(table, out / "components.parquet")
    page = out / "report.html"
    assert (
        main(["report", str(runs.uninterrupted), "--analysis", str(analysis), "--out", str(page)])
        == 0
    )
    return runs, analysis, page


def test_report_is_self_contained(report: tuple[Runs, Path, Path]) -> None:
    _, _, page = report
    text = page.read_text()
    for section in ("Summary", "Curves", "CI-L0 per site", "Components", "config.yaml"):
        assert f">{section}<" in text
    # Nothing to fetch: every image is inline, no external script or style.
    assert "http://" not in text and "https://" not in text
    assert text.count('src="data:image/png;base64,') >= 4  # losses, eval, L0 heatmap, density
    assert "<script src" not in text and '<link rel="stylesheet"' not in text


@pytest.mark.skipif(find_chromium() is None, reason="needs chromium (apt-get install chromium)")
def test_report_in_headless_chromium(report: tuple[Runs, Path, Path], tmp_path: Path) -> None:
    _, analysis, page = report
    table, _ = read_table(analysis)
    columns = table.to_pydict()
    n = table.num_rows
    with Browser(width=1280, height=1000) as browser:
        browser.open(page.absolute().as_uri())
        assert browser.errors() == []
        rows = "document.querySelectorAll('#components tbody tr.component')"
        assert browser.evaluate(f"{rows}.length") == min(n, 200)
        assert (
            browser.evaluate("document.getElementById('count').textContent")
            == f"{n} of {n} components"
        )
        # At load in the page's order (sparse first, by selectivity), one header per group.
        order = component_order(columns)[:200]
        shown = browser.evaluate(
            f"Array.from({rows}).map(r => r.children[0].textContent + ':' + r.children[1].textContent)"
        )
        assert shown == [f"{columns['site'][i]}:{columns['component'][i]}" for i in order]
        groups = {density_class(columns["density"][i]) for i in order}
        heads = browser.evaluate(
            "Array.from(document.querySelectorAll('#components tbody tr.group')).map(r => r.textContent)"
        )
        assert len(heads) == len(groups)
        # Filter by site: exactly that site's components.
        site = "layers.1.self_attn.q_proj"
        browser.evaluate(
            "(() => { const s = document.getElementById('site-filter'); s.value = "
            f"'{site}'; s.dispatchEvent(new Event('change')); }})()"
        )
        sites = browser.evaluate(f"Array.from({rows}).map(r => r.children[0].textContent)")
        assert sites == [site] * columns["site"].count(site)
        # Sort by mean CI ascending (two clicks: descending, then ascending).
        for _ in range(2):
            browser.evaluate("document.querySelector('th[data-col=\"5\"]').click()")
        means = browser.evaluate(f"Array.from({rows}).map(r => Number(r.children[3].textContent))")
        assert means == sorted(means)
        # Open the first component: one line per top context, tokens shaded by their CI.
        browser.evaluate(f"{rows}[0].click()")
        first = browser.evaluate(f"{rows}[0].children[1].textContent")
        i = next(
            j
            for j in range(n)
            if columns["site"][j] == site and str(columns["component"][j]) == first
        )
        lines = browser.evaluate("document.querySelectorAll('tr.detail div').length")
        assert lines == len(columns["top_ci"][i])
        shaded = browser.evaluate(
            "Array.from(document.querySelectorAll('tr.detail .tok.center')).map(t => t.style.backgroundColor)"
        )
        assert len(shaded) == lines and all(s.startswith("rgba(255, 120, 0") for s in shaded)
        assert browser.errors() == []
        shot = browser.screenshot(tmp_path / "report.png", full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_report_without_analysis_says_how_to_make_one(
    report: tuple[Runs, Path, Path], tmp_path: Path
) -> None:
    runs, _, _ = report
    run_dir = tmp_path / "run"
    for name in ("config.yaml", "metrics.jsonl", "summary.txt"):
        shutil.copy(
            runs.uninterrupted / name, run_dir / name if run_dir.exists() else _mk(run_dir) / name
        )
    page = render_report(run_dir)
    assert f"pd-train analyze {run_dir}" in page
    assert 'id="components"' not in page


def _mk(path: Path) -> Path:
    path.mkdir()
    return path


def test_report_bad_input_exits_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("run_name: x\n")
    (tmp_path / "bad.parquet").write_text("not parquet")
    assert main(["report", str(tmp_path / "run"), "--analysis", str(tmp_path / "bad.parquet")]) == 2
    assert "cannot be read as Parquet" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["bad.parquet", "config.yaml", "run"]


def _train_record(step: int) -> str:
    return json.dumps(
        {"step": step, "phase": "train", "time": 1.0 + step, "loss/total": 2.0 / (step + 1)}
    )


def test_report_skips_a_metrics_line_that_is_not_utf8_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A damaged byte in metrics.jsonl used to crash `report` (UnicodeDecodeError): the line
    is skipped with a warning naming the file, the line and the byte, and the page is made
    from every other record."""
    run_dir = _mk(tmp_path / "run")
    (run_dir / "config.yaml").write_text("run_name: x\n")
    lines = [
        _train_record(0).encode(),
        b'{"step": 1, "phase": "tr\xffin"}',
        _train_record(2).encode(),
    ]
    (run_dir / "metrics.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    logger = logging.getLogger("pd_train.outputs")  # pd's logger does not propagate to root
    logger.addHandler(caplog.handler)
    try:
        assert main(["report", str(run_dir)]) == 0
    finally:
        logger.removeHandler(caplog.handler)
    assert (
        f"{run_dir / 'metrics.jsonl'}:2: skipping a line that is not UTF-8 text (byte 0xff at column 25)"
        in caplog.text
    )
    page = (run_dir / "report.html").read_text()
    assert "No metrics recorded yet" not in page and 'alt="Training losses"' in page
    assert "pd-train: warning" not in capsys.readouterr().err  # the run has records


def test_report_of_a_run_dir_with_nothing_to_show_warns_and_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _mk(tmp_path / "run")
    (run_dir / "config.yaml").write_text("run_name: x\n")
    assert main(["report", str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert f"wrote {run_dir / 'report.html'}" in captured.out
    assert captured.err.startswith(
        f"pd-train: warning: {run_dir} holds no metrics, summary or checkpoint yet"
    )
    assert f"`pd-train run {run_dir / 'config.yaml'} --run-dir {run_dir}`" in captured.err
    # A toy run dir without a checkpoint: the advice is a new dir.
    (run_dir / "config.yaml").write_text("toy: tms_5_2\n")
    assert main(["report", str(run_dir)]) == 0
    err = capsys.readouterr().err
    assert f"`pd-train run {run_dir / 'config.yaml'} --run-dir NEW_DIR`" in err, err


def _columns(rows: list[tuple[str, int, float, float, list[float], int]]) -> dict[str, list]:
    """An analysis table's columns from (site, component, density, mean_ci, top_ci, n_active)."""
    cols: dict[str, list] = {k: [] for k in ("site", "kind", "layer", "component", "density")}
    cols.update({k: [] for k in ("mean_ci", "n_active", "top_ci", "top_tokens", "top_token_ci")})
    cols["top_center"] = []
    for site, c, density, mean_ci, top, n_active in rows:
        cols["site"].append(site)
        cols["kind"].append(site.rsplit(".", 1)[1])
        cols["layer"].append(int(site.split(".")[1]))
        cols["component"].append(c)
        cols["density"].append(density)
        cols["mean_ci"].append(mean_ci)
        cols["n_active"].append(n_active)
        cols["top_ci"].append(top)
        cols["top_tokens"].append([["a", "b"]] * len(top))
        cols["top_token_ci"].append([[0.0, v] for v in top])
        cols["top_center"].append([1] * len(top))
    return cols


def test_report_leads_with_sparse_selective_components_and_groups_the_rest(
    tmp_path: Path,
) -> None:
    """Page order: sparse (density < 0.1), then moderate, then always on (> 0.9); inside a
    group by selectivity = mean top-k CI − mean CI, descending (ties: more active tokens first);
    dead components (C − alive per site) counted per site, not listed."""
    q, down = "layers.0.self_attn.q_proj", "layers.1.mlp.down_proj"
    cols = _columns(
        [
            (q, 0, 1.0, 0.6, [0.7, 0.7], 1000),  # always on: selectivity 0.1
            (q, 1, 0.05, 0.04, [0.9, 0.7], 50),  # sparse: 0.8 − 0.04 = 0.76
            (q, 2, 0.5, 0.3, [1.0, 1.0], 500),  # moderate: 0.7
            (down, 0, 0.01, 0.005, [1.0, 1.0], 10),  # sparse: 0.995
            (down, 1, 0.02, 0.01, [0.2, 0.2], 20),  # sparse: 0.19
            (down, 2, 0.95, 0.85, [1.0, 1.0], 950),  # always on: 0.15
            (down, 3, 0.1, 0.05, [0.5, 0.5], 100),  # moderate (0.1 is not below 0.1): 0.45
            (down, 4, 0.03, 0.01, [0.2, 0.2], 30),  # sparse: 0.19, ties down1: more active first
        ]
    )
    assert selectivity([0.9, 0.7], 0.04) == pytest.approx(0.76)
    order = component_order(cols)
    assert order == [3, 1, 7, 4, 2, 6, 5, 0]

    run_dir = _mk(tmp_path / "run")
    (run_dir / "config.yaml").write_text("run_name: x\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = {"sites": {q: {"C": 4, "alive": 3}, down: {"C": 7, "alive": 5}}, "threshold": 0.1}
    table = pa.table(
        {k: v for k, v in cols.items()} | {"top_text": [["a b"] * len(t) for t in cols["top_ci"]]},
        metadata={b"pd_train.analysis": json.dumps(meta).encode()},
    )
    pq.write_table(table, run_dir / "components.parquet")
    page = render_report(run_dir, analysis=run_dir / "components.parquet")
    data = json.loads(
        page.split('<script id="data" type="application/json">')[1].split("</script>")[0]
    )
    assert [(r[0], r[3]) for r in data["rows"]] == [
        (cols["site"][i], cols["component"][i]) for i in order
    ]
    assert [r[8] for r in data["rows"]] == [0, 0, 0, 0, 1, 1, 2, 2]  # group per row
    assert [r[10] for r in data["rows"]] == list(range(8))  # the page's default sort key
    assert "<b>4 sparse</b> (density &lt; 0.1: read these first), 2 moderate, 2 always on" in page
    assert "3 dead (never above the threshold on these tokens; no row)" in page
    assert f"<summary>dead per site</summary>{q} 1, {down} 2</details>" in page
