"""The process layout comes from an explicit choice, never from merely inherited variables."""

import pytest

from pd_launch import SlurmStepError
from pd_train.run.distributed import DistributedError, Placement, resolve_placement


def test_none_is_one_process_even_inside_an_allocation() -> None:
    inherited = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "2"}
    assert resolve_placement("none", env=inherited) == Placement()


def test_slurm_refuses_a_shell_that_only_inherits_an_allocation() -> None:
    # What an `salloc -n 4` shell has: job variables, but no step of its own.
    inherited = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_NODELIST": "n1"}
    with pytest.raises(SlurmStepError):
        resolve_placement("slurm", env=inherited)


def test_slurm_reads_the_step() -> None:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NODELIST": "node[3-4]",
        "SLURM_NODEID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    }
    placement = resolve_placement("slurm", env=env, process_per="device")
    assert (placement.process_id, placement.num_processes) == (1, 2)
    assert placement.coordinator is not None and placement.coordinator.startswith("node3:")
    assert placement.local_device_ids == (0,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs --coordinator, --num-processes, --process-id"),
        (
            {"coordinator": "127.0.0.1:1", "num_processes": 2, "process_id": 2},
            "--process-id 2 is outside [0, --num-processes=2)",
        ),
    ],
)
def test_explicit_needs_complete_consistent_values(kwargs: dict, message: str) -> None:
    with pytest.raises(DistributedError, match=message.replace("[", r"\[").replace(")", r"\)")):
        resolve_placement("explicit", **kwargs)


def test_unknown_mode_is_named() -> None:
    with pytest.raises(DistributedError, match="expected one of none, slurm, explicit"):
        resolve_placement("mpi")
