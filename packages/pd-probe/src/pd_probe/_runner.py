"""The runner: every run of every arm in a fresh process, with the arm's isolated environment."""

from __future__ import annotations

import datetime
import json
import os
import signal
import string
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal, Protocol

import attrs

from pd_probe._arm import Arm
from pd_probe._checks import EquivalenceCheck, check_equivalence
from pd_probe._errors import ProbeError
from pd_probe._grid import Grid
from pd_probe._io import write_json
from pd_probe._isolation import ArmPaths, arm_env, arm_paths
from pd_probe._overrides import OverridesLike

Mode = Literal["compile", "steps"]
MODES = ("compile", "steps")

PLACEHOLDERS = ("arm", "run", "mode", "config", "record", "out", "metrics", "arm_dir", "cache_dir")
"""Names a command template may use, e.g. ``["python", "-m", "pd_train", "{mode}", "{config}",
"--record", "{record}"]``: the arm's name, the run index, the mode, the arm's config.json, the
run's record.json, output dir and metrics.jsonl, the arm dir and its compilation cache dir."""


class Launcher(Protocol):
    """How a run's process is started and awaited (locally, or as a SLURM job via pd-launch).

    ``launch`` starts ``command`` with exactly ``env`` (the full environment) and sends its
    stdout/stderr to ``out_dir/stdout.log`` and ``out_dir/stderr.log``; it returns any handle.
    ``wait`` blocks until the process ends and returns its exit code, or stops it and returns
    None once ``timeout_s`` seconds have passed since it was launched.
    """

    def launch(
        self, arm: Arm, command: Sequence[str], env: Mapping[str, str], out_dir: Path
    ) -> Any: ...

    def wait(self, handle: Any, *, timeout_s: float | None) -> int | None: ...


@attrs.define
class _LocalHandle:
    process: subprocess.Popen[bytes]
    started: float
    logs: tuple[IO[bytes], IO[bytes]]


class LocalLauncher:
    """Runs each command as a local subprocess in its own session (so a timeout stops the
    whole process group it started, and nothing else)."""

    def __init__(self, *, kill_grace_s: float = 10.0) -> None:
        self.kill_grace_s = kill_grace_s

    def launch(
        self, arm: Arm, command: Sequence[str], env: Mapping[str, str], out_dir: Path
    ) -> _LocalHandle:
        out_dir.mkdir(parents=True, exist_ok=True)
        stdout = open(out_dir / "stdout.log", "wb")  # noqa: SIM115 - closed in wait()
        stderr = open(out_dir / "stderr.log", "wb")  # noqa: SIM115
        try:
            process = subprocess.Popen(
                list(command),
                env=dict(env),
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            stdout.close()
            stderr.close()
            raise
        return _LocalHandle(process, time.monotonic(), (stdout, stderr))

    def wait(self, handle: _LocalHandle, *, timeout_s: float | None) -> int | None:
        remaining = None if timeout_s is None else timeout_s - (time.monotonic() - handle.started)
        try:
            return handle.process.wait(timeout=None if remaining is None else max(remaining, 0))
        except subprocess.TimeoutExpired:
            self._stop(handle.process)
            return None
        finally:
            for log in handle.logs:
                log.close()

    def _stop(self, process: subprocess.Popen[bytes]) -> None:
        # The process leads its own session (start_new_session), so its group is ours alone.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(timeout=self.kill_grace_s)
                return
            except subprocess.TimeoutExpired:
                continue


@attrs.frozen
class RunStatus:
    """One run of one arm: its exit code (None when it timed out or never started)."""

    run: int
    status: str
    returncode: int | None
    seconds: float
    command: tuple[str, ...]
    error: str | None = None


@attrs.frozen
class ArmStatus:
    """Outcome of one arm: ``ok`` | ``failed`` | ``timeout`` | ``skipped`` | ``alias``."""

    name: str
    status: str
    runs: tuple[RunStatus, ...] = ()
    alias_of: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class ProbeResult:
    """What :func:`run_probe` did: the probe dir, each arm's status, and in ``steps`` mode the
    equivalence checks."""

    probe_dir: Path
    mode: str
    arms: dict[str, ArmStatus]
    equivalence: tuple[EquivalenceCheck, ...] = ()

    @property
    def failed(self) -> list[str]:
        return [n for n, s in self.arms.items() if s.status in ("failed", "timeout")]


def _format_command(template: Sequence[str], values: Mapping[str, Any]) -> tuple[str, ...]:
    out = []
    for part in template:
        for _, field, _, _ in string.Formatter().parse(part):
            if field is not None and field not in PLACEHOLDERS:
                msg = (
                    f"command part {part!r} uses unknown placeholder {{{field}}}; allowed: "
                    + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)
                )
                raise ProbeError(msg)
        out.append(part.format(**values))
    return tuple(out)


def _placeholders(arm: Arm, paths: ArmPaths, run: int, mode: str) -> dict[str, str]:
    run_paths = paths.run(run)
    return {
        "arm": arm.name,
        "run": str(run),
        "mode": mode,
        "config": str(paths.config),
        "record": str(run_paths.record),
        "out": str(run_paths.out),
        "metrics": str(run_paths.metrics),
        "arm_dir": str(paths.root),
        "cache_dir": str(paths.cache_dir),
    }


def _tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _cache_counts(record_path: Path) -> str:
    """``"; cache: 3 hit, 1 miss"`` from an arm's record, or "" without one."""
    try:
        jits = json.loads(record_path.read_text()).get("jits", {})
    except (OSError, ValueError):
        return ""
    hits = sum(int(e.get("cache_hits", 0)) for e in jits.values())
    misses = sum(int(e.get("cache_misses", 0)) for e in jits.values())
    return f"; cache: {hits} hit, {misses} miss" if hits or misses else ""


def run_probe(
    grid: Grid,
    probe_dir: str | os.PathLike[str],
    *,
    command: Sequence[str],
    mode: Mode = "compile",
    launcher: Launcher | None = None,
    timeout_s: float | None = None,
    max_parallel: int = 1,
    include_gpu_only: bool = True,
    path_overrides: Callable[[ArmPaths], OverridesLike] | None = None,
    require_record: bool = True,
    loss_keys: Sequence[str] = ("loss",),
    base_env: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ProbeResult:
    """Run every arm of ``grid`` in fresh processes and record the outcome in ``probe_dir``.

    Every config is materialized and validated before anything is written; ``probe_dir`` must
    not exist or be empty. A failing or timed-out arm is recorded and the others still run.

    Args:
      grid: the arms (aliases are not run again; GPU-only arms are skipped unless
        ``include_gpu_only``).
      probe_dir: where everything goes (layout in :mod:`pd_probe._isolation`).
      command: the command template of one run; placeholders in :data:`PLACEHOLDERS`.
      mode: ``compile`` or ``steps`` (given to the command as ``{mode}`` and PD_PROBE_MODE;
        ``steps`` also checks equivalence groups for identical losses).
      launcher: how processes start; default :class:`LocalLauncher`.
      timeout_s: per-run timeout (an arm's own ``timeout_s`` wins); None waits forever.
      max_parallel: arms in flight at once; 1 (local default) keeps timings undisturbed, a
        cluster launcher may run all at once. Runs of one arm are always sequential.
      path_overrides: ``ArmPaths → overrides`` pointing config fields at the arm's dirs (e.g.
        the config's compilation cache dir field at ``paths.cache_dir``); validated again.
      require_record: a run that exits 0 without writing its record.json counts as failed.
      loss_keys: metrics.jsonl keys compared in ``steps`` mode.
      base_env: the environment arms start from; default ``os.environ``.
      progress: called with one line per started and per finished run (e.g. ``print``); a
        finished run's line counts its compile-cache hits and misses.
    """
    if mode not in MODES:
        msg = f"mode {mode!r} is not one of {', '.join(MODES)}"
        raise ProbeError(msg)
    if max_parallel < 1:
        msg = f"max_parallel = {max_parallel}: must be at least 1"
        raise ProbeError(msg)
    probe = Path(probe_dir).absolute()
    if probe.exists() and any(probe.iterdir()):
        msg = f"probe dir {probe} is not empty; give a new directory for each probe"
        raise ProbeError(msg)
    runs = _Runs(
        probe=probe,
        command=tuple(command),
        mode=mode,
        launcher=launcher or LocalLauncher(),
        base_env=base_env,
        progress=progress,
    )
    # Validate first: every config and every command is built before anything is written.
    to_run, configs = runs.plan(grid, include_gpu_only=include_gpu_only, overrides=path_overrides)
    _write_probe_dir(probe, grid, runs, configs)
    todo = deque(to_run)
    while todo or runs.active:
        while todo and len(runs.active) < max_parallel:
            runs.start(todo.popleft(), 1)
        if runs.active:
            runs.wait_next(timeout_s=timeout_s, require_record=require_record)

    equivalence: tuple[EquivalenceCheck, ...] = ()
    if mode == "steps":
        equivalence = tuple(check_equivalence(probe, loss_keys=loss_keys))
    ordered = {arm.name: runs.statuses[arm.name] for arm in grid.arms}
    return ProbeResult(probe_dir=probe, mode=mode, arms=ordered, equivalence=equivalence)


def _write_probe_dir(probe: Path, grid: Grid, runs: _Runs, configs: dict[str, Any]) -> None:
    """``grid.json`` (the grid, the mode, the command, the start time) and per arm its dirs and
    config, or the status of an arm that does not run (an alias, a skipped GPU-only arm)."""
    manifest = {
        **grid.to_dict(),
        "mode": runs.mode,
        "command": list(runs.command),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    write_json(probe / "grid.json", manifest)
    for arm in grid.arms:
        paths = arm_paths(probe, arm.name)
        paths.root.mkdir(parents=True, exist_ok=True)
        if arm.name in configs:
            write_json(paths.config, configs[arm.name])
            paths.cache_dir.mkdir(parents=True, exist_ok=True)
            paths.autotune_dir.mkdir(parents=True, exist_ok=True)
        else:
            write_json(paths.status, runs.statuses[arm.name].to_dict())


@attrs.define(kw_only=True)
class _Runs:
    """:func:`run_probe`'s scheduler: the runs in flight, each arm's finished runs and its
    status (written to its ``status.json`` when its last run ends)."""

    probe: Path
    command: tuple[str, ...]
    mode: Mode
    launcher: Launcher
    base_env: Mapping[str, str] | None
    progress: Callable[[str], None] | None
    statuses: dict[str, ArmStatus] = attrs.field(factory=dict)
    runs: dict[str, list[RunStatus]] = attrs.field(factory=dict)
    active: deque[tuple[Arm, int, Any, float, tuple[str, ...]]] = attrs.field(factory=deque)

    def plan(
        self,
        grid: Grid,
        *,
        include_gpu_only: bool,
        overrides: Callable[[ArmPaths], OverridesLike] | None,
    ) -> tuple[list[Arm], dict[str, dict[str, Any]]]:
        """The arms to run and their configs, every config and command built (and so
        validated); aliases and skipped arms get their status."""
        to_run: list[Arm] = []
        configs: dict[str, dict[str, Any]] = {}
        for arm in grid.arms:
            paths = arm_paths(self.probe, arm.name)
            if arm.name in grid.aliases:
                alias = grid.aliases[arm.name]
                self.statuses[arm.name] = ArmStatus(arm.name, "alias", alias_of=alias)
                continue
            if arm.gpu_only and not include_gpu_only:
                self.statuses[arm.name] = ArmStatus(arm.name, "skipped", error="GPU-only arm")
                continue
            extra = overrides(paths) if overrides is not None else None
            configs[arm.name] = grid.config_with(arm.name, extra)
            _format_command(self.command, _placeholders(arm, paths, 1, self.mode))
            arm_env(arm, paths, 1, mode=self.mode, base_env=self.base_env)
            to_run.append(arm)
            self.runs[arm.name] = []
        return to_run, configs

    def start(self, arm: Arm, run: int) -> None:
        """Launch run ``run`` of ``arm`` (a launch that fails is that arm's failure)."""
        paths = arm_paths(self.probe, arm.name)
        run_paths = paths.run(run)
        run_paths.out.mkdir(parents=True, exist_ok=True)
        cmd = _format_command(self.command, _placeholders(arm, paths, run, self.mode))
        env = arm_env(arm, paths, run, mode=self.mode, base_env=self.base_env)
        t0 = time.monotonic()
        try:
            handle = self.launcher.launch(arm, cmd, env, run_paths.dir)
        except Exception as e:  # recorded for this arm; the others still run
            error = f"could not launch: {type(e).__name__}: {e}"
            self.runs[arm.name].append(RunStatus(run, "failed", None, 0.0, cmd, error))
            self.finish(arm)
            return
        self.active.append((arm, run, handle, t0, cmd))
        if self.progress is not None:
            self.progress(f"{arm.name} run {run}: started")

    def finish(self, arm: Arm) -> None:
        arm_runs = tuple(self.runs[arm.name])
        bad = next((r for r in arm_runs if r.status != "ok"), None)
        status = ArmStatus(
            arm.name,
            "ok" if bad is None else bad.status,
            runs=arm_runs,
            error=None if bad is None else f"run {bad.run}: {bad.error}",
        )
        self.statuses[arm.name] = status
        write_json(arm_paths(self.probe, arm.name).status, status.to_dict())

    def wait_next(self, *, timeout_s: float | None, require_record: bool) -> None:
        """Wait for the oldest run in flight; record it, then start the arm's next run or
        finish the arm."""
        arm, run, handle, t0, cmd = self.active.popleft()
        limit = arm.timeout_s if arm.timeout_s is not None else timeout_s
        try:
            returncode = self.launcher.wait(handle, timeout_s=limit)
            wait_error = None
        except Exception as e:  # a launcher that loses track of a job fails that arm only
            returncode, wait_error = None, f"wait failed: {type(e).__name__}: {e}"
        seconds = time.monotonic() - t0
        run_paths = arm_paths(self.probe, arm.name).run(run)
        if wait_error is not None:
            result = RunStatus(run, "failed", None, seconds, cmd, wait_error)
        elif returncode is None:
            result = RunStatus(run, "timeout", None, seconds, cmd, f"timed out after {limit} s")
        elif returncode != 0:
            error = f"exit code {returncode}; stderr tail:\n{_tail(run_paths.stderr)}"
            result = RunStatus(run, "failed", returncode, seconds, cmd, error)
        elif require_record and not run_paths.record.exists():
            error = f"exit code 0 but no record at {run_paths.record}"
            result = RunStatus(run, "failed", returncode, seconds, cmd, error)
        else:
            result = RunStatus(run, "ok", returncode, seconds, cmd)
        self.runs[arm.name].append(result)
        if self.progress is not None:
            cache = _cache_counts(run_paths.record) if result.status == "ok" else ""
            self.progress(f"{arm.name} run {run}: {result.status} ({seconds:.1f} s{cache})")
        if result.status == "ok" and run < arm.repeats:
            self.start(arm, run + 1)
        else:
            self.finish(arm)
