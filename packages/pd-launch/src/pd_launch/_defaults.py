"""The caller's sbatch defaults (``SBATCH_ACCOUNT``, ``SBATCH_QOS``, ...) that a submission
drops, and how the job description keeps each one."""

from __future__ import annotations

from collections.abc import Mapping

from pd_launch._job import JobSpec, render_script
from pd_launch._options import FLAG_OPTIONS, MANAGED_OPTIONS, resolve_option, sbatch_option_of

# Options a JobSpec field renders, and that field.
_FIELD_OF_OPTION = {
    "--job-name": "name",
    "--nodes": "nodes",
    "--ntasks-per-node": "tasks_per_node",
    "--cpus-per-task": "cpus_per_task",
    "--gpus-per-node": "gpus_per_node",
    "--mem": "memory",
    "--mem-per-cpu": "mem_per_cpu",
    "--time": "time",
    "--partition": "partition",
    "--account": "account",
    "--signal": "signal",
    "--output": "output",
    "--error": "error",
    "--chdir": "chdir",
}
_INTEGER_FIELDS = frozenset({"nodes", "tasks_per_node", "cpus_per_task", "gpus_per_node"})
# Options that exclude each other: a job that sets one has no use for a default of another.
_ALTERNATIVES = (
    frozenset({"--requeue", "--no-requeue"}),
    frozenset({"--mem", "--mem-per-cpu", "--mem-per-gpu"}),
)
# Options whose value is optional: a default of "" or "1" means the bare option.
_OPTIONAL_VALUE = frozenset({"--exclusive", "--no-kill", "--verbose"})


def _rendered_options(job: JobSpec) -> set[str]:
    """The long options the job's ``#SBATCH`` lines set (short extra directives are not
    resolved)."""
    options: set[str] = set()
    for line in render_script(job).splitlines():
        if line.startswith("#SBATCH --"):
            options.add(resolve_option(line.removeprefix("#SBATCH ").split("=", 1)[0])[0])
    for group in _ALTERNATIVES:
        if options & group:
            options |= group
    return options


def _as_directive(option: str, value: str) -> str:
    if option in FLAG_OPTIONS or (option in _OPTIONAL_VALUE and value in ("", "1")):
        return option
    return f"{option}={value}"


def dropped_defaults_warning(
    job: JobSpec, removed: tuple[str, ...], env: Mapping[str, str]
) -> str | None:
    """One line naming the caller's ``SBATCH_*`` defaults in ``removed`` that the job does not
    set itself, with the fields or extra directives that keep them; None when there are none.

    Args:
        job: the job being submitted.
        removed: the names the scrub took out of ``env``.
        env: the caller's environment (for the values).
    """
    rendered = _rendered_options(job)
    dropped: list[str] = []
    fields: list[str] = []
    directives: list[str] = []
    lost: list[str] = []
    for name in removed:
        if not name.startswith("SBATCH_") or name not in env:
            continue
        value = env[name]
        option = sbatch_option_of(name)
        if option is not None and option in rendered:
            continue  # the job sets this option itself; its value is the one wanted
        dropped.append(f"{name}={value!r}")
        field = _FIELD_OF_OPTION.get(option or "")
        if field is not None:
            shown = value if field in _INTEGER_FIELDS and value.isdigit() else repr(value)
            fields.append(f"{field}={shown}")
        elif option is None:
            lost.append(f"{name} (not an sbatch option variable pd-launch knows)")
        elif option in MANAGED_OPTIONS:
            lost.append(f"{name} ({option} is pd-launch's: {MANAGED_OPTIONS[option]})")
        else:
            directives.append(repr(_as_directive(option, value)))
    if not dropped:
        return None
    keep = []
    if fields:
        keep.append(f"set {', '.join(fields)}")
    if directives:
        keep.append(f"add {', '.join(directives)} to extra_directives")
    message = (
        f"the caller's sbatch defaults {', '.join(dropped)} are not passed on (pd-launch "
        "submits without SBATCH_* variables, which would override the job's own #SBATCH lines)"
    )
    if keep:
        message += f"; to keep them, {' and '.join(keep)} in the job"
    if lost:
        message += f"; cannot be kept: {', '.join(lost)}"
    return message
