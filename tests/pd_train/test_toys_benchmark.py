"""benchmarks/toys.py's ``--set``: a recipe change checked by field path before any run, shown
in the table, and never counted as the paper's settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "toys.py"


def _toys(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["seed=3"], "--set: got 'seed=3'; only pd.<field>=<value>"),
        (["pd.stepz=3"], "pd.stepz: unknown field"),
        # In a TMS 40-10 recipe the first loss term is faithfulness, which has no p.
        (
            ["pd.loss_metrics[0].pnorm_end=1.0"],
            "pd.loss_metrics[0].pnorm_end: unknown field in a 'faithfulness' entry",
        ),
    ],
)
def test_a_bad_set_is_refused_before_any_run(sets: list[str], expected: str) -> None:
    args = [a for s in sets for a in ("--set", s)]
    proc = _toys("--toys", "tms_40_10_fast", "--seeds", "0", "--rate-toys", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr
    assert "###" not in proc.stdout  # no table started


@pytest.mark.slow
def test_a_changed_recipe_runs_and_is_not_counted_as_the_papers() -> None:
    proc = _toys(
        "--toys", "tms_5_2", "--seeds", "0", "--rate-toys",
        "--set", "pd.steps=200", "--set", "pd.batch_size=256",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recipe changed by --set pd.steps=200 --set pd.batch_size=256" in proc.stdout
    (row,) = [line for line in proc.stdout.splitlines() if line.startswith("| 0 |")]
    assert row.split("|")[2:4] == [" 200 ", " 256 "]  # the changed steps and batch ran
    assert "with the recipes changed by --set (paper settings for 0 of 7)" in proc.stdout
