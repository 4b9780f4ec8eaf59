"""Persistent PGD on two jax processes (2 CPU devices each, gloo on 127.0.0.1) matches one
process on four devices: the train metrics and the whole adversary state after two steps.

Run as a script this file is one worker process of the test:
``python test_pgd_multiprocess.py PORT PROCESS_ID OUT_NPZ``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

TIMEOUT_S = 400
B, T, STEPS = 8, 8, 2


def _setup() -> tuple[Any, Any]:
    """The tiny model and a cheap PD config with a bsc persistent-PGD term (Adam, 1 warmup)."""
    from pd_train.config.pd import (
        MLPCI,
        DecompositionTarget,
        Faithfulness,
        OptimizerConfig,
        PDConfig,
        PersistentPGDRecon,
        PGDOptimizer,
    )
    from pd_train.models import llama

    model = llama.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    pd = PDConfig(
        steps=20,
        batch_size=B,
        decomposition_targets=(
            DecompositionTarget(module_pattern="layers.*.self_attn.q_proj", C=4),
        ),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=(
            Faithfulness(coeff=100.0),
            PersistentPGDRecon(
                coeff=0.5,
                scope="bsc",
                n_warmup_steps=1,
                optimizer=PGDOptimizer(type="adam", lr=0.05, b1=0.5, b2=0.99, warmup_frac=0.1),
            ),
        ),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
    )
    return model, pd


def _tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 32, (B, T)).astype(np.int32)


def run_steps(mesh: Any) -> dict[str, np.ndarray]:
    """Two train steps on ``mesh`` (one or several processes); metrics and adversary on host."""
    import jax
    from jax.experimental import multihost_utils

    import pd_sharding
    from pd_train.models import llama
    from pd_train.train import Trainer, step_key

    model, pd = _setup()
    trainer = Trainer(
        model, pd, mesh=mesh, compiler_options={"xla_backend_optimization_level": 0}, seq_len=T
    )
    target = jax.tree.map(np.asarray, llama.init_params(model, key=jax.random.key(0)))
    target = jax.device_put(target, trainer.target_shardings(target))
    tokens = _tokens()
    n_proc, rows = jax.process_count(), B // jax.process_count()
    local = tokens[jax.process_index() * rows : (jax.process_index() + 1) * rows]
    toks = pd_sharding.global_batch(local, mesh)
    assert trainer.layout is not None
    replicated = trainer.layout.replicated()

    def key(seed: int) -> jax.Array:  # from host data: a global array on every process
        data = np.asarray(jax.random.key_data(jax.random.key(seed)))
        return jax.random.wrap_key_data(jax.device_put(data, replicated))

    run_key = key(2)
    state = trainer.init_state(key=key(1))

    def host(x: Any) -> np.ndarray:
        if n_proc == 1:
            return np.asarray(x)
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    out: dict[str, np.ndarray] = {}
    for i in range(STEPS):
        state, metrics = trainer.train_step(state, target, toks, step_key(run_key, i))
        for k, v in metrics.items():
            for path, leaf in jax.tree_util.tree_leaves_with_path(v):
                out[f"step{i}/{k}{jax.tree_util.keystr(path)}"] = host(leaf)
    for path, leaf in jax.tree_util.tree_leaves_with_path(state.adversary):
        out[f"adversary{jax.tree_util.keystr(path)}"] = host(leaf)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(port: int, process_id: int, out_path: str) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    import pd_sharding

    assert jax.process_count() == 2 and jax.device_count() == 4
    mesh = pd_sharding.make_mesh(data=4)
    result = run_steps(mesh)
    np.savez(out_path, **result)
    jax.distributed.shutdown()


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
else:
    import pytest

    @pytest.mark.multiprocess
    @pytest.mark.slow
    def test_two_processes_match_one_with_persistent_pgd(tmp_path: Path) -> None:
        import jax

        import pd_sharding

        env = {
            **os.environ,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
            "JAX_PLATFORMS": "cpu",
        }
        port = _free_port()
        outs = [tmp_path / f"process{i}.npz" for i in range(2)]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, str(port), str(i), str(outs[i])],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(2)
        ]
        try:
            # the one-process reference compiles while the workers do
            single = run_steps(pd_sharding.make_mesh(data=4, devices=jax.devices()[:4]))
            logs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for i, p in enumerate(procs):
            assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{logs[i][-4000:]}"
        assert any(k.startswith("adversary['sources']") for k in single)
        assert "step1/loss/persistent_pgd_recon" in single
        for i, path in enumerate(outs):
            with np.load(path) as got:
                assert sorted(got.files) == sorted(single), i
                for k, want in single.items():
                    np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-5, err_msg=k)
        # the adversary moved: two final ascents + one warmup ascent per step
        assert int(single["adversary['opt_state']['count']"]) == 4
