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
from pd_train.analysis.report import render_report
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
        # Sorted by density, descending, at load.
        shown = browser.evaluate(f"Array.from({rows}).map(r => r.children[2].textContent)")
        assert float(shown[0]) == pytest.approx(max(columns["density"]), rel=1e-2)
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
