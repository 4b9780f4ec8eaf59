"""Python's cyclic garbage collector paused while ``pd-train run`` imports and sets up.

A launch imports ~1,100 modules and builds the config and the trainer: ~300 collections that
found almost nothing to free (a few thousand objects of ~180,000), ~0.2 CPU s of the main
thread (docs/compile-cache.md, "2 Dec 2026"). :func:`paused` turns collection off for the
set-up; :func:`resume` (``pd-train run`` calls it once the runtime has started, before any
device array exists; else at the block's end) moves every object alive then, and the set-up's
few unreachable ones, into the permanent generation (``gc.freeze``: later collections do not
scan the modules again) and turns collection back on. Imports nothing: it runs before JAX is
imported.
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
