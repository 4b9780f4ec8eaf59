"""packages/pd-train/ARCHITECTURE.md stays true: its tables list every module of pd-train, each
under its folder, and nothing that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "packages/pd-train/ARCHITECTURE.md"
SRC = ROOT / "packages/pd-train/src"

_FOLDER = re.compile(r"^### `(pd_train(?:/[\w]+)*)/`$")
_ROW = re.compile(r"^\| `([\w.]+)` \|")


def _listed(text: str) -> dict[str, list[str]]:
    """{folder: [file names]} of the doc's tables, in order."""
    out: dict[str, list[str]] = {}
    folder = None
    for line in text.splitlines():
        if (m := _FOLDER.match(line)) is not None:
            folder = m[1]
            out.setdefault(folder, [])
        elif line.startswith("#"):
            folder = None
        elif folder is not None and (m := _ROW.match(line)) is not None:
            out[folder].append(m[1])
    return out


def _modules() -> dict[str, set[str]]:
    """{folder: {file names}} of the package's Python modules."""
    out: dict[str, set[str]] = {}
    for path in (SRC / "pd_train").rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        out.setdefault(path.parent.relative_to(SRC).as_posix(), set()).add(path.name)
    return out


def test_every_module_is_in_the_architecture_doc_and_every_row_exists() -> None:
    listed, modules = _listed(DOC.read_text()), _modules()
    missing = sorted(
        f"{folder}/{name}"
        for folder, names in modules.items()
        for name in names - set(listed.get(folder, []))
    )
    assert not missing, f"modules without a row in {DOC.name}: {missing}"
    stale = sorted(
        f"{folder}/{name}"
        for folder, names in listed.items()
        for name in names
        if name not in modules.get(folder, set())
    )
    assert not stale, f"rows of {DOC.name} naming no module: {stale}"
    doubled = sorted(f"{f}: {n}" for f, ns in listed.items() for n in set(ns) if ns.count(n) > 1)
    assert not doubled, doubled


def test_the_doc_parser_reads_a_table() -> None:
    text = "### `pd_train/run/`\n\n| file | what |\n| --- | --- |\n| `loop.py` | x |\n## Other\n| `no.py` | y |\n"
    assert _listed(text) == {"pd_train/run": ["loop.py"]}
