"""Where a task of a SLURM step stands among its peers: inputs for ``jax.distributed``.

Pure functions of an environment mapping passed in by the caller. They never read
``os.environ`` themselves: whether a process is a task that should join a distributed run is the
caller's explicit decision (e.g. a ``--distributed=slurm`` flag in the command pd-launch renders),
because SLURM variables are inherited by every child of an allocation, an salloc shell or a
batch script, and finding them proves nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from pd_launch._errors import SlurmStepError

# Coordinator ports are derived from the job and step ids so that two steps on one node do not
# collide; every task of a step computes the same port.
_PORT_BASE = 20000
_PORT_SPAN = 10000

# ASCII digits only: \d and int() also accept other scripts' digits ('٣', '３').
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_TASKS_PER_NODE = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
_INTEGER = re.compile(r"[0-9]+")


def _split_top_level(text: str, separator: str = ",") -> list[str]:
    """Split on ``separator`` outside brackets: 'a[1,2],b' -> ['a[1,2]', 'b']."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _expand_one(pattern: str, whole: str) -> list[str]:
    open_at = pattern.find("[")
    if open_at < 0:
        return [pattern]
    close_at = pattern.find("]", open_at)
    if close_at < 0:
        msg = f"host list {whole!r}: unclosed '[' in {pattern!r}"
        raise SlurmStepError(msg)
    prefix, body, rest = pattern[:open_at], pattern[open_at + 1 : close_at], pattern[close_at + 1 :]
    numbers: list[str] = []
    for item in body.split(","):
        match = _RANGE.fullmatch(item.strip())
        if match is None:
            msg = f"host list {whole!r}: {item!r} is not a number or a range like 01-04"
            raise SlurmStepError(msg)
        first, last = match[1], match[2] or match[1]
        width = len(first)  # SLURM keeps leading zeros: node[08-10] -> node08, node09, node10
        if int(last) < int(first):
            msg = f"host list {whole!r}: range {item!r} runs backwards"
            raise SlurmStepError(msg)
        numbers.extend(str(n).zfill(width) for n in range(int(first), int(last) + 1))
    return [f"{prefix}{n}{tail}" for n in numbers for tail in _expand_one(rest, whole)]


def expand_hostlist(hostlist: str) -> list[str]:
    """Host names in a SLURM host list, in order: ``"gpu[01-02,05],cpu1"`` -> 4 names."""
    if not hostlist.strip():
        msg = "host list is empty"
        raise SlurmStepError(msg)
    hosts: list[str] = []
    for part in _split_top_level(hostlist.strip()):
        if not part:
            msg = f"host list {hostlist!r} has an empty entry"
            raise SlurmStepError(msg)
        hosts.extend(_expand_one(part, hostlist))
    return hosts


def _tasks_per_node(value: str) -> list[int]:
    """SLURM's compressed counts: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS_PER_NODE.fullmatch(item.strip())
        if match is None:
            msg = f"SLURM_STEP_TASKS_PER_NODE={value!r} is not like '2(x3),1'"
            raise SlurmStepError(msg)
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts


@attrs.frozen(kw_only=True)
class SlurmProcess:
    """One task of a SLURM step, as ``jax.distributed.initialize`` wants it.

    Attributes:
        coordinator_address: ``host:port`` on the step's first node, where process 0 listens.
        process_id: this task's rank in the step (SLURM_PROCID).
        num_processes: tasks in the step (SLURM_STEP_NUM_TASKS).
        local_process_id: rank among the tasks on this node (SLURM_LOCALID).
        local_process_count: tasks of the step on this node.
        node_id: this node's index in the step (SLURM_NODEID).
        num_nodes: nodes in the step.
        job_id: SLURM_JOB_ID.
        step_id: SLURM_STEP_ID.
    """

    coordinator_address: str
    process_id: int
    num_processes: int
    local_process_id: int
    local_process_count: int
    node_id: int
    num_nodes: int
    job_id: str
    step_id: str


def _require_int(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None:
        msg = (
            f"{name} is not set: this is not a task of a SLURM step (srun sets it). A batch "
            "script, an salloc shell and their children are not steps; launch the command with srun"
        )
        raise SlurmStepError(msg)
    # int() would also take ' 3', '+3', '1_0' and non-ASCII digits; SLURM writes plain digits.
    if _INTEGER.fullmatch(value) is None:
        msg = f"{name}={value!r} is not an integer (ASCII digits)"
        raise SlurmStepError(msg)
    return int(value)


def slurm_process(env: Mapping[str, str], *, port: int | None = None) -> SlurmProcess:
    """This task's place in its SLURM step, from the step's environment ``env``.

    Reads SLURM_JOB_ID, SLURM_STEP_ID, SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST,
    SLURM_NODEID, SLURM_LOCALID and SLURM_STEP_TASKS_PER_NODE, all set by srun for each task.
    Call it only where the command was launched as a distributed task on purpose.

    Args:
        env: the task's environment, e.g. ``os.environ`` (read, never modified).
        port: the coordinator's port; by default derived from the job and step ids, the same in
            every task of the step.

    Raises:
        SlurmStepError: a variable is missing (not inside an srun step), malformed, or the
            variables contradict each other (e.g. SLURM_NTASKS leaked from another allocation).
    """
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        msg = "SLURM_JOB_ID is not set: not running inside a SLURM job"
        raise SlurmStepError(msg)
    step_id = _require_int(env, "SLURM_STEP_ID")
    process_id = _require_int(env, "SLURM_PROCID")
    num_processes = _require_int(env, "SLURM_STEP_NUM_TASKS")
    node_id = _require_int(env, "SLURM_NODEID")
    local_id = _require_int(env, "SLURM_LOCALID")
    nodelist = env.get("SLURM_STEP_NODELIST")
    if not nodelist:
        msg = "SLURM_STEP_NODELIST is not set: not a task of a SLURM step (srun sets it)"
        raise SlurmStepError(msg)
    hosts = expand_hostlist(nodelist)

    if not 0 <= process_id < num_processes:
        msg = f"SLURM_PROCID={process_id} is outside the step's {num_processes} tasks"
        raise SlurmStepError(msg)
    ntasks = env.get("SLURM_NTASKS")
    if ntasks is not None and ntasks != str(num_processes):
        msg = (
            f"SLURM_NTASKS={ntasks} but SLURM_STEP_NUM_TASKS={num_processes}: the environment "
            "mixes two allocations (submit with pd-launch, which scrubs the caller's SLURM_*)"
        )
        raise SlurmStepError(msg)
    if not 0 <= node_id < len(hosts):
        msg = f"SLURM_NODEID={node_id} is outside SLURM_STEP_NODELIST={nodelist!r}"
        raise SlurmStepError(msg)
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE")
    if per_node is None:
        local_count = num_processes // len(hosts)
    else:
        counts = _tasks_per_node(per_node)
        if len(counts) != len(hosts) or sum(counts) != num_processes:
            msg = (
                f"SLURM_STEP_TASKS_PER_NODE={per_node!r} does not spread "
                f"{num_processes} tasks over {len(hosts)} nodes"
            )
            raise SlurmStepError(msg)
        local_count = counts[node_id]
    if not 0 <= local_id < local_count:
        msg = f"SLURM_LOCALID={local_id} is outside this node's {local_count} tasks"
        raise SlurmStepError(msg)

    if port is None:
        if _INTEGER.fullmatch(job_id) is None:  # str.isdigit() is true for '٣' too
            msg = f"SLURM_JOB_ID={job_id!r} is not numeric; pass port= explicitly"
            raise SlurmStepError(msg)
        port = _PORT_BASE + (int(job_id) * 16 + step_id) % _PORT_SPAN
    elif isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        msg = f"port={port!r} is not a TCP port (an integer 1-65535)"
        raise SlurmStepError(msg)
    return SlurmProcess(
        coordinator_address=f"{hosts[0]}:{port}",
        process_id=process_id,
        num_processes=num_processes,
        local_process_id=local_id,
        local_process_count=local_count,
        node_id=node_id,
        num_nodes=len(hosts),
        job_id=job_id,
        step_id=str(step_id),
    )
