"""Process-level runtime setup: the persistent compile cache, HLO dumps, traces and logging.

Order matters. XLA reads ``XLA_FLAGS`` once, when the backend initializes, so the launch
environment (and an HLO dump directory) is applied before anything touches a device; the
compile cache is configured before the first compile.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

import jax

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
    if cache_dir is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    cache_dir = Path(cache_dir).absolute()
    cache_dir.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if xla_caches is not None:
        jax.config.update("jax_persistent_cache_enable_xla_caches", xla_caches)
    # A cache that was initialized earlier in this process keeps its old directory otherwise.
    from jax._src import compilation_cache

    compilation_cache.reset_cache()


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
