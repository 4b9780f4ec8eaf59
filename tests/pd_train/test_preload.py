"""`pd-train run` starts loading its train step from a launch hint before its set-up
(pd_train._preload): the hint is only a hint. The launch takes the preloaded program only when
its own key is the hint's, a stale, damaged or mismatched hint is never used (the launch still
hits or compiles as before), and a launch that could be multi-process, or that sets its launch
environment, never starts the backend early."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from pd_train import _preload
from pd_train.outputs import read_metrics
from pd_train.process_env import ExecutableCache

from ._cli import _cli, _finish, tiny_config, write_config


def _store(directory: Path, key: str, fn: Any = jnp.tanh) -> Any:
    """A small program compiled and stored under ``key`` in ``directory``'s executables."""
    compiled = jax.jit(fn).lower(jnp.ones((2, 4))).compile()
    assert ExecutableCache(directory / "executables").store(key, compiled)
    return compiled


def _hinted(directory: Path, step: str, key: str = "hint") -> _preload.Preload:
    """A hint ``key`` that names ``step`` (written as a launch that held it writes it)."""
    _preload.Preload(key, directory).remember(step, held=True)
    return _preload.Preload(key, directory)


def test_a_hint_starts_loading_its_step_which_the_launch_takes_by_its_key(tmp_path: Path) -> None:
    _store(tmp_path, "step-a")
    preload = _hinted(tmp_path, "step-a")
    preload.start()
    try:
        assert preload.guess == "step-a"
        assert preload.claim("step-a", tmp_path)
        compiled = preload.step()
        assert compiled is not None
        assert preload.outcome == "used"
        x = jnp.linspace(-2.0, 2.0, 8).reshape(2, 4)
        np.testing.assert_array_equal(np.asarray(compiled(x)), np.asarray(jnp.tanh(x)))
    finally:
        preload.close()


def test_a_hint_for_another_step_or_cache_is_dropped(tmp_path: Path) -> None:
    """The preloaded program is never handed to a launch whose step has another key (a
    stale hint naming another stored program) or lives in another cache directory."""
    _store(tmp_path, "step-a")
    _store(tmp_path, "step-b", jnp.sin)
    for key, directory in (("step-b", tmp_path), ("step-a", tmp_path / "elsewhere")):
        preload = _hinted(tmp_path, "step-a")
        preload.start()
        try:
            assert preload.guess == "step-a"
            assert not preload.claim(key, directory)
            assert preload.claim("step-a", tmp_path) is False  # decided once
            assert preload.step() is None
            assert preload.prefetch() is None
            assert preload.outcome == "dropped"
        finally:
            preload.close()
    # The launch that found step-b under its own key rewrites the hint to name it.
    _preload.Preload("hint", tmp_path).remember("step-b", held=True)
    assert _preload.Preload("hint", tmp_path).read()["step"] == "step-b"  # type: ignore[index]


@pytest.mark.parametrize(
    "hint",
    [
        "{not json",
        "[1, 2]",
        json.dumps({"step": 3, "backend": "x"}),
        json.dumps({"step": "gone", "backend": _preload.backend_signature()}),
        json.dumps({"step": "step-a", "backend": "['tpu', 'v9', 1, []]"}),
    ],
    ids=["damaged", "not a mapping", "not a key", "entry gone", "another backend"],
)
def test_a_stale_or_damaged_hint_loads_nothing(tmp_path: Path, hint: str) -> None:
    _store(tmp_path, "step-a")
    path = tmp_path / "executables" / f"hint{_preload.HINT_SUFFIX}"
    path.write_text(hint)
    preload = _preload.Preload("hint", tmp_path)
    preload.start()
    assert preload.guess is None
    assert preload._thread is None  # nothing loading
    assert preload.outcome in ("no hint", "stale hint")
    assert not preload.claim("step-a", tmp_path)
    assert preload.step() is None
    preload.close()
    # A launch whose step the cache does not hold leaves no usable hint; one that holds it
    # writes a good one.
    preload.remember("step-c", held=False)
    assert preload.read() is None
    preload.remember("step-a", held=True)
    assert preload.read() == {"step": "step-a", "backend": _preload.backend_signature()}


def test_pruning_an_entry_removes_the_hints_that_name_it(tmp_path: Path) -> None:
    _store(tmp_path, "old")
    _hinted(tmp_path, "old", key="h-old")
    cache = ExecutableCache(tmp_path / "executables", max_entries=1)
    cache.store("new", jax.jit(jnp.cos).lower(jnp.ones((2, 4))).compile())
    _hinted(tmp_path, "new", key="h-new")
    cache.prune()
    assert not cache.holds("old")
    assert _preload.Preload("h-old", tmp_path).read() is None
    assert _preload.Preload("h-new", tmp_path).read() is not None


def test_the_preload_reads_the_cache_directory_the_run_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pd_train.config.run import load_config
    from pd_train.run._runtime import compile_cache_directory

    monkeypatch.chdir(tmp_path)
    base = tiny_config(tmp_path, tmp_path / "cache")
    variants: list[dict[str, Any]] = [
        {},
        {"runtime": {"compile_cache": {"dir": "relative/cache"}}},
        {"runtime": {"compile_cache": {"dir": "~/somewhere"}}},
        {"runtime": {}, "output_dir": "out"},
        {"runtime": {}},
        {"runtime": {"compile_cache": {"dir": None}}},
        {"runtime": {"compile_cache": {"enabled": False}}},
    ]
    for change in variants:
        raw = {**base, **change}
        config, _ = load_config(raw)
        assert _preload.cache_directory(raw) == compile_cache_directory(config), change
    # Set before the backend starts (start_runtime): the preload leaves such a launch alone.
    for runtime in (
        {"launch_env": {"env": {"XLA_FLAGS": "--xla_cpu_use_thunk_runtime=true"}}},
        {"launch_env": {"profile": {"hlo_dump": True}}},
    ):
        raw = {**base, "runtime": {**base["runtime"], **runtime}}
        load_config(raw)  # a valid config
        assert _preload.cache_directory(raw) is None, runtime


def test_the_hint_is_the_same_for_a_value_change_and_differs_for_a_structural_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pd_train.config.io import apply_overrides

    raw = tiny_config(tmp_path, tmp_path / "cache")
    directory = tmp_path / "cache"

    def key(*overrides: str, where: Path = directory) -> str:
        return _preload.hint_key(apply_overrides(raw, overrides), where)

    same = key()
    for value in ("seed=7", "pd.components.lr=0.004", "pd.loss_metrics[1].coeff=0.01"):
        assert key(value) == same, value
    for structural in ("pd.batch_size=16", "pd.decomposition_targets[1].C=8", "data.seq_len=8"):
        assert key(structural) != same, structural
    assert key(where=tmp_path / "other") != same
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=3")
    assert key() != same


def _args(*argv: str) -> Any:
    from pd_train.cli import build_parser

    return build_parser().parse_args(["run", *argv])


def test_only_a_one_process_launch_with_its_environment_unset_preloads(tmp_path: Path) -> None:
    """With a hint for the config stored, `pd-train run`'s preload starts loading; the same
    launch as one process of several (``--distributed``: the backend must start after
    ``jax.distributed``), with a launch environment, without the cache, or of a toy does not
    even read it."""
    from pd_train.cli import run as run_cli

    cache = tmp_path / "cache"
    config = write_config(tmp_path, tiny_config(tmp_path, cache))
    raw = yaml.safe_load(config.read_text())
    _store(cache, "step-a")
    _hinted(cache, "step-a", key=_preload.hint_key(raw, cache))
    started = run_cli._preload(_args(str(config)))
    assert started is not None
    try:
        assert started.guess == "step-a"
    finally:
        started.close()
    # A value override keeps the hint.
    lr = run_cli._preload(_args(str(config), "--set", "pd.components.lr=0.5"))
    assert lr is not None
    lr.close()
    assert lr.guess == "step-a"
    explicit = ["--distributed", "explicit", "--coordinator", "127.0.0.1:1"]
    explicit += ["--num-processes", "2", "--process-id", "0"]
    refused = [
        _args(str(config), *explicit),
        _args(str(config), "--distributed", "slurm"),
        _args(str(config), "--set", "runtime.launch_env.env={JAX_ENABLE_X64: '1'}"),
        _args(str(config), "--set", "runtime.compile_cache.enabled=false"),
        _args(str(config), "--set", "runtime.launch_env.profile.hlo_dump=true"),
        _args("builtin:tms_5_2"),
        _args(str(tmp_path / "missing.yaml")),
    ]
    for args in refused:
        assert run_cli._preload(args) is None, args


# ---------------------------------------------------------------------------------------------
# End to end: `pd-train run` processes on one cache


def _records(run_dir: Path) -> list[dict[str, Any]]:
    """The warm-up and step-0 records without their times."""
    rows = [r for r in read_metrics(run_dir) if r["phase"] == "warmup" or r["step"] == 0]
    return [{k: v for k, v in r.items() if k != "time"} for r in rows]


def _launch(config: Path, run_dir: Path) -> dict[str, Any]:
    out = _finish(_cli("run", str(config), "--run-dir", str(run_dir), "--max-steps", "1"))
    assert "Traceback" not in out, out[-3000:]
    notes: dict[str, Any] = json.loads((run_dir / "compile.json").read_text())["notes"]
    return notes


def test_a_launch_with_a_good_a_damaged_or_a_wrong_hint_computes_the_same_numbers(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "cache"
    config = write_config(tmp_path, tiny_config(tmp_path, cache))
    cold = _launch(config, tmp_path / "cold")
    assert cold["train_step_preload"] == "no hint", cold
    hints = list((cache / "executables").glob(f"*{_preload.HINT_SUFFIX}"))
    assert len(hints) == 1
    step = json.loads(hints[0].read_text())["step"]
    assert cold["train_step_executable_cache"] == "miss"

    warm = _launch(config, tmp_path / "warm")
    assert warm["train_step_preload"] == "used", warm
    assert warm["train_step_executable_cache"] == "hit"
    assert set(warm["init_executable_cache"].values()) == {"hit"}
    expected = _records(tmp_path / "warm")
    assert len(expected) == 4 and expected[-1]["phase"] == "train"
    assert _records(tmp_path / "cold") == expected

    hints[0].write_text("{damaged")
    damaged = _launch(config, tmp_path / "damaged")
    assert damaged["train_step_preload"] == "no hint", damaged
    assert damaged["train_step_executable_cache"] == "hit"  # loaded by its own key
    assert _records(tmp_path / "damaged") == expected
    assert json.loads(hints[0].read_text())["step"] == step  # written again

    # A hint that names another stored program (an init program's entry): it is loaded in
    # the preload's thread and never used; the step loads by its own key.
    listed = ExecutableCache(cache / "executables").companions(step)
    wrong = next(key for _, key in listed)
    hint = json.loads(hints[0].read_text())
    hints[0].write_text(json.dumps({**hint, "step": wrong}))
    dropped = _launch(config, tmp_path / "wrong")
    assert dropped["train_step_preload"] == "dropped", dropped
    assert dropped["train_step_executable_cache"] == "hit"
    assert _records(tmp_path / "wrong") == expected
    assert json.loads(hints[0].read_text())["step"] == step


def test_an_entry_is_its_executable_then_its_trees_and_an_older_entry_still_loads(
    tmp_path: Path,
) -> None:
    """The preload's thread deserializes the executable (XLA's work, without the GIL) before
    it unpickles the argument and result trees, whose node types (pd's state, optax's) are
    imported by that unpickling: an entry is two pickles, the executable first. An entry
    stored as one pickle (before) loads as it did."""
    import io
    import pickle

    from jax.experimental import serialize_executable

    from pd_train.process_env import ENTRY_FORMAT

    fn = jax.jit(lambda x, y: {"a": jnp.tanh(x) + y, "b": (x * 2.0,)})
    x = jnp.linspace(-1.0, 1.0, 8).reshape(2, 4)
    compiled = fn.lower(x, 1.0).compile()
    cache = ExecutableCache(tmp_path)
    assert cache.store("new", compiled)
    with io.BytesIO((tmp_path / "new.jaxexe").read_bytes()) as file:
        head = pickle.load(file)
        assert head[0] == ENTRY_FORMAT and isinstance(head[2], bytes)
        in_tree, out_tree = pickle.load(file)
        assert file.read() == b""
    assert in_tree == jax.tree.structure(((x, 1.0), {}))
    assert out_tree == jax.tree.structure(compiled(x, 1.0))
    old = pickle.dumps(([0], serialize_executable.serialize(compiled)))
    (tmp_path / "old.jaxexe").write_bytes(old)
    for key in ("new", "old"):
        loaded = cache.load(key)
        assert loaded is not None, key
        got, want = loaded(x, 2.0), compiled(x, 2.0)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_loading_threads_import_nothing_the_trees_are_read_by_the_taker(
    tmp_path: Path,
) -> None:
    """A thread that imports while the main thread imports the same package can get a partly
    initialized module (an optax ImportError ended a launch): `load_executable`, what the
    preload's threads run, imports nothing; the trees' node types are imported by `finish`."""
    import os
    import sys

    (tmp_path / "treemod.py").write_text(
        "from typing import NamedTuple\nclass Pair(NamedTuple):\n    a: object\n    b: object\n"
    )
    common = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "import jax, jax.numpy as jnp\n"
        "from pd_train.process_env import ExecutableCache\n"
        f"cache = ExecutableCache({str(tmp_path)!r})\n"
    )
    store = common + (
        "from treemod import Pair\n"
        "f = jax.jit(lambda p: Pair(p.a + p.b, p.a * p.b))\n"
        "assert cache.store('k', f.lower(Pair(jnp.ones(3), jnp.ones(3))).compile())\n"
    )
    load = common + (
        "from jax.experimental import serialize_executable\n"
        "loading = cache.load_executable('k')\n"
        "print('treemod' in sys.modules)\n"
        "compiled = cache.finish(loading)\n"
        "from treemod import Pair\n"
        "out = compiled(Pair(jnp.full(3, 2.0), jnp.full(3, 3.0)))\n"
        "print('treemod' in sys.modules, type(out).__name__, float(out.a[0]), float(out.b[0]))\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    for code in (store, load):
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "True", "Pair", "5.0", "6.0"]
