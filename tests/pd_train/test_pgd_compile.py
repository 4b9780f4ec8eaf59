"""`pd-train compile` with persistent PGD lowers and compiles the sources' init jits too, and a
`pd-train run` of the same config then loads every init program, and the step, from the cache it
warmed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ._cli import _cli, _finish, tiny_config, write_config
from ._pgd import PPGD


@pytest.mark.slow
def test_compile_lists_the_sources_init_and_the_run_hits_its_cache(tmp_path: Path) -> None:
    config = tiny_config(tmp_path, tmp_path / "cache", steps=1)
    # One kind, so train_step (which compile must compile too) stays small.
    config["pd"]["decomposition_targets"] = [
        {"module_pattern": "layers.*.self_attn.q_proj", "C": 4}
    ]
    config["pd"]["loss_metrics"].append({**PPGD, "n_warmup_steps": 1})
    config["pd"]["faithfulness_warmup"]["steps"] = 0
    config["cadence"]["save_every"] = 0
    path = write_config(tmp_path, config)

    record = tmp_path / "compile.json"
    out = _finish(_cli("compile", str(path), "--record", str(record)))
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")]
    assert rows[1:5] == ["init_params", "init_sources", "init_sources_opt", "opt_init"], out
    jits = json.loads(record.read_text())["jits"]
    assert {"init_sources", "init_sources_opt"} <= set(jits), sorted(jits)

    # A fresh process: the programs of the jits compile listed (the params' and the sources'
    # stacks, both optimizer states) are the ones the run's init calls, found in the cache.
    # (Eager ops of the init, such as making the step counter, are no listed jits.)
    run_dir = tmp_path / "run"
    _finish(_cli("run", str(path), "--run-dir", str(run_dir)))
    recorded = json.loads((run_dir / "compile.json").read_text())["jits"]
    init = recorded["init"]["compiles"]
    listed = ("jit(stacked)", "jit(_opt_init)", "jit(init_opt_state)")
    found = sorted((c["module"], c["cache"]) for c in init if c["module"] in listed)
    assert found == [
        ("jit(_opt_init)", "hit"),
        ("jit(init_opt_state)", "hit"),
        ("jit(stacked)", "hit"),
        ("jit(stacked)", "hit"),
    ], init
    # The step too: the run lowers it on the same abstract layout as compile did.
    step = [(c["module"], c["cache"]) for c in recorded["train_step"]["compiles"]]
    assert step == [("jit(train_step)", "hit")], step
