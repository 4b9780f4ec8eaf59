"""Process-level runtime setup: the persistent compile cache, HLO dumps, traces and logging.

Order matters. XLA reads ``XLA_FLAGS`` once, when the backend initializes, so the launch
environment (and an HLO dump directory) is applied before anything touches a device; the
compile cache is configured before the first compile.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from pd_train._cache_files import EXECUTABLES_DIR as EXECUTABLES_DIR  # re-exported
from pd_train._cache_files import HINT_SUFFIX

log = logging.getLogger("pd_train")

# The step's jit is named after its Python function; the dump filter keeps only its modules.
STEP_MODULE_REGEX = r".*train_step.*"

REFUSED_XLA_CACHES = {
    "all": (
        "jax_persistent_cache_enable_xla_caches='all' also turns on XLA's GPU kernel cache, "
        "which crashed at run time on GPU in the original system (CUDA_ERROR_NOT_FOUND: named "
        "symbol not found); leave it unset (JAX enables the per-fusion autotune cache with the "
        "persistent cache) or name caches explicitly, e.g. 'xla_gpu_per_fusion_autotune_cache_dir'"
    ),
}


class RuntimeSetupError(RuntimeError):
    pass


def _backend_initialized() -> bool:
    from jax._src import xla_bridge

    return bool(xla_bridge._backends)


def apply_launch_env(
    env: Mapping[str, str],
    *,
    hlo_dump_dir: Path | None = None,
    module_regex: str = STEP_MODULE_REGEX,
) -> dict[str, str]:
    """Set ``env`` (and HLO dump flags) in ``os.environ`` before the backend initializes.

    ``XLA_FLAGS`` from ``env`` is appended to the current value rather than replacing it, so
    simulated-device flags survive. Returns what was set.
    """
    updates = dict(env)
    flags = [f for f in (os.environ.get("XLA_FLAGS", ""), updates.pop("XLA_FLAGS", "")) if f]
    if hlo_dump_dir is not None:
        flags += [
            f"--xla_dump_to={hlo_dump_dir}",
            f"--xla_dump_hlo_module_re={module_regex}",
            "--xla_dump_hlo_as_text",
        ]
    if flags:
        updates["XLA_FLAGS"] = " ".join(flags)
    if not updates:
        return {}
    changes_xla = "XLA_FLAGS" in updates and updates["XLA_FLAGS"] != os.environ.get("XLA_FLAGS")
    if changes_xla and _backend_initialized():
        msg = (
            "XLA_FLAGS must be set before the JAX backend initializes, but a device was already "
            "used in this process; apply the launch environment first"
        )
        raise RuntimeSetupError(msg)
    os.environ.update(updates)
    return updates


def configure_compile_cache(
    cache_dir: Path | None,
    *,
    min_compile_time_s: float = 0.0,
    xla_caches: str | None = None,
) -> None:
    """Turn the persistent compilation cache on in ``cache_dir`` (off when ``None``).

    JAX itself writes entries only from process 0 and enables the per-fusion autotune cache
    alongside (on GPU). ``min_compile_time_s`` low keeps the init and step compiles.
    """
    if xla_caches in REFUSED_XLA_CACHES:
        raise RuntimeSetupError(REFUSED_XLA_CACHES[xla_caches])
    # JAX decides once per process whether its cache is used, and with which directory:
    # reset_cache makes a change take effect in a process that compiled before (both ways).
    from jax._src import compilation_cache

    if cache_dir is None:
        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()
        return
    cache_dir = Path(cache_dir).absolute()
    cache_dir.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if xla_caches is not None:
        jax.config.update("jax_persistent_cache_enable_xla_caches", xla_caches)
    compilation_cache.reset_cache()


#: The first item of an entry's first pickle (the executable; its trees are a second pickle).
#: An entry without it (stored before) is one pickle, trees first; both load.
ENTRY_FORMAT = "pd-executable/2"

#: Beside an entry ``KEY.jaxexe``: ``KEY.programs.json``, the programs loaded with it
#: (:meth:`ExecutableCache.companions`).
COMPANIONS_SUFFIX = ".programs.json"

#: The packages whose Python source is traced into pd's programs: any change to a file of
#: theirs changes every executable-cache key.
TRACED_PACKAGES = ("pd_train", "pd_sharding", "pd_init")

#: Installed distributions whose versions enter every executable-cache key.
KEYED_DISTRIBUTIONS = ("jax", "jaxlib", "optax", "numpy", "ml_dtypes")


def _source_digest(packages: tuple[str, ...]) -> str:
    """sha256 over the path and bytes of every ``.py`` file of ``packages`` (a few ms; found
    without importing them: ``pd-train run``'s preload reads it before pd's imports)."""
    import hashlib
    import importlib.util

    digest = hashlib.sha256()
    for name in packages:
        spec = importlib.util.find_spec(name)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if spec is None or len(locations) != 1:
            msg = f"{name}: not a package in one directory (found {spec})"
            raise ImportError(msg)
        root = Path(locations[0])
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def source_digest() -> str:
    """sha256 of the source of :data:`TRACED_PACKAGES` as it is on disk now."""
    return _source_digest(TRACED_PACKAGES)


#: JAX options that say where and when programs are cached, or what is logged about compiles,
#: not what they compute (``runtime.compile_cache.*`` is *outside* the programs,
#: :mod:`pd_train.config.hyperparameters`): left out of :func:`program_key`, so that the same
#: program keeps its key whatever the cache's directory or thresholds, and a launch with
#: ``JAX_LOG_COMPILES=1`` loads the programs the others stored.
UNKEYED_JAX_OPTIONS = frozenset(
    {
        "jax_enable_compilation_cache",
        "jax_compilation_cache_dir",
        "jax_compilation_cache_max_size",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
        "jax_persistent_cache_enable_xla_caches",
        "jax_explain_cache_misses",
        "jax_log_compiles",
    }
)


def program_key(name: str, *parts: Any, source: str | None = None) -> str:
    """A hex key for the program ``name`` built from ``parts`` (reprs of its static inputs:
    configs, abstract arguments) in this environment: the traced packages' source
    (``source``, a :func:`source_digest`; read now if None) and :func:`_environment`. Equal
    keys mean the same traced program on the same backend."""
    import hashlib

    context = [
        name,
        source_digest() if source is None else source,
        _environment(),
        [repr(p) for p in parts],
    ]
    return hashlib.sha256(repr(context).encode()).hexdigest()


def _environment() -> list[Any]:
    """What every executable-cache key holds of the environment: Python, the versions of jax
    and the libraries it traces (:data:`KEYED_DISTRIBUTIONS`), the backend and its devices,
    ``XLA_FLAGS`` and JAX's configuration (but for the compile cache's own options,
    :data:`UNKEYED_JAX_OPTIONS`)."""
    import sys

    versions = list(keyed_versions())
    devices = jax.devices()
    config = sorted(
        (k, repr(v))
        for k, v in jax.config.values.items()
        if isinstance(v, str | int | float | bool | type(None)) and k not in UNKEYED_JAX_OPTIONS
    )
    return [
        sys.version,
        versions,
        devices[0].client.platform,
        devices[0].client.platform_version,
        [(d.id, d.device_kind, d.process_index) for d in devices],
        jax.process_count(),
        os.environ.get("XLA_FLAGS", ""),
        config,
    ]


@functools.cache
def keyed_versions() -> tuple[str, ...]:
    """``dist==version`` of each of :data:`KEYED_DISTRIBUTIONS` (read once per process: each
    read scans the installed distributions' metadata)."""
    import importlib.metadata

    versions = []
    for dist in KEYED_DISTRIBUTIONS:
        try:
            versions.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist} absent")
    return tuple(versions)


def lowered_program_key(lowered: Any) -> str | None:
    """A hex key for the program ``lowered`` (a ``jax.stages.Lowered``, or an object that
    passes its attributes through) is, whatever source traced it: its StableHLO text (without
    locations), its argument and result trees, what its compile adds (compiler options, device
    assignment, donations, platforms, hoisted constants) and :func:`_environment`. None when the
    lowering is not one this understands (its compile inputs are JAX internals): the program
    then has no second key."""
    import hashlib

    import numpy as np

    try:
        lowering = lowered._lowering
        digest = hashlib.sha256(lowered.as_text().encode())
        for const in lowering.const_args:
            array = np.asarray(const)
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(array.tobytes())
        context = [
            "lowered",
            digest.hexdigest(),
            repr(lowered.in_tree),
            repr(lowered.out_tree),
            repr(lowering._compiler_options_kvs),
            [d.id for d in lowering._device_list],
            repr(lowering._donated_invars),
            repr(lowering._platforms),
            _environment(),
        ]
    except Exception as exc:  # another JAX's internals: no second key
        log.debug("executable cache: no lowered key (%s: %s)", type(exc).__name__, exc)
        return None
    return hashlib.sha256(repr(context).encode()).hexdigest()


#: JAX's monitoring event for a program served by the persistent compile cache.
PERSISTENT_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def compile_counting_persistent_hits(lowered: Any) -> tuple[Any, int]:
    """``lowered.compile()`` and how many programs JAX's persistent cache served for it (the
    hits this thread recorded while compiling; other threads' compiles are not counted)."""
    import threading

    from jax import monitoring

    thread = threading.get_ident()
    hits = 0

    def on_event(event: str, **_: Any) -> None:
        nonlocal hits
        if event == PERSISTENT_CACHE_HIT_EVENT and threading.get_ident() == thread:
            hits += 1

    monitoring.register_event_listener(on_event)
    try:
        compiled = lowered.compile()
    finally:
        monitoring.unregister_event_listener(on_event)
    return compiled, hits


class ProgramOrJit:
    """A compiled program called like its jit; if it refuses the arguments (a layout that
    drifted from the one it was built for) the jit runs instead, with a warning."""

    def __init__(self, name: str, compiled: Any, jit: Any) -> None:
        self.name, self.compiled, self.jit = name, compiled, jit

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except (TypeError, ValueError) as exc:
                log.warning("%s: the compiled program refused the arguments: %s", self.name, exc)
                self.compiled = None
        return self.jit(*args, **kwargs)


class _Loading:
    """An entry whose executable XLA has deserialized (``parts``: the unpickled executable, its
    flat argument infos, ``no_kwargs``) and whose trees (``rest``, a pickle) are still to be read
    (:meth:`ExecutableCache.finish`); ``parts`` None: an entry of the older format, ``rest``
    all of it."""

    def __init__(self, path: Path, rest: bytes, parts: Any) -> None:
        self.path, self.rest, self.parts = path, rest, parts


class ExecutableCache:
    """Compiled programs serialized to ``directory``, one file per :func:`program_key`.

    JAX's persistent cache keys a program by its lowered module, so even a hit traces and
    lowers it first (seconds for the train step); this cache keys it by what it was traced
    from, so a hit only loads the executable. Each entry is also linked under its lowered
    program's key (:func:`lowered_program_key`): after a source edit that leaves a program as
    it was, its lowering finds the entry there (:meth:`obtain`). For one process only (a multi-process program
    is compiled by every process together): :meth:`usable` says whether it applies. Loading
    runs code from the file (as JAX's own cache does): keep the directory private.
    """

    def __init__(self, directory: Path, *, max_entries: int = 16) -> None:
        if max_entries < 1:
            msg = f"max_entries must be >= 1, got {max_entries}"
            raise ValueError(msg)
        self.directory = Path(directory)
        #: Entries kept: storing one more removes the least recently used (each code edit
        #: keys new programs, and an entry is ~10 MB even for the tiny default).
        self.max_entries = max_entries

    @staticmethod
    def usable() -> bool:
        """Whether this process may use the cache: a single-process run."""
        return jax.process_count() == 1

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.jaxexe"

    def _companions_path(self, key: str) -> Path:
        return self.directory / f"{key}{COMPANIONS_SUFFIX}"

    def holds(self, key: str) -> bool:
        """Whether an entry is stored under ``key``."""
        return self._path(key).is_file()

    def companions(self, key: str) -> list[tuple[str, str]]:
        """The ``(name, key)`` pairs :meth:`set_companions` listed beside ``key``'s entry (the
        programs a launch that loaded it asked for next); [] when none are listed or the list
        is unreadable."""
        import json

        try:
            pairs = json.loads(self._companions_path(key).read_text())
            return [(str(name), str(other)) for name, other in pairs]
        except (OSError, ValueError, TypeError) as exc:
            if not isinstance(exc, FileNotFoundError):
                log.debug("executable cache: ignoring the companions of %s (%s)", key[:12], exc)
            return []

    def set_companions(self, key: str, pairs: list[tuple[str, str]]) -> None:
        """List ``pairs`` (``(name, key)``) beside ``key``'s entry (atomically; also before the
        entry is stored, as a cold launch's step still compiling); removed with it by
        :meth:`prune`. Only a hint: a launch still loads each program by its own key."""
        import json

        path = self._companions_path(key)
        tmp = self._tmp(path)
        try:
            tmp.write_text(json.dumps([list(pair) for pair in pairs]))
            os.replace(tmp, path)
        except OSError as exc:  # a full disk: the next launch loads them one by one
            tmp.unlink(missing_ok=True)
            log.debug("executable cache: not listing the companions of %s (%s)", key[:12], exc)

    def load(self, key: str) -> Any:
        """The ``jax.stages.Compiled`` stored under ``key``, or None (absent or unreadable:
        a damaged file is logged and ignored, and the program compiles again)."""
        loading = self.load_executable(key)
        return None if loading is None else self.finish(loading)

    def load_executable(self, key: str) -> Any:
        """XLA's part of :meth:`load` (the executable deserialized, the GIL released), without
        unpickling the argument and result trees: that imports their node types (pd's state,
        optax's), which must not happen in a thread while the main thread may be importing
        the same packages (Python then hands one of them a partly initialized module).
        :meth:`finish` completes it; None when absent or unreadable."""
        import io
        import pickle

        from jax.experimental import serialize_executable

        path = self._path(key)
        if not path.is_file():
            return None
        try:
            os.utime(path)  # recently used: kept when older entries are pruned
            data = path.read_bytes()
            with io.BytesIO(data) as file:
                head = pickle.load(file)
                if not (isinstance(head, tuple) and head[:1] == (ENTRY_FORMAT,)):
                    return _Loading(path, data, None)  # stored before: trees first
                _, device_ids, payload = head
                by_id = {d.id: d for d in jax.devices()}
                devices = [by_id[i] for i in device_ids]
                parts = serialize_executable._JaxPjrtUnpickler(
                    io.BytesIO(payload), devices[0].client, devices
                ).load()
                return _Loading(path, data[file.tell() :], parts)
        except Exception as exc:  # a truncated or foreign file: compile instead
            log.warning("executable cache: ignoring %s (%s: %s)", path, type(exc).__name__, exc)
            return None

    @staticmethod
    def finish(loading: Any) -> Any:
        """The ``jax.stages.Compiled`` of a :meth:`load_executable`, or None (logged)."""
        import pickle

        from jax.experimental import serialize_executable

        try:
            if loading.parts is None:  # one pickle, trees first (entries stored before)
                device_ids, (payload, in_tree, out_tree) = pickle.loads(loading.rest)
                by_id = {d.id: d for d in jax.devices()}
                return serialize_executable.deserialize_and_load(
                    payload, in_tree, out_tree, execution_devices=[by_id[i] for i in device_ids]
                )
            unloaded, args_info_flat, no_kwargs = loading.parts
            in_tree, out_tree = pickle.loads(loading.rest)
            args_info = in_tree.unflatten(args_info_flat)
            return jax.stages.Compiled(
                unloaded.load(), [], args_info, out_tree, no_kwargs=no_kwargs
            )
        except Exception as exc:  # a truncated or foreign file: compile instead
            path, kind = loading.path, type(exc).__name__
            log.warning("executable cache: ignoring %s (%s: %s)", path, kind, exc)
            return None

    def compile_and_store(
        self, key: str, lowered: Any, *, unchanged: Any = None
    ) -> tuple[Any, bool]:
        """``(program, stored)``: :meth:`obtain`, with ``stored`` True when the program is now
        under ``key`` (compiled here and stored, or found under its lowered key)."""
        compiled, outcome = self.obtain(key, lowered, unchanged=unchanged)
        return compiled, outcome != "miss, not stored"

    def obtain(self, key: str, lowered: Any, *, unchanged: Any = None) -> tuple[Any, str]:
        """``(program, outcome)`` for a ``key`` that missed, its program ``lowered``.

        Each stored program is also reachable by its :func:`lowered_program_key` (a hard link:
        no bytes twice), so a source edit that leaves the program as it was finds it there:
        ``hit (lowered)``, loaded without a compile and linked under ``key`` for the next launch.
        Else ``lowered.compile()``: ``miss`` when it was compiled here and stored under both
        keys; ``miss, not stored`` when JAX's persistent cache served it (on XLA:CPU an
        executable that was deserialized does not serialize again completely: its reload fails
        at the first call with ``NOT_FOUND: Function <fusion> not found``), it does not
        serialize, or ``unchanged()`` (optional, asked after the compile) is False: the traced
        source changed meanwhile."""
        second = lowered_program_key(lowered)
        if second is not None and (found := self.load(second)) is not None:
            if unchanged is None or unchanged():
                self.link(second, key)
            return found, "hit (lowered)"
        compiled, hits = compile_counting_persistent_hits(lowered)
        stored = hits == 0 and (unchanged is None or unchanged()) and self.store(key, compiled)
        if stored and second is not None:
            self.link(key, second)
        return compiled, "miss" if stored else "miss, not stored"

    def link(self, key: str, new_key: str) -> bool:
        """Make the entry under ``key`` reachable under ``new_key`` too (atomically replacing
        what was there); False (logged) where the file system has no hard links."""
        tmp = self._tmp(self._path(new_key))
        try:
            os.link(self._path(key), tmp)
            os.replace(tmp, self._path(new_key))
        except OSError as exc:  # pruned meanwhile, or no hard links: the program stays loaded
            tmp.unlink(missing_ok=True)
            log.debug("executable cache: not linking %s (%s)", new_key[:12], exc)
            return False
        return True

    @staticmethod
    def _tmp(path: Path) -> Path:
        """A temporary name beside ``path`` that no other process or thread writes."""
        import threading

        return path.with_suffix(f".tmp{os.getpid()}-{threading.get_ident()}")

    def store(self, key: str, compiled: Any) -> bool:
        """Write ``compiled`` under ``key`` (atomically); False if it cannot be serialized.
        ``compiled`` must come from a compile, not from a cache (see :meth:`obtain`)."""
        import pickle

        from jax.experimental import serialize_executable

        try:
            # The program's devices in its own order: its arguments' device assignment, or its
            # results' when it keeps no argument (an init that reads only shapes).
            shardings = jax.tree.leaves(compiled.input_shardings) or jax.tree.leaves(
                compiled.output_shardings
            )
            devices = shardings[0]._device_assignment if shardings else jax.devices()
            serialized, in_tree, out_tree = serialize_executable.serialize(compiled)
            # Two pickles: the executable, then its trees (see load).
            payload = pickle.dumps((ENTRY_FORMAT, [d.id for d in devices], serialized))
            payload += pickle.dumps((in_tree, out_tree))
        except Exception as exc:  # an executable that does not serialize: keep it in memory
            log.warning("executable cache: not storing %s (%s)", key[:12], exc)
            return False
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(key)
        tmp = self._tmp(path)
        tmp.write_bytes(payload)
        os.replace(tmp, path)
        self.prune()
        return True

    def prune(self) -> None:
        """Keep the :attr:`max_entries` most recently used payloads: an older one goes with
        every name linked to it (its source keys and its lowered key)."""
        payloads: dict[tuple[int, int], tuple[float, list[Path]]] = {}
        for path in self.directory.glob("*.jaxexe"):
            try:
                stat = path.stat()
            except FileNotFoundError:  # removed by another process meanwhile
                continue
            inode = (stat.st_dev, stat.st_ino)
            payloads.setdefault(inode, (stat.st_mtime, []))[1].append(path)
        by_age = sorted(payloads.values(), key=lambda entry: entry[0])
        for _, names in by_age[: max(len(by_age) - self.max_entries, 0)]:
            for name in names:
                name.unlink(missing_ok=True)
                self._companions_path(name.stem).unlink(missing_ok=True)
        # Lists whose entry was never stored (a step that failed to compile), after a while.
        for path in self.directory.glob(f"*{COMPANIONS_SUFFIX}"):
            entry = self._path(path.name.removesuffix(COMPANIONS_SUFFIX))
            with contextlib.suppress(FileNotFoundError):
                if not entry.exists() and time.time() - path.stat().st_mtime > 3600:
                    path.unlink()
        # Launch hints (pd_train._preload) that name an entry no longer stored.
        for path in self.directory.glob(f"*{HINT_SUFFIX}"):
            try:
                step = json.loads(path.read_text()).get("step")
            except (OSError, ValueError, AttributeError):
                step = None
            if not isinstance(step, str) or not self._path(step).exists():
                path.unlink(missing_ok=True)


class ProgramPrefetch:
    """Programs loaded from an executable cache in a thread, in the order given; :meth:`take`
    hands each over once."""

    def __init__(self, cache: Any, keys: list[str]) -> None:
        self._cache = cache
        self._lock = threading.Lock()
        self._pending = list(dict.fromkeys(keys))  # not started yet
        self._loaded: dict[str, Any] = {}
        self._events = {key: threading.Event() for key in self._pending}
        self._thread = threading.Thread(
            target=self._run, name="pd-train-init-programs", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._pending:
                    return
                key = self._pending.pop(0)
            try:
                self._loaded[key] = self._cache.load_executable(key)
            finally:
                self._events[key].set()

    def take(self, key: str) -> Any:
        """The program loaded under ``key`` (waiting for its load to finish), or None: not
        listed, taken already, or not started yet (the caller loads it itself, and the thread
        skips it)."""
        with self._lock:
            if key in self._pending:
                self._pending.remove(key)
                return None
            event = self._events.get(key)
        if event is None:
            return None
        event.wait()
        loading = self._loaded.pop(key, None)
        # The trees are read here, by the caller (see ExecutableCache.load_executable).
        return None if loading is None else self._cache.finish(loading)

    def wait(self) -> None:
        self._thread.join()

    def finish(self) -> None:
        """Start no more loads, wait for the one in progress (a process must not exit while
        XLA deserializes in a thread) and drop what nobody took."""
        with self._lock:
            self._pending.clear()
        self._thread.join()
        self._loaded.clear()


class TraceWindow:
    """Record a ``jax.profiler`` trace of steps ``[start, start + num_steps)`` into ``directory``."""

    def __init__(self, directory: Path, *, start: int, num_steps: int) -> None:
        self.directory = directory
        self.start = start
        self.stop = start + num_steps
        self.active = False

    def before_step(self, step: int) -> None:
        if step == self.start and not self.active and self.stop > self.start:
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory))
            self.active = True

    def after_step(self, step: int) -> None:
        if self.active and step + 1 >= self.stop:
            self.close()

    def close(self) -> None:
        if self.active:
            jax.profiler.stop_trace()
            self.active = False


def setup_logging(level: int = logging.INFO) -> None:
    """Log pd's messages to stderr without disabling other loggers.

    ``logging.config.dictConfig`` disables existing loggers by default, which would silence
    JAX's compile log (``JAX_LOG_COMPILES=1``); this only adds a handler to pd's logger.
    """
    if not any(getattr(h, "_pd_handler", False) for h in log.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s pd %(levelname)s %(message)s"))
        handler._pd_handler = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
