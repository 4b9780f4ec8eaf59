"""Compile cache, HLO dumps and compile logging, each in a fresh process (XLA reads flags once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pd_train.process_env import RuntimeSetupError, configure_compile_cache

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from pd_train.process_env import apply_launch_env, configure_compile_cache, setup_logging
    args = json.loads(sys.argv[1])
    dump = Path(args["dump"]) if args["dump"] else None
    apply_launch_env({}, hlo_dump_dir=dump)
    setup_logging()
    import jax, jax.numpy as jnp
    from jax import monitoring
    events = []
    monitoring.register_event_listener(lambda name, **kw: events.append(name))
    configure_compile_cache(Path(args["cache"]) if args["cache"] else None)

    @jax.jit
    def train_step(x):
        return jnp.sin(x) @ x.T

    train_step(jnp.ones((8, 8))).block_until_ready()
    print(json.dumps({
        "hits": events.count("/jax/compilation_cache/cache_hits"),
        "misses": events.count("/jax/compilation_cache/cache_misses"),
    }))
    """
)


def _run(tmp_path: Path, *, cache: Path | None, dump: Path | None, env: dict | None = None):
    args = json.dumps({"cache": str(cache) if cache else None, "dump": str(dump) if dump else None})
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_second_process_hits_the_persistent_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, _ = _run(tmp_path, cache=cache, dump=None)
    second, _ = _run(tmp_path, cache=cache, dump=None)
    # jnp.ones and the step both compile: every module the first run wrote, the second reads.
    assert first["hits"] == 0 and first["misses"] >= 1
    assert (second["hits"], second["misses"]) == (first["misses"], 0)
    assert any(cache.iterdir())


def test_hlo_dump_writes_files_only_when_on(tmp_path: Path) -> None:
    dump = tmp_path / "hlo"
    _run(tmp_path, cache=None, dump=None)
    assert not dump.exists()
    _run(tmp_path, cache=None, dump=dump)
    names = [p.name for p in dump.iterdir()]
    assert any("train_step" in n and n.endswith(".txt") for n in names), names


def test_compile_log_is_not_silenced_by_pd_logging(tmp_path: Path) -> None:
    _, stderr = _run(tmp_path, cache=None, dump=None, env={"JAX_LOG_COMPILES": "1"})
    assert "train_step" in stderr and "Compiling" in stderr, stderr[-2000:]


def test_xla_caches_all_is_refused_with_the_reason() -> None:
    with pytest.raises(RuntimeSetupError, match="crashed at run time on GPU"):
        configure_compile_cache(Path("/nonexistent"), xla_caches="all")


SWITCH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import jax, jax.numpy as jnp
    from jax import monitoring
    from pd_train.process_env import configure_compile_cache
    events = []
    monitoring.register_event_listener(lambda name, **kw: events.append(name))
    x = jnp.ones((8, 8))

    def compile_once():
        # A fresh jit each time: only the persistent cache can serve it.
        jax.jit(lambda y: jnp.cos(y) @ y.T).lower(x).compile()

    def count(phase):
        counts = {e: events.count(e) for e in ("/jax/compilation_cache/cache_hits",
                                               "/jax/compilation_cache/cache_misses")}
        events.clear()
        return phase, counts

    configure_compile_cache(Path(sys.argv[1]) / "a")
    compile_once()
    out = [count("on (a)")]
    configure_compile_cache(None)
    compile_once()
    out.append(count("off"))
    configure_compile_cache(Path(sys.argv[1]) / "b")
    compile_once()
    out.append(count("on (b)"))
    print(json.dumps(out))
    """
)


def test_the_cache_switches_off_and_to_another_directory_within_a_process(tmp_path: Path) -> None:
    """JAX decides once per process whether its persistent cache is used and where: turning it
    off (``None``) after a compile must stop it, and another directory must be the one used."""
    proc = subprocess.run(
        [sys.executable, "-c", SWITCH_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    phases = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    hits, misses = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"
    assert phases["on (a)"][misses] == 1 and phases["on (a)"][hits] == 0
    # Off: the program that directory a holds is compiled, neither read nor written.
    assert phases["off"] == {hits: 0, misses: 0}
    assert phases["on (b)"][misses] == 1 and phases["on (b)"][hits] == 0
    assert any((tmp_path / "b").iterdir())
