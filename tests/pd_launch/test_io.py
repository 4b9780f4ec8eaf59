"""Job descriptions from and to plain data."""

import json
from pathlib import Path

import pytest

from pd_launch import JobSpec, JobSpecError, job_from_dict, job_to_dict, load_job

JOB = JobSpec(
    name="demo",
    command=("python", "-c", "print(1)"),
    nodes=2,
    tasks_per_node=None,
    mem_per_cpu="2G",
    time="2:00:00",
    signal="TERM@300",
    requeue=True,
    env={"A": "1"},
    extra_directives=("--qos=high",),
)


def test_round_trip_through_json() -> None:
    data = json.loads(json.dumps(job_to_dict(JOB)))
    assert job_from_dict(data) == JOB


def test_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        'name = "demo"\ncommand = ["python", "-c", "print(1)"]\nnodes = 2\n'
        'time = "2:00:00"\nrequeue = true\n[env]\nA = "1"\n'
    )
    job = load_job(path)
    assert job.nodes == 2 and job.requeue and dict(job.env) == {"A": "1"}
    assert job.tasks_per_node == 1  # default


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job_to_dict(JOB)))
    assert load_job(path) == JOB


def test_unknown_key_is_named() -> None:
    with pytest.raises(JobSpecError, match=r"unknown field\(s\) ntasks, walltime; allowed: name"):
        job_from_dict({"name": "x", "command": ["true"], "ntasks": 2, "walltime": "1"})


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("nodes", "2", "expected an integer"),
        ("nodes", True, "expected an integer"),
        ("requeue", "false", "expected true or false"),
        ("time", 30, "expected a string"),
        ("command", "echo hi", "expected a list of strings"),
        ("command", ["echo", 1], "expected a list of strings"),
        ("env", {"A": 1}, "expected a table of string values"),
    ],
)
def test_wrong_types_are_refused_not_coerced(field: str, value: object, fragment: str) -> None:
    with pytest.raises(JobSpecError, match=fragment) as info:
        job_from_dict({"name": "x", "command": ["true"], field: value}, where="cfg.launch")
    assert f"cfg.launch.{field}" in str(info.value)


def test_validation_errors_keep_their_message() -> None:
    with pytest.raises(JobSpecError, match=r"job: time='1h' is not a SLURM time limit"):
        job_from_dict({"name": "x", "command": ["true"], "time": "1h"})


def test_missing_required_field() -> None:
    with pytest.raises(JobSpecError, match=r"required field missing @ job.command"):
        job_from_dict({"name": "x"})


def test_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "job.toml"
    bad.write_text("name = \n")
    with pytest.raises(JobSpecError, match="is not valid TOML"):
        load_job(bad)
    other = tmp_path / "job.yaml"
    other.write_text("name: x\n")
    with pytest.raises(JobSpecError, match=r"expected a \.json or \.toml file"):
        load_job(other)
