"""A warm launch's fixed cost (docs/compile-cache.md, "The warm launch's floor"): what
`pd-train run` pays before step 0 when every program is cached — no toy module imported for a
shipped config, no ml_dtypes whose import alone took half of `import jax`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def _python(code: str) -> str:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return out.stdout.strip()


def test_a_shipped_config_resolves_without_importing_the_toys() -> None:
    """`builtin:default` used to import pd_train.targets.toys (its resid_mlp, tms, optax) only to
    check that `default` is not a toy's name."""
    code = (
        "import sys\n"
        "from pd_train.cli import config_source\n"
        "path = config_source('builtin:default')\n"
        "assert path.name == 'default.yaml', path\n"
        "print(sorted(m for m in ('pd_train.targets.toys', 'pd_train.targets.resid_mlp')"
        " if m in sys.modules))\n"
    )
    assert _python(code) == "[]"


def test_a_toy_or_an_unknown_name_is_still_refused_with_the_toys_listed() -> None:
    from pd_train.config.io import ConfigError
    from pd_train.configs import builtin_config

    with pytest.raises(ConfigError, match=r"builtin:tms_5_2 is a toy"):
        builtin_config("tms_5_2")
    with pytest.raises(ConfigError, match=r"no builtin config 'nope'; configs: .*toys: .*tms_5_2"):
        builtin_config("nope")


def test_ml_dtypes_is_a_version_whose_import_is_not_quadratic() -> None:
    """ml_dtypes 0.7.0 (beside numpy 2.4) spent ~0.57 CPU s registering its ufunc loops at import
    (0.6.0: 0.006 s): half of `import jax`, ~13 % of a warm launch to step 0. pd-train pins
    ``ml_dtypes<0.7`` (packages/pd-train/pyproject.toml) until a release imports quickly again."""
    from importlib.metadata import version

    major, minor = (int(part) for part in version("ml_dtypes").split(".")[:2])
    assert (major, minor) < (0, 7), version("ml_dtypes")


def test_logging_compiles_does_not_change_a_programs_executable_cache_key() -> None:
    """A launch with ``JAX_LOG_COMPILES=1`` (to see what compiles) missed every program in pd's
    executable cache: the option was part of the key. JAX's persistent cache then served them,
    and a served program is not stored, so it paid their trace and lowering each time."""
    import jax

    from pd_train.process_env import program_key

    before = jax.config.jax_log_compiles
    try:
        jax.config.update("jax_log_compiles", False)
        quiet = program_key("train_step", "structural", source="s")
        jax.config.update("jax_log_compiles", True)
        logged = program_key("train_step", "structural", source="s")
        precision = jax.config.jax_default_matmul_precision
        jax.config.update("jax_default_matmul_precision", "highest")
        try:  # an option that changes what programs compute still changes the key
            assert program_key("train_step", "structural", source="s") != logged
        finally:
            jax.config.update("jax_default_matmul_precision", precision)
    finally:
        jax.config.update("jax_log_compiles", before)
    assert quiet == logged


def test_a_warm_launch_loads_its_init_programs_beside_the_step(tmp_path: Path) -> None:
    """The init and warm-up programs a launch asked for are listed beside the step's entry;
    the next launch with that step loads them in a thread as soon as it starts (not one by one
    when each is called), and each is still taken by its own key: the state and warm-up
    losses are the first launch's bit for bit."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax._src import compilation_cache

    from pd_train.process_env import EXECUTABLES_DIR, ExecutableCache
    from pd_train.run import StepProgram
    from pd_train.train import Trainer

    from ._pgd import FAST, TINY, T, _pd, _target

    names = ["init_params", "opt_init", "init_sources", "init_sources_opt"]
    names += ["warmup_init", "warmup_step"]

    def launch() -> tuple[StepProgram, list[Any]]:
        trainer = Trainer(TINY, _pd(), compiler_options=FAST, seq_len=T)
        program = StepProgram(trainer, target_dtype=jnp.float32, recorder=None, cache_dir=tmp_path)
        program.start()  # the step misses: its thread waits for a recorder, never given here
        program.wait_for_prefetch()
        trainer.programs = program.init_programs()
        try:
            state = trainer.init_state(key=jax.random.key(5))
            state, losses = trainer.faithfulness_warmup(state, _target(), steps=2)
        finally:
            trainer.programs = None
            program.remember_init_programs()
            program.cancel(wait=True)
        return program, [*jax.tree.leaves(state), *losses]

    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        first, cold = launch()
        assert first.init_outcomes == dict.fromkeys(names, "miss")
        assert first.init_prefetched == []  # nothing was listed yet
        listed = ExecutableCache(tmp_path / EXECUTABLES_DIR).companions(first.key())
        assert [name for name, _ in listed] == names
        second, warm = launch()
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()
    assert second.key() == first.key()
    assert second.init_outcomes == dict.fromkeys(names, "hit")
    assert second.init_prefetched == names
    assert len(cold) == len(warm) > 10
    for a, b in zip(cold, warm, strict=True):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_a_listed_program_the_launch_does_not_ask_for_is_not_used(tmp_path: Path) -> None:
    """The list beside a step's entry is a hint: a program listed under another key (a stale
    list) is loaded but never handed to a jit whose key differs, and a damaged list is
    ignored."""
    import jax
    import jax.numpy as jnp

    from pd_train.process_env import ExecutableCache
    from pd_train.run._programs import _Prefetch

    cache = ExecutableCache(tmp_path)
    cache.store("a", jax.jit(jnp.tanh).lower(jnp.ones((2, 4))).compile())
    cache.set_companions("step", [("init_params", "a"), ("opt_init", "gone")])
    assert cache.companions("step") == [("init_params", "a"), ("opt_init", "gone")]
    prefetch = _Prefetch(cache, [key for _, key in cache.companions("step")])
    prefetch.wait()
    assert prefetch.take("other") is None  # not listed
    assert prefetch.take("gone") is None  # listed, no entry
    assert prefetch.take("a") is not None
    assert prefetch.take("a") is None  # handed over once
    (tmp_path / "step.programs.json").write_text("{not json")
    assert cache.companions("step") == []
    assert cache.companions("never") == []


def test_the_collector_is_paused_over_the_set_up_and_frozen_after() -> None:
    """`pd-train run` validates its config with the cyclic collector off (its imports and set-up
    made ~300 collections that freed almost nothing) and turns it back on, with the set-up's
    objects frozen, once the runtime has started."""
    code = (
        "import gc, sys\n"
        "import pd_train.run as runner\n"
        "seen = []\n"
        "def prepare(*args, **kwargs):\n"
        "    seen.append(gc.isenabled())\n"
        "    raise KeyboardInterrupt\n"
        "runner.prepare = prepare\n"
        "from pd_train import cli\n"
        "code = cli.main(['run', 'builtin:default'])\n"
        "print(seen, gc.isenabled(), gc.get_freeze_count() > 0, code)\n"
    )
    assert _python(code) == "[False] True True 130"


def test_resume_turns_collection_back_on_once() -> None:
    import gc

    from pd_train import _gc_pause

    assert gc.isenabled()
    with _gc_pause.paused():
        assert not gc.isenabled()
        _gc_pause.resume()
        assert gc.isenabled()
        gc.disable()  # someone else's choice after the resume: left alone
        _gc_pause.resume()
        assert not gc.isenabled()
        gc.enable()
    assert gc.isenabled()
    gc.unfreeze()
    gc.disable()
    with _gc_pause.paused():  # already off: not turned on at the end
        pass
    assert not gc.isenabled()
    gc.enable()


def test_the_command_line_parses_without_importing_jax() -> None:
    """`pd-train run` starts loading its step (pd_train._preload) right after its arguments,
    before pd's and JAX's imports finish; the parser of every subcommand used to import
    pd_train.run, and JAX with it, first (`pd-train probe`'s module)."""
    code = (
        "import sys\n"
        "from pd_train.cli import build_parser\n"
        "build_parser().parse_args(['run', 'builtin:default'])\n"
        "print(sorted(m for m in ('jax', 'pd_train.run', 'numpy') if m in sys.modules))\n"
    )
    assert _python(code) == "[]"
