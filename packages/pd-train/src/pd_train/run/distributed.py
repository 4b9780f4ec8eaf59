"""Which process this is, and ``jax.distributed`` from that, never from inherited variables.

The process layout comes from an explicit choice on the command line: ``none`` (one process),
``slurm`` (this is a task of an srun step: pd-launch reads the step's own variables and refuses
an environment that merely inherits an allocation), or ``explicit`` (coordinator, count and id
given, e.g. by a test that starts two processes on 127.0.0.1).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import attrs

Mode = Literal["none", "slurm", "explicit"]
MODES = ("none", "slurm", "explicit")


class DistributedError(ValueError):
    pass


@attrs.frozen(kw_only=True)
class Placement:
    """This process's place in the run. ``local_device_ids`` None: every local device."""

    process_id: int = 0
    num_processes: int = 1
    coordinator: str | None = None
    local_device_ids: tuple[int, ...] | None = None

    @property
    def is_primary(self) -> bool:
        return self.process_id == 0


def resolve_placement(
    mode: str,
    *,
    env: Mapping[str, str] | None = None,
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    process_per: Literal["node", "device"] = "node",
) -> Placement:
    """The :class:`Placement` for ``mode`` (see the module docstring)."""
    if mode == "none":
        return Placement()
    if mode == "slurm":
        from pd_launch import slurm_process

        proc = slurm_process(os.environ if env is None else env)
        devices = (proc.local_process_id,) if process_per == "device" else None
        return Placement(
            process_id=proc.process_id,
            num_processes=proc.num_processes,
            coordinator=proc.coordinator_address,
            local_device_ids=devices,
        )
    if mode == "explicit":
        missing = [
            name
            for name, value in (
                ("--coordinator", coordinator),
                ("--num-processes", num_processes),
                ("--process-id", process_id),
            )
            if value is None
        ]
        if missing:
            msg = f"--distributed explicit needs {', '.join(missing)}"
            raise DistributedError(msg)
        assert num_processes is not None and process_id is not None
        if not 0 <= process_id < num_processes:
            msg = f"--process-id {process_id} is outside [0, --num-processes={num_processes})"
            raise DistributedError(msg)
        return Placement(
            process_id=process_id, num_processes=num_processes, coordinator=coordinator
        )
    msg = f"--distributed is {mode!r}; expected one of {', '.join(MODES)}"
    raise DistributedError(msg)


def placement_from_flags(flags: Any) -> Placement:
    """:func:`resolve_placement` from a command line's ``--distributed``, ``--coordinator``,
    ``--num-processes``, ``--process-id`` and ``--process-per`` (``pd-train run`` and
    ``analyze``); outside an srun step, ``--distributed slurm`` is a :class:`DistributedError`."""
    from pd_launch import SlurmStepError

    try:
        return resolve_placement(
            flags.distributed,
            coordinator=flags.coordinator,
            num_processes=flags.num_processes,
            process_id=flags.process_id,
            process_per=flags.process_per,
        )
    except SlurmStepError as exc:
        raise DistributedError(f"--distributed slurm: {exc}") from exc


def initialize(placement: Placement) -> None:
    """``jax.distributed.initialize`` for a multi-process placement (nothing for one process).

    Cross-process collectives of the CPU backend need gloo; it is selected before the backend
    starts (it changes nothing for GPU devices).
    """
    if placement.num_processes == 1:
        return
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=placement.coordinator,
        num_processes=placement.num_processes,
        process_id=placement.process_id,
        local_device_ids=list(placement.local_device_ids)
        if placement.local_device_ids is not None
        else None,
    )
