"""Per-arm directories and environment, and the check that arms shared no cache.

Layout of a probe directory (``PROBE``)::

    PROBE/grid.json                      the grid: arms, aliases, baseline, mode
    PROBE/arms/NAME/config.json          the arm's raw config (JSON, which is also YAML)
    PROBE/arms/NAME/cache/jax/           JAX_COMPILATION_CACHE_DIR of the arm
    PROBE/arms/NAME/cache/autotune/      --xla_gpu_per_fusion_autotune_cache_dir of the arm
    PROBE/arms/NAME/status.json          the runner's outcome of every run
    PROBE/arms/NAME/run-I/record.json    the recorder's JSON of run I (1 = cold)
    PROBE/arms/NAME/run-I/out/           the run's output dir; steps mode: out/metrics.jsonl
    PROBE/arms/NAME/run-I/stdout.log     (and stderr.log)
    PROBE/report.md, report.csv, compile_seconds.png
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

import attrs

from pd_probe._arm import Arm
from pd_probe._errors import ProbeError

AUTOTUNE_FLAG = "--xla_gpu_per_fusion_autotune_cache_dir"

# Variables the runner sets for the arm's process (read by Recorder.from_env()).
ENV_ARM = "PD_PROBE_ARM"
ENV_RUN = "PD_PROBE_RUN"
ENV_MODE = "PD_PROBE_MODE"
ENV_RECORD = "PD_PROBE_RECORD"
ENV_OUT = "PD_PROBE_OUT"

# Isolation is pd-probe's job: an arm that sets these itself would defeat it.
_RESERVED_ENV = ("JAX_COMPILATION_CACHE_DIR", ENV_ARM, ENV_RUN, ENV_MODE, ENV_RECORD, ENV_OUT)


@attrs.frozen
class RunPaths:
    """Files of one run of an arm (run 1 is cold; later runs reuse the arm's caches)."""

    dir: Path
    record: Path
    out: Path
    metrics: Path
    stdout: Path
    stderr: Path


@attrs.frozen
class ArmPaths:
    """Directories of one arm inside a probe directory."""

    root: Path
    config: Path
    cache_dir: Path
    autotune_dir: Path
    status: Path

    def run(self, index: int) -> RunPaths:
        d = self.root / f"run-{index}"
        return RunPaths(
            dir=d,
            record=d / "record.json",
            out=d / "out",
            metrics=d / "out" / "metrics.jsonl",
            stdout=d / "stdout.log",
            stderr=d / "stderr.log",
        )


def arm_paths(probe_dir: str | os.PathLike[str], name: str) -> ArmPaths:
    root = Path(probe_dir).absolute() / "arms" / name
    return ArmPaths(
        root=root,
        config=root / "config.json",
        cache_dir=root / "cache" / "jax",
        autotune_dir=root / "cache" / "autotune",
        status=root / "status.json",
    )


def merge_xla_flags(*flag_strings: str | None) -> str:
    """Join XLA_FLAGS strings; a flag given again later replaces the earlier value.

    ``merge_xla_flags("--a=1 --b=2", "--a=3")`` → ``"--a=3 --b=2"`` (first position kept).
    """
    merged: dict[str, str] = {}
    for flags in flag_strings:
        for flag in shlex.split(flags or ""):
            merged[flag.split("=", 1)[0]] = flag
    return " ".join(shlex.quote(f) for f in merged.values())


def arm_env(
    arm: Arm,
    paths: ArmPaths,
    run: int,
    *,
    mode: str,
    base_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of run ``run`` of ``arm``.

    ``base_env`` (default ``os.environ``), then the arm's variables, then the isolation:
    JAX_COMPILATION_CACHE_DIR and the per-fusion autotune cache dir point into the arm's own
    directory, and XLA_FLAGS is the flag-by-flag merge of inherited, arm and isolation flags.
    (With the persistent cache on, JAX itself points the autotune cache into the compilation
    cache dir, which is the arm's too.)
    """
    for key in _RESERVED_ENV:
        if key in arm.env:
            msg = f"arm {arm.name!r} sets {key}; pd-probe sets it to give each arm its own cache"
            raise ProbeError(msg)
    if AUTOTUNE_FLAG in arm.env.get("XLA_FLAGS", ""):
        msg = (
            f"arm {arm.name!r} sets {AUTOTUNE_FLAG} in XLA_FLAGS; pd-probe sets it to give each "
            "arm its own autotune cache"
        )
        raise ProbeError(msg)
    base = dict(os.environ if base_env is None else base_env)
    env = {**base, **arm.env}
    env["XLA_FLAGS"] = merge_xla_flags(
        base.get("XLA_FLAGS"), arm.env.get("XLA_FLAGS"), f"{AUTOTUNE_FLAG}={paths.autotune_dir}"
    )
    run_paths = paths.run(run)
    env["JAX_COMPILATION_CACHE_DIR"] = str(paths.cache_dir)
    env[ENV_ARM] = arm.name
    env[ENV_RUN] = str(run)
    env[ENV_MODE] = mode
    env[ENV_RECORD] = str(run_paths.record)
    env[ENV_OUT] = str(run_paths.out)
    return env
