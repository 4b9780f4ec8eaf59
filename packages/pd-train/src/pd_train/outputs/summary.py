"""The end-of-run summary: a plain-text report of what was found (in words), final losses, L0
per site, the components' density classes, eval numbers and outputs."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pd_train.outputs._metrics import METRICS_FILE
from pd_train.outputs._progress import format_duration
from pd_train.outputs.density import (
    ALWAYS_ON_ABOVE,
    DENSITY_CLASSES,
    SPARSE_BELOW,
    class_counts,
    density_by_kind,
)
from pd_train.outputs.records import (
    KIND_ORDER,
    Record,
    canonical_sites,
    finite,
    l0_source,
    last_with_prefix,
    of_phase,
    site_kind,
    site_layer,
)

# Per-site L0 rows are listed only for small decompositions; large ones get per-kind rows.
MAX_SITE_ROWS = 24
# Sentences (what was found) wrap at this width; continuation lines are indented by 4.
WIDTH = 100


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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


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
        f"final losses (train, step {last.get('step')}; min: the least of the logged steps):",
        *table(["term", "final", "min"], rows),
    ]


def _site_grid(values: Mapping[str, float]) -> list[str] | None:
    """L0 of Llama sites as a table, one row per layer and one column per kind (None when a
    site is not named like ``layers.3.mlp.down_proj``)."""
    cells: dict[int, dict[str, float]] = {}
    for s, v in values.items():
        layer, kind = site_layer(s), site_kind(s)
        if layer is None or kind not in KIND_ORDER:
            return None
        cells.setdefault(layer, {})[kind] = v
    kinds = [k for k in KIND_ORDER if any(k in row for row in cells.values())]
    rows = [
        [f"layer {layer}", *(_num(cells[layer][k], 3) if k in cells[layer] else "-" for k in kinds)]
        for layer in sorted(cells)
    ]
    return table(["", *kinds], rows)


def _l0(records: Sequence[Record]) -> list[str]:
    source = l0_source(records)
    if source is None:
        return ["L0: none logged"]
    phase, rs = source
    last = rs[-1]
    sites = canonical_sites(k[3:] for k in last if k.startswith("l0/"))
    values = {s: x for s in sites if (x := finite(last[f"l0/{s}"])) is not None}
    lines = [
        f"L0 per site ({phase}, step {last.get('step')}, {len(sites)} sites; "
        "mean number of active components per token):"
    ]
    grid = _site_grid(values)
    if grid is not None:
        lines += grid
    elif len(values) <= MAX_SITE_ROWS:
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


#: The eval masks the "what was found" lines compare with clean, in this order (those logged),
#: each with what it is (pd_train.evaluate).
_OTHER_MASKS = {
    "ones": "every component at 1: V@U vs W",
    "stochastic": "the training's random masks",
    "rounded": "ci_lower > threshold as 1, else 0",
    "ppgd": "the persistent adversarial masks",
    "pgd": "adversarial masks ascended on the batch",
}


def _threshold(run_dir: Path) -> float | None:
    """``pd.l0_threshold`` of the run's config.yaml (the default 0.0 when the field is absent;
    None without a readable config)."""
    import yaml

    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    pd = config.get("pd") if isinstance(config, dict) else None
    if not isinstance(pd, dict):
        return None
    return finite(pd.get("l0_threshold", 0.0))


def _ce_lines(record: Record) -> list[str]:
    clean = finite(record.get("eval/ce_clean"))
    ci = finite(record.get("eval/ce_ci"))
    if clean is None or ci is None:
        return []

    def vs(x: float) -> str:
        rel = f", {100 * (x - clean) / clean:+.1f} %" if clean else ""
        return f"{x:.4g} ({x - clean:+.3g}{rel})"

    lines = [
        "  cross entropy (nats/token): clean "
        f"{clean:.4g}; with the CI masks (each component scaled by its CI) {vs(ci)}"
    ]
    others = [
        f"{m} ({what}) {vs(x)}"
        for m, what in _OTHER_MASKS.items()
        if (x := finite(record.get(f"eval/ce_{m}"))) is not None
    ]
    if others:
        lines.append("  other masks: " + "; ".join(others))
    return lines


def _verdict(counts: Mapping[str, int]) -> str:
    """One sentence: sparse (at least half of the alive components sparse, at most 1 in 20
    always on) or not yet, and what to change."""
    sparse, always = counts["sparse"], counts["always on"]
    alive = sparse + counts["moderate"] + always
    if alive and sparse >= alive / 2 and always <= alive / 20:
        return (
            f"  reading: sparse: {100 * sparse / alive:.0f} % of the alive components fire on "
            "under 10 % of tokens and few are always on; read them with `pd-train analyze "
            "RUN_DIR`, then `pd-train report RUN_DIR`"
        )
    share = f"{100 * sparse / alive:.0f} %" if alive else "none"
    return (
        f"  reading: not sparse yet: {share} of the alive components are sparse and {always} "
        "always on (a result worth reading has most sparse, few always on); train longer, "
        "raise the importance_minimality coeff or lower its pnorm_end"
    )


def _found(records: Sequence[Record], threshold: float | None) -> list[str]:
    """What was found, in words: CE with CI masks vs clean (and the other masks), how many
    components are sparse / moderate / always on / dead, and the total L0."""
    evals = of_phase(records, "eval")
    ce = last_with_prefix(evals, "eval/ce_ci")
    dens = last_with_prefix(evals, "density/")
    if ce is None and dens is None:
        return []
    step = (dens or ce or {}).get("step")
    lines = [f"what was found (eval, step {step}):"]
    if ce is not None:
        lines += _ce_lines(ce)
    if dens is not None:
        values = np.concatenate(list(density_by_kind(dens).values()))
        counts = class_counts(values)
        n_sites = sum(1 for k in dens if k.startswith("density/"))
        t = "pd.l0_threshold" if threshold is None else f"{threshold:g}"
        lines.append(
            f"  components: {values.size} in {_plural(n_sites, 'site')}: {counts['sparse']} sparse "
            f"(density < 0.1), {counts['moderate']} moderate, {counts['always on']} always on "
            f"(density > 0.9), {counts['dead']} dead (never ci_lower > {t})"
        )
        tokens = finite(dens.get("density_tokens"))
        window = f"the last {int(tokens)} tokens" if tokens else "the eval's tokens"
        lines.append(
            f"  alive: {values.size - counts['dead']} of {values.size} (spd's definition: "
            f"ci_lower > {t} on at least one of {window})"
        )
        l0 = {k: x for k, v in dens.items() if k.startswith("l0/") and (x := finite(v)) is not None}
        if l0:
            lines.append(
                f"  L0: {sum(l0.values()):.4g} active components per token over all {len(l0)} "
                f"sites (of {values.size}); {np.mean(list(l0.values())):.3g} per site on average"
            )
        if values.size:
            lines.append(_verdict(counts))
    if len(lines) == 1:
        return []
    return [w for line in lines for w in textwrap.wrap(line, WIDTH, subsequent_indent="    ")]


def _fmt_threshold(threshold: float | None) -> str:
    return "the threshold (pd.l0_threshold)" if threshold is None else f"{threshold:g}"


def density_section(records: Sequence[Record], *, threshold: float | None = None) -> list[str]:
    """The summary's component lines (empty without an eval record with ``alive/<site>``).

    threshold: the run's ``pd.l0_threshold`` (ci_lower above it counts as active), named in
    the lines; None names the field instead.
    """
    record = last_with_prefix(of_phase(records, "eval"), "alive/")
    if record is None:
        return []
    alive = {k[len("alive/") :]: int(v) for k, v in record.items() if k.startswith("alive/")}
    by_kind = density_by_kind(record)
    tokens = finite(record.get("density_tokens"))
    on = f"{int(tokens)} eval tokens" if tokens else "the eval tokens"
    t = _fmt_threshold(threshold)
    lines = [
        f"components (eval, step {record.get('step')}, {on}; "
        f"density = fraction of tokens with ci_lower > {t}):"
    ]
    if by_kind:
        rows = []
        for kind, values in [*by_kind.items(), ("all", np.concatenate(list(by_kind.values())))]:
            counts = class_counts(values)
            live = values[values > 0]
            median = f"{np.median(live):.3g}" if live.size else "-"
            rows.append([kind, values.size, *(counts[c] for c in DENSITY_CLASSES), median])
        headers = ["kind", "components", *DENSITY_CLASSES, "median density (alive)"]
        lines += table(headers, rows)
        lines.append(
            f"  sparse: 0 < density < {SPARSE_BELOW:g}; moderate: {SPARSE_BELOW:g} to "
            f"{ALWAYS_ON_ABOVE:g}; always on: above {ALWAYS_ON_ABOVE:g}; dead: 0"
        )
    total = sum(by_kind[k].size for k in by_kind)
    logged = {s for s in alive if f"density/{s}" in record}
    n_alive = sum(alive.values())
    window = f"the last {int(tokens)} tokens" if tokens else "the eval's tokens"
    of_total = f" of {total}" if len(logged) == len(alive) and total else ""
    lines.append(
        f"  alive: {n_alive}{of_total} in {len(alive)} site{'' if len(alive) == 1 else 's'} "
        "(spd's AliveComponentsTracker: "
        f"ci_lower > {t} on at least one of {window})"
    )
    if len(logged) < len(alive):
        unlogged = sum(v for s, v in alive.items() if s not in logged)
        lines.append(
            f"  {len(alive) - len(logged)} of them too large to log per-component density "
            f"({unlogged} alive there) are left out of the table"
        )
    return lines


def _eval(records: Sequence[Record]) -> list[str]:
    last = last_with_prefix(of_phase(records, "eval"), "eval/")
    if last is None:
        return []
    rows = [[k[len("eval/") :], _num(v)] for k, v in last.items() if k.startswith("eval/")]
    return [
        f"eval (step {last.get('step')}; ce_<mask>: cross entropy in nats/token, kl_<mask>: "
        "KL(clean || masked) in nats/token):",
        *table(["metric", "value"], rows),
    ]


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
    return ["outputs:", *table(["path", "holds"], rows)]


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
    threshold = _threshold(run_dir)
    sections = (
        _found(records, threshold),
        _losses(records),
        _l0(records),
        density_section(records, threshold=threshold),
        _eval(records),
    )
    for section in (*sections, _outputs(run_dir)):
        if section:
            lines += ["", *section]
    return "\n".join(lines) + "\n"
