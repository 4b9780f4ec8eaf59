"""The installed ``pd-train`` command answers --version and --help."""

import subprocess

import pd_train


def test_version_matches_package() -> None:
    out = subprocess.run(["pd-train", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"pd-train {pd_train.__version__}"


def test_help_lists_usage() -> None:
    out = subprocess.run(["pd-train", "--help"], capture_output=True, text=True, check=True)
    assert "usage: pd-train" in out.stdout
