"""Two jax processes (gloo collectives on 127.0.0.1) agree with the same computation in one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import pd_sharding as ps

WORKER = Path(__file__).with_name("mp_worker.py")
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_worker():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pd_sharding_mp_worker", WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_match_one(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
    }
    port = _free_port()
    outs = [tmp_path / f"process{i}.json" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(port), str(i), str(outs[i])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for p in procs:
            log, _ = p.communicate(timeout=TIMEOUT_S)
            logs.append(log)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{logs[i][-4000:]}"
    results = [json.loads(o.read_text()) for o in outs]

    worker = _load_worker()
    mesh = ps.make_mesh(replicate=2, data=2, devices=jax.devices()[:4])
    single = worker.compute(mesh, np.concatenate([worker.rows_of(0), worker.rows_of(1)]))

    for i, r in enumerate(results):
        assert r["process_count"] == 2 and r["device_count"] == 4
        # replicate slice r lives on process r: data-axis collectives stay within a process
        assert r["replicate_rows_processes"] == [[0], [1]]
        assert r["v_shards_exact"] is True
        assert r["local_rows"] == worker.rows_of(i).tolist()
        for key in ("v_sum", "v_layer_sums", "v_din_sums", "batch_sum", "batch_row_sums"):
            assert r[key] == single[key], key
        assert r["batch_at_v"] == single["batch_at_v"]
        assert r["batch_host"] == single["batch_host"]
        assert (
            r["v_spec"] == single["v_spec"] == str(ps.Zero1Layout(mesh).v((3, 8, 4), name="V").spec)
        )
        assert r["batch_spec"] == single["batch_spec"]
        assert r["batch_shape"] == [8, 8]
    # the single-process reference is itself right
    rows = np.concatenate([worker.rows_of(0), worker.rows_of(1)])
    assert single["batch_host"] == rows.tolist()
    assert single["batch_row_sums"] == rows.sum(axis=1).astype(np.float32).tolist()
