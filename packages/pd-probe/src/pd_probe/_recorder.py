"""The recorder: compile events per jit inside an arm's process, written as one JSON.

JAX 0.10 reports compilation through ``jax.monitoring`` (read from jax/_src/dispatch.py,
pxla.py, pjit.py, compiler.py and compilation_cache.py):

* ``/jax/core/compile/jaxpr_trace_duration`` (duration, ``fun_name`` = the Python name, ``step``)
* ``/jax/core/compile/jaxpr_to_mlir_module_duration`` (duration, ``fun_name`` = ``jit(step)``)
* ``/jax/core/compile/backend_compile_duration`` (duration, ``fun_name`` = ``jit(step)``); it
  spans the persistent-cache lookup, so on a hit it is the load time. Each of the three is
  also sent as a scalar (the start time) when its span opens.
* ``/jax/compilation_cache/compile_requests_use_cache`` (event): this compile consulted the
  persistent cache; ``/jax/compilation_cache/cache_hits`` (event): and found it there;
  ``/jax/compilation_cache/cache_misses`` (event): a compiled executable was *written* (a miss
  that passed the min compile time / entry size thresholds). None of these carry a name: they
  fire inside the backend-compile span, which tells us which module they belong to.

Events are attributed to the innermost :meth:`Recorder.phase` open in the thread, else to the
function's own name (``jit(step)`` → ``step``).

A cache miss is known before the compile starts through JAX's ``test_event``
``compile_after_persistent_compilation_miss`` (fired right after the lookup fails); the recorder
chains itself onto that hook only when given ``on_compile``, to announce each compile as it
begins (:class:`CompileAnnouncer`: ``compiling train_step (cache miss)… 142 s``).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from pd_probe._io import write_json
from pd_probe._isolation import ENV_ARM, ENV_MODE, ENV_RECORD, ENV_RUN

SCHEMA = "pd-probe/arm-record/1"

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_USED_EVENT = "/jax/compilation_cache/compile_requests_use_cache"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_WRITE_EVENT = "/jax/compilation_cache/cache_misses"

_DURATION_FIELD = {
    TRACE_EVENT: "trace_seconds",
    LOWER_EVENT: "lower_seconds",
    COMPILE_EVENT: "compile_seconds",
}
_MEMORY_FIELDS = (
    "argument_size_in_bytes",
    "output_size_in_bytes",
    "alias_size_in_bytes",
    "temp_size_in_bytes",
    "generated_code_size_in_bytes",
    "peak_memory_in_bytes",
    "host_argument_size_in_bytes",
    "host_output_size_in_bytes",
    "host_alias_size_in_bytes",
    "host_temp_size_in_bytes",
    "host_generated_code_size_in_bytes",
)
MISS_TEST_EVENT = "compile_after_persistent_compilation_miss"
_WRAPPED_NAME = re.compile(r"^(?:p?jit)\((.*)\)$|^(?:p?jit)_(.*)$")
#: The environment a record keeps: what can change a compile or explain its time (XLA, JAX,
#: CUDA, NCCL, TPU runtimes, XLA's logging through the TF_CPP_* names, the probe's own), never
#: the rest of the caller's shell (a bare TF_ prefix is Terraform's too: TF_TOKEN_*, TF_VAR_*).
_ENV_PREFIXES = ("JAX_", "XLA_", "NCCL_", "CUDA_", "TPU_", "LIBTPU_", "TF_CPP_", "PD_PROBE_")
_ENV_NAMES = ("NVIDIA_TF32_OVERRIDE", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR")
#: Even under an allowed prefix, a name like these holds a credential: never recorded.
_SECRET = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|API_?KEY|AUTH", re.IGNORECASE)


def compile_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default ``os.environ``) that explain a compile, sorted."""
    environ = dict(os.environ if environ is None else environ)
    return {
        name: value
        for name, value in sorted(environ.items())
        if (name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES) and not _SECRET.search(name)
    }


def jit_name(fun_name: str) -> str:
    """``jit(step)`` / ``jit_step`` → ``step``: the name JAX's events give a function."""
    match = _WRAPPED_NAME.match(fun_name)
    if match is None:
        return fun_name
    return match.group(1) if match.group(1) is not None else match.group(2)


def peak_rss_bytes() -> int:
    """This process's peak resident set size (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


#: jax.numpy / jax.random helpers that JAX compiles as tiny jits of their own (a dtype cast, a
#: key fold): not announced, they take milliseconds. A caller's own jit named ``_warmup`` is.
_HELPER_JITS = frozenset(
    {"convert_element_type", "broadcast_in_dim", "concatenate", "reshape", "squeeze", "copy"}
    | {"iota", "random_wrap", "random_unwrap", "random_bits", "random_seed", "clip", "fill"}
)
_HELPER_PREFIXES = (
    "_threefry",
    "_random",
    "_uniform",
    "_normal",
    "_bernoulli",
    "_gamma",
    "_split",
    "_fold_in",
    "_wrap",
    "_unwrap",
    "_where",
    "_multi_slice",
    "_reduce",
    "_take",
    "_rewriting_take",
    "_gather",
    "_one_hot",
    "_cumulative",
    "_mean",
    "_var",
)


def _is_helper(name: str) -> bool:
    return name in _HELPER_JITS or name.startswith(_HELPER_PREFIXES)


def _persistent_cache_on() -> bool:
    import jax

    values = jax.config.values
    return bool(values.get("jax_compilation_cache_dir")) and bool(
        values.get("jax_enable_compilation_cache", True)
    )


def _new_jit(from_phase: bool) -> dict[str, Any]:
    return {
        "phase": from_phase,
        "trace_seconds": 0.0,
        "lower_seconds": 0.0,
        "compile_seconds": 0.0,
        "total_seconds": 0.0,
        "wall_seconds": None,
        "first_compile_cache": None,
        "cache_hits": 0,
        "cache_misses": 0,
        "compiles": [],
        "memory": None,
    }


class Recorder:
    """Record compile time per jit, cache outcomes, XLA memory analysis and peak RSS.

    Use inside the arm's process::

        with Recorder.from_env() as rec:          # or Recorder("record.json", arm="baseline")
            with rec.phase("train_step"):
                compiled = step.lower(*abstract_args).compile()
            rec.memory("train_step", compiled)

    On exit (also on an exception, which is recorded and re-raised) the record is written to
    ``path`` as one JSON (see the README for its schema); ``path=None`` writes nothing.
    jax is imported only when the recorder is entered.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        arm: str | None = None,
        run: int = 1,
        mode: str | None = None,
        on_compile: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        """``on_compile(event, info)``, if given, is called in the compiling thread for every
        backend compile inside a :meth:`phase`: ``"start"`` when it begins, ``"cache"`` as soon
        as the persistent-cache outcome is known (``info["cache"]``: ``"hit"`` or ``"miss"``),
        ``"done"`` when it ends (``info["seconds"]``, final ``info["cache"]``: also ``"off"``).
        ``info["name"]`` is the phase, ``info["jit"]`` the compiled function's name."""
        self.path = None if path is None else Path(path)
        self.on_compile = on_compile
        self._previous_test_listener: Any = None
        self.arm = arm
        self.run = run
        self.mode = mode
        self._jits: dict[str, dict[str, Any]] = {}
        self._notes: dict[str, Any] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._listeners: list[tuple[Any, Any]] = []
        self._started_at = ""
        self._t0 = 0.0
        self._record: dict[str, Any] | None = None

    @classmethod
    def from_env(cls) -> Recorder:
        """A recorder configured by the variables the pd-probe runner sets for an arm
        (PD_PROBE_RECORD, PD_PROBE_ARM, PD_PROBE_RUN, PD_PROBE_MODE); outside a probe run,
        one that writes nothing."""
        return cls(
            os.environ.get(ENV_RECORD) or None,
            arm=os.environ.get(ENV_ARM),
            run=int(os.environ.get(ENV_RUN, "1")),
            mode=os.environ.get(ENV_MODE),
        )

    # -- thread-local state: the open phases and open backend compiles of this thread
    def _phases(self) -> list[str]:
        if not hasattr(self._local, "phases"):
            self._local.phases = []
        return self._local.phases

    def _open_compiles(self) -> list[dict[str, Any]]:
        if not hasattr(self._local, "compiles"):
            self._local.compiles = []
        return self._local.compiles

    def _pending(self) -> dict[str, Any]:
        # Cache events seen outside any open compile span (older JAX without start scalars).
        if not hasattr(self._local, "pending"):
            self._local.pending = {"cache": "off", "written": False}
        return self._local.pending

    def _jit(self, fun_name: str) -> dict[str, Any]:
        phases = self._phases()
        name = phases[-1] if phases else jit_name(fun_name)
        if name not in self._jits:
            self._jits[name] = _new_jit(from_phase=bool(phases))
        return self._jits[name]

    # -- jax.monitoring listeners
    def _announce(self, event: str, compile_: dict[str, Any], **info: Any) -> None:
        name = compile_.get("phase")
        if self.on_compile is None or name is None or _is_helper(jit_name(compile_["module"])):
            return
        with contextlib.suppress(Exception):  # a display callback must never break a compile
            self.on_compile(event, {"name": name, "jit": jit_name(compile_["module"]), **info})

    def _on_scalar(self, event: str, value: float | int, **kwargs: Any) -> None:
        if event == COMPILE_EVENT:
            module = str(kwargs.get("fun_name", "?"))
            phases = self._phases()
            compile_ = {
                "module": module,
                "cache": "off",
                "written": False,
                "phase": phases[-1] if phases else None,
            }
            self._open_compiles().append(compile_)
            self._announce("start", compile_, cache_enabled=_persistent_cache_on())

    def _on_event(self, event: str, **kwargs: Any) -> None:
        open_compiles = self._open_compiles()
        target = open_compiles[-1] if open_compiles else self._pending()
        if event == CACHE_USED_EVENT and target["cache"] != "hit":
            target["cache"] = "miss"
        elif event == CACHE_HIT_EVENT:
            target["cache"] = "hit"
            if open_compiles:
                self._announce("cache", target, cache="hit")
        elif event == CACHE_WRITE_EVENT:
            target["written"] = True

    def _on_test_event(self, name: str, *args: Any) -> None:
        if self._previous_test_listener is not None:
            self._previous_test_listener(name, *args)
        open_compiles = self._open_compiles()
        if name == MISS_TEST_EVENT and open_compiles:
            self._announce("cache", open_compiles[-1], cache="miss")

    def _on_duration(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        field = _DURATION_FIELD.get(event)
        if field is None:
            return
        fun_name = str(kwargs.get("fun_name", "?"))
        with self._lock:
            entry = self._jit(fun_name)
            entry[field] += duration_secs
            entry["total_seconds"] += duration_secs
            if event != COMPILE_EVENT:
                return
            open_compiles = self._open_compiles()
            if open_compiles:
                outcome = open_compiles.pop()
            else:
                outcome = {"module": fun_name, **self._pending()}
                self._local.pending = {"cache": "off", "written": False}
            compile_entry = {
                "module": outcome["module"],
                "seconds": duration_secs,
                "cache": outcome["cache"],
                "written": outcome["written"],
            }
            self._announce("done", outcome, cache=outcome["cache"], seconds=duration_secs)
            entry["compiles"].append(compile_entry)
            if entry["first_compile_cache"] is None:
                entry["first_compile_cache"] = compile_entry["cache"]
            if compile_entry["cache"] == "hit":
                entry["cache_hits"] += 1
            elif compile_entry["cache"] == "miss":
                entry["cache_misses"] += 1

    # -- public API
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute every compile event inside (this thread) to the jit ``name``, and time it.

        Wrap each jit's lower/compile (or its first call) in one phase; entering the same
        name again adds to it.
        """
        phases = self._phases()
        phases.append(name)
        with self._lock:
            entry = self._jits.setdefault(name, _new_jit(from_phase=True))
            entry["phase"] = True
        t0 = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - t0
            phases.pop()
            with self._lock:
                entry["wall_seconds"] = (entry["wall_seconds"] or 0.0) + elapsed

    def memory(self, name: str, compiled: Any) -> dict[str, int] | None:
        """Store XLA's memory analysis of ``compiled`` (a ``jax.stages.Compiled``) under jit
        ``name``; backends without it store None."""
        try:
            stats = compiled.memory_analysis()
        except Exception:  # backends may not implement it; absence is recorded, not fatal
            stats = None
        analysis = None
        if stats is not None:
            analysis = {
                field: int(getattr(stats, field))
                for field in _MEMORY_FIELDS
                if isinstance(getattr(stats, field, None), int)
            }
        with self._lock:
            self._jits.setdefault(name, _new_jit(from_phase=False))["memory"] = analysis
        return analysis

    def cache_outcomes(self, name: str) -> list[str]:
        """The persistent-cache outcome (``hit``, ``miss``, ``off``) of each compile recorded
        under jit ``name`` so far, in order."""
        with self._lock:
            entry = self._jits.get(name)
            return [c["cache"] for c in entry["compiles"]] if entry else []

    def note(self, **values: Any) -> None:
        """Add JSON-able values to the record's ``notes`` (e.g. sites=224, step_loss=…)."""
        self._notes.update(values)

    def __enter__(self) -> Recorder:
        import jax.monitoring

        self._started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self._t0 = time.perf_counter()
        # Every listener is registered with its unregister function, so exit undoes it.
        monitoring = jax.monitoring
        monitoring.register_scalar_listener(self._on_scalar)
        self._listeners.append((monitoring.unregister_scalar_listener, self._on_scalar))
        monitoring.register_event_listener(self._on_event)
        self._listeners.append((monitoring.unregister_event_listener, self._on_event))
        monitoring.register_event_duration_secs_listener(self._on_duration)
        self._listeners.append((monitoring.unregister_event_duration_listener, self._on_duration))
        if self.on_compile is not None:
            self._hook_miss_event()
        return self

    def _hook_miss_event(self) -> None:
        try:
            from jax._src import util as jax_util
        except ImportError:  # private module moved: misses are then announced when done
            return
        if not hasattr(jax_util, "test_event_listener"):
            return
        self._previous_test_listener = jax_util.test_event_listener
        jax_util.test_event_listener = self._on_test_event

        def unhook(_callback: Any) -> None:
            if jax_util.test_event_listener == self._on_test_event:  # bound: == not is
                jax_util.test_event_listener = self._previous_test_listener
            self._previous_test_listener = None

        self._listeners.append((unhook, None))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for unregister, callback in self._listeners:
            unregister(callback)
        self._listeners.clear()
        error = None if exc is None else f"{type(exc).__name__}: {exc}"
        self._record = self.to_dict(error=error)
        if self.path is not None:
            write_json(self.path, self._record)

    def to_dict(self, *, error: str | None = None) -> dict[str, Any]:
        """The record (the JSON written on exit)."""
        import jax

        try:
            backend: dict[str, Any] = {
                "backend": jax.default_backend(),
                "device_count": jax.device_count(),
                "process_index": jax.process_index(),
                "process_count": jax.process_count(),
            }
        except Exception as e:  # no backend (e.g. a failed init) must not lose the record
            backend = {"backend": None, "error": f"{type(e).__name__}: {e}"}
        with self._lock:
            jits = {
                name: {**entry, "compiles": list(entry["compiles"])}
                for name, entry in self._jits.items()
            }
        return {
            "schema": SCHEMA,
            "arm": self.arm,
            "run": self.run,
            "mode": self.mode,
            "started_at": self._started_at,
            "wall_seconds": time.perf_counter() - self._t0,
            "peak_rss_bytes": peak_rss_bytes(),
            "jax": {"version": jax.__version__, **backend},
            "cache_dir": jax.config.values.get("jax_compilation_cache_dir"),
            "env": compile_environment(),
            "jits": jits,
            "notes": dict(self._notes),
            "error": error,
        }


class CompileAnnouncer:
    """An ``on_compile`` callback for :class:`Recorder`: one line per compile on ``stream``
    (default stderr), begun before the compile and finished after it, e.g.
    ``compiling train_step (cache miss)… 142.0 s`` or ``compiling init: stacked (cache hit)… 0.3 s``.
    """

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        self._open: dict[int, bool] = {}  # thread id -> the line's head was written

    def _write(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(text)
        stream.flush()

    @staticmethod
    def _label(info: dict[str, Any]) -> str:
        name, jit = info["name"], info["jit"]
        return name if jit in (name, "?") else f"{name}: {jit}"

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        thread = threading.get_ident()
        if event == "start":
            self._open[thread] = not info.get("cache_enabled", True)
            if self._open[thread]:  # no lookup will tell hit or miss: say so now
                self._write(f"compiling {self._label(info)} (no cache)… ")
            return
        if event == "cache" and not self._open.get(thread, True):
            self._open[thread] = True
            self._write(f"compiling {self._label(info)} (cache {info['cache']})… ")
            return
        if event == "done":
            head = self._open.pop(thread, False)
            if not head:
                cache = {"off": "no cache"}.get(info["cache"], f"cache {info['cache']}")
                self._write(f"compiling {self._label(info)} ({cache})… ")
            self._write(f"{info['seconds']:.1f} s\n")
