"""The submission environment: the caller's, minus everything an allocation leaves behind."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

# sbatch copies the caller's environment into the job, and srun inside the job reads these
# prefixes as its own options: an inherited SLURM_NTASKS starts the wrong number of tasks, an
# inherited SLURM_MEM_PER_CPU next to the job's SLURM_MEM_PER_NODE kills srun, an inherited
# SLURM_CPU_BIND pins ranks to the caller's cores. SBATCH_*/SALLOC_* are read as options by
# sbatch itself, PMIX_* describe the caller's own process-management session.
SCRUBBED_PREFIXES: tuple[str, ...] = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMIX_")

# Where to find the cluster, not something an allocation sets.
KEPT_NAMES: frozenset[str] = frozenset({"SLURM_CONF"})


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
    """``env`` without SLURM_*, SBATCH_*, SRUN_*, SALLOC_*, PMIX_* (except SLURM_CONF).

    Args:
        env: the caller's environment (e.g. ``os.environ``); not modified.
        keep: more names to keep although they match a scrubbed prefix.
        overrides: variables set explicitly (a job description's ``env``); they are added
            last, so they are never removed and win over the caller's values.
    """
    kept = KEPT_NAMES | set(keep)
    clean: dict[str, str] = {}
    removed: list[str] = []
    for name, value in env.items():
        if name.startswith(SCRUBBED_PREFIXES) and name not in kept:
            removed.append(name)
        else:
            clean[name] = value
    if overrides:
        clean.update(overrides)
        removed = [name for name in removed if name not in overrides]
    return ScrubbedEnvironment(env=clean, removed=tuple(sorted(removed)))
