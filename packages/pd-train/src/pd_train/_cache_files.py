"""The names of the executable cache's files inside the compile cache's directory, in a module
that imports nothing, so that :mod:`pd_train._preload` (before JAX is imported) and
:mod:`pd_train.process_env` (the cache itself) agree on them."""

__all__ = ["EXECUTABLES_DIR", "HINT_SUFFIX"]

#: pd's executable cache, inside the compile cache's directory.
EXECUTABLES_DIR = "executables"

#: A launch hint beside the cache's entries: ``HINT.hint.json`` (:func:`pd_train._preload.hint_key`).
HINT_SUFFIX = ".hint.json"
