"""``pd-train report RUN_DIR``: one self-contained HTML page of a run.

The page needs no server and no network: styles and script are inline, plots are inline PNGs
(``data:`` URIs), the component table is inline JSON. Sections: the run's summary and config;
loss and eval curves; CI-L0 per site over training (a heatmap, sites × logged steps); the
activation density of every component per kind (histograms, dead components counted apart);
and a browsable table of the alive components from a ``pd-train analyze`` file — sort by any
column, filter by site or kind, and open a row to read its top contexts with every token shaded
by that component's ci_lower.

The table leads with the components worth reading: by default its rows come grouped by density
class (:func:`pd_train.analysis.density.density_class`) — sparse first, then moderate, then
always on, each group under its own labelled header — and within a group by **selectivity**
(the mean of a component's top-k ci_lower values minus its mean ci_lower over all tokens: high
when it is strongly on at a few tokens and off elsewhere), then by active tokens. Dead
components (no token above the threshold) have no row; the page counts them per site.

Without an analysis file the page says how to make one and shows the rest.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MAX_ROWS",
    "ReportError",
    "component_order",
    "render_report",
    "selectivity",
    "write_report",
]

#: At most this many components go into the page (the first in :func:`component_order`); the
#: Parquet file has all.
MAX_ROWS = 20000

#: The row groups of the component table, in page order (dead components have no rows).
GROUPS = ("sparse", "moderate", "always on")


class ReportError(ValueError):
    """The run dir cannot be reported (not a run dir, an unreadable analysis file)."""


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _file_png(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _curves(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(title, PNG data URI) of the training-loss and eval curves (drawn by pd_train.outputs)
    and of the last slow eval's recon per site and layer, when the run has one."""
    from pd_train.analysis.recon_plot import plot_recon
    from pd_train.outputs import plot_eval_curves, plot_loss_curves

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for title, plot in (
            ("Training losses", plot_loss_curves),
            ("Evaluation", plot_eval_curves),
            (
                "Slow-eval recon (hidden activations per site, attention patterns per layer)",
                plot_recon,
            ),
        ):
            for path in plot(records, tmp):
                out.append((title, _file_png(path)))
    return out


def _l0_heatmap(records: list[dict[str, Any]]) -> str | None:
    """CI-L0 of every site (rows, canonical order) at every logged train step (columns)."""
    from matplotlib.figure import Figure

    from pd_train.outputs.records import canonical_sites, finite, of_phase

    train = [r for r in of_phase(records, "train") if any(k.startswith("l0/") for k in r)]
    if not train:
        return None
    sites = canonical_sites(k[3:] for r in train for k in r if k.startswith("l0/"))
    grid = np.full((len(sites), len(train)), np.nan)
    for j, r in enumerate(train):
        for i, s in enumerate(sites):
            x = finite(r.get(f"l0/{s}"))
            if x is not None:
                grid[i, j] = x
    steps = [r["step"] for r in train]
    # At most ~60 labelled rows (224 sites of Llama-8B: every 4th) and a bounded height.
    every = max(1, math.ceil(len(sites) / 60))
    fig = Figure(
        figsize=(9, min(14.0, max(2.5, 0.18 * len(sites) / every + 1.2))), layout="constrained"
    )
    ax = fig.subplots()
    image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis")
    labels = [
        s.replace("layers.", "L").replace("self_attn.", "").replace("mlp.", "") for s in sites
    ]
    ax.set_yticks(
        range(0, len(sites), every),
        labels[::every],
        fontsize=7,
    )
    ticks = np.linspace(0, len(steps) - 1, min(len(steps), 10)).round().astype(int)
    ax.set_xticks(ticks, [str(steps[t]) for t in ticks])
    ax.set_xlabel("step")
    ax.set_title("CI-L0 per site over training (active components per token)")
    fig.colorbar(image, ax=ax, label="L0")
    return _png(fig)


def _density_histograms(columns: dict[str, list[Any]], meta: dict[str, Any]) -> str | None:
    """Per kind, the histogram of log10 activation density of its alive components; the number
    of dead components (density 0) in each panel's title."""
    from matplotlib.figure import Figure

    from pd_train.outputs.records import KIND_ORDER

    if not columns["site"]:
        return None
    kinds = [k for k in KIND_ORDER if k in set(columns["kind"])]
    dead: dict[str, int] = {}
    for site, info in meta.get("sites", {}).items():
        kind = site.rsplit(".", 1)[-1]
        dead[kind] = dead.get(kind, 0) + info["C"] - info["alive"]
    ncols = min(4, len(kinds))
    nrows = math.ceil(len(kinds) / ncols)
    fig = Figure(figsize=(3.3 * ncols, 2.6 * nrows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    density = np.asarray(columns["density"], dtype=float)
    kind_of = np.asarray(columns["kind"])
    low = max(np.log10(density.min()), -8) if density.size else -8
    bins = np.linspace(min(math.floor(low), -1), 0, 25)  # never empty, also when all are 1
    for ax, kind in zip(axes, kinds, strict=False):
        values = np.log10(density[kind_of == kind])
        ax.hist(values, bins=bins, color="C0")
        ax.set_title(f"{kind}: {values.size} alive, {dead.get(kind, 0)} dead", fontsize=9)
        ax.set_xlabel("log10 density")
    for ax in axes[len(kinds) :]:
        ax.set_visible(False)
    fig.suptitle(f"activation density (ci_lower > {meta.get('threshold', 0):g})")
    return _png(fig)


def _latest_analysis(run_dir: Path) -> Path | None:
    from pd_train.analysis.components import ANALYSIS_DIR

    files = sorted((run_dir / ANALYSIS_DIR).glob("components-step*.parquet"))
    return files[-1] if files else None


def selectivity(top_ci: Any, mean_ci: float) -> float:
    """Mean of the top-k ci_lower values minus the mean ci_lower over all tokens (0 without top
    values): near 1 for a component fully on at a few tokens and off elsewhere, small for one
    that is on everywhere or only weakly on anywhere."""
    top = np.asarray(top_ci, dtype=float)
    return float(top.mean() - mean_ci) if top.size else 0.0


def component_order(columns: dict[str, list[Any]]) -> list[int]:
    """Row indices of an analysis table in page order: density class (sparse, moderate, always
    on), then selectivity descending, then active tokens descending, then table order."""
    from pd_train.analysis.density import density_class

    def key(i: int) -> tuple[int, float, int, int]:
        group = GROUPS.index(density_class(float(columns["density"][i])))
        sel = selectivity(columns["top_ci"][i], float(columns["mean_ci"][i]))
        return (group, -sel, -int(columns["n_active"][i]), i)

    return sorted(range(len(columns["site"])), key=key)


def _table_rows(columns: dict[str, list[Any]]) -> list[list[Any]]:
    """The rows the page's script shows, in :func:`component_order`: [site, kind, layer,
    component, density, mean_ci, n_active, contexts, group, selectivity, rank] with contexts
    [[tokens, ci per token, center, top ci], ...] and group an index into :data:`GROUPS`."""
    from pd_train.analysis.density import density_class

    rows = []
    for rank, i in enumerate(component_order(columns)[:MAX_ROWS]):
        contexts = [
            [
                list(tokens),
                [round(float(c), 4) if c == c else None for c in cis],
                int(center),
                round(float(top), 4),
            ]
            for tokens, cis, center, top in zip(
                columns["top_tokens"][i],
                columns["top_token_ci"][i],
                columns["top_center"][i],
                columns["top_ci"][i],
                strict=True,
            )
        ]
        density = float(columns["density"][i])
        rows.append(
            [
                columns["site"][i],
                columns["kind"][i],
                int(columns["layer"][i]),
                int(columns["component"][i]),
                density,
                float(columns["mean_ci"][i]),
                int(columns["n_active"][i]),
                contexts,
                GROUPS.index(density_class(density)),
                round(selectivity(columns["top_ci"][i], float(columns["mean_ci"][i])), 4),
                rank,
            ]
        )
    return rows


def _groups_note(columns: dict[str, list[Any]], meta: dict[str, Any]) -> str:
    """One paragraph: how many components are in each group, and the dead ones per site."""
    from pd_train.analysis.density import ALWAYS_ON_ABOVE, SPARSE_BELOW, class_counts

    counts = class_counts(np.asarray(columns["density"], dtype=float))
    dead = {
        site: info["C"] - info["alive"]
        for site, info in meta.get("sites", {}).items()
        if info["C"] > info["alive"]
    }
    n_dead = sum(dead.values())
    per_site = ", ".join(f"{_e(s)} {n}" for s, n in dead.items())
    dead_text = f" <details><summary>dead per site</summary>{per_site}</details>" if dead else ""
    return (
        f'<div class="groups"><b>{counts["sparse"]} sparse</b> (density &lt; {SPARSE_BELOW:g}: '
        f"read these first), {counts['moderate']} moderate, {counts['always on']} always on "
        f"(density &gt; {ALWAYS_ON_ABOVE:g}: on at almost every token, their contexts say "
        f"little), {n_dead} dead (never above the threshold on these tokens; no row). "
        "Rows come in that order, each group by selectivity (mean top-k CI minus mean CI); "
        f"click a column to sort by it instead.{dead_text}</div>"
    )


def render_report(run_dir: str | Path, *, analysis: str | Path | None = None) -> str:
    """The page of ``run_dir`` as an HTML string (see the module docstring)."""
    from pd_train.analysis.ground_truth import ground_truth_section
    from pd_train.outputs import read_metrics
    from pd_train.run import CONFIG_FILE, METRICS_FILE

    run_dir = Path(run_dir)
    _check_run_dir(run_dir, CONFIG_FILE)
    records = read_metrics(run_dir) if (run_dir / METRICS_FILE).exists() else []
    analysis_file = Path(analysis) if analysis is not None else _latest_analysis(run_dir)
    columns, meta = _read_analysis(analysis_file) if analysis_file is not None else (None, {})

    parts = _summary_parts(run_dir, (run_dir / CONFIG_FILE).read_text())
    parts += _curve_parts(records)
    toy = ground_truth_section(run_dir)  # a toy run dir: its ground truth, not components
    rows: list[list[Any]] = []
    if toy is not None:
        parts += toy
    else:
        parts.append("<h2>Components</h2>")
        if columns is None:
            parts.append(
                f"<p>No component analysis in this run dir yet: run <code>pd-train analyze {_e(str(run_dir))}</code> "
                "and then this command again.</p>"
            )
        else:
            rows = _table_rows(columns)
            parts += _components_parts(columns, meta, analysis_file)
    data = json.dumps({"rows": rows}, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return _PAGE.format(
        title=_e(f"pd report: {run_dir.name}"),
        style=_STYLE,
        body="\n".join(parts),
        data=data,
        script=_SCRIPT,
    )


def _check_run_dir(run_dir: Path, config_file: str) -> None:
    """ReportError unless ``run_dir`` is a directory holding the run's config."""
    from pd_train.analysis.components import run_dir_problem

    problem = run_dir_problem(run_dir, config_file)
    if problem is not None:
        raise ReportError(problem)


def _read_analysis(analysis_file: Path) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """The component table's columns and metadata; ReportError naming the file when it is
    missing, not Parquet or not from ``pd-train analyze``."""
    from pd_train.analysis.components import read_table

    if not analysis_file.is_file():
        msg = f"--analysis {analysis_file} does not exist"
        raise ReportError(msg)
    try:
        table, meta = read_table(analysis_file)
    except Exception as exc:  # pyarrow raises several types for a file that isn't Parquet
        msg = f"analysis file {analysis_file} cannot be read as Parquet: {exc}"
        raise ReportError(msg) from None
    missing = {"site", "kind", "density", "top_tokens", "top_token_ci"} - set(table.column_names)
    if missing:
        msg = f"analysis file {analysis_file} lacks columns {sorted(missing)}; not from `pd-train analyze`"
        raise ReportError(msg)
    return table.to_pydict(), meta


def _summary_parts(run_dir: Path, config_text: str) -> list[str]:
    """The heading, the run's summary.txt and its config (folded)."""
    summary = run_dir / "summary.txt"
    parts = [f"<h1>{_e(run_dir.name)}</h1>", f'<p class="sub">{_e(str(run_dir.absolute()))}</p>']
    parts.append("<h2>Summary</h2>")
    if summary.is_file():
        parts.append(f"<pre>{_e(summary.read_text())}</pre>")
    else:
        parts.append("<p>No summary.txt yet (the run writes it when it ends).</p>")
    parts.append(f"<details><summary>config.yaml</summary><pre>{_e(config_text)}</pre></details>")
    return parts


def _curve_parts(records: list[dict[str, Any]]) -> list[str]:
    """The loss curves and the CI-L0 heat map of the records."""
    parts = ["<h2>Curves</h2>"]
    curves = _curves(records) if records else []
    if not curves:
        parts.append("<p>No metrics recorded yet.</p>")
    for title, uri in curves:
        parts.append(
            f'<figure><img alt="{_e(title)}" src="{uri}"><figcaption>{_e(title)}</figcaption></figure>'
        )
    heat = _l0_heatmap(records) if records else None
    parts.append("<h2>CI-L0 per site</h2>")
    parts.append(
        f'<figure><img alt="CI-L0 per site over training" src="{heat}"></figure>'
        if heat
        else "<p>No L0 records yet.</p>"
    )
    return parts


def _components_parts(
    columns: dict[str, list[Any]], meta: dict[str, Any], analysis_file: Path | None
) -> list[str]:
    """What the component table says about itself, the density histograms, and the table's
    filters and header (its rows are the page's data, filled in by the script)."""
    shown = f"; the first {MAX_ROWS} shown" if len(columns["site"]) > MAX_ROWS else ""
    parts = [
        f'<p class="sub">{_e(str(analysis_file))}: checkpoint step {meta.get("checkpoint_step")}, '
        f"{meta.get('n_alive')}/{meta.get('n_components')} components alive on "
        f"{meta.get('n_tokens')} tokens (ci_lower &gt; {meta.get('threshold')}), "
        f"top {meta.get('top_k')} contexts each{shown}.</p>",
        _groups_note(columns, meta),
    ]
    hist = _density_histograms(columns, meta)
    if hist:
        parts.append(f'<figure><img alt="activation density histograms" src="{hist}"></figure>')
    sites = list(dict.fromkeys(columns["site"]))
    options = "".join(f'<option value="{_e(s)}">{_e(s)}</option>' for s in sites)
    kinds = list(dict.fromkeys(columns["kind"]))
    kind_options = "".join(f'<option value="{_e(k)}">{_e(k)}</option>' for k in kinds)
    parts.append(
        '<div class="controls">'
        f'<label>site <select id="site-filter"><option value="">all sites</option>{options}</select></label> '
        f'<label>kind <select id="kind-filter"><option value="">all kinds</option>{kind_options}</select></label> '
        '<label>context contains <input id="text-filter" type="search" placeholder="token"></label> '
        '<span id="count"></span></div>'
        '<table id="components"><thead><tr>'
        '<th data-col="0">site</th><th data-col="3">component</th>'
        '<th data-col="4" class="num">density</th><th data-col="5" class="num">mean CI</th>'
        '<th data-col="6" class="num">active tokens</th>'
        '<th data-col="9" class="num">selectivity</th><th>top context</th>'
        "</tr></thead><tbody></tbody></table>"
        '<p><button id="more" type="button">show more</button></p>'
    )
    return parts


def write_report(
    run_dir: str | Path, *, analysis: str | Path | None = None, out: str | Path | None = None
) -> Path:
    """Write the page to ``out`` (default ``RUN_DIR/report.html``) through a temp file."""
    page = render_report(run_dir, analysis=analysis)
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _e(text: str) -> str:
    return html.escape(text, quote=True)


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>{style}</style></head>
<body>
{body}
<script id="data" type="application/json">{data}</script>
<script>{script}</script>
</body></html>
"""

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto;
       max-width: 1200px; padding: 0 16px; color: #1d1d1f; background: #fff; }
h1 { margin-bottom: 0; } h2 { margin-top: 32px; border-bottom: 1px solid #ddd; }
.sub { color: #666; margin-top: 4px; }
pre { background: #f6f8fa; padding: 10px; overflow-x: auto; font-size: 12px; }
figure { margin: 12px 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #666; font-size: 12px; }
.controls { margin: 12px 0; display: flex; gap: 16px; flex-wrap: wrap; align-items: center; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #eee; padding: 4px 8px; text-align: left; vertical-align: top; }
th[data-col] { cursor: pointer; user-select: none; background: #fafafa; }
th.sorted-desc::after { content: " \\25BC"; } th.sorted-asc::after { content: " \\25B2"; }
.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.component { cursor: pointer; } tr.component:hover { background: #f5f9ff; }
.ctx { font-family: ui-monospace, Menlo, Consolas, monospace; font-size: 12px; white-space: pre-wrap; }
.tok { padding: 0 1px; border-radius: 2px; }
.tok.center { outline: 1.5px solid #c00; }
.detail td { background: #fcfcfc; } .detail div { margin: 3px 0; }
.cival { color: #888; font-size: 11px; margin-right: 6px; }
tr.group td { font-weight: 600; background: #eef4fb; padding-top: 10px; }
tr.group.g2 td { background: #f4f4f4; color: #555; }
"""

_SCRIPT = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("data").textContent);
  var table = document.getElementById("components");
  if (!table) { return; }
  var rows = data.rows, tbody = table.querySelector("tbody");
  var siteSel = document.getElementById("site-filter"), kindSel = document.getElementById("kind-filter");
  var textIn = document.getElementById("text-filter"), more = document.getElementById("more");
  var countEl = document.getElementById("count");
  var RANK = 10, sortCol = RANK, sortDir = 1, limit = 200, PAGE = 200;
  var GROUPS = [
    "Sparse components (density < 0.1): the ones to read first",
    "Moderate components (density 0.1 to 0.9)",
    "Always on (density > 0.9): on at almost every token; their top contexts say little"
  ];

  function fmt(x) { return x === 0 ? "0" : (Math.abs(x) < 1e-3 ? x.toExponential(2) : x.toPrecision(3)); }

  function context(ctx) {
    var span = document.createElement("span");
    span.className = "ctx";
    var tokens = ctx[0], cis = ctx[1], center = ctx[2];
    for (var i = 0; i < tokens.length; i++) {
      var t = document.createElement("span");
      var ci = cis[i] === null ? 0 : cis[i];
      t.className = i === center ? "tok center" : "tok";
      t.style.backgroundColor = "rgba(255, 120, 0, " + Math.min(1, Math.max(0, ci)).toFixed(3) + ")";
      t.title = "ci_lower " + (cis[i] === null ? "n/a" : cis[i]);
      t.textContent = tokens[i];
      span.appendChild(t);
      if (i + 1 < tokens.length) { span.appendChild(document.createTextNode(" ")); }
    }
    return span;
  }

  function matches(r) {
    if (siteSel.value && r[0] !== siteSel.value) { return false; }
    if (kindSel.value && r[1] !== kindSel.value) { return false; }
    var q = textIn.value.trim().toLowerCase();
    if (q) {
      return r[7].some(function (ctx) {
        return ctx[0].some(function (tok) { return tok.toLowerCase().indexOf(q) >= 0; });
      });
    }
    return true;
  }

  function compare(a, b) {
    var x = a[sortCol], y = b[sortCol];
    if (sortCol === 0) {  // site: layer, then canonical kind order, then component
      x = a[2] * 10 + order(a[1]); y = b[2] * 10 + order(b[1]);
      if (x === y) { return a[3] - b[3]; }
    }
    if (x < y) { return -sortDir; }
    if (x > y) { return sortDir; }
    return 0;
  }
  var KINDS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];
  function order(kind) { var i = KINDS.indexOf(kind); return i < 0 ? 9 : i; }

  function cell(tr, text, cls) {
    var td = document.createElement("td");
    if (cls) { td.className = cls; }
    if (typeof text === "string") { td.textContent = text; } else { td.appendChild(text); }
    tr.appendChild(td);
    return td;
  }

  function detail(r) {
    var tr = document.createElement("tr");
    tr.className = "detail";
    var td = document.createElement("td");
    td.colSpan = 7;
    r[7].forEach(function (ctx) {
      var line = document.createElement("div");
      var v = document.createElement("span");
      v.className = "cival";
      v.textContent = ctx[3].toFixed(3);
      line.appendChild(v);
      line.appendChild(context(ctx));
      td.appendChild(line);
    });
    tr.appendChild(td);
    return tr;
  }

  function render() {
    var shown = rows.filter(matches).sort(compare);
    tbody.textContent = "";
    var group = -1;
    shown.slice(0, limit).forEach(function (r) {
      if (sortCol === RANK && r[8] !== group) {  // the default order: a header per group
        group = r[8];
        var head = document.createElement("tr");
        head.className = "group g" + group;
        var th = document.createElement("td");
        th.colSpan = 7;
        th.textContent = GROUPS[group];
        head.appendChild(th);
        tbody.appendChild(head);
      }
      var tr = document.createElement("tr");
      tr.className = "component";
      cell(tr, r[0]);
      cell(tr, String(r[3]), "num");
      cell(tr, fmt(r[4]), "num");
      cell(tr, fmt(r[5]), "num");
      cell(tr, String(r[6]), "num");
      cell(tr, fmt(r[9]), "num");
      cell(tr, r[7].length ? context(r[7][0]) : "");
      tr.addEventListener("click", function () {
        var next = tr.nextSibling;
        if (next && next.className === "detail") { tbody.removeChild(next); }
        else { tbody.insertBefore(detail(r), next); }
      });
      tbody.appendChild(tr);
    });
    countEl.textContent = Math.min(limit, shown.length) + " of " + shown.length + " components";
    more.style.display = shown.length > limit ? "" : "none";
    table.querySelectorAll("th[data-col]").forEach(function (th) {
      th.classList.remove("sorted-asc", "sorted-desc");
      if (Number(th.dataset.col) === sortCol) { th.classList.add(sortDir < 0 ? "sorted-desc" : "sorted-asc"); }
    });
  }

  table.querySelectorAll("th[data-col]").forEach(function (th) {
    th.addEventListener("click", function () {
      var col = Number(th.dataset.col);
      if (col === sortCol) { sortDir = -sortDir; } else { sortCol = col; sortDir = col === 0 ? 1 : -1; }
      render();
    });
  });
  [siteSel, kindSel].forEach(function (el) { el.addEventListener("change", function () { limit = PAGE; render(); }); });
  textIn.addEventListener("input", function () { limit = PAGE; render(); });
  more.addEventListener("click", function () { limit += PAGE; render(); });
  render();
})();
"""
