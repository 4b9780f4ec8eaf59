"""The executable cache's second key, the lowered program's (docs/compile-cache.md, "The warm
launch"): a source edit that leaves a program as it was changes its source key, and the
program's lowering finds the stored executable by its lowered key, loaded without a compile."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.process_env import (
    ExecutableCache,
    lowered_program_key,
    program_key,
)

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture(autouse=True)
def no_persistent_cache() -> Iterator[None]:
    """Every compile here is XLA's (another test in this process may have pointed JAX's
    persistent cache at a directory that holds these tiny programs). JAX decides once per
    process whether its cache is used: ``reset_cache`` makes the switch take effect, here and
    back."""
    from jax._src import compilation_cache

    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


class Compiles:
    """Counts XLA backend compiles while entered (JAX's monitoring event for each)."""

    def __enter__(self) -> Compiles:
        from jax import monitoring

        self.count = 0

        def on_duration(event: str, _duration: float, **_: Any) -> None:
            if event == BACKEND_COMPILE_EVENT:
                self.count += 1

        self._listener = on_duration
        monitoring.register_event_duration_secs_listener(on_duration)
        return self

    def __exit__(self, *_: Any) -> None:
        from jax._src import monitoring

        monitoring.unregister_event_duration_listener(self._listener)


def _scaled(scale: float) -> Any:
    return jax.jit(lambda x: jnp.sin(x) * scale + 1.0)


X = jnp.arange(8, dtype=jnp.float32)


def _key(source: str, name: str = "p") -> str:
    return program_key(name, "structural", source=source)


def test_a_source_edit_that_keeps_the_program_loads_it_without_a_compile(
    tmp_path: Path,
) -> None:
    cache = ExecutableCache(tmp_path)
    old, new = _key("source before"), _key("source after")
    with Compiles() as first:
        _, stored = cache.compile_and_store(old, _scaled(2.0).lower(X))
    assert stored and first.count == 1
    assert cache.load(new) is None  # the source key changed with the source

    with Compiles() as second:
        program, stored = cache.compile_and_store(new, _scaled(2.0).lower(X))
    assert second.count == 0, "loaded by the lowered key, not compiled"
    assert stored
    np.testing.assert_allclose(
        np.asarray(program(X)), np.sin(np.arange(8.0)) * 2.0 + 1.0, rtol=1e-6
    )

    # Linked under the new source key: the next launch hits without lowering.
    with Compiles() as third:
        again = cache.load(new)
    assert again is not None and third.count == 0
    np.testing.assert_allclose(np.asarray(again(X)), np.asarray(program(X)))
    # One payload, three names (two source keys, one lowered key).
    names = list(tmp_path.glob("*.jaxexe"))
    assert len(names) == 3 and len({p.stat().st_ino for p in names}) == 1


def test_obtain_names_the_outcome(tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path)
    _, outcome = cache.obtain(_key("a"), _scaled(2.0).lower(X))
    assert outcome == "miss"
    _, outcome = cache.obtain(_key("b"), _scaled(2.0).lower(X))
    assert outcome == "hit (lowered)"
    # The source changed while compiling: nothing is linked under the source key.
    _, outcome = cache.obtain(_key("c"), _scaled(2.0).lower(X), unchanged=lambda: False)
    assert outcome == "hit (lowered)"
    assert cache.load(_key("c")) is None


def test_a_changed_program_under_a_new_source_key_still_compiles(tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path)
    cache.obtain(_key("a"), _scaled(2.0).lower(X))
    changed = _scaled(3.0).lower(X)
    assert lowered_program_key(changed) != lowered_program_key(_scaled(2.0).lower(X))
    with Compiles() as compiles:
        program, outcome = cache.obtain(_key("b"), changed)
    assert outcome == "miss" and compiles.count == 1
    np.testing.assert_allclose(
        np.asarray(program(X)), np.sin(np.arange(8.0)) * 3.0 + 1.0, rtol=1e-6
    )
    loaded = cache.load(_key("b"))
    assert loaded is not None
    np.testing.assert_allclose(np.asarray(loaded(X)), np.asarray(program(X)))


def test_arguments_of_another_shape_or_tree_are_another_program() -> None:
    f = _scaled(2.0)
    base = lowered_program_key(f.lower(X))
    assert base is not None
    assert lowered_program_key(f.lower(jnp.ones(9, jnp.float32))) != base
    g = jax.jit(lambda tree: jnp.sin(jax.tree.leaves(tree)[0]) * 2.0 + 1.0)
    assert lowered_program_key(g.lower({"x": X})) != lowered_program_key(g.lower({"y": X}))
    assert lowered_program_key(_scaled(2.0).lower(X)) == base  # a fresh jit, the same program


def test_pruning_removes_a_payload_with_every_name_linked_to_it(tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path, max_entries=2)
    cache.obtain(_key("a"), _scaled(1.0).lower(X))
    cache.obtain(_key("b"), _scaled(1.0).lower(X))  # linked: still one payload
    oldest = {p.name for p in tmp_path.glob("*.jaxexe")}
    assert len(oldest) == 3
    os.utime(tmp_path / f"{_key('a')}.jaxexe", (1000, 1000))  # every name of the inode
    cache.obtain(_key("a", "q"), _scaled(2.0).lower(X))
    os.utime(tmp_path / f"{_key('a', 'q')}.jaxexe", (2000, 2000))
    assert len(list(tmp_path.glob("*.jaxexe"))) == 5  # two payloads: nothing pruned yet
    cache.obtain(_key("a", "r"), _scaled(3.0).lower(X))
    left = {p.name for p in tmp_path.glob("*.jaxexe")}
    assert not left & oldest, "the oldest payload went with its three names"
    assert len(left) == 4 and len({(tmp_path / n).stat().st_ino for n in left}) == 2
    assert cache.load(_key("a", "q")) is not None and cache.load(_key("a", "r")) is not None


def test_a_damaged_lowered_entry_is_ignored_and_replaced(tmp_path: Path) -> None:
    cache = ExecutableCache(tmp_path)
    lowered = _scaled(2.0).lower(X)
    second = lowered_program_key(lowered)
    assert second is not None
    (tmp_path / f"{second}.jaxexe").write_bytes(b"truncated")
    with Compiles() as compiles:
        _, outcome = cache.obtain(_key("a"), lowered)
    assert outcome == "miss" and compiles.count == 1
    _, outcome = cache.obtain(_key("b"), _scaled(2.0).lower(X))
    assert outcome == "hit (lowered)"
