"""An array job: ``JobSpec.array`` renders ``--array``; a bad index list is refused."""

from __future__ import annotations

import pytest

from pd_launch import JobSpec, JobSpecError, job_from_dict, job_to_dict, render_script


def test_array_renders_one_directive_and_round_trips() -> None:
    job = JobSpec(name="sweep", command=("true",), array="0-3%2")
    script = render_script(job)
    assert "#SBATCH --array=0-3%2\n" in script
    assert job_from_dict(job_to_dict(job)) == job
    assert "--array" not in render_script(JobSpec(name="one", command=("true",)))


@pytest.mark.parametrize("array", ["", "0-", "a", "0-3 ", "1,,2", "0-3%", "-1"])
def test_a_bad_array_is_refused_naming_the_field(array: str) -> None:
    with pytest.raises(JobSpecError, match=r"^array="):
        JobSpec(name="sweep", command=("true",), array=array)


def test_an_array_directive_points_to_the_field() -> None:
    with pytest.raises(JobSpecError, match="use the field 'array'"):
        JobSpec(name="sweep", command=("true",), extra_directives=("--array=0-3",))
