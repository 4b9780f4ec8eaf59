"""What SLURM says about one job, and which of its states are final (no import of the rest of
pd-launch: the errors that carry a status import it)."""

from __future__ import annotations

import attrs

__all__ = ["FINAL_STATES", "JobStatus"]

# States after which a job never runs again. Everything else (PENDING, RUNNING, COMPLETING,
# REQUEUED, SUSPENDED, ...) is still on its way; an unrecognized state counts as not final, so
# a wait ends by its timeout rather than by a guess.
FINAL_STATES: frozenset[str] = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)


@attrs.frozen(kw_only=True)
class JobStatus:
    """What SLURM says about one job.

    Attributes:
        job_id: the job id.
        state: SLURM's state name, e.g. ``"PENDING"``, ``"COMPLETED"``, ``"CANCELLED"``.
        exit_code: ``"code:signal"``, e.g. ``"1:0"``; None if unknown.
        reason: squeue's reason (e.g. ``"Resources"``) or sacct's; None if none given.
        source: ``"squeue"`` or ``"sacct"``.
    """

    job_id: str
    state: str
    exit_code: str | None = None
    reason: str | None = None
    source: str = "squeue"

    @property
    def final(self) -> bool:
        """Whether the job has ended for good."""
        return self.state in FINAL_STATES

    @property
    def ok(self) -> bool:
        """Whether the job ended COMPLETED, the only state that means success."""
        return self.state == "COMPLETED"
