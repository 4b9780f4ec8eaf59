"""What a run does before its first step: the executable cache that lets a warm launch skip
tracing and lowering the step, and the imports a run must not pay for before step 0."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.process_env import ExecutableCache, program_key, source_digest


def _compiled() -> jax.stages.Compiled:
    def step(state: dict[str, jax.Array], x: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
        w = state["w"] + x.sum()
        return {"w": w}, jnp.tanh(x @ w)

    shapes = (
        {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32)},
        jax.ShapeDtypeStruct((2, 4), jnp.float32),
    )
    return jax.jit(step, donate_argnums=0).lower(*shapes).compile()


def test_executable_cache_round_trip_gives_the_same_program(tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path / "executables")
    key = program_key("toy", "config-a")
    assert cache.load(key) is None  # nothing stored yet
    compiled = _compiled()
    assert cache.store(key, compiled)
    loaded = cache.load(key)
    assert loaded is not None
    x = jnp.arange(8, dtype=jnp.float32).reshape(2, 4) / 8
    w = np.eye(4, dtype=np.float32)
    expected = compiled({"w": jnp.asarray(w)}, x)
    got = loaded({"w": jnp.asarray(w)}, x)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(expected[1]))
    np.testing.assert_array_equal(np.asarray(got[0]["w"]), np.asarray(expected[0]["w"]))
    # The loaded program checks its arguments like the compiled one: another shape is refused.
    with pytest.raises((TypeError, ValueError)):
        loaded({"w": jnp.ones((4, 4))}, jnp.ones((3, 4)))


def test_a_damaged_entry_is_ignored_not_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ExecutableCache(tmp_path)
    key = program_key("toy", "config-b")
    cache.store(key, _compiled())
    path = tmp_path / f"{key}.jaxexe"
    path.write_bytes(path.read_bytes()[:1000])  # a write cut short
    with caplog.at_level("WARNING", logger="pd_train"):
        assert cache.load(key) is None
    assert "ignoring" in caplog.text and path.name in caplog.text


def test_the_cache_keeps_its_most_recently_used_entries(tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path, max_entries=2)
    compiled = _compiled()
    keys = [program_key("toy", i) for i in range(3)]
    cache.store(keys[0], compiled)
    cache.store(keys[1], compiled)
    for i, key in enumerate(keys[:2]):  # distinct, ordered use times on coarse clocks
        os.utime(tmp_path / f"{key}.jaxexe", (1000 + i, 1000 + i))
    assert cache.load(keys[0]) is not None  # used now: the newest
    cache.store(keys[2], compiled)
    assert sorted(p.stem for p in tmp_path.glob("*.jaxexe")) == sorted([keys[0], keys[2]])


def test_program_key_follows_inputs_and_source() -> None:
    source = source_digest()
    key = program_key("train_step", "pd-config", 64, source=source)
    assert key == program_key("train_step", "pd-config", 64, source=source)
    assert key == program_key("train_step", "pd-config", 64)  # the source read now: the same
    assert key != program_key("train_step", "pd-config", 65, source=source)
    assert key != program_key("eval", "pd-config", 64, source=source)
    assert key != program_key("train_step", "pd-config", 64, source="edited")


def test_a_run_imports_no_orbax_or_matplotlib_before_its_first_step() -> None:
    """Everything `pd-train run` imports up to step 0 (checkpoints are written after it, plots
    at the end): orbax costs about a second to import, matplotlib more."""
    code = (
        "import sys\n"
        "import pd_train.cli, pd_train.run, pd_train.train, pd_train.evaluate, pd_train.flops\n"
        "import pd_train.run.data, pd_train.outputs, pd_probe\n"
        "from pd_train.run.checkpoints import Checkpoints\n"
        "Checkpoints(sys.argv[1])\n"
        "print(sorted(m for m in ('orbax', 'orbax.checkpoint', 'matplotlib', 'pandas')"
        " if m in sys.modules))\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code, "/nonexistent/ckpt"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_program_from_the_persistent_cache_is_used_but_not_stored(tmp_path: Path) -> None:
    """XLA:CPU does not serialize a deserialized executable completely (its reload failed at
    the first call: ``NOT_FOUND: Function add_convert_fusion not found``), so only a program
    compiled in this process enters the executable cache."""
    from jax._src import compilation_cache

    from pd_train.process_env import configure_compile_cache

    def lowered() -> jax.stages.Lowered:
        def f(x: jax.Array) -> jax.Array:  # a program no other test compiles
            return jnp.sin(x) * 3.25 + jnp.cos(x).sum()

        return jax.jit(f).lower(jax.ShapeDtypeStruct((5, 3), jnp.float32))

    enabled = jax.config.jax_enable_compilation_cache
    directory = jax.config.jax_compilation_cache_dir
    configure_compile_cache(tmp_path / "persistent")
    try:
        fresh = ExecutableCache(tmp_path / "fresh")
        _, stored = fresh.compile_and_store("k", lowered())
        assert stored and fresh.load("k") is not None
        jax.clear_caches()  # the next compile reads the persistent cache
        served = ExecutableCache(tmp_path / "served")
        compiled, stored = served.compile_and_store("k", lowered())
        assert not stored and not list((tmp_path / "served").glob("*"))
        x = jnp.ones((5, 3))
        np.testing.assert_allclose(compiled(x), jnp.sin(x) * 3.25 + jnp.cos(x).sum(), rtol=1e-6)
        # A source edited during the compile: nothing stored either.
        _, stored = ExecutableCache(tmp_path / "edited").compile_and_store(
            "k", lowered(), unchanged=lambda: False
        )
        assert not stored
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        jax.config.update("jax_compilation_cache_dir", directory)
        compilation_cache.reset_cache()


def test_a_shipped_config_is_told_from_a_toy_without_importing_the_toys() -> None:
    """`pd-train run builtin:default` used to import the toy module (and with it scipy, ~1.5 s)
    just to learn that `default` is not a toy."""
    code = (
        "import sys\n"
        "from pd_train.cli import is_toy_config\n"
        "assert not is_toy_config('builtin:default')\n"
        "print(sorted(m for m in ('scipy', 'pd_train.targets.toys') if m in sys.modules))\n"
        "assert is_toy_config('builtin:tms_5_2')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_no_toy_is_named_like_a_shipped_config() -> None:
    """The shortcut above answers a shipped config's name first: a toy of the same name would
    stop being reachable as `builtin:<name>`."""
    from pd_train.configs import builtin_configs
    from pd_train.targets.toys import TOYS

    assert builtin_configs() and TOYS
    assert not set(builtin_configs()) & set(TOYS)


def test_pd_train_run_relaunches_with_huge_page_malloc() -> None:
    """`pd-train run` re-executes itself once with glibc's huge-page malloc tunable (the train
    step's per-step buffers otherwise fault in ~96,000 fresh 4 KiB pages each step), keeping
    other tunables, never twice, and not when opted out."""
    from pd_train.cli import HUGEPAGE_TUNABLE, hugepage_environment

    if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc 2."):
        pytest.skip("not glibc")
    env = hugepage_environment({"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    if env is None:
        pytest.skip("glibc older than 2.35")
    assert env == {
        "PATH": "/bin",
        "GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{HUGEPAGE_TUNABLE}",
    }
    assert hugepage_environment({})["GLIBC_TUNABLES"] == HUGEPAGE_TUNABLE  # type: ignore[index]
    assert hugepage_environment(env) is None  # the relaunched process does not relaunch
    assert hugepage_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert hugepage_environment({"PD_TRAIN_HUGEPAGES": "0"}) is None
    with pytest.raises(ValueError, match=r"PD_TRAIN_HUGEPAGES: got 'no'; must be 0 \(off\) or 1"):
        hugepage_environment({"PD_TRAIN_HUGEPAGES": "no"})  # never read as on or off
    # The relaunched process itself: same arguments, the tunable in its environment.
    code = (
        "import os, sys\n"
        "sys.argv = ['pd-train', 'run', '--help']\n"
        "if 'hugetlb' in os.environ.get('GLIBC_TUNABLES', ''):\n"
        "    print('relaunched', sys.orig_argv[-2:]); sys.exit(0)\n"
        "from pd_train import cli\n"
        "cli.main()\n"
    )
    clean = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", code, "run", "--help"], capture_output=True, text=True, env=clean
    )
    assert "relaunched" in out.stdout, out.stdout + out.stderr


def test_a_warm_launch_loads_the_init_programs_from_the_executable_cache(tmp_path: Path) -> None:
    """The jits a fresh run calls before step 0 (params, optimizer state, persistent-PGD sources
    and their state, the warm-up's init and step) are stored by the first launch and loaded,
    untraced, by the next; the state and warm-up losses equal the plain jits' bit for bit."""
    from pd_train.run import StepProgram
    from pd_train.train import Trainer

    from ._pgd import FAST, TINY, T, _pd, _target

    init_names = {"stacked", "_opt_init", "init_opt_state", "init", "_warmup"}

    def launch(cache_dir: Path | None) -> tuple[dict[str, str], list[str], list[Any]]:
        """A new trainer (no jit has run): its init state and 2 warm-up steps."""
        trainer = Trainer(TINY, _pd(), compiler_options=FAST, seq_len=T)
        program = StepProgram(trainer, target_dtype=jnp.float32, recorder=None, cache_dir=cache_dir)
        trainer.programs = program.init_programs()
        traced: list[str] = []

        def on_trace(event: str, _: float, **kwargs: Any) -> None:
            if event == "/jax/core/compile/jaxpr_trace_duration":
                traced.append(str(kwargs.get("fun_name")))

        jax.monitoring.register_event_duration_secs_listener(on_trace)
        try:
            state = trainer.init_state(key=jax.random.key(5))
            state, losses = trainer.faithfulness_warmup(state, _target(), steps=2)
        finally:
            jax.monitoring.unregister_event_duration_listener(on_trace)
        return program.init_outcomes, traced, [*jax.tree.leaves(state), *losses]

    names = ["init_params", "opt_init", "init_sources", "init_sources_opt"]
    names += ["warmup_init", "warmup_step"]
    # An earlier in-process run may have left JAX's persistent cache on: the plain launch
    # would fill it and the next launch's programs would come from it ("miss, not stored").
    from jax._src import compilation_cache

    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        outcomes, _, plain = launch(None)
        assert outcomes == {}  # without an executable cache each jit is only labelled
        outcomes, traced, first = launch(tmp_path)
        assert outcomes == dict.fromkeys(names, "miss")
        assert init_names & set(traced), traced  # the first launch traced them
        stored = list((tmp_path / "executables").glob("*.jaxexe"))
        # One payload per program, each under its source key and its lowered key.
        assert len({p.stat().st_ino for p in stored}) == len(names)
        assert len(stored) == 2 * len(names)
        outcomes, traced, warm = launch(tmp_path)
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()
    assert outcomes == dict.fromkeys(names, "hit")
    assert not init_names & set(traced), traced
    assert len(plain) == len(first) == len(warm) > 10
    for a, b, c in zip(plain, first, warm, strict=True):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
        np.testing.assert_array_equal(np.asarray(c), np.asarray(a))


def test_the_step_starts_loading_before_the_run_attaches_its_recorder(tmp_path: Path) -> None:
    """`pd-train run` starts the step's thread in start_runtime, before the run dir and its
    compile recorder exist: a cached program loads at once, with no recorder; a program that
    must compile waits (untraced) for `attach`, and `cancel` ends that wait."""
    from pd_train.run import StepProgram
    from pd_train.train import Trainer

    from ._pgd import FAST, TINY, T, _pd

    trainer = Trainer(TINY, _pd(), compiler_options=FAST, seq_len=T)
    # A miss: the thread waits for the recorder, tracing nothing meanwhile.
    traced: list[str] = []

    def on_trace(event: str, _: float, **kwargs: Any) -> None:
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traced.append(str(kwargs.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(on_trace)
    try:
        waiting = StepProgram(trainer, target_dtype=jnp.float32, recorder=None, cache_dir=tmp_path)
        waiting.start()
        waiting._thread.join(timeout=1.0)
        assert waiting._thread.is_alive()
        waiting.cancel()
        waiting._thread.join(timeout=10)
    finally:
        jax.monitoring.unregister_event_duration_listener(on_trace)
    assert not waiting._thread.is_alive()
    assert waiting.compiled is None and waiting.error is None
    assert not [name for name in traced if "train_step" in name], traced

    # A hit: whatever program the cache holds under the step's key is loaded with no recorder.
    program = StepProgram(trainer, target_dtype=jnp.float32, recorder=None, cache_dir=tmp_path)
    lowered = jax.jit(lambda x: x * 2.0).lower(jax.ShapeDtypeStruct((3,), jnp.float32))
    _, stored = ExecutableCache(tmp_path / "executables").compile_and_store(program.key(), lowered)
    assert stored
    program.start()
    program._thread.join(timeout=60)
    assert program.outcome == "hit" and program.recorder is None
    assert program.load_seconds is not None and program.load_seconds > 0
    # The loaded program comes bound to the trainer's hyperparameters (called with four
    # arguments); the stored one underneath is the dummy.
    np.testing.assert_array_equal(program.compiled.compiled(jnp.ones(3)), 2.0 * np.ones(3))


def test_exit_now_skips_the_teardown_but_not_the_output(tmp_path: Path) -> None:
    """`pd-train run` ends with os._exit after its summary (the interpreter's teardown took ~1 s
    after every file was closed): buffered output and log lines still come out, the exit code
    is kept, exit hooks do not run; with a non-daemon thread still working it does not exit."""
    marker = tmp_path / "atexit-ran"
    code = (
        "import atexit, logging, sys, threading, time\n"
        "from pathlib import Path\n"
        "from pd_train import cli\n"
        f"atexit.register(lambda: Path({str(marker)!r}).write_text('x'))\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        "sys.stdout.write('summary')\n"  # buffered: a pipe, no newline
        "logging.getLogger('pd').warning('last log line')\n"
        "if sys.argv[1] == 'busy':\n"
        "    threading.Thread(target=time.sleep, args=(0.5,)).start()\n"
        "cli.exit_now(3)\n"
        "sys.exit(4)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, "idle"], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (3, "summary"), out
    assert "last log line" in out.stderr
    assert not marker.exists()
    out = subprocess.run([sys.executable, "-c", code, "busy"], capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (4, "summary"), out
    assert marker.exists()
