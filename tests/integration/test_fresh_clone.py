"""A new user's first minutes: clone the repository, run the README's install command in a clean
virtual environment, then find ``pd-train`` on the PATH (issue 31, item 1).

The command is read from the root README (the bash block under "Install pd for your own runs"),
so the test follows the README. It needs git, network access to the package index (as every nox
session does) and a committed checkout: it clones HEAD, uncommitted changes are not in the clone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Install pd for your own runs"


def readme_install_command() -> str:
    """The first line of the first bash block under the README's install heading."""
    text = (ROOT / "README.md").read_text()
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```bash\n(.+?)\n```", section, flags=re.S)
    assert match is not None, f"no ```bash block under {SECTION!r}"
    lines = [line for line in match.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, f"the install section shows {len(lines)} commands, not one: {lines}"
    return lines[0]


def test_the_readme_shows_one_install_command() -> None:
    command = readme_install_command()
    assert "uv sync" in command, command


@pytest.mark.slow
def test_fresh_clone_install_puts_pd_train_on_path(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of pd")
    clone = tmp_path / "pd"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    # A clean venv of the interpreter running the tests: only pip in it, nothing of pd.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {
        name: value
        for name, value in os.environ.items()
        # Nothing of the environment running the tests may leak into the user's shell.
        if name not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")
        and not name.startswith(("UV_PROJECT", "UV_PYTHON", "NOX_"))
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", os.defpath).split(os.pathsep) if ".nox" not in p
    )
    env["UV_PYTHON"] = sys.executable  # the same Python as the suite (jax 0.10 needs 3.11)
    script = "\n".join(
        [
            "set -euo pipefail",
            f"source {venv}/bin/activate",
            readme_install_command(),
            'echo "PD_TRAIN_AT=$(command -v pd-train)"',
            "pd-train --help",
        ]
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    found = re.search(r"PD_TRAIN_AT=(.+)", proc.stdout)
    assert found is not None, out[-4000:]
    # The command found on the PATH is the clone's, not one of the test environment's.
    assert Path(found.group(1)).resolve().is_relative_to(clone.resolve()), found.group(1)
    assert "usage: pd-train" in proc.stdout, out[-4000:]
    # Every package is installed editable from the clone: its siblings resolved to the checkout.
    check = subprocess.run(
        [
            str(clone / ".venv" / "bin" / "python"),
            "-c",
            "import pd_init, pd_launch, pd_probe, pd_sharding, pd_train\n"
            "for m in (pd_init, pd_launch, pd_probe, pd_sharding, pd_train): print(m.__file__)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for line in check.stdout.split():
        assert Path(line).resolve().is_relative_to((clone / "packages").resolve()), line
