"""The train step's executable loaded at the very start of ``pd-train run``, from a launch hint.

A warm launch's critical path was the train step's deserialization (~1 CPU s in XLA for the
default config), which could only start once the trainer existed and its key was computed
(:func:`pd_train.run.start_runtime`, ~1 s into the process). Each launch that obtains its step
from the executable cache leaves a **hint** beside the entries,
``<cache>/executables/HINT.hint.json``: HINT hashes what is known right after the arguments
are parsed (the overridden config's *structural* leaves, the cache directory, pd's source, the
Python and library versions and the ``JAX_*``/``XLA_*`` environment, :func:`hint_key`), the
file names the step's key and the backend it was loaded on. The next launch with the same
hint (a value change keeps it: values are not part of it) imports JAX, starts the backend and
starts loading that entry, and the init programs listed beside it, in threads, before pd's
own imports, the config's validation, the runtime's set-up and the warm-up
(:meth:`Preload.start`).

It is only a hint: the launch still computes the step's real key
(:class:`pd_train.run.StepProgram`), and takes the preloaded program only when the keys (and
the cache directories) are equal; otherwise the preloaded program is dropped and the step is
loaded or compiled as before (:meth:`Preload.claim`), and the hint is rewritten or removed
(:meth:`Preload.remember`). Nothing is speculated without a hint whose entry is stored and
whose backend is this one, nor in a launch that could be multi-process (the backend must not
start before ``jax.distributed``), nor when the config sets a launch environment (applied
before the backend starts), an HLO dump or no cache (``begin`` returns None).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pd_train._cache_files import EXECUTABLES_DIR, HINT_SUFFIX

log = logging.getLogger("pd_train")


#: Environment variables that change the backend or JAX's options: part of the hint.
_ENV_PREFIXES = ("JAX_", "XLA_", "CUDA_", "TPU_", "NVIDIA_", "ROCR_", "HIP_")


def cache_directory(raw: Mapping[str, Any], *, cwd: Path | None = None) -> Path | None:
    """The compile cache's directory that :func:`pd_train.run.configure_cache` will use for
    the overridden config ``raw`` (unvalidated: the defaults of
    :class:`pd_train.config.runtime.CompileCacheConfig` and ``output_dir``), or None where
    the preload does not apply: the cache off, an HLO dump (which turns it off), or a launch
    environment (``runtime.launch_env.env``, set before the backend starts)."""
    runtime = raw.get("runtime") or {}
    launch = runtime.get("launch_env") or {}
    if launch.get("env") or (launch.get("profile") or {}).get("hlo_dump"):
        return None
    cache = runtime.get("compile_cache") or {}
    if cache.get("enabled", True) is not True:
        return None
    if cache.get("dir"):
        directory = Path(cache["dir"]).expanduser()
    else:
        directory = Path(raw.get("output_dir", "runs")).expanduser() / ".compile_cache"
    if not directory.is_absolute():
        directory = (cwd or Path.cwd()) / directory
    return directory


def hint_key(raw: Mapping[str, Any], directory: Path) -> str:
    """The hint's name for the overridden config ``raw`` with its cache in ``directory``: its
    structural leaves (:func:`pd_train.config.hyperparameters.structural_leaves`; a value
    change keeps the hint), pd's source (:func:`pd_train.process_env.source_digest`), the
    Python and library versions and the ``JAX_*``/``XLA_*``/device environment variables."""
    import sys

    from pd_train.config.hyperparameters import structural_leaves
    from pd_train.process_env import keyed_versions, source_digest

    structural = json.dumps(structural_leaves(raw), sort_keys=True, default=repr)
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES))
    context = [
        "pd-train run hint 1",
        structural,
        str(Path(directory).absolute()),
        source_digest(),
        sys.version,
        list(keyed_versions()),
        env,
    ]
    return hashlib.sha256(repr(context).encode()).hexdigest()


def backend_signature() -> str:
    """The backend and devices of this process (starts the backend)."""
    import jax

    devices = jax.devices()
    client = devices[0].client
    rows = [(d.id, d.device_kind, d.process_index) for d in devices]
    return repr([client.platform, client.platform_version, jax.process_count(), rows])


class Preload:
    """One launch's hint and, when it named a stored step, the step and its init programs
    loading in threads (:meth:`start`).

    ``outcome`` (compile.json's ``train_step_preload``): ``no hint``, ``stale hint`` (its entry
    is gone or its backend differs: nothing was loaded), ``unread`` (a hint whose launch never
    asked for its step), ``used`` (the preloaded step was the launch's), ``dropped`` (the
    launch's step has another key or cache: the preloaded program was not used).
    """

    def __init__(self, key: str, directory: Path) -> None:
        self.key = key
        self.directory = Path(directory)
        self.executables = self.directory / EXECUTABLES_DIR
        #: The step key the hint named (when its entry was stored), else None.
        self.guess: str | None = None
        self.outcome = "no hint"
        #: When the step's load began and ended (``time.time()``), and its thread's CPU seconds.
        self.load_started: float | None = None
        self.load_ended: float | None = None
        self.load_cpu: float | None = None
        self._cache: Any = None
        self._compiled: Any = None
        self._thread: threading.Thread | None = None
        self._prefetch: Any = None
        self._listed: list[tuple[str, str]] = []
        self._claimed: bool | None = None

    @property
    def _hint_path(self) -> Path:
        return self.executables / f"{self.key}{HINT_SUFFIX}"

    def read(self) -> dict[str, str] | None:
        """The hint stored under :attr:`key` (``{"step": key, "backend": signature}``), or None:
        absent, damaged, or of another shape."""
        try:
            hint = json.loads(self._hint_path.read_text())
        except (OSError, ValueError) as exc:
            if not isinstance(exc, FileNotFoundError):
                log.debug("launch hint %s: ignored (%s)", self.key[:12], exc)
            return None
        if not isinstance(hint, dict) or not all(
            isinstance(hint.get(k), str) for k in ("step", "backend")
        ):
            return None
        return {"step": hint["step"], "backend": hint["backend"]}

    def start(self) -> None:
        """Read the hint; if it names a stored step for this backend, start the backend and
        load that step (and the init programs listed beside it) in threads."""
        hint = self.read()
        if hint is None:
            return
        self.outcome = "stale hint"
        if not (self.executables / f"{hint['step']}.jaxexe").is_file():
            return
        if backend_signature() != hint["backend"]:  # starts the backend
            return
        # Imported here, in the main thread: the threads below import nothing (see
        # ExecutableCache.load_executable).
        from jax.experimental import serialize_executable  # noqa: F401

        from pd_train.process_env import ExecutableCache, ProgramPrefetch

        if not ExecutableCache.usable():
            return
        self._cache = cache = ExecutableCache(self.executables)
        self.guess = hint["step"]
        self.outcome = "unread"

        def load() -> None:
            self.load_started = time.time()
            try:  # XLA's part only: the trees are read by the launch (Preload.step)
                self._compiled = cache.load_executable(hint["step"])
            finally:
                self.load_ended, self.load_cpu = time.time(), time.thread_time()

        self._thread = threading.Thread(target=load, name="pd-train-preload", daemon=True)
        self._thread.start()
        self._listed = cache.companions(hint["step"])
        if self._listed:
            self._prefetch = ProgramPrefetch(cache, [key for _, key in self._listed])

    def claim(self, step_key: str, directory: Path | None) -> bool:
        """Whether the preloaded step is the launch's (``step_key`` in the cache at
        ``directory``); decided once. Not: the preloaded programs are dropped (the step's load
        finishes in its thread, :meth:`close` waits for it)."""
        if self._claimed is None:
            same = directory is not None and Path(directory) == self.directory
            self._claimed = self.guess is not None and same and step_key == self.guess
            if self.guess is not None:
                self.outcome = "used" if self._claimed else "dropped"
            if not self._claimed and self._prefetch is not None:
                self._prefetch.finish()
                self._prefetch = None
        return self._claimed

    def step(self) -> Any:
        """The preloaded step (waiting for its load; its trees read now, in the caller's
        thread), once :meth:`claim` said it is the launch's; None when its load failed (the
        launch loads or compiles it as before)."""
        if not self._claimed or self._thread is None:
            return None
        self._thread.join()
        loading, self._compiled = self._compiled, None
        return None if loading is None else self._cache.finish(loading)

    def prefetch(self) -> tuple[Any, list[tuple[str, str]]] | None:
        """``(ProgramPrefetch, listed (name, key) pairs)`` of the claimed step's init
        programs, handed over once; None if there is none or the step was not claimed."""
        if not self._claimed or self._prefetch is None:
            return None
        prefetch, self._prefetch = self._prefetch, None
        return prefetch, self._listed

    def remember(self, step_key: str, *, held: bool) -> None:
        """After the launch obtained its step ``step_key``: name it in the hint when the cache
        ``held`` it (stored or loaded), else remove a hint that named another (never
        speculate on it again)."""
        hint = self.read()
        if held:
            wanted = {"step": step_key, "backend": backend_signature()}
            if hint != wanted:
                self._write(wanted)
        elif hint is not None:
            self._hint_path.unlink(missing_ok=True)

    def _write(self, hint: dict[str, str]) -> None:
        path = self._hint_path
        tmp = path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(hint))
            os.replace(tmp, path)
        except OSError as exc:  # a full disk: the next launch loads its step as before
            tmp.unlink(missing_ok=True)
            log.debug("launch hint %s: not written (%s)", self.key[:12], exc)

    def close(self) -> None:
        """Wait for the loads still running (a process must not exit while XLA deserializes
        in a thread) and drop what was not taken."""
        if self._thread is not None:
            self._thread.join()
            self._compiled = None
        if self._prefetch is not None:
            self._prefetch.finish()
            self._prefetch = None


def begin(source: str | Path, overrides: Sequence[str]) -> Preload | None:
    """The launch's :class:`Preload` for the config ``source`` with ``overrides`` (started:
    loading when a hint names a stored step), or None where it does not apply
    (:func:`cache_directory`; a toy's config). Raises what reading the config raises (the
    caller ignores it: :func:`pd_train.run.prepare` reports it)."""
    from pd_train.config.io import apply_overrides, read_yaml

    raw = apply_overrides(read_yaml(source), overrides)
    if "toy" in raw:
        return None
    directory = cache_directory(raw)
    if directory is None:
        return None
    preload = Preload(hint_key(raw, directory), directory)
    preload.start()
    return preload
