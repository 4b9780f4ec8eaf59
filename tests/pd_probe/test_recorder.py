"""The recorder: compile events per jit, cache hit/miss, memory analysis, peak RSS."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from pd_probe import Recorder, jit_name, peak_rss_bytes

PROGRAM = textwrap.dedent(
    """
    import sys

    import jax
    import jax.numpy as jnp

    from pd_probe import Recorder

    cache_dir, record, run = sys.argv[1], sys.argv[2], int(sys.argv[3])
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    # Write every executable to the cache, however small or fast to compile.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


    def step(w, x):
        return jnp.tanh(x @ w).sum()


    with Recorder(record, arm="probe_test", run=run) as rec:
        with rec.phase("step"):
            w = jax.ShapeDtypeStruct((16, 16), jnp.float32)
            x = jax.ShapeDtypeStruct((4, 16), jnp.float32)
            compiled = jax.jit(step).lower(w, x).compile()
        rec.memory("step", compiled)
        jax.block_until_ready(jnp.arange(3.0) * 2.0)  # eager ops, outside any phase
    """
)


def _run(tmp_path, cache_dir, run):
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    record = tmp_path / f"record-{run}.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    subprocess.run(
        [sys.executable, str(script), str(cache_dir), str(record), str(run)],
        env=env,
        check=True,
        timeout=120,
    )
    return json.loads(record.read_text())


@pytest.mark.slow
def test_first_process_misses_and_second_process_hits(tmp_path):
    cache_dir = tmp_path / "cache"
    first = _run(tmp_path, cache_dir, 1)
    step = first["jits"]["step"]
    assert step["phase"] is True
    assert step["first_compile_cache"] == "miss"
    assert step["cache_misses"] == 1 and step["cache_hits"] == 0
    assert [c["module"] for c in step["compiles"]] == ["jit(step)"]
    assert step["compiles"][0]["written"] is True
    assert step["trace_seconds"] > 0 and step["lower_seconds"] > 0 and step["compile_seconds"] > 0
    total = step["trace_seconds"] + step["lower_seconds"] + step["compile_seconds"]
    assert step["total_seconds"] == pytest.approx(total)
    assert step["wall_seconds"] >= step["total_seconds"] * 0.99
    assert step["memory"]["argument_size_in_bytes"] == (16 * 16 + 4 * 16) * 4
    assert step["memory"]["output_size_in_bytes"] == 4
    # Eager ops outside any phase are recorded under their own names, not as phases.
    others = {name: e for name, e in first["jits"].items() if name != "step"}
    assert others and not any(e["phase"] for e in others.values())
    assert first["arm"] == "probe_test" and first["run"] == 1
    assert first["cache_dir"] == str(cache_dir)
    assert first["jax"]["backend"] == "cpu"
    assert first["peak_rss_bytes"] > 10 * 2**20
    assert first["error"] is None
    assert any(cache_dir.iterdir())

    second = _run(tmp_path, cache_dir, 2)
    step2 = second["jits"]["step"]
    assert step2["first_compile_cache"] == "hit"
    assert step2["cache_hits"] == 1 and step2["cache_misses"] == 0
    assert step2["trace_seconds"] > 0  # tracing and lowering happen on a hit too


def test_in_process_phases_errors_and_listener_cleanup(tmp_path):
    import jax
    import jax.numpy as jnp
    from jax._src import monitoring

    before = (
        len(monitoring.get_event_listeners()),
        len(monitoring.get_event_duration_listeners()),
        len(monitoring.get_scalar_listeners()),
    )
    path = tmp_path / "r.json"

    def body(x):
        return jnp.cos(x) * 3.0

    with pytest.raises(RuntimeError, match="boom"), Recorder(path, arm="a") as rec:
        with rec.phase("outer"), rec.phase("inner"):
            jax.jit(body).lower(jax.ShapeDtypeStruct((8,), jnp.float32)).compile()
        with rec.phase("inner"):  # re-entering a phase adds to it
            jax.jit(lambda x: x + 1).lower(jax.ShapeDtypeStruct((8,), jnp.float32)).compile()
        rec.note(sites=7)
        raise RuntimeError("boom")
    after = (
        len(monitoring.get_event_listeners()),
        len(monitoring.get_event_duration_listeners()),
        len(monitoring.get_scalar_listeners()),
    )
    assert after == before
    record = json.loads(path.read_text())
    assert record["error"] == "RuntimeError: boom"
    assert record["notes"] == {"sites": 7}
    inner = record["jits"]["inner"]
    assert [c["module"] for c in inner["compiles"]] == ["jit(body)", "jit(<lambda>)"]
    # Nothing compiled directly in "outer": the innermost phase gets the events.
    assert record["jits"]["outer"]["compiles"] == []
    assert record["jits"]["outer"]["wall_seconds"] > 0


def test_names_and_rss():
    assert jit_name("jit(step)") == "step"
    assert jit_name("jit_step") == "step"
    assert jit_name("pjit(f)") == "f"
    assert jit_name("step") == "step"
    assert peak_rss_bytes() > 2**20


def test_on_compile_announces_each_compile_with_its_cache_outcome(tmp_path):
    """One line per compile inside a phase, begun before the backend compile with the cache's
    outcome (the miss is known before compiling), ended with the seconds; JAX's own helper
    jits are not announced; the miss hook is removed on exit."""
    import io

    import jax
    import jax.numpy as jnp
    from jax._src import compilation_cache
    from jax._src import util as jax_util

    from pd_probe import CompileAnnouncer

    saved = {
        name: jax.config.values[name]
        for name in (
            "jax_compilation_cache_dir",
            "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes",
        )
    }
    listener = jax_util.test_event_listener
    events = []
    stream = io.StringIO()

    def on_compile(event, info):
        events.append((event, info.get("cache")))
        announcer(event, info)

    announcer = CompileAnnouncer(stream)
    x = jax.ShapeDtypeStruct((8,), jnp.float32)
    try:
        compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        with Recorder(None, on_compile=on_compile) as rec:
            for _ in range(2):  # a new jit each time: no in-memory cache, the same program

                def step(v):
                    return jnp.sin(v) * 2.0

                with rec.phase("step"):
                    jax.jit(step).lower(x).compile()
            with rec.phase("step"):
                jnp.zeros(3, jnp.int32).astype(jnp.float32)  # helper jits: not announced

                def _warmup(v):  # the caller's own jit, private name and all: announced
                    return v + 2.0

                jax.jit(_warmup).lower(x).compile()
        assert jax_util.test_event_listener is listener
        compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", None)
        with Recorder(None, on_compile=announcer) as rec, rec.phase("step"):
            jax.jit(lambda v: v - 1.0).lower(x).compile()
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()
    lines = stream.getvalue().splitlines()
    assert [line.rsplit("… ", 1)[0] for line in lines] == [
        "compiling step (cache miss)",
        "compiling step (cache hit)",
        "compiling step: _warmup (cache miss)",
        "compiling step: <lambda> (no cache)",
    ], lines
    assert all(line.endswith(" s") for line in lines)
    # The outcome arrives before the compile ends: start, cache, done for each.
    once = [("start", None), ("cache", "{}"), ("done", "{}")]
    assert events == [(e, c and c.format("miss")) for e, c in once] + [
        (e, c and c.format("hit")) for e, c in once
    ] + [(e, c and c.format("miss")) for e, c in once]
