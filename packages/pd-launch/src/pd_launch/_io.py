"""Job descriptions to and from plain data (JSON, TOML, a pd-train config section)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
from cattrs.v import format_exception

from pd_launch._errors import JobSpecError
from pd_launch._job import JobSpec


def _strict(kind: type, label: str) -> Any:
    def structure(value: Any, _type: Any) -> Any:
        # bool is an int subclass and "false" is truthy: refuse rather than guess.
        if type(value) is not kind:
            msg = f"expected {label}, got {type(value).__name__} {value!r}"
            raise TypeError(msg)
        return value

    return structure


def _string_tuple(value: Any, _type: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        msg = f"expected a list of strings, got {type(value).__name__} {value!r}"
        raise TypeError(msg)
    if not all(isinstance(v, str) for v in value):
        msg = f"expected a list of strings, got {value!r}"
        raise TypeError(msg)
    return tuple(value)


def _string_mapping(value: Any, _type: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        msg = f"expected a table of string values, got {value!r}"
        raise TypeError(msg)
    return dict(value)


converter = cattrs.Converter(forbid_extra_keys=True)
converter.register_structure_hook(int, _strict(int, "an integer"))
converter.register_structure_hook(str, _strict(str, "a string"))
converter.register_structure_hook(bool, _strict(bool, "true or false"))
converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _string_tuple)
converter.register_structure_hook_func(lambda t: t == Mapping[str, str], _string_mapping)
converter.register_unstructure_hook_func(lambda t: t == Mapping[str, str], dict)

_FIELDS = tuple(a.name for a in attrs.fields(JobSpec))


def _format(error: BaseException, kind: Any) -> str:
    # Our own type hooks say what they got; cattrs' default wording drops the value.
    if isinstance(error, TypeError) and str(error).startswith("expected "):
        return str(error)
    return format_exception(error, kind)


def _first_spec_error(error: BaseException) -> JobSpecError | None:
    if isinstance(error, JobSpecError):
        return error
    for inner in getattr(error, "exceptions", ()):
        found = _first_spec_error(inner)
        if found is not None:
            return found
    return None


def job_from_dict(data: Mapping[str, Any], *, where: str = "job") -> JobSpec:
    """A :class:`JobSpec` from plain data; unknown keys and wrong types are errors.

    Raises:
        JobSpecError: naming the field (``job.nodes``), the bad value and what is allowed.
    """
    if not isinstance(data, Mapping):
        msg = f"{where} must be a table of job fields, got {type(data).__name__}"
        raise JobSpecError(msg)
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        msg = f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(_FIELDS)}"
        raise JobSpecError(msg)
    try:
        return converter.structure(dict(data), JobSpec)
    except cattrs.ClassValidationError as e:
        spec_error = _first_spec_error(e)
        if spec_error is not None:
            msg = f"{where}: {spec_error}"
            raise JobSpecError(msg) from e
        problems = [
            p.replace("@ $", f"@ {where}")
            for p in cattrs.transform_error(e, format_exception=_format)
        ]
        msg = f"{where}: " + "; ".join(problems)
        raise JobSpecError(msg) from e


def job_to_dict(job: JobSpec) -> dict[str, Any]:
    """Plain data for ``job`` that :func:`job_from_dict` turns back into an equal JobSpec."""
    data: dict[str, Any] = converter.unstructure(job)
    data["command"] = list(job.command)
    data["extra_directives"] = list(job.extra_directives)
    data["env"] = dict(job.env)
    return data


def load_job(path: str | Path) -> JobSpec:
    """Read a job description from a ``.json`` or ``.toml`` file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        elif path.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            msg = f"job file {str(path)!r}: expected a .json or .toml file"
            raise JobSpecError(msg)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        msg = f"job file {str(path)!r} is not valid {path.suffix[1:].upper()}: {e}"
        raise JobSpecError(msg) from e
    return job_from_dict(data, where=str(path))
