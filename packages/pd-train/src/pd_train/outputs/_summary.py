"""The end-of-run summary: a plain-text report of final losses, L0, eval numbers and outputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pd_train.outputs._metrics import METRICS_FILE
from pd_train.outputs._progress import format_duration
from pd_train.outputs._records import (
    KIND_ORDER,
    Record,
    canonical_sites,
    finite,
    l0_source,
    last_with_prefix,
    of_phase,
    site_kind,
)

# Per-site L0 rows are listed only for small decompositions; large ones get per-kind rows.
MAX_SITE_ROWS = 24


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> list[str]:
    """Left-aligned first column, right-aligned others, two spaces between columns."""
    cells = [[str(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        parts = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        return (indent + "  ".join(parts)).rstrip()

    rule = indent + "  ".join("-" * w for w in widths)
    return [fmt(cells[0]), rule, *(fmt(row) for row in cells[1:])]


def _num(value: Any, digits: int = 4) -> str:
    x = finite(value)
    if x is None:
        return str(value)
    return f"{x:.{digits}g}"


def _losses(records: Sequence[Record]) -> list[str]:
    train = of_phase(records, "train")
    last = last_with_prefix(train, "loss/")
    if last is None:
        return ["final losses: none logged"]
    keys = sorted((k for k in last if k.startswith("loss/")), key=lambda k: (k != "loss/total", k))
    rows = []
    for k in keys:
        values = [x for r in train if (x := finite(r.get(k))) is not None]
        rows.append([k[len("loss/") :], _num(last[k]), _num(min(values)) if values else "-"])
    return [
        f"final losses (train, step {last.get('step')}):",
        *table(["term", "final", "min"], rows),
    ]


def _l0(records: Sequence[Record]) -> list[str]:
    source = l0_source(records)
    if source is None:
        return ["L0: none logged"]
    phase, rs = source
    last = rs[-1]
    sites = canonical_sites(k[3:] for k in last if k.startswith("l0/"))
    values = {s: x for s in sites if (x := finite(last[f"l0/{s}"])) is not None}
    lines = [f"L0 per site ({phase}, step {last.get('step')}, {len(sites)} sites):"]
    if len(values) <= MAX_SITE_ROWS:
        lines += table(["site", "L0"], [[s, _num(v)] for s, v in values.items()])
    else:
        by_kind: dict[str, list[float]] = {}
        for s, v in values.items():
            by_kind.setdefault(site_kind(s), []).append(v)
        order = [k for k in KIND_ORDER if k in by_kind] + [
            k for k in by_kind if k not in KIND_ORDER
        ]
        rows = [
            [
                k,
                len(by_kind[k]),
                _num(np.mean(by_kind[k])),
                _num(min(by_kind[k])),
                _num(max(by_kind[k])),
            ]
            for k in order
        ]
        lines += table(["kind", "sites", "mean L0", "min", "max"], rows)
    if len(values) < len(sites):
        lines.append(f"  ({len(sites) - len(values)} sites with a non-finite L0 left out)")
    if values:
        all_l0 = list(values.values())
        lines.append(f"  mean L0 {_num(np.mean(all_l0))}, total L0 {_num(np.sum(all_l0), 7)}")
    return lines


def _eval(records: Sequence[Record]) -> list[str]:
    last = last_with_prefix(of_phase(records, "eval"), "eval/")
    if last is None:
        return []
    rows = [[k[len("eval/") :], _num(v)] for k, v in last.items() if k.startswith("eval/")]
    return [f"eval (step {last.get('step')}):", *table(["metric", "value"], rows)]


def _outputs(run_dir: Path) -> list[str]:
    plots = sorted((run_dir / "plots").glob("*.png"))
    ckpt_dir = run_dir / "checkpoints"
    ckpts = sorted(
        (int(p.name) for p in ckpt_dir.iterdir() if p.is_dir() and p.name.isdigit())
        if ckpt_dir.is_dir()
        else []
    )
    notes = {
        METRICS_FILE: "",
        "plots": f"{len(plots)} PNG" if plots else "",
        "checkpoints": f"steps {', '.join(map(str, ckpts[-4:]))}" if ckpts else "",
        "config.yaml": "",
        "compile.json": "",
    }
    rows = []
    for name, note in notes.items():
        path = run_dir / name
        rows.append(
            [str(path) + ("/" if path.is_dir() else ""), note if path.exists() else "(missing)"]
        )
    return ["outputs:", *table(["path", ""], rows)]


def _wall_time(records: Sequence[Record]) -> str | None:
    times = [t for r in records if (t := finite(r.get("time"))) is not None]
    if len(times) < 2:
        return None
    return f"{format_duration(max(times) - min(times))} (first to last metrics record)"


def render_summary(
    records: Sequence[Record],
    run_dir: str | Path,
    *,
    extra: Mapping[str, Any] | None = None,
    wall_time_s: float | None = None,
    last_step: int | None = None,
    attempt_first_step: int | None = None,
) -> str:
    """The summary printed at the end of a run, as text.

    ``records``: the run's metric records (:func:`read_metrics`); ``extra``: more ``label:
    value`` lines for the header (e.g. run name, device count); ``wall_time_s``: the run's wall
    time (default: the span of the records' timestamps, which includes any time between a stop
    and a resume). ``last_step``: the last step actually run (0-based, as in metrics.jsonl),
    which need not be a logged one; ``attempt_first_step``: the step this attempt started at
    (a resume starts at its checkpoint's step).

    Steps: metrics records number steps from 0 (``step k`` is the (k+1)-th step), a checkpoint
    is named by the steps it holds finished, so a run whose last step is 7 ends in checkpoint 8.
    """
    run_dir = Path(run_dir)
    train_steps = [r["step"] for r in of_phase(records, "train") if isinstance(r.get("step"), int)]
    header = {"run dir": str(run_dir)}
    if last_step is not None:
        header["last step run"] = (
            f"{last_step} (0-based as in metrics.jsonl; its checkpoint is named {last_step + 1})"
        )
        if attempt_first_step:
            header["this attempt"] = (
                f"steps {attempt_first_step}..{last_step}, resumed from checkpoint "
                f"{attempt_first_step}"
            )
    if train_steps:
        header["steps logged"] = (
            f"{min(train_steps)}..{max(train_steps)} ({len(train_steps)} records)"
        )
    wall = format_duration(wall_time_s) if wall_time_s is not None else _wall_time(records)
    if wall is not None:
        header["wall time"] = wall
    header.update({str(k): str(v) for k, v in (extra or {}).items()})
    width = max(len(k) for k in header)
    lines = ["pd-train summary", *(f"  {k.ljust(width)}  {v}" for k, v in header.items())]
    from pd_train.analysis.density import density_section

    sections = (_losses(records), _l0(records), density_section(records), _eval(records))
    for section in (*sections, _outputs(run_dir)):
        if section:
            lines += ["", *section]
    return "\n".join(lines) + "\n"
