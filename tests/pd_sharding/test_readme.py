"""The README's layout and memory tables are the script's output, and agree with hand arithmetic."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "packages" / "pd-sharding"


def _script():
    spec = importlib.util.spec_from_file_location(
        "pd_sharding_readme_tables", PACKAGE / "scripts" / "readme_tables.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def test_readme_tables_are_current() -> None:
    readme = (PACKAGE / "README.md").read_text()
    script = _script()
    assert _between(readme, "<!-- layout table -->", "<!-- end layout table -->") == (
        script.layout_table()
    ), "regenerate with python packages/pd-sharding/scripts/readme_tables.py"
    assert _between(readme, "<!-- memory tables -->", "<!-- end memory tables -->") == (
        script.memory_tables()
    ), "regenerate with python packages/pd-sharding/scripts/readme_tables.py"


def test_readme_memory_rows_match_hand_arithmetic() -> None:
    script = _script()
    vu = 18_320_719_872
    for n, (replicate, data) in script.MESHES.items():
        import pd_sharding as ps

        layout = ps.Zero1Layout(ps.abstract_mesh(replicate=replicate, data=data))
        rows = ps.memory_estimate(script.production_groups(layout), layout.mesh)
        trainable = [r for r in rows if r.group.startswith("V/U")]
        assert sum(r.params for r in trainable) == vu
        assert sum(r.state_bytes for r in trainable) == 12 * vu // n
        target = next(r for r in rows if r.group.startswith("target"))
        assert target.params == 8_030_261_248  # Llama-3-8B
        norms = 2 * 32 * 4096 + 4096
        assert target.param_bytes == 2 * (target.params - norms) // n + 2 * norms
