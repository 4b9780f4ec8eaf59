"""sbatch's options and option variables: which ones a job description owns, and how sbatch
reads an abbreviated option or an ``SBATCH_*`` variable."""

from __future__ import annotations

# Options the description renders itself, or that would break what pd-launch does with the job
# (one job, found by its comment, submitted with --parsable, in a scrubbed environment); an
# extra directive may not set them. Keys are as sbatch spells them in full; an abbreviation
# sbatch would expand to one of them is caught too (see resolve_option).
MANAGED_OPTIONS = {
    "--job-name": "name",
    "-J": "name",
    "--nodes": "nodes",
    "-N": "nodes",
    "--ntasks-per-node": "tasks_per_node",
    "--tasks-per-node": "tasks_per_node",
    "--ntasks": "tasks_per_node (tasks = nodes × tasks_per_node)",
    "-n": "tasks_per_node (tasks = nodes × tasks_per_node)",
    "--ntasks-per-gpu": "tasks_per_node",
    "--ntasks-per-tres": "tasks_per_node",
    "--cpus-per-task": "cpus_per_task",
    "-c": "cpus_per_task",
    "--cpus-per-gpu": "cpus_per_task",
    "--tres-per-task": "cpus_per_task / gpus_per_node",
    "--gpus-per-node": "gpus_per_node",
    "--gpus": "gpus_per_node",
    "-G": "gpus_per_node",
    "--gpus-per-task": "gpus_per_node",
    "--gpus-per-socket": "gpus_per_node",
    "--mem": "memory",
    "--mem-per-cpu": "mem_per_cpu",
    "--mem-per-gpu": "memory / mem_per_cpu (SLURM allows one of --mem, --mem-per-cpu, "
    "--mem-per-gpu)",
    "--time": "time",
    "-t": "time",
    "--partition": "partition",
    "-p": "partition",
    "--account": "account",
    "-A": "account",
    "--signal": "signal",
    "--requeue": "requeue",
    "--no-requeue": "requeue",
    "--output": "output",
    "-o": "output",
    "--error": "error",
    "-e": "error",
    "--open-mode": "output/error (always append)",
    "--chdir": "chdir",
    "-D": "chdir",
    "--export": "env (pd-launch controls the submission environment)",
    "--export-file": "env (pd-launch controls the submission environment)",
    "--get-user-env": "env (pd-launch controls the submission environment)",
    "--comment": "none (pd-launch tags each submission with a comment to find it again)",
    "--parsable": "none (pd-launch passes it to read the job id)",
    "--array": "array",
    "-a": "array",
    "--wait": "none (use pd-launch's wait)",
    "-W": "none (use pd-launch's wait)",
    "--test-only": "none (no job would be created; use a dry run)",
    "--wrap": "command",
}

# sbatch's long options, to resolve abbreviations the way sbatch's getopt_long does: an exact
# name wins, else a prefix of exactly one option means that option, and a prefix of several is
# an error. The SLURM 22.05 ones are read from Debian 12's sbatch itself (its "ambiguous;
# possibilities: ..." answer to --a= through --z=), plus later releases' additions.
SBATCH_LONG_OPTION_NAMES = """
    account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters
    comment constraint container context container-id contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu
    cpus-per-task deadline delay-boot dependency distribution error exclude exclusive export
    export-file extra extra-node-info get-user-env gid gpu-bind gpu-freq gpus gpus-per-node
    gpus-per-socket gpus-per-task gres gres-flags help hint hold ignore-pbs input job-name
    kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu
    mem-per-gpu mincpus network nice no-kill no-requeue nodefile nodelist nodes ntasks
    ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres
    oom-kill-step open-mode
    output overcommit oversubscribe parsable partition power prefer priority profile propagate
    qos quiet reboot requeue reservation segment signal sockets-per-node spread-job switches
    tasks-per-node test-only thread-spec threads-per-core time time-min tmp tres-bind
    tres-per-task uid usage use-min-nodes verbose version wait wait-all-nodes wckey wrap
"""
SBATCH_LONG_OPTIONS = frozenset("--" + name for name in SBATCH_LONG_OPTION_NAMES.split())


def resolve_option(option: str) -> tuple[str, tuple[str, ...]]:
    """The long option sbatch reads ``option`` as, and the candidates when it is ambiguous.

    An option sbatch does not list (a newer SLURM's) resolves to itself: sbatch is its judge.
    """
    if option in SBATCH_LONG_OPTIONS:
        return option, ()
    candidates = tuple(sorted(o for o in SBATCH_LONG_OPTIONS if o.startswith(option)))
    if len(candidates) == 1:
        return candidates[0], ()
    return option, candidates


# sbatch's option variables (SLURM 22.05: every SBATCH_* name Debian 12's sbatch and
# libslurmfull carry, less the SBATCH_MEM_BIND_* ones sbatch sets for the job) and the option
# each stands for. sbatch reads them after the script's #SBATCH lines, so each one overrides the
# directive for its option (only a command-line option beats them).
SBATCH_VARIABLES: dict[str, str] = {
    "SBATCH_ACCOUNT": "--account",
    "SBATCH_ACCTG_FREQ": "--acctg-freq",
    "SBATCH_ARRAY_INX": "--array",
    "SBATCH_BATCH": "--batch",
    "SBATCH_BURST_BUFFER": "--bb",
    "SBATCH_CLUSTERS": "--clusters",
    "SBATCH_CLUSTER_CONSTRAINT": "--cluster-constraint",
    "SBATCH_CONSTRAINT": "--constraint",
    "SBATCH_CONTAINER": "--container",
    "SBATCH_CORE_SPEC": "--core-spec",
    "SBATCH_CPUS_PER_GPU": "--cpus-per-gpu",
    "SBATCH_CPU_FREQ_REQ": "--cpu-freq",
    "SBATCH_DEBUG": "--verbose",
    "SBATCH_DELAY_BOOT": "--delay-boot",
    "SBATCH_DISTRIBUTION": "--distribution",
    "SBATCH_ERROR": "--error",
    "SBATCH_EXCLUSIVE": "--exclusive",
    "SBATCH_EXPORT": "--export",
    "SBATCH_GET_USER_ENV": "--get-user-env",
    "SBATCH_GPUS": "--gpus",
    "SBATCH_GPUS_PER_NODE": "--gpus-per-node",
    "SBATCH_GPUS_PER_SOCKET": "--gpus-per-socket",
    "SBATCH_GPUS_PER_TASK": "--gpus-per-task",
    "SBATCH_GPU_BIND": "--gpu-bind",
    "SBATCH_GPU_FREQ": "--gpu-freq",
    "SBATCH_GRES": "--gres",
    "SBATCH_GRES_FLAGS": "--gres-flags",
    "SBATCH_HINT": "--hint",
    "SBATCH_IGNORE_PBS": "--ignore-pbs",
    "SBATCH_INPUT": "--input",
    "SBATCH_JOB_NAME": "--job-name",
    "SBATCH_MEM_BIND": "--mem-bind",
    "SBATCH_MEM_PER_CPU": "--mem-per-cpu",
    "SBATCH_MEM_PER_GPU": "--mem-per-gpu",
    "SBATCH_MEM_PER_NODE": "--mem",
    "SBATCH_NETWORK": "--network",
    "SBATCH_NO_KILL": "--no-kill",
    "SBATCH_NO_REQUEUE": "--no-requeue",
    "SBATCH_OPEN_MODE": "--open-mode",
    "SBATCH_OUTPUT": "--output",
    "SBATCH_OVERCOMMIT": "--overcommit",
    "SBATCH_PARTITION": "--partition",
    "SBATCH_POWER": "--power",
    "SBATCH_PROFILE": "--profile",
    "SBATCH_QOS": "--qos",
    "SBATCH_REQUEUE": "--requeue",
    "SBATCH_REQ_SWITCH": "--switches",
    "SBATCH_RESERVATION": "--reservation",
    "SBATCH_SIGNAL": "--signal",
    "SBATCH_SPREAD_JOB": "--spread-job",
    "SBATCH_THREADS_PER_CORE": "--threads-per-core",
    "SBATCH_THREAD_SPEC": "--thread-spec",
    "SBATCH_TIMELIMIT": "--time",
    "SBATCH_TRES_BIND": "--tres-bind",
    "SBATCH_TRES_PER_TASK": "--tres-per-task",
    "SBATCH_USE_MIN_NODES": "--use-min-nodes",
    "SBATCH_WAIT": "--wait",
    "SBATCH_WAIT4SWITCH": "--switches",
    "SBATCH_WAIT_ALL_NODES": "--wait-all-nodes",
    "SBATCH_WCKEY": "--wckey",
}

# Options that take no value: kept as a bare directive.
FLAG_OPTIONS = frozenset(
    {"--ignore-pbs", "--no-requeue", "--overcommit", "--requeue", "--spread-job",
     "--use-min-nodes", "--wait"}
)  # fmt: skip

# Prefixes of option variables that sbatch (SBATCH_*), salloc (SALLOC_*) or the job's srun
# (SRUN_*) would read as options; a job's ``env`` may not set them.
OPTION_VARIABLE_PREFIXES = ("SBATCH_", "SALLOC_", "SRUN_")


def sbatch_option_of(variable: str) -> str | None:
    """The sbatch option an ``SBATCH_*`` variable sets; None for a name sbatch is not known to
    read (a newer release's ``SBATCH_X_Y`` is taken as ``--x-y`` when sbatch has that option)."""
    if variable in SBATCH_VARIABLES:
        return SBATCH_VARIABLES[variable]
    guess = "--" + variable.removeprefix("SBATCH_").lower().replace("_", "-")
    return guess if variable.startswith("SBATCH_") and guess in SBATCH_LONG_OPTIONS else None


def option_variable_problem(name: str) -> str | None:
    """Why a job's ``env`` may not set ``name`` (an sbatch, salloc or srun option variable), or
    None when it may."""
    if name.startswith("SBATCH_"):
        option = sbatch_option_of(name)
        if option is None:
            return (
                f"env key {name!r}: SBATCH_* variables are sbatch's options, which would override "
                "the job's #SBATCH lines; set the job's fields or extra_directives instead"
            )
        owner = MANAGED_OPTIONS.get(option)
        instead = (
            f"use the field {owner!r} instead"
            if owner is not None
            else f"use extra_directives=[{option + ('' if option in FLAG_OPTIONS else '=...')!r}]"
        )
        return (
            f"env key {name!r} is sbatch's variable for {option}, which would override the "
            f"job's #SBATCH lines; {instead}"
        )
    if name.startswith("SRUN_"):
        return (
            f"env key {name!r}: SRUN_* variables are srun's options, which the job's srun would "
            "read over what pd-launch renders (e.g. SRUN_CPUS_PER_TASK over --cpus-per-task); "
            "set the job's fields instead"
        )
    if name.startswith("SALLOC_"):
        return (
            f"env key {name!r}: SALLOC_* variables are salloc's options and have no place in a "
            "batch job's environment"
        )
    return None
