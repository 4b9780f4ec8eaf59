"""Reading metric records: series over steps, the last record holding a key, site order."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

KIND_ORDER = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_SITE = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")

Record = dict[str, Any]


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (missing, non-numeric, NaN or infinite)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def site_kind(site: str) -> str:
    """``"layers.3.mlp.down_proj"`` → ``"down_proj"`` (the last name part for other names)."""
    return site.rsplit(".", 1)[-1]


def site_layer(site: str) -> int | None:
    match = _SITE.match(site)
    return int(match.group(1)) if match else None


def canonical_sites(sites: Iterable[str]) -> list[str]:
    """Layer ascending, then q, k, v, o, gate, up, down; names that are not Llama sites follow,
    in the order given."""
    known: list[tuple[int, int, str]] = []
    other: list[str] = []
    for site in dict.fromkeys(sites):
        match = _SITE.match(site)
        if match and match.group(2) in KIND_ORDER:
            known.append((int(match.group(1)), KIND_ORDER.index(match.group(2)), site))
        else:
            other.append(site)
    return [s for _, _, s in sorted(known)] + other


def of_phase(records: Sequence[Record], phase: str) -> list[Record]:
    return [r for r in records if r.get("phase") == phase]


def keys_with_prefix(records: Sequence[Record], prefix: str) -> list[str]:
    """Keys starting with ``prefix`` in any record, in first-seen order."""
    return list(dict.fromkeys(k for r in records for k in r if k.startswith(prefix)))


def series(records: Sequence[Record], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the records whose ``key`` is a finite number."""
    steps: list[int] = []
    values: list[float] = []
    for r in records:
        x = finite(r.get(key))
        if x is not None and isinstance(r.get("step"), int):
            steps.append(r["step"])
            values.append(x)
    return steps, values


def last_with_prefix(records: Sequence[Record], prefix: str) -> Record | None:
    """The last record holding any key that starts with ``prefix``."""
    for r in reversed(records):
        if any(k.startswith(prefix) for k in r):
            return r
    return None


def l0_source(records: Sequence[Record]) -> tuple[str, list[Record]] | None:
    """The phase whose records carry per-site L0 (eval preferred, else train) and those records."""
    for phase in ("eval", "train"):
        rs = [r for r in of_phase(records, phase) if any(k.startswith("l0/") for k in r)]
        if rs:
            return phase, rs
    return None
