"""The submission environment: the caller's, minus everything an allocation leaves behind."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

# sbatch copies the caller's environment into the job, and what runs inside reads these as its
# own: srun reads SLURM_* as options (an inherited SLURM_NTASKS starts the wrong number of
# tasks, an inherited SLURM_MEM_PER_CPU next to the job's SLURM_MEM_PER_NODE kills srun, an
# inherited SLURM_CPU_BIND pins ranks to the caller's cores), sbatch and salloc read SBATCH_*
# and SALLOC_* (and scrun SCRUN_*) as options. The rest describe the caller's own place in a
# parallel launch, which the new job's processes would take for theirs: slurmd's SLURMD_NODENAME;
# PMI-1/PMI-2 (srun --mpi=pmi2, MPICH/Hydra, Intel MPI, Cray: PMI_RANK, PMI_SIZE, PMI_FD,
# PMI_JOBID, ...); PMIx (PMIX_RANK, PMIX_NAMESPACE, PMIX_SERVER_URI*, ...); PRRTE (PRTE_*);
# Open MPI's launch-time variables (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_*, the OMPI_MCA_orte_*,
# OMPI_MCA_ess* and OMPI_MCA_pmix* ones mpirun sets, OMPI_UNIVERSE_SIZE, ...: jax's own
# Open MPI detection reads these); MVAPICH2 (MV2_COMM_WORLD_*, MPIRUN_* of mpirun_rsh);
# Hydra's MPI_LOCALRANKID/MPI_LOCALNRANKS; Cray PALS (PALS_RANKID, PALS_NODEID, ...).
# Settings a user chooses (OMPI_MCA_btl_*, I_MPI_*, UCX_*, NCCL_*) are kept.
SCRUBBED_PREFIXES: tuple[str, ...] = (
    "SLURM_",
    "SLURMD_",
    "SBATCH_",
    "SRUN_",
    "SALLOC_",
    "SCRUN_",
    "PMI_",
    "PMIX_",
    "PRTE_",
    "OMPI_COMM_WORLD_",
    "OMPI_MCA_orte_",
    "OMPI_MCA_ess",
    "OMPI_MCA_pmix",
    "OMPI_MCA_prte_",
    "MV2_COMM_WORLD_",
    "MPIRUN_",
    "PALS_",
)

# Single launch-time names outside those prefixes.
SCRUBBED_NAMES: frozenset[str] = frozenset(
    {
        "OMPI_UNIVERSE_SIZE",
        "OMPI_FIRST_RANKS",
        "OMPI_APP_CTX_NUM_PROCS",
        "OMPI_NUM_APP_CTX",
        "OMPI_FILE_LOCATION",
        "OMPI_COMMAND",
        "OMPI_ARGV",
        "OMPI_MCA_initial_wdir",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
    }
)

# Where to find the cluster, not something an allocation sets.
KEPT_NAMES: frozenset[str] = frozenset({"SLURM_CONF"})

# Names that an allocation gives the processes inside it, but that are also ordinary settings
# outside one: the devices a job may use (set by slurmd's gres/gpu plugin: CUDA_, ROCR_,
# GPU_DEVICE_ORDINAL, ZE_AFFINITY_MASK; by container runtimes: NVIDIA_; by sites and ROCm:
# HIP_) and its scratch directory (TMPDIR: a per-job directory from slurmstepd, the site's
# prolog or job_container/tmpfs, on the caller's node, removed when the caller's job ends). They
# are removed only when the caller is inside a SLURM job (see :func:`in_allocation`); a new job
# gets its own from its own allocation, or the values its ``env`` sets.
ALLOCATION_NAMES: frozenset[str] = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
        "ZE_AFFINITY_MASK",
        "TMPDIR",
    }
)

# The query commands' own option variables: squeue reads SQUEUE_USERS, SQUEUE_PARTITION,
# SQUEUE_NAMES, SQUEUE_STATES, ... as filters (the job asked about is then "not found"),
# scancel reads SCANCEL_NAME, SCANCEL_PARTITION, SCANCEL_USER, ... as filters (the job is then
# silently not cancelled, exit 0) and SCANCEL_INTERACTIVE as "ask first"; sacct reads SACCT_*.
# pd-launch's own squeue, sacct and scancel calls run without them; sbatch and the job keep them.
QUERY_PREFIXES: tuple[str, ...] = ("SQUEUE_", "SCANCEL_", "SACCT_")


def in_allocation(env: Mapping[str, str]) -> bool:
    """Whether ``env`` is that of a process inside a SLURM job: SLURM_JOB_ID (or the older
    SLURM_JOBID) is set and not empty. slurmd sets both for every batch script, ``salloc``
    shell and ``srun`` task, and nothing outside a job does."""
    return bool(env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID"))


def is_scrubbed(name: str) -> bool:
    """Whether the scrub rule removes a variable called ``name`` (before ``keep``/overrides)."""
    return (name.startswith(SCRUBBED_PREFIXES) or name in SCRUBBED_NAMES) and (
        name not in KEPT_NAMES
    )


@attrs.frozen(kw_only=True)
class ScrubbedEnvironment:
    """An environment to run sbatch with, and what was taken out of the caller's.

    Attributes:
        env: the variables sbatch gets.
        removed: names removed from the caller's environment, sorted.
    """

    env: Mapping[str, str] = attrs.field(hash=False)
    removed: tuple[str, ...]


def scrub_environment(
    env: Mapping[str, str], *, keep: Iterable[str] = (), overrides: Mapping[str, str] | None = None
) -> ScrubbedEnvironment:
    """``env`` without the variables of :data:`SCRUBBED_PREFIXES` and :data:`SCRUBBED_NAMES`
    (SLURM_*, SBATCH_*, PMI_*, PMIX_*, OMPI_COMM_WORLD_*, ...), except SLURM_CONF; inside a
    SLURM job (:func:`in_allocation`) also without :data:`ALLOCATION_NAMES`
    (CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, ..., TMPDIR).

    Args:
        env: the caller's environment (e.g. ``os.environ``); not modified.
        keep: more names to keep although they match a scrubbed prefix.
        overrides: variables set explicitly (a job description's ``env``); they are added
            last, so they are never removed and win over the caller's values.
    """
    kept = KEPT_NAMES | set(keep)
    allocated = ALLOCATION_NAMES if in_allocation(env) else frozenset()
    clean: dict[str, str] = {}
    removed: list[str] = []
    for name, value in env.items():
        if (is_scrubbed(name) or name in allocated) and name not in kept:
            removed.append(name)
        else:
            clean[name] = value
    if overrides:
        clean.update(overrides)
        removed = [name for name in removed if name not in overrides]
    return ScrubbedEnvironment(env=clean, removed=tuple(sorted(removed)))


def query_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment pd-launch runs squeue, sacct and scancel with: ``env`` scrubbed as for a
    submission and without the query commands' own settings (:data:`QUERY_PREFIXES`)."""
    return {
        name: value
        for name, value in scrub_environment(env).env.items()
        if not name.startswith(QUERY_PREFIXES)
    }


def scrub_notes(removed: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """A dry run's comment lines on sbatch's environment: the caller variables it would run
    without (``removed``, or that there are none), and ``# Kept: SLURM_CONF`` when ``env``
    sets it."""
    removed = tuple(removed)
    if removed:
        lines = [f"# sbatch would run without these {len(removed)} caller variables:"]
        lines.extend(f"#   {name}" for name in removed)
    else:
        lines = ["# No caller variables would be removed."]
    if "SLURM_CONF" in env:
        lines.append("# Kept: SLURM_CONF")
    return lines
