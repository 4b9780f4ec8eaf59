"""jax.distributed arguments from a SLURM step's environment (pure functions of a mapping)."""

import pytest

from pd_launch import SlurmStepError, expand_hostlist, slurm_process

# Task 1 of a two-task step, as srun set it on the test cluster (trimmed to what matters).
STEP_TASK_1 = {
    "SLURM_JOB_ID": "19",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NODELIST": "vm",
    "SLURM_STEP_TASKS_PER_NODE": "2",
}

# The batch script of the same job: SLURM_PROCID=0 and SLURM_NTASKS=2 but no step. A process
# that trusted these would wait forever for a second process.
BATCH_SCRIPT = {
    "SLURM_JOB_ID": "19",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "2",
    "SLURM_NODELIST": "vm",
    "SLURM_TASKS_PER_NODE": "2",
}


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("vm", ["vm"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[08-10,12]", ["gpu08", "gpu09", "gpu10", "gpu12"]),
        ("a[1-2],b,c[7]", ["a1", "a2", "b", "c7"]),
        ("r[1-2]n[0-1]", ["r1n0", "r1n1", "r2n0", "r2n1"]),
        ("gpu-[1-2]-ib", ["gpu-1-ib", "gpu-2-ib"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    ("hostlist", "fragment"),
    [("", "empty"), ("a[1-2", "unclosed"), ("a[x]", "not a number"), ("a[3-1]", "backwards"),
     ("a,,b", "empty entry")],
)  # fmt: skip
def test_bad_hostlist(hostlist: str, fragment: str) -> None:
    with pytest.raises(SlurmStepError, match=fragment):
        expand_hostlist(hostlist)


def test_task_of_a_step() -> None:
    process = slurm_process(STEP_TASK_1)
    assert process.process_id == 1
    assert process.num_processes == 2
    assert process.local_process_id == 1
    assert process.local_process_count == 2
    assert process.node_id == 0 and process.num_nodes == 1
    assert process.job_id == "19" and process.step_id == "0"
    host, port = process.coordinator_address.split(":")
    assert host == "vm" and 20000 <= int(port) < 30000


def test_every_task_agrees_on_the_coordinator() -> None:
    task_0 = {**STEP_TASK_1, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    assert (
        slurm_process(task_0).coordinator_address == slurm_process(STEP_TASK_1).coordinator_address
    )
    next_step = {**STEP_TASK_1, "SLURM_STEP_ID": "1"}
    assert (
        slurm_process(next_step).coordinator_address
        != slurm_process(STEP_TASK_1).coordinator_address
    )
    assert slurm_process(STEP_TASK_1, port=1234).coordinator_address == "vm:1234"


def test_multi_node_step() -> None:
    env = {
        **STEP_TASK_1,
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "2",
        "SLURM_NTASKS": "10",
        "SLURM_STEP_NUM_TASKS": "10",
        "SLURM_STEP_NODELIST": "gpu[07-09],cpu1",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2),2,0",
    }
    process = slurm_process(env)
    assert process.coordinator_address.startswith("gpu07:")
    assert process.num_nodes == 4
    assert process.local_process_count == 2


def test_batch_script_is_not_a_step() -> None:
    with pytest.raises(SlurmStepError, match="SLURM_STEP_ID is not set: this is not a task"):
        slurm_process(BATCH_SCRIPT)


def test_outside_slurm() -> None:
    with pytest.raises(SlurmStepError, match="SLURM_JOB_ID is not set"):
        slurm_process({"PATH": "/bin"})


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"SLURM_NTASKS": "4"}, "SLURM_NTASKS=4 but SLURM_STEP_NUM_TASKS=2"),
        ({"SLURM_PROCID": "2"}, "SLURM_PROCID=2 is outside the step's 2 tasks"),
        ({"SLURM_PROCID": "one"}, "SLURM_PROCID='one' is not an integer"),
        ({"SLURM_NODEID": "1"}, "SLURM_NODEID=1 is outside"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is outside this node's 2 tasks"),
        ({"SLURM_STEP_TASKS_PER_NODE": "1"}, "does not spread 2 tasks over 1 nodes"),
        ({"SLURM_STEP_TASKS_PER_NODE": "two"}, "is not like"),
        ({"SLURM_STEP_NODELIST": ""}, "SLURM_STEP_NODELIST is not set"),
        ({"SLURM_JOB_ID": "19_3"}, "pass port= explicitly"),
    ],
)
def test_inconsistent_step_environment(change: dict[str, str], fragment: str) -> None:
    with pytest.raises(SlurmStepError, match=fragment):
        slurm_process({**STEP_TASK_1, **change})


def test_bad_port() -> None:
    with pytest.raises(SlurmStepError, match="port=70000 is not a TCP port"):
        slurm_process(STEP_TASK_1, port=70000)
