"""Checks after a run: arms shared no cache, and equivalent arms logged identical losses."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from pd_probe._errors import IsolationError
from pd_probe._io import read_json
from pd_probe._isolation import arm_paths


@attrs.frozen
class IsolationCheck:
    """Outcome of :func:`check_isolation`.

    Attributes:
      arms: the arms checked (those that ran).
      first_compiles: arm → jit → cache outcome of the jit's first compile in run 1.
      problems: what broke isolation; empty when ``ok``.
    """

    arms: tuple[str, ...]
    first_compiles: dict[str, dict[str, str | None]]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self) -> None:
        if self.problems:
            msg = "arms were not isolated:\n  " + "\n  ".join(self.problems)
            raise IsolationError(msg)


def _files(root: Path) -> dict[tuple[int, int], str]:
    """(device, inode) → path of every file under ``root``; identity survives links."""
    out: dict[tuple[int, int], str] = {}
    if not root.exists():
        return out
    for dirpath, _, filenames in os.walk(root, followlinks=True):
        for filename in filenames:
            path = Path(dirpath, filename)
            st = path.stat()
            out[(st.st_dev, st.st_ino)] = str(path)
    return out


def _ran(probe_dir: Path) -> dict[str, str]:
    """Arm name → status, for the arms the runner started (not aliases, not skipped)."""
    grid = read_json(probe_dir / "grid.json")
    out = {}
    for arm in grid["arms"]:
        status_path = arm_paths(probe_dir, arm["name"]).status
        status = read_json(status_path)["status"] if status_path.exists() else None
        if status in ("ok", "failed", "timeout"):
            out[arm["name"]] = status
    return out


def check_isolation(probe_dir: str | os.PathLike[str]) -> IsolationCheck:
    """Prove that no arm's compile could hit another arm's cache.

    Two facts: (1) no two arms' cache directories (compilation and autotune) share a file, by
    identity (device, inode), so hard links, symlinked or nested directories count too; (2) in each arm's run 1, the first compile of every jit was not a persistent-cache
    hit (recorder outcome ``miss``, or ``off`` for an arm without the cache).
    """
    probe = Path(probe_dir).absolute()
    ran = _ran(probe)
    names = list(ran)
    problems: list[str] = []
    files: dict[str, dict[tuple[int, int], str]] = {}
    for name in names:
        paths = arm_paths(probe, name)
        files[name] = {**_files(paths.cache_dir), **_files(paths.autotune_dir)}
    for a, b in itertools.combinations(names, 2):
        shared = sorted(set(files[a]) & set(files[b]))
        if shared:
            examples = ", ".join(files[a][k] for k in shared[:3])
            problems.append(f"arms {a!r} and {b!r} share {len(shared)} cache file(s): {examples}")
    first_compiles: dict[str, dict[str, str | None]] = {}
    for name in names:
        record_path = arm_paths(probe, name).run(1).record
        if not record_path.exists():
            if ran[name] != "ok":
                continue  # a failed run without a record compiled nothing we can judge
            problems.append(f"arm {name!r}: no record at {record_path}, cannot check its compiles")
            continue
        record = read_json(record_path)
        first_compiles[name] = {}
        for jit, entry in record["jits"].items():
            outcome = entry.get("first_compile_cache")
            first_compiles[name][jit] = outcome
            if outcome == "hit":
                problems.append(
                    f"arm {name!r}: the first compile of jit {jit!r} was a persistent-cache hit"
                )
    return IsolationCheck(
        arms=tuple(names), first_compiles=first_compiles, problems=tuple(problems)
    )


@attrs.frozen
class EquivalenceCheck:
    """Losses of arms declared numerically equivalent (one ``equivalence`` label)."""

    group: str
    arms: tuple[str, ...]
    identical: bool
    detail: str


def read_losses(metrics: Path, loss_keys: Sequence[str]) -> list[tuple[Any, ...]]:
    """``(step, key, value)`` rows of ``metrics.jsonl`` for every key in ``loss_keys`` a line
    has; values compare by ``repr`` so that NaN equals NaN and -0.0 differs from 0.0."""
    rows: list[tuple[Any, ...]] = []
    for line in metrics.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        for key in loss_keys:
            if key in entry:
                value = entry[key]
                shown = repr(float(value)) if isinstance(value, int | float) else repr(value)
                rows.append((entry.get("step"), key, shown))
    return rows


def _first_difference(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> str:
    for ra, rb in zip(a, b, strict=False):
        if ra != rb:
            return f"step {ra[0]} {ra[1]}: {ra[2]} vs {rb[2]}"
    return f"{len(a)} vs {len(b)} loss values"


def check_equivalence(
    probe_dir: str | os.PathLike[str], *, loss_keys: Sequence[str] = ("loss",)
) -> list[EquivalenceCheck]:
    """For every equivalence group of the probe's grid, whether its arms' run-1
    ``out/metrics.jsonl`` hold bit-identical ``loss_keys`` at every step (an alias arm uses
    the metrics of the arm it aliases)."""
    probe = Path(probe_dir).absolute()
    grid = read_json(probe / "grid.json")
    aliases: dict[str, str] = grid.get("aliases", {})
    groups: dict[str, list[str]] = {}
    for arm in grid["arms"]:
        if arm.get("equivalence"):
            groups.setdefault(arm["equivalence"], []).append(arm["name"])
    results = []
    for group, names in groups.items():
        losses: dict[str, list[tuple[Any, ...]]] = {}
        missing = []
        for name in names:
            metrics = arm_paths(probe, aliases.get(name, name)).run(1).metrics
            if metrics.exists():
                losses[name] = read_losses(metrics, loss_keys)
            else:
                missing.append(name)
        if missing:
            detail = f"no metrics.jsonl for {', '.join(missing)}"
            results.append(EquivalenceCheck(group, tuple(names), False, detail))
            continue
        reference = names[0]
        if not losses[reference]:
            detail = f"{reference} logged none of {', '.join(loss_keys)}"
            results.append(EquivalenceCheck(group, tuple(names), False, detail))
            continue
        differing = [n for n in names[1:] if losses[n] != losses[reference]]
        if differing:
            detail = "; ".join(
                f"{n} differs from {reference} at {_first_difference(losses[reference], losses[n])}"
                for n in differing
            )
            results.append(EquivalenceCheck(group, tuple(names), False, detail))
        else:
            count = len(losses[reference])
            detail = f"{count} loss values identical"
            results.append(EquivalenceCheck(group, tuple(names), True, detail))
    return results
