"""``pd-train analyze`` on two jax processes (2 CPU devices each, gloo on 127.0.0.1) writes the
same component table as one process: each process reads its rows of every eval batch, the
harvest state is reduced over the global batch, and only process 0 writes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pd_train.analysis import analyze_run, read_table

from ._analysis_runs import Runs, tiny_runs

SETTINGS = {"n_batches": 2, "top_k": 3, "window": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return tiny_runs(tmp_path_factory)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _assert_close(got: object, expected: object, name: str) -> None:
    """Nested lists of floats (contexts are ragged) equal within fp32 rounding."""
    if isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), name
        for a, b in zip(got, expected, strict=True):
            _assert_close(a, b, name)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_process_analysis_equals_one_process(runs: Runs, tmp_path: Path) -> None:
    port = _free_port()
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
    }
    outs = [tmp_path / f"p{i}.parquet" for i in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pd_train.cli",
                "analyze",
                str(runs.uninterrupted),
                *("--n-batches", "2", "--top-k", "3", "--window", "2"),
                *("--distributed", "explicit", "--coordinator", f"127.0.0.1:{port}"),
                *("--num-processes", "2", "--process-id", str(i), "--out", str(outs[i])),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=600)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(t[-3000:] for t in logs)
    assert outs[0].is_file() and not outs[1].exists()  # process 0 writes, process 1 does not
    table, meta = read_table(outs[0])
    assert meta["n_tokens"] == 2 * 8 * 16  # the global batches, not one process's rows

    single = analyze_run(runs.uninterrupted, progress=False, **SETTINGS)
    expected = single.to_arrow().to_pydict()
    got = table.to_pydict()
    assert sorted(got) == sorted(expected)
    for name, column in expected.items():
        if name in ("mean_ci", "top_ci", "top_token_ci"):  # fp32 sums in another order
            _assert_close(got[name], column, name)
        else:
            assert got[name] == column, name
