"""Package-level promises: no jax (or matplotlib) on import, and no sibling pd packages."""

import subprocess
import sys
from pathlib import Path

import pd_probe


def test_import_pulls_in_neither_jax_nor_matplotlib_nor_siblings():
    code = (
        "import sys, pd_probe; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('jax', 'jaxlib', 'matplotlib', 'pd_train', 'pd_init', 'pd_sharding', 'pd_launch')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_sources_never_import_sibling_packages():
    src = Path(pd_probe.__file__).parent
    for path in src.glob("*.py"):
        text = path.read_text()
        for sibling in ("pd_train", "pd_init", "pd_sharding", "pd_launch"):
            assert f"import {sibling}" not in text and f"from {sibling}" not in text, path


def test_public_api_is_exported():
    for name in pd_probe.__all__:
        assert hasattr(pd_probe, name), name
