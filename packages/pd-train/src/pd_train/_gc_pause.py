"""Python's cyclic garbage collector paused while ``pd-train run`` sets up, until the runtime has started.

A launch imports ~1,100 modules and builds the config, the trainer and the programs' Python
objects: ~0.1 CPU s of the main thread went to collections that found almost nothing to free
(tests/pd_train/test_warm_launch.py; docs/compile-cache.md). :func:`paused` turns collection off
for the set-up; :func:`resume` (once the runtime has started, before any device array exists; or when the block ends) moves every object alive
then into the permanent generation (``gc.freeze``: later collections do not scan the modules
and set-up objects again) and turns collection back on. Cycles made during the set-up are
freed when collection resumes. Imports nothing: it runs before JAX is imported.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_paused = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Collection off inside the block (unless it was off already), back on at its end or at
    :func:`resume`, whichever comes first."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True
    try:
        yield
    finally:
        resume()


def resume() -> None:
    """End a :func:`paused` set-up now: freeze what is alive, collect again. A no-op when
    nothing is paused."""
    global _paused
    if _paused:
        _paused = False
        gc.freeze()
        gc.enable()
