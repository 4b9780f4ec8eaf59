"""Exceptions raised by pd-launch; every one derives from :class:`LaunchError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pd_launch._status import JobStatus


class LaunchError(Exception):
    """Base class of every error pd-launch raises on purpose."""


class JobSpecError(LaunchError, ValueError):
    """A job description field holds a value SLURM would not accept (raised before any sbatch)."""


class SlurmNotFoundError(LaunchError, FileNotFoundError):
    """A SLURM client command (sbatch, squeue, sacct, scancel) is not on PATH."""


class SlurmConfigError(LaunchError):
    """SLURM_CONF names a file that cannot be read (SLURM's clients would retry it for a minute
    or more before failing)."""


class SubmissionError(LaunchError):
    """sbatch rejected the job or gave no usable answer; ``stderr`` is sbatch's own message.
    No job is left that could run."""

    def __init__(self, message: str, *, stderr: str = "", returncode: int | None = None) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.returncode = returncode


class SubmissionRejectedError(SubmissionError):
    """sbatch answered and refused the job (it exited non-zero); ``stderr`` says why."""


class UnknownPartitionError(SubmissionRejectedError):
    """sbatch rejected the job because its partition does not exist on this cluster."""


class SlurmQueryError(LaunchError):
    """squeue/sacct/scancel failed or could not say anything about a job."""


class UnknownJobError(SlurmQueryError):
    """Neither squeue nor sacct knows the job id."""


class JobFailedError(LaunchError):
    """A job ended in a state other than COMPLETED; ``status`` is its final status."""

    def __init__(self, message: str, *, status: JobStatus) -> None:
        super().__init__(message)
        self.status = status


class JobWaitTimeoutError(LaunchError, TimeoutError):
    """A job did not reach a final state in time; ``status`` is the last one seen (or None)."""

    def __init__(self, message: str, *, status: JobStatus | None) -> None:
        super().__init__(message)
        self.status = status


class SlurmStepError(LaunchError, ValueError):
    """The environment given is not that of a SLURM job step (or is inconsistent)."""


class LaunchWarning(UserWarning):
    """Base class of the warnings pd-launch issues."""


class DroppedDefaultsWarning(LaunchWarning):
    """The caller's sbatch option variables (``SBATCH_ACCOUNT``, ``SBATCH_QOS``, ...) were left
    out of a submission; the message says how to keep each through the job's fields."""
