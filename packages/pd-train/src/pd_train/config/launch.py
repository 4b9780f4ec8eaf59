"""The ``launch`` section of a run config: how ``pd-train submit`` asks SLURM to run it.

Every value is checked when the config is loaded, before anything is written or submitted:
SLURM-facing values (time, signal, memory, partition, ...) go through pd-launch's own
:class:`~pd_launch.JobSpec` checks, so what passes here renders into a valid sbatch script.
Errors carry the field path (``launch.time: ...``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import attrs

from pd_launch import time_limit_seconds
from pd_train.config.io import FieldValueError, non_negative, one_of, positive

__all__ = ["LaunchConfig"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# SLURM sends --signal's signal this many seconds before the limit when no @SECONDS is given.
_DEFAULT_SIGNAL_LEAD = 60
# LaunchConfig field -> pd_launch.JobSpec field, for the values pd-launch checks.
_JOB_FIELDS = {
    "job_name": "name",
    "mem": "memory",
    "mem_per_cpu": "mem_per_cpu",
    "time": "time",
    "partition": "partition",
    "account": "account",
    "signal": "signal",
    "log_dir": "output",
    "extra_directives": "extra_directives",
}


def _signal_lead_seconds(signal: str | None) -> int | None:
    if signal is None:
        return None
    _, at, seconds = signal.partition("@")
    return int(seconds) if at else _DEFAULT_SIGNAL_LEAD


def _as_job_spec(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    """Check one value the way pd-launch will when the job is built."""
    from pd_launch import JobSpec, JobSpecError

    if value is None:
        return
    # The value replaces a placeholder (job_name's among them: it is JobSpec's `name`).
    fields: dict[str, Any] = {"name": "check", "command": ("true",)}
    fields[_JOB_FIELDS[attribute.name]] = value
    try:
        JobSpec(**fields)
    except JobSpecError as exc:
        # Name the user's field, not pd-launch's (`job_name=`, not `name=`).
        message = str(exc)
        spelled = f"{_JOB_FIELDS[attribute.name]}="
        if message.startswith(spelled):
            message = f"{attribute.name}={message.removeprefix(spelled)}"
        raise FieldValueError(attribute.name, message) from None


def _quoted_time(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    if isinstance(value, int):
        msg = (
            f"got the number {value!r}; a time limit is a string in a SLURM format (minutes "
            "are '30', not 30): write e.g. '30' or '4:00:00'"
        )
        raise FieldValueError(attribute.name, msg)


def _check_env(_instance: Any, _attribute: Any, value: dict[str, str]) -> None:
    for name, val in value.items():
        if _ENV_NAME.fullmatch(name) is None:
            msg = f"key {name!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
            raise FieldValueError("env", msg)
        if "\0" in val:
            raise FieldValueError(f"env.{name}", f"got {val!r}; must not contain NUL bytes")


def _check_setup(_instance: Any, _attribute: Any, value: tuple[str, ...]) -> None:
    for i, line in enumerate(value):
        if not line.strip() or "\0" in line:
            msg = f"got {line!r}; each setup item must be a non-empty shell command"
            raise FieldValueError(f"setup[{i}]", msg)


@attrs.frozen(kw_only=True)
class LaunchConfig:
    """How ``pd-train submit`` runs this config under SLURM (``pd-train run`` ignores it).

    The job runs ``nodes × tasks_per_node`` processes with ``srun``; each is one process of
    the run's ``jax.distributed`` world.

    Attributes:
        job_name: SLURM job name; null: the config's ``run_name``.
        nodes: nodes to allocate.
        tasks_per_node: processes per node; null: 1 with ``process_per: node``,
            ``gpus_per_node`` with ``process_per: device``.
        process_per: ``node`` (one process sees all the node's devices) or ``device`` (one
            process per GPU; pass as ``pd-train run --process-per``).
        cpus_per_task: CPUs per process; null leaves it to SLURM.
        gpus_per_node: GPUs per node (``--gpus-per-node``); 0 requests none.
        mem: memory per node, e.g. ``64G`` (``--mem``; ``0`` is all of it).
        mem_per_cpu: memory per CPU (``--mem-per-cpu``); not together with ``mem``.
        time: time limit in a SLURM format (``30``, ``2:00:00``, ``1-12:00:00``).
        partition: partition; null uses the cluster's default.
        account: account to charge; null uses the user's default.
        signal: ``--signal``: SIGTERM 300 s before the limit lets the run save a checkpoint.
        requeue: whether SLURM may requeue the job; a requeued job resumes from its last
            checkpoint in the same run dir.
        env: variables exported to every process (e.g. ``XLA_FLAGS``).
        python: the interpreter that runs ``pd_train.cli`` in the job; null: the one running
            ``pd-train submit`` (right on a shared file system).
        setup: shell commands each process runs first, e.g. ``source /path/venv/bin/activate``
            or ``module load cuda``.
        log_dir: directory for SLURM's log files; null: ``RUN_DIR/logs``.
        extra_directives: more sbatch options, e.g. ``["--constraint=a100", "--qos=high"]``.
    """

    job_name: str | None = attrs.field(default=None, validator=_as_job_spec)
    nodes: int = attrs.field(default=1, validator=positive())
    tasks_per_node: int | None = attrs.field(default=None, validator=positive())
    process_per: Literal["node", "device"] = attrs.field(
        default="node", validator=one_of("node", "device")
    )
    cpus_per_task: int | None = attrs.field(default=None, validator=positive())
    gpus_per_node: int = attrs.field(default=0, validator=non_negative())
    mem: str | None = attrs.field(default=None, validator=_as_job_spec)
    mem_per_cpu: str | None = attrs.field(default=None, validator=_as_job_spec)
    # Typed `str | int` only to answer a number with advice rather than a type error: a bare
    # number is ambiguous (YAML 1.1 tools read 4:00:00 as the base-60 integer 14400).
    time: str | int = attrs.field(default="1:00:00", validator=[_quoted_time, _as_job_spec])
    partition: str | None = attrs.field(default=None, validator=_as_job_spec)
    account: str | None = attrs.field(default=None, validator=_as_job_spec)
    signal: str | None = attrs.field(default="TERM@300", validator=_as_job_spec)
    requeue: bool = True
    env: dict[str, str] = attrs.field(factory=dict, validator=_check_env)
    python: str | None = None
    setup: tuple[str, ...] = attrs.field(default=(), validator=_check_setup)
    log_dir: str | None = attrs.field(default=None, validator=_as_job_spec)
    extra_directives: tuple[str, ...] = attrs.field(default=(), validator=_as_job_spec)

    def __attrs_post_init__(self) -> None:
        if self.mem is not None and self.mem_per_cpu is not None:
            msg = (
                f"got {self.mem_per_cpu!r} together with launch.mem={self.mem!r}; SLURM allows "
                "only one of --mem and --mem-per-cpu: set the other to null"
            )
            raise FieldValueError("mem_per_cpu", msg)
        lead = _signal_lead_seconds(self.signal)
        limit = time_limit_seconds(str(self.time))
        if lead is not None and limit is not None and lead >= limit:
            msg = (
                f"got {self.signal!r}: {lead} s before the time limit, but launch.time="
                f"{self.time!r} is {limit} s, so the run would be told to stop as it starts; "
                "use a shorter lead (e.g. TERM@60), a longer time, or null"
            )
            raise FieldValueError("signal", msg)
        if self.process_per == "device" and self.tasks_per_node is None and not self.gpus_per_node:
            msg = (
                "is 'device' but gpus_per_node is 0 and tasks_per_node is null, so the number "
                "of processes per node is unknown; set gpus_per_node or tasks_per_node"
            )
            raise FieldValueError("process_per", msg)

    @property
    def processes_per_node(self) -> int:
        """Tasks SLURM starts on each node."""
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return self.gpus_per_node if self.process_per == "device" else 1
