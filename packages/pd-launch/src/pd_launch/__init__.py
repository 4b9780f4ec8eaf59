"""pd-launch: SLURM job submission that never leaks the caller's allocation into a new job.

Describe a job with :class:`JobSpec`, look at it with :func:`render_script`, submit it with
:func:`submit` (``sbatch --parsable`` from a scrubbed environment), follow it with
:func:`job_status`, :func:`wait` and :func:`cancel`. Inside a job, :func:`slurm_process` turns a
task's SLURM step environment into ``jax.distributed`` arguments. Standard library, attrs and
cattrs only: it runs on a login node without jax.
"""

from pd_launch._distributed import SlurmProcess, expand_hostlist, slurm_process
from pd_launch._env import (
    ALLOCATION_NAMES,
    KEPT_NAMES,
    QUERY_PREFIXES,
    SCRUBBED_NAMES,
    SCRUBBED_PREFIXES,
    ScrubbedEnvironment,
    in_allocation,
    is_scrubbed,
    query_environment,
    scrub_environment,
    scrub_notes,
)
from pd_launch._errors import (
    DroppedDefaultsWarning,
    JobFailedError,
    JobSpecError,
    JobWaitTimeoutError,
    LaunchError,
    LaunchWarning,
    SlurmConfigError,
    SlurmNotFoundError,
    SlurmQueryError,
    SlurmStepError,
    SubmissionError,
    SubmissionRejectedError,
    UnknownJobError,
    UnknownPartitionError,
)
from pd_launch._io import job_from_dict, job_to_dict, load_job
from pd_launch._job import (
    MAX_ARG_STRLEN,
    JobSpec,
    env_problem,
    path_problem,
    render_script,
    time_limit_seconds,
)
from pd_launch._slurm import (
    PreparedSubmission,
    Submission,
    cancel,
    check_slurm_conf,
    job_status,
    prepare_submission,
    submit,
    wait,
)
from pd_launch._status import FINAL_STATES, JobStatus

__version__ = "0.1.0"

__all__ = [
    "ALLOCATION_NAMES",
    "FINAL_STATES",
    "KEPT_NAMES",
    "MAX_ARG_STRLEN",
    "QUERY_PREFIXES",
    "SCRUBBED_NAMES",
    "SCRUBBED_PREFIXES",
    "DroppedDefaultsWarning",
    "JobFailedError",
    "JobSpec",
    "JobSpecError",
    "JobStatus",
    "JobWaitTimeoutError",
    "LaunchError",
    "LaunchWarning",
    "PreparedSubmission",
    "ScrubbedEnvironment",
    "SlurmConfigError",
    "SlurmNotFoundError",
    "SlurmProcess",
    "SlurmQueryError",
    "SlurmStepError",
    "Submission",
    "SubmissionError",
    "SubmissionRejectedError",
    "UnknownJobError",
    "UnknownPartitionError",
    "__version__",
    "cancel",
    "check_slurm_conf",
    "env_problem",
    "expand_hostlist",
    "in_allocation",
    "is_scrubbed",
    "job_from_dict",
    "job_status",
    "job_to_dict",
    "load_job",
    "path_problem",
    "prepare_submission",
    "query_environment",
    "render_script",
    "scrub_environment",
    "scrub_notes",
    "slurm_process",
    "submit",
    "time_limit_seconds",
    "wait",
]
