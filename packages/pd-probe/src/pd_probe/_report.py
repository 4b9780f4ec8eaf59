"""The report: arms × jits compile seconds with ratios to the baseline, as markdown, CSV, PNG."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any

import attrs

from pd_probe._checks import check_equivalence, check_isolation
from pd_probe._io import read_json, write_text
from pd_probe._isolation import arm_paths

GIB = 1024**3


@attrs.frozen
class Row:
    """One row of the report: one run of one arm (run 1 cold; aliases show their target)."""

    arm: str
    run: int
    status: str
    meta: dict[str, Any]
    record: dict[str, Any] | None
    alias_of: str | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return self.arm if self.run == 1 else f"{self.arm} (run {self.run})"


@attrs.frozen
class Report:
    """Paths of the written report files and the markdown table (what ``pd-train probe``
    prints)."""

    markdown: str
    markdown_path: Path
    csv_path: Path
    png_path: Path


def _records(probe: Path, name: str) -> dict[int, dict[str, Any]]:
    root = arm_paths(probe, name).root
    out = {}
    for run_dir in sorted(root.glob("run-*")):
        record = run_dir / "record.json"
        suffix = run_dir.name.removeprefix("run-")
        if record.exists() and suffix.isdigit():
            out[int(suffix)] = read_json(record)
    return dict(sorted(out.items()))


def load_rows(probe_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], list[Row]]:
    """The probe's ``grid.json`` and one :class:`Row` per arm run, in grid order."""
    probe = Path(probe_dir).absolute()
    grid = read_json(probe / "grid.json")
    aliases: dict[str, str] = grid.get("aliases", {})
    rows: list[Row] = []
    for arm in grid["arms"]:
        name, meta = arm["name"], arm.get("meta", {})
        status_path = arm_paths(probe, name).status
        status = read_json(status_path) if status_path.exists() else None
        target = aliases.get(name)
        records = _records(probe, target or name)
        if target is not None:
            state = f"= {target}"
        elif status is not None:
            state = status["status"]
        else:
            state = "ok" if records else "missing"
        error = None if status is None else status.get("error")
        if not records:
            rows.append(Row(name, 1, state, meta, None, alias_of=target, error=error))
        for run, record in records.items():
            rows.append(Row(name, run, state, meta, record, alias_of=target, error=error))
    return grid, rows


def _jit_names(rows: list[Row], *, phases_only: bool) -> list[str]:
    names: list[str] = []
    for row in rows:
        for jit, entry in (row.record or {}).get("jits", {}).items():
            if jit not in names and (entry.get("phase") or not phases_only):
                names.append(jit)
    if phases_only and not names:
        return _jit_names(rows, phases_only=False)
    return names


def _seconds(row: Row | None, jit: str) -> float | None:
    if row is None:
        return None
    entry = (row.record or {}).get("jits", {}).get(jit)
    return None if entry is None else float(entry["total_seconds"])


def _all_seconds(row: Row | None) -> float | None:
    if row is None or row.record is None:
        return None
    return sum(float(e["total_seconds"]) for e in row.record["jits"].values())


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return value / base


def _cache_hit(row: Row | None, jit: str) -> bool:
    """Every compile of ``jit`` in this run was loaded from the persistent cache."""
    entry = None if row is None else (row.record or {}).get("jits", {}).get(jit)
    if not entry:
        return False
    return bool(entry.get("cache_hits", 0) > 0 and entry.get("cache_misses", 0) == 0)


def _cell(value: float | None, ratio: float | None, *, hit: bool = False) -> str:
    if value is None:
        return "–"
    mark = ", cache hit" if hit else ""
    if ratio is not None:
        return f"{value:.2f} ({ratio:.2f}×{mark})"
    return f"{value:.2f}" + (" (cache hit)" if hit else "")


def _meta_keys(rows: list[Row]) -> list[str]:
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row.meta if k not in keys]
    return keys


def _baseline_row(grid: dict[str, Any], rows: list[Row]) -> Row | None:
    return next((r for r in rows if r.arm == grid["baseline"] and r.run == 1), None)


def markdown_table(grid: dict[str, Any], rows: list[Row]) -> str:
    """Arms × jits: total compile seconds (trace + lowering + backend compile) and, in
    parentheses, the ratio to the baseline arm's cold run, marked ``cache hit`` where every
    compile of that jit was loaded from the persistent compile cache."""
    jits = _jit_names(rows, phases_only=True)
    meta_keys = _meta_keys(rows)
    base = _baseline_row(grid, rows)
    header = ["arm", "status", *meta_keys, *(f"{j} s (×base)" for j in jits), "all jits s"]
    header.append("peak RSS GiB")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.label, row.status]
        cells += [str(row.meta.get(k, "")) for k in meta_keys]
        for jit in jits:
            value = _seconds(row, jit)
            hit = _cache_hit(row, jit)
            cells.append(_cell(value, _ratio(value, _seconds(base, jit)), hit=hit))
        total = _all_seconds(row)
        cells.append(_cell(total, _ratio(total, _all_seconds(base))))
        rss = (row.record or {}).get("peak_rss_bytes")
        cells.append("–" if rss is None else f"{rss / GIB:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


CSV_COLUMNS = (
    "arm",
    "run",
    "status",
    "alias_of",
    "jit",
    "phase",
    "trace_s",
    "lower_s",
    "backend_compile_s",
    "total_s",
    "ratio_to_baseline",
    "first_compile_cache",
    "cache_hits",
    "cache_misses",
    "xla_peak_memory_bytes",
    "xla_temp_bytes",
    "peak_rss_bytes",
)


def csv_text(grid: dict[str, Any], rows: list[Row]) -> str:
    """Long format: one line per arm run and jit (every jit, phases and others), with the
    arms' metadata as extra columns."""
    meta_keys = _meta_keys(rows)
    base = _baseline_row(grid, rows)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([*CSV_COLUMNS, *(f"meta_{k}" for k in meta_keys)])
    for row in rows:
        meta = [row.meta.get(k, "") for k in meta_keys]
        common = [row.arm, row.run, row.status, row.alias_of or ""]
        jits = (row.record or {}).get("jits", {})
        rss = (row.record or {}).get("peak_rss_bytes", "")
        if not jits:
            writer.writerow([*common, *[""] * (len(CSV_COLUMNS) - 5), rss, *meta])
            continue
        for jit, entry in jits.items():
            memory = entry.get("memory") or {}
            ratio = _ratio(float(entry["total_seconds"]), _seconds(base, jit))
            writer.writerow(
                [
                    *common,
                    jit,
                    bool(entry.get("phase")),
                    f"{entry['trace_seconds']:.6f}",
                    f"{entry['lower_seconds']:.6f}",
                    f"{entry['compile_seconds']:.6f}",
                    f"{entry['total_seconds']:.6f}",
                    "" if ratio is None else f"{ratio:.4f}",
                    entry.get("first_compile_cache") or "",
                    entry.get("cache_hits", 0),
                    entry.get("cache_misses", 0),
                    memory.get("peak_memory_in_bytes", ""),
                    memory.get("temp_size_in_bytes", ""),
                    rss,
                    *meta,
                ]
            )
    return buffer.getvalue()


def plot(rows: list[Row], path: Path) -> None:
    """Compile seconds (per jit, cold runs) against the arms' ``layers`` and ``chunks`` metadata."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jits = _jit_names(rows, phases_only=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for ax, key in zip(axes, ("layers", "chunks"), strict=True):
        # One point per x: the first arm in grid order that has it (baseline comes first).
        points: dict[Any, Row] = {}
        for row in rows:
            x = row.meta.get(key)
            if row.run == 1 and row.record is not None and isinstance(x, int | float):
                points.setdefault(x, row)
        xs = sorted(points)
        plotted = False
        for jit in jits:
            pairs = [(x, _seconds(points[x], jit)) for x in xs]
            pairs = [(x, y) for x, y in pairs if y is not None]
            if pairs:
                ax.plot(*zip(*pairs, strict=True), marker="o", label=jit)
                plotted = True
        ax.set_title(f"compile seconds vs {key}")
        ax.set_xlabel(key)
        ax.set_ylabel("trace + lower + compile (s)")
        if plotted:
            if min(xs) > 0:
                ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_ylim(bottom=0)
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, f"no arms with '{key}' metadata", ha="center", transform=ax.transAxes)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _summary(error: str | None) -> str:
    """First and last line of an error (the exit code and the end of stderr)."""
    lines = [line for line in (error or "").splitlines() if line.strip()]
    if len(lines) <= 1:
        return "".join(lines)
    return f"{lines[0]} … {lines[-1]}"


def write_report(probe_dir: str | os.PathLike[str]) -> Report:
    """Write ``report.md``, ``report.csv`` and ``compile_seconds.png`` into ``probe_dir`` from
    its ``grid.json`` and per-arm records and statuses; returns the markdown too."""
    probe = Path(probe_dir).absolute()
    grid, rows = load_rows(probe)
    table = markdown_table(grid, rows)
    parts = [
        f"# Compile probe: {probe.name}\n",
        f"Mode `{grid.get('mode', '?')}`; baseline `{grid['baseline']}`. Seconds are trace + "
        "lowering + backend compile per jit (cold run unless marked); the ratio is to the "
        "baseline's cold run.\n",
        table,
    ]
    problems = [f"- `{r.arm}`: {r.status}: {_summary(r.error)}" for r in rows if r.error]
    if problems:
        parts.append("Failures:\n\n" + "\n".join(problems) + "\n")
    isolation = check_isolation(probe)
    if isolation.arms:
        verdict = "ok" if isolation.ok else "BROKEN"
        lines = [f"Isolation ({len(isolation.arms)} arms run): {verdict}."]
        lines += [f"- {p}" for p in isolation.problems]
        parts.append("\n".join(lines) + "\n")
    if grid.get("mode") == "steps":
        checks = check_equivalence(probe)
        lines = ["Equivalent arms:"]
        lines += [
            f"- {c.group} ({', '.join(c.arms)}): {'identical' if c.identical else 'DIFFER'}: {c.detail}"
            for c in checks
        ]
        parts.append("\n".join(lines) + "\n")
    markdown = "\n".join(parts)
    report = Report(
        markdown=table,
        markdown_path=probe / "report.md",
        csv_path=probe / "report.csv",
        png_path=probe / "compile_seconds.png",
    )
    write_text(report.markdown_path, markdown)
    write_text(report.csv_path, csv_text(grid, rows))
    plot(rows, report.png_path)
    return report
