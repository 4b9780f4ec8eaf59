"""Property-based tests of job descriptions (issue 14, item 8).

Around one valid job description, hypothesis changes one field at a time (wrong types, boundary
values, unicode, a missing key, an extra key). Whatever it generates, pd-launch either refuses
with a ``JobSpecError`` that names the field, or builds a job holding exactly the value given
(nothing coerced) whose script renders and which round-trips through plain data. Never another
exception.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pd_launch import JobSpec, JobSpecError, job_from_dict, job_to_dict, render_script

VALID: dict[str, Any] = {
    "name": "llama-spd",
    "command": ["pd-train", "run", "c.yaml"],
    "nodes": 2,
    "tasks_per_node": 4,
    "cpus_per_task": 8,
    "gpus_per_node": 4,
    "memory": "64G",
    "time": "1-00:00:00",
    "partition": "gpu",
    "account": "interp",
    "signal": "TERM@300",
    "requeue": True,
    "output": "runs/%j.out",
    "error": "runs/%j.err",
    "chdir": "/scratch/runs",
    "env": {"XLA_FLAGS": "--x"},
    "extra_directives": ["--constraint=a100"],
}
FIELDS = tuple(a.name for a in attrs.fields(JobSpec))
REQUIRED = ("name", "command")
PROPERTY_SETTINGS = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Values of every JSON/TOML type, boundaries and near misses of the valid ones.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 65535, 65536]),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            " ",
            "30",
            "٣٠",
            "３0",
            "1-12",
            "24:00:00",
            "0",
            "UNLIMITED",
            "ınfınıte",
            "64G",
            "64g",
            "TERM",
            "TERM@65536",
            "B:USR1@60",
            "gpu,debug",
            "my runs/%j.out",
            'a"b',
            "a\\b",
            "x\ny",
            "--job-na=x",
            "--mem-per-gpu=1G",
            "-n4",
            "--qos=high",
            "NAME",
            "\0",
        ]
    ),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=6), SCALARS, max_size=2),
)


def _expected(field: str, value: Any) -> Any:
    """What the job holds when it accepts ``value`` for ``field`` unchanged."""
    if field in ("command", "extra_directives"):
        return tuple(value)
    return value


# Full long options pd-launch sets itself or must control. Independently of how pd-launch
# resolves abbreviations: sbatch reads any prefix of one of these as that option or refuses it
# as ambiguous, so an accepted extra directive must never be spelled as such a prefix.
OWNED = (
    *("--job-name", "--nodes", "--ntasks", "--ntasks-per-node", "--tasks-per-node"),
    *("--cpus-per-task", "--gpus", "--gpus-per-node", "--mem", "--mem-per-cpu", "--mem-per-gpu"),
    *("--time", "--partition", "--account", "--signal", "--requeue", "--no-requeue", "--output"),
    *("--error", "--open-mode", "--chdir", "--export", "--comment", "--parsable", "--array"),
    *("--wait", "--wrap"),
)
OWNED_SHORT = ("-J", "-N", "-n", "-c", "-G", "-t", "-p", "-A", "-o", "-e", "-D", "-a", "-W")


def _check_accepted_job(job: JobSpec, field: str, value: Any) -> None:
    held = getattr(job, field)
    # What sbatch parses as numbers or names must be plain ASCII ('٣٠' is not 30 to sbatch).
    for name in ("time", "memory", "mem_per_cpu", "signal", "partition", "account", "name"):
        text = getattr(job, name)
        assert text is None or (isinstance(text, str) and text.isascii()), (name, text)
    for directive in job.extra_directives:
        written = directive.split("=", 1)[0]
        assert not any(owned.startswith(written) for owned in OWNED), directive
        assert directive[:2] not in OWNED_SHORT, directive
    if field == "env":
        assert dict(held) == value
    else:
        assert held == _expected(field, value), (field, value, held)
        # No bool slipped in as an int, no int as a float: the exact type is kept.
        assert type(held) is type(_expected(field, value))
    render_script(job)
    assert job_from_dict(job_to_dict(job)) == job


@PROPERTY_SETTINGS
@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_one_changed_field_is_refused_by_name_or_kept_exactly(field: str, value: Any) -> None:
    data = {**VALID, field: value}
    try:
        job = job_from_dict(data)
    except JobSpecError as e:
        assert field in str(e), (field, value, str(e))
        return
    _check_accepted_job(job, field, value)


@PROPERTY_SETTINGS
@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_constructor_takes_or_refuses_the_same_way(field: str, value: Any) -> None:
    """``JobSpec(...)`` itself (no converter in front) refuses with a JobSpecError naming the
    field too, e.g. a number for ``time`` or ``"yes"`` for ``requeue``."""
    kwargs = {**VALID, field: value}
    try:
        job = JobSpec(**kwargs)
    except JobSpecError as e:
        assert field in str(e) or (field == "env" and "env" in str(e)), (field, value, str(e))
        return
    _check_accepted_job(job, field, value)


@settings(max_examples=40, derandomize=True, deadline=None)
@given(
    missing=st.sampled_from(FIELDS),
    extra=st.text(min_size=1, max_size=10).filter(lambda k: k not in FIELDS),
)
def test_missing_and_extra_keys(missing: str, extra: str) -> None:
    data = {k: v for k, v in VALID.items() if k != missing}
    try:
        job = job_from_dict(data)
    except JobSpecError as e:
        assert missing in REQUIRED and missing in str(e)
    else:
        assert missing not in REQUIRED
        default = attrs.fields_dict(JobSpec)[missing].default
        default = default.factory() if isinstance(default, attrs.Factory) else default  # type: ignore[misc]
        held = getattr(job, missing)
        assert (dict(held) if missing == "env" else held) == default
    try:
        job_from_dict({**VALID, extra: 1})
    except JobSpecError as e:
        assert "unknown field" in str(e) and extra in str(e)
    else:
        raise AssertionError(f"extra key {extra!r} was accepted")
