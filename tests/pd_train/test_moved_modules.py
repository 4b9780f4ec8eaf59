"""The module paths from before the relayout (issue 26) still import: the same module object as
the new path, with one DeprecationWarning per old name; pd-train itself uses none of them."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pd_train._moved import MOVED

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter: no old name imported yet, every warning recorded.
_PROBE = """
import importlib, json, sys, warnings
old_names = json.loads(sys.argv[1])
out = {}
for old in old_names:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = importlib.import_module(old)
        again = importlib.import_module(old)
    out[old] = {
        "module": first.__name__,
        "same": first is again and sys.modules[old] is sys.modules[first.__name__],
        "spec": first.__spec__.name,
        "warnings": [
            [w.category.__name__, str(w.message)]
            for w in caught
            if w.category is DeprecationWarning and "moved to" in str(w.message)
        ],
    }
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from pd_train.config import PDConfig
    from pd_train.config import PDConfig as again
    from pd_train.config import io
from pd_train.config.pd import PDConfig as new
out["pd_train.config.PDConfig"] = {
    "same": PDConfig is new and again is new,
    "io": io.__name__,
    "warnings": [str(w.message) for w in caught if "moved to" in str(w.message)],
}
print(json.dumps(out))
"""


def test_old_module_paths_import_the_new_modules_and_warn_once() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(sorted(MOVED))],
        capture_output=True,
        text=True,
        check=True,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    found = json.loads(done.stdout)
    for old, new in MOVED.items():
        got = found[old]
        assert got["module"] == new, old
        assert got["same"], f"{old} is not the module object of {new}"
        assert got["spec"] == new, f"{old}: __spec__ left pointing at the alias"
        assert got["warnings"] == [
            ["DeprecationWarning", f"{old} moved to {new}; import it from there"]
        ], old
    config = found["pd_train.config.PDConfig"]
    assert config["same"] and config["io"] == "pd_train.config.io"
    assert config["warnings"] == [
        "pd_train.config.PDConfig moved to pd_train.config.pd.PDConfig; import it from there"
    ]


def test_old_module_paths_are_gone_from_the_source() -> None:
    """Each old name is only an alias now: its file is gone, and no module, test or benchmark
    imports it (the aliases are for code outside pd)."""
    src = ROOT / "packages/pd-train/src"
    for old in MOVED:
        stem = src.joinpath(*old.split("."))
        assert not stem.with_suffix(".py").exists(), stem
        assert not (stem / "__init__.py").exists(), stem
    users = []
    for folder in ("packages", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    found = [a.name for a in node.names if a.name in MOVED]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    found = [node.module] if node.module in MOVED else []
                    found += [
                        f"{node.module}.{a.name}"
                        for a in node.names
                        if f"{node.module}.{a.name}" in MOVED
                    ]
                else:
                    continue
                users.extend(f"{path.relative_to(ROOT)}:{node.lineno}: {old}" for old in found)
    assert not users, "\n".join(users)


#: (old module, name, the module that holds it now): names moved down to break a back-edge
#: (issue 26), still importable from their old module as the same object.
MOVED_NAMES = [
    *(
        ("pd_train.flops", name, "pd_train.census")
        for name in (
            "ADAM_FLOPS_PER_PARAM",
            "Census",
            "CensusContext",
            "FlopAccumulator",
            "FlopEntry",
        )
    ),
    *(
        ("pd_train.losses.recon", name, "pd_train.losses.plan")
        for name in ("ReconPlan", "all_sites_plan", "all_sites_subset_plan", "chunkwise_plan")
    ),
    *(
        ("pd_train.analysis.tracking", name, "pd_train.config.tracking")
        for name in ("CHECKPOINT", "FIGURES", "MODES", "WandbConfig", "parse_tracking")
    ),
    *(
        ("pd_train.analysis.density", name, "pd_train.outputs.density")
        for name in (
            "ALWAYS_ON_ABOVE",
            "DENSITY_CLASSES",
            "SPARSE_BELOW",
            "class_counts",
            "density_by_kind",
            "density_class",
        )
    ),
    ("pd_train.analysis.density", "density_section", "pd_train.outputs.summary"),
]


@pytest.mark.parametrize(("old", "name", "new"), MOVED_NAMES)
def test_moved_names_are_re_exported_from_their_old_module(old: str, name: str, new: str) -> None:
    new_module = importlib.import_module(new)
    assert name in vars(new_module), f"{name} does not live in {new}"
    assert getattr(importlib.import_module(old), name) is vars(new_module)[name]
    obj = vars(new_module)[name]
    if inspect.isclass(obj) or inspect.isfunction(obj):
        assert obj.__module__ == new, f"{name} is defined in {obj.__module__}, not {new}"
