"""The job description and its sbatch script."""

from __future__ import annotations

import re
import shlex
import signal as _signal
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from pd_launch._errors import JobSpecError
from pd_launch._options import MANAGED_OPTIONS, option_variable_problem, resolve_option

# Every pattern is ASCII-only: Python's \d and int() accept any script's digits ('٣', '３'),
# which sbatch refuses. Values must also be ASCII strings (``_ascii``) before a pattern runs,
# so that e.g. 'ınfınıte'.upper() == 'INFINITE' cannot pass either.
# SLURM's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME_FORMATS = (
    re.compile(r"(?P<m>[0-9]+)"),
    re.compile(r"(?P<m>[0-9]+):(?P<s>[0-9]{1,2})"),
    re.compile(r"(?P<h>[0-9]+):(?P<m>[0-9]{1,2}):(?P<s>[0-9]{1,2})"),
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]{1,2})"),
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]{1,2}):(?P<m>[0-9]{1,2})"),
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]{1,2}):(?P<m>[0-9]{1,2}):(?P<s>[0-9]{1,2})"),
)
_UNLIMITED = ("UNLIMITED", "INFINITE")
_TIME_HELP = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (or UNLIMITED)"
_SIGNAL = re.compile(r"(?:(?P<scope>[BR]):)?(?P<sig>[A-Za-z0-9]+)(?:@(?P<secs>[0-9]+))?")
_MEMORY = re.compile(r"[0-9]+[KMGT]?")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:,[A-Za-z0-9][A-Za-z0-9._-]*)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# sbatch --array: indices and ranges (with an optional :step), comma-separated, then %max.
_ARRAY_RANGE = r"[0-9]+(?:-[0-9]+(?::[0-9]+)?)?"
_ARRAY = re.compile(rf"{_ARRAY_RANGE}(?:,{_ARRAY_RANGE})*(?:%[0-9]+)?")
_UNSAFE_IN_DIRECTIVE = re.compile(r"[\s\"'\\]")
_LONG_OPTION = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")
_SHORT_OPTION = re.compile(r"-[A-Za-z]")
# A path in a directive: sbatch reads '#SBATCH' lines with quotes grouping words (so a space is
# fine inside "..."), a backslash escaping the next character and an unquoted '#' starting a
# comment. Paths made only of these characters are written bare, any other inside "...".
_BARE_PATH = re.compile(r"[A-Za-z0-9_./%:@+,=~-]+")

# Linux refuses to exec a program with any one argument or environment string ("NAME=value")
# longer than MAX_ARG_STRLEN bytes counting its NUL, i.e. of 131072 bytes or more: 32 pages of 4 KiB (E2BIG, "Argument list
# too long"). Kernels with larger pages allow more; 4 KiB pages are what x86-64 nodes have.
MAX_ARG_STRLEN = 128 * 1024


def _string_bytes(text: str) -> int:
    """Bytes ``text`` takes in an exec'd argument or environment string, with its NUL."""
    return len(text.encode("utf-8", "surrogatepass")) + 1


def _too_long(size: int) -> str:
    return (
        f"{size - 1} bytes (UTF-8); Linux refuses to start a program with any one argument or "
        f"environment string of {MAX_ARG_STRLEN} bytes or more (MAX_ARG_STRLEN, 128 KiB "
        "counting its NUL), so the job would fail with 'Argument list too long': pass the data in "
        "a file instead"
    )


def _preview(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:30]!r}...({len(text)} characters)"


def path_problem(value: object) -> str | None:
    """Why ``value`` cannot be a path in an ``#SBATCH`` line, or None when it can.

    Spaces, ``'`` and ``#`` are fine (the path is then written inside double quotes); a path
    must be a non-empty string without double quotes, backslashes, line breaks or other control
    characters (sbatch reads backslashes and quotes as escapes, a line break ends the line).
    """
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if not value.isprintable() or '"' in value or "\\" in value:
        return (
            "must not contain double quotes, backslashes, line breaks or other control "
            "characters (it goes into an #SBATCH line)"
        )
    return None


def _directive_path(option: str, path: str) -> str:
    """``--option=path``, the path in double quotes unless it needs none."""
    if _BARE_PATH.fullmatch(path):
        return f"{option}={path}"
    return f'{option}="{path}"'


def time_limit_seconds(time: str) -> int | None:
    """Seconds in a SLURM time limit string; None for UNLIMITED/INFINITE.

    Raises:
        JobSpecError: ``time`` is not one of SLURM's formats, has a field out of range (seconds
            or minutes after hours >= 60, hours after days >= 24) or is zero.
    """
    if not isinstance(time, str):
        msg = f"time={time!r} must be a string in a SLURM format: {_TIME_HELP}"
        raise JobSpecError(msg)
    if not time.isascii():
        msg = f"time={time!r} must be ASCII (digits 0-9); use one of {_TIME_HELP}"
        raise JobSpecError(msg)
    if time.upper() in _UNLIMITED:
        return None
    for pattern in _TIME_FORMATS:
        match = pattern.fullmatch(time)
        if match is None:
            continue
        parts = {k: int(v) for k, v in match.groupdict().items() if v is not None}
        days, hours = parts.get("d", 0), parts.get("h", 0)
        minutes, seconds = parts.get("m", 0), parts.get("s", 0)
        if "s" in parts and seconds >= 60:
            msg = f"time={time!r}: seconds must be below 60 (formats: {_TIME_HELP})"
            raise JobSpecError(msg)
        if "h" in parts and "m" in parts and minutes >= 60:
            msg = f"time={time!r}: minutes after hours must be below 60 (formats: {_TIME_HELP})"
            raise JobSpecError(msg)
        if "d" in parts and hours >= 24:
            msg = f"time={time!r}: hours after days must be below 24 (formats: {_TIME_HELP})"
            raise JobSpecError(msg)
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
        if total == 0:
            # SLURM reads a zero limit as "no limit"; say so explicitly instead.
            msg = f"time={time!r} is zero; give a positive limit or 'UNLIMITED'"
            raise JobSpecError(msg)
        return total
    msg = f"time={time!r} is not a SLURM time limit; use one of {_TIME_HELP}"
    raise JobSpecError(msg)


def _check_time(_instance: Any, _attribute: Any, value: str) -> None:
    time_limit_seconds(value)


def _check_signal(_instance: Any, _attribute: Any, value: str | None) -> None:
    if value is None:
        return
    match = _SIGNAL.fullmatch(value) if isinstance(value, str) and value.isascii() else None
    if match is None:
        msg = (
            f"signal={value!r} is not a SLURM --signal value; use [B:|R:]SIG[@SECONDS], "
            "e.g. 'TERM@300' (SIGTERM 300 s before the time limit) or 'B:USR1@60'"
        )
        raise JobSpecError(msg)
    sig = match["sig"]
    if sig.isdigit():
        known = int(sig) in {s.value for s in _signal.Signals}
    else:
        name = sig.upper() if sig.upper().startswith("SIG") else f"SIG{sig.upper()}"
        known = name in _signal.Signals.__members__
    if not known:
        msg = f"signal={value!r}: {sig!r} is not a signal name or number (e.g. TERM, USR1, 15)"
        raise JobSpecError(msg)
    if match["secs"] is not None and int(match["secs"]) > 65535:
        msg = f"signal={value!r}: SLURM allows at most 65535 seconds before the limit"
        raise JobSpecError(msg)


def _required(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        msg = f"{attribute.name}=None: a value is required"
        raise JobSpecError(msg)


def _positive(_instance: Any, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{attribute.name}={value!r} must be a positive integer"
        raise JobSpecError(msg)


def _non_negative(_instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"{attribute.name}={value!r} must be an integer >= 0"
        raise JobSpecError(msg)


def _matches(pattern: re.Pattern[str], allowed: str) -> Any:
    def check(_instance: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
        if value is None:
            return
        if not isinstance(value, str) or not value.isascii() or pattern.fullmatch(value) is None:
            msg = f"{attribute.name}={value!r} is not allowed; expected {allowed} (ASCII)"
            raise JobSpecError(msg)

    return check


def _check_path(_instance: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is None:
        return
    problem = path_problem(value)
    if problem is not None:
        msg = f"{attribute.name}={value!r} {problem}; SLURM patterns like %j are fine"
        raise JobSpecError(msg)


def _check_bool(_instance: Any, attribute: attrs.Attribute[Any], value: bool) -> None:
    if not isinstance(value, bool):
        msg = f"{attribute.name}={value!r} must be true or false"
        raise JobSpecError(msg)


def _check_command(_instance: Any, _attribute: Any, value: tuple[str, ...]) -> None:
    if not value or not value[0]:
        msg = f"command={value!r} must name a program: a non-empty list like ['python', 'x.py']"
        raise JobSpecError(msg)
    for i, arg in enumerate(value):
        if not isinstance(arg, str) or "\0" in arg:
            msg = f"command[{i}]={arg!r} must be a string without NUL bytes"
            raise JobSpecError(msg)
        size = _string_bytes(arg)
        if size > MAX_ARG_STRLEN:
            msg = f"command[{i}]={_preview(arg)} is {_too_long(size)}"
            raise JobSpecError(msg)


def env_problem(name: object, value: object) -> str | None:
    """Why a job's ``env`` cannot hold ``name=value``, or None when it can.

    The name must be a variable name and not an option variable of sbatch, salloc or srun
    (``SBATCH_*``, ``SALLOC_*``, ``SRUN_*``: they would override the job's own fields); the
    value a string without NUL bytes; ``NAME=value`` under :data:`MAX_ARG_STRLEN` bytes.
    """
    if not isinstance(name, str) or _ENV_NAME.fullmatch(name) is None:
        return f"env key {name!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
    problem = option_variable_problem(name)
    if problem is not None:
        return problem
    if not isinstance(value, str) or "\0" in value:
        return f"env[{name!r}]={value!r} must be a string without NUL bytes"
    size = _string_bytes(f"{name}={value}")
    if size > MAX_ARG_STRLEN:
        return f"env[{name!r}]={_preview(value)}: {name}=VALUE is {_too_long(size)}"
    return None


def _check_env(_instance: Any, _attribute: Any, value: Mapping[str, str]) -> None:
    for name, val in value.items():
        problem = env_problem(name, val)
        if problem is not None:
            raise JobSpecError(problem)


def _check_extra(_instance: Any, _attribute: Any, value: tuple[str, ...]) -> None:
    for i, item in enumerate(value):
        where = f"extra_directives[{i}]={item!r}"
        if not isinstance(item, str) or not item.isascii() or _UNSAFE_IN_DIRECTIVE.search(item):
            msg = (
                f"{where} must be one sbatch option like '--constraint=a100' (ASCII, no "
                "whitespace or quotes)"
            )
            raise JobSpecError(msg)
        written = item.split("=", 1)[0]
        if _LONG_OPTION.fullmatch(written):
            option, ambiguous = resolve_option(written)
            if ambiguous:
                msg = (
                    f"{where}: sbatch reads {written} as an abbreviation of any of "
                    f"{', '.join(ambiguous)} and refuses it; write the option in full"
                )
                raise JobSpecError(msg)
        elif _SHORT_OPTION.fullmatch(item[:2]):
            option = item[:2]  # -n4, -n=4 and -n all set -n
        else:
            msg = (
                f"{where} must be one sbatch option like '--constraint=a100': a long option "
                "(--name[=value]) or a short one (-x[value])"
            )
            raise JobSpecError(msg)
        if option in MANAGED_OPTIONS:
            spelled = (
                option
                if option == written or not written.startswith("--")
                else (f"{option} (abbreviated {written})")
            )
            msg = (
                f"{where} sets {spelled}, which the job description owns; use the field "
                f"{MANAGED_OPTIONS[option]!r} instead"
            )
            raise JobSpecError(msg)


def _freeze_env(value: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        msg = f"env={value!r} must be a mapping of variable name to string value"
        raise JobSpecError(msg)
    return MappingProxyType(dict(value))


def _to_tuple(field: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        # A bare string would otherwise become a tuple of characters.
        msg = (
            f"{field}={value!r}: expected a list of strings, got a string; split it into arguments"
        )
        raise JobSpecError(msg)
    if not isinstance(value, list | tuple):
        msg = f"{field}={value!r}: expected a list of strings, got {type(value).__name__}"
        raise JobSpecError(msg)
    return tuple(value)


def _command_tuple(value: Any) -> tuple[str, ...]:
    return _to_tuple("command", value)


def _directives_tuple(value: Any) -> tuple[str, ...]:
    return _to_tuple("extra_directives", value)


@attrs.frozen(kw_only=True)
class JobSpec:
    """What to run under SLURM, rendered by :func:`render_script` into an sbatch script.

    Every task runs ``command`` under ``srun``; there are ``nodes * tasks_per_node`` tasks.
    Values are checked on construction, before anything talks to SLURM.

    Attributes:
        name: job name (``--job-name``).
        command: the program and arguments each task runs, e.g. ``("pd-train", "run", "c.yaml")``;
            each under :data:`MAX_ARG_STRLEN` bytes.
        nodes: number of nodes.
        tasks_per_node: tasks (processes) per node; None leaves it to SLURM, which starts one
            task per node unless the submission environment says otherwise.
        cpus_per_task: CPUs per task; also passed to ``srun`` (SLURM >= 22.05 no longer
            hands the job's value to srun by itself).
        gpus_per_node: GPUs per node; 0 requests none.
        memory: memory per node (``--mem``), e.g. ``"64G"``, ``"500M"``, ``"0"`` (all of it).
        mem_per_cpu: memory per CPU (``--mem-per-cpu``); exclusive with ``memory``.
        time: time limit in a SLURM format (``"30"``, ``"2:00:00"``, ``"1-12"``, ...).
        partition: partition name (or a comma-separated list); None uses the cluster default.
        account: account to charge.
        signal: ``--signal`` value, e.g. ``"TERM@300"`` so tasks get SIGTERM 300 s before the
            time limit.
        requeue: whether SLURM may requeue the job (rendered either way, never left to the
            cluster's default).
        output: stdout path (SLURM patterns like ``%j`` allowed); opened in append mode.
        error: stderr path; None sends stderr to ``output``.
        chdir: working directory of the job; None is the directory sbatch is run from.
        env: variables exported in the script before ``srun`` (and kept in the submission
            environment even when their names look like SLURM's); sbatch's, salloc's and
            srun's option variables (``SBATCH_*``, ``SALLOC_*``, ``SRUN_*``) are refused.
        extra_directives: more sbatch options, one per ``#SBATCH`` line, e.g.
            ``("--constraint=a100", "--qos=high")``; options the fields above own are refused.
    """

    name: str = attrs.field(
        validator=[_required, _matches(_NAME, "letters, digits, '.', '_', '-'")]
    )
    command: tuple[str, ...] = attrs.field(converter=_command_tuple, validator=_check_command)
    nodes: int = attrs.field(default=1, validator=[_required, _positive])
    tasks_per_node: int | None = attrs.field(default=1, validator=_positive)
    cpus_per_task: int | None = attrs.field(default=None, validator=_positive)
    gpus_per_node: int = attrs.field(default=0, validator=_non_negative)
    memory: str | None = attrs.field(
        default=None, validator=_matches(_MEMORY, "an integer with optional unit K/M/G/T")
    )
    mem_per_cpu: str | None = attrs.field(
        default=None, validator=_matches(_MEMORY, "an integer with optional unit K/M/G/T")
    )
    time: str = attrs.field(default="30", validator=_check_time)
    partition: str | None = attrs.field(
        default=None, validator=_matches(_WORD, "a partition name or comma-separated names")
    )
    account: str | None = attrs.field(
        default=None, validator=_matches(_NAME, "letters, digits, '.', '_', '-'")
    )
    signal: str | None = attrs.field(default=None, validator=_check_signal)
    requeue: bool = attrs.field(default=False, validator=_check_bool)
    output: str | None = attrs.field(default=None, validator=_check_path)
    error: str | None = attrs.field(default=None, validator=_check_path)
    chdir: str | None = attrs.field(default=None, validator=_check_path)
    env: Mapping[str, str] = attrs.field(
        factory=dict, converter=_freeze_env, validator=_check_env, hash=False
    )
    extra_directives: tuple[str, ...] = attrs.field(
        default=(), converter=_directives_tuple, validator=_check_extra
    )
    array: str | None = attrs.field(
        default=None,
        validator=_matches(_ARRAY, "array indices like '0-3', '0,2,5' or '0-15%4'"),
    )

    def __attrs_post_init__(self) -> None:
        if self.memory is not None and self.mem_per_cpu is not None:
            msg = (
                f"memory={self.memory!r} and mem_per_cpu={self.mem_per_cpu!r} are both set; "
                "SLURM allows only one of --mem and --mem-per-cpu"
            )
            raise JobSpecError(msg)

    @property
    def num_tasks(self) -> int | None:
        """Total tasks, ``nodes * tasks_per_node``; None when SLURM decides."""
        return None if self.tasks_per_node is None else self.nodes * self.tasks_per_node

    @property
    def time_seconds(self) -> int | None:
        """The time limit in seconds; None for UNLIMITED."""
        return time_limit_seconds(self.time)


def render_script(job: JobSpec) -> str:
    """The sbatch script for ``job``: ``#SBATCH`` directives, exports, then ``exec srun``.

    The text depends only on ``job`` (no dates, hosts or user names), so it can be compared,
    stored next to a run and tested.
    """
    directives = [f"--job-name={job.name}", f"--nodes={job.nodes}"]
    if job.array is not None:
        directives.append(f"--array={job.array}")
    if job.tasks_per_node is not None:
        directives.append(f"--ntasks-per-node={job.tasks_per_node}")
    if job.cpus_per_task is not None:
        directives.append(f"--cpus-per-task={job.cpus_per_task}")
    if job.gpus_per_node:
        directives.append(f"--gpus-per-node={job.gpus_per_node}")
    if job.memory is not None:
        directives.append(f"--mem={job.memory}")
    if job.mem_per_cpu is not None:
        directives.append(f"--mem-per-cpu={job.mem_per_cpu}")
    directives.append(f"--time={job.time}")
    if job.partition is not None:
        directives.append(f"--partition={job.partition}")
    if job.account is not None:
        directives.append(f"--account={job.account}")
    if job.signal is not None:
        directives.append(f"--signal={job.signal}")
    directives.append("--requeue" if job.requeue else "--no-requeue")
    if job.output is not None:
        directives.append(_directive_path("--output", job.output))
    if job.error is not None:
        directives.append(_directive_path("--error", job.error))
    # Append so a requeued or restarted job keeps the earlier attempt's log.
    directives.append("--open-mode=append")
    if job.chdir is not None:
        directives.append(_directive_path("--chdir", job.chdir))
    directives.extend(job.extra_directives)

    srun = ["srun", "--kill-on-bad-exit=1"]
    if job.cpus_per_task is not None:
        srun.append(f"--cpus-per-task={job.cpus_per_task}")

    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives), "", "set -eu"]
    lines.extend(f"export {name}={shlex.quote(value)}" for name, value in sorted(job.env.items()))
    lines.append(f"exec {shlex.join(srun)} {shlex.join(job.command)}")
    return "\n".join(lines) + "\n"
