"""Issue 30, item 6: the caller's SLURM settings that used to break queries, override a job's
fields or be dropped silently; strings too long to exec; SLURM_CONF; the CLI's exit codes.

No cluster here (tests/slurm/test_caller_settings.py has the same cases on the test cluster).
Where a real program answers (the kernel's exec limit, a squeue that fails), a real process runs.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pd_launch import (
    ALLOCATION_NAMES,
    MAX_ARG_STRLEN,
    JobSpec,
    JobSpecError,
    SlurmConfigError,
    check_slurm_conf,
    env_problem,
    in_allocation,
    job_from_dict,
    job_status,
    prepare_submission,
    query_environment,
    scrub_environment,
)


def job(**fields: object) -> JobSpec:
    return JobSpec(**{"name": "x", "command": ["true"], **fields})  # type: ignore[arg-type]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    return subprocess.run(
        [sys.executable, "-m", "pd_launch", *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=60,
        check=False,
    )


# ------------------------------------------------------------------ queries and cancels
QUERY_SETTINGS = {
    "SQUEUE_USERS": "nobody",
    "SQUEUE_PARTITION": "short",
    "SQUEUE_NAMES": "other",
    "SQUEUE_STATES": "RUNNING",
    "SQUEUE_FORMAT": "%i",
    "SCANCEL_PARTITION": "short",
    "SCANCEL_NAME": "other",
    "SCANCEL_INTERACTIVE": "1",
    "SCANCEL_USER": "nobody",
    "SACCT_FEDERATION": "1",
    "SACCT_FORMAT": "jobid",
}


def test_queries_run_without_the_callers_query_settings() -> None:
    caller = {**QUERY_SETTINGS, "PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm.conf"}
    caller["SLURM_JOB_ID"] = "7"
    assert query_environment(caller) == {"PATH": "/usr/bin", "SLURM_CONF": "/etc/slurm.conf"}
    # A submission keeps them: the job's own shell may want the user's squeue defaults.
    assert set(QUERY_SETTINGS) <= set(scrub_environment(caller).env)


def _fake_squeue(tmp_path: Path) -> Path:
    """A squeue that logs the variables it was started with and fails like an unreachable
    controller does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(
        "#!/bin/sh\n"
        f"env > {tmp_path}/squeue.env\n"
        "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2\n"
        "exit 1\n"
    )
    squeue.chmod(squeue.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_status_failure_exits_4_and_squeue_never_sees_query_settings(tmp_path: Path) -> None:
    bin_dir = _fake_squeue(tmp_path)
    result = _cli("status", "12", env={**QUERY_SETTINGS, "PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert result.returncode == 4, result.stderr
    assert "squeue failed for job 12 (exit 1): slurm_load_jobs error" in result.stderr
    seen = (tmp_path / "squeue.env").read_text().splitlines()
    assert not [line for line in seen if line.startswith(("SQUEUE_", "SCANCEL_", "SACCT_"))]


# ------------------------------------------------------------------ option variables in env
@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("SBATCH_TIMELIMIT", "sbatch's variable for --time, which would override the job's "
         "#SBATCH lines; use the field 'time' instead"),
        ("SBATCH_JOB_NAME", "variable for --job-name, .*; use the field 'name' instead"),
        ("SBATCH_PARTITION", "variable for --partition, .*; use the field 'partition' instead"),
        ("SBATCH_EXPORT", "variable for --export, .*use the field 'env \\(pd-launch controls"),
        ("SBATCH_QOS", "variable for --qos, .*; use extra_directives=\\['--qos=...'\\]"),
        ("SBATCH_REQUEUE", "variable for --requeue, .*; use the field 'requeue' instead"),
        ("SBATCH_OVERCOMMIT", "use extra_directives=\\['--overcommit'\\]"),
        ("SBATCH_SOMETHING_NEW", "SBATCH_\\* variables are sbatch's options"),
        ("SALLOC_PARTITION", "SALLOC_\\* variables are salloc's options"),
        ("SRUN_CPUS_PER_TASK", "SRUN_\\* variables are srun's options"),
    ],
)  # fmt: skip
def test_option_variables_in_env_are_refused_by_name(name: str, says: str) -> None:
    with pytest.raises(JobSpecError, match=f"env key '{name}'.*{says}"):
        job(env={name: "5"})
    with pytest.raises(JobSpecError, match=f"env key '{name}'"):
        job_from_dict({"name": "x", "command": ["true"], "env": {name: "5"}})


def test_other_slurm_names_in_env_stay_allowed() -> None:
    # SLURM_* inside the job are srun's inputs the user may mean to set (documented).
    assert job(env={"SLURM_CPU_BIND": "none"}).env["SLURM_CPU_BIND"] == "none"
    assert env_problem("MY_SBATCH_NOTE", "x") is None


def test_option_variable_on_the_command_line_exits_2() -> None:
    result = _cli(
        "submit", "--dry-run", "--name", "x", "--env", "SBATCH_TIMELIMIT=5", "--", "true", env={}
    )
    assert result.returncode == 2
    assert "env key 'SBATCH_TIMELIMIT' is sbatch's variable for --time" in result.stderr
    assert result.stdout == ""
    malformed = _cli(
        "submit", "--dry-run", "--name", "x", "--env", "NOEQUALS", "--", "true", env={}
    )
    assert malformed.returncode == 2
    assert "--env 'NOEQUALS': expected NAME=VALUE" in malformed.stderr


# ------------------------------------------------------------------ the kernel's string limit
def _exec_errno(argv: list[str], env: dict[str, str]) -> int:
    try:
        subprocess.run(argv, env=env, check=True)
    except OSError as e:
        return e.errno or -1
    return 0


def test_the_limit_is_the_kernels() -> None:
    # The longest accepted argument and environment string exec; one byte more does not.
    assert MAX_ARG_STRLEN == 131072
    assert _exec_errno(["true", "x" * 131071], {}) == 0
    assert _exec_errno(["true", "x" * 131072], {}) == errno.E2BIG
    assert _exec_errno(["true"], {"A": "x" * (131071 - 2)}) == 0
    assert _exec_errno(["true"], {"A": "x" * (131072 - 2)}) == errno.E2BIG


def test_arguments_at_the_limit_pass_and_over_it_are_refused() -> None:
    assert job(command=["echo", "x" * 131071]).command[1] == "x" * 131071
    with pytest.raises(JobSpecError, match=r"command\[2\]='xxx.*is 131072 bytes \(UTF-8\)") as e:
        job(command=["echo", "ok", "x" * 131072])
    assert "Argument list too long" in str(e.value)
    assert len(str(e.value)) < 1000  # the value is shown shortened
    # Bytes, not characters: 65536 two-byte characters are 131072 bytes.
    with pytest.raises(JobSpecError, match=r"command\[1\]=.* is 131072 bytes"):
        job(command=["echo", "é" * 65536])


def test_env_strings_at_the_limit_pass_and_over_it_are_refused() -> None:
    # NAME=value counts whole: "AB=" is 3 bytes.
    assert len(job(env={"AB": "x" * (131071 - 3)}).env["AB"]) == 131068
    with pytest.raises(JobSpecError, match=r"env\['AB'\]=.*: AB=VALUE is 131072 bytes"):
        job(env={"AB": "x" * (131072 - 3)})


def test_too_long_argument_in_a_job_file_exits_2(tmp_path: Path) -> None:
    # (An argv string that long cannot even start pd-launch, hence a file.)
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"name": "x", "command": ["echo", "y" * 131072]}))
    result = _cli("submit", "--dry-run", "--job", str(path), env={})
    assert result.returncode == 2
    assert "command[1]=" in result.stderr and "131072 bytes" in result.stderr


# ------------------------------------------------------------------ dropped sbatch defaults
SITE_DEFAULTS = {
    "SBATCH_ACCOUNT": "proj42",
    "SBATCH_QOS": "high",
    "SBATCH_RESERVATION": "maint",
    "SBATCH_EXCLUSIVE": "",
    "SBATCH_EXPORT": "NONE",
    "SBATCH_TIMELIMIT": "5",  # the job sets --time itself: nothing lost
    "PATH": "/usr/bin",
}


def test_dropped_defaults_are_named_in_one_line_with_how_to_keep_them() -> None:
    prepared = prepare_submission(job(), env=SITE_DEFAULTS)
    assert set(SITE_DEFAULTS) - {"PATH"} <= set(prepared.removed)
    assert prepared.dropped_defaults == (
        "the caller's sbatch defaults SBATCH_ACCOUNT='proj42', SBATCH_EXCLUSIVE='', "
        "SBATCH_EXPORT='NONE', SBATCH_QOS='high', SBATCH_RESERVATION='maint' are not passed on "
        "(pd-launch submits without SBATCH_* variables, which would override the job's own "
        "#SBATCH lines); to keep them, set account='proj42' and add '--exclusive', "
        "'--qos=high', '--reservation=maint' to extra_directives in the job; cannot be kept: "
        "SBATCH_EXPORT (--export is pd-launch's: env (pd-launch controls the submission "
        "environment))"
    )
    assert "\n" not in prepared.dropped_defaults


def test_following_the_advice_silences_the_warning() -> None:
    kept = job(
        account="proj42",
        extra_directives=["--qos=high", "--reservation=maint", "--exclusive"],
    )
    env = {k: v for k, v in SITE_DEFAULTS.items() if k != "SBATCH_EXPORT"}
    assert prepare_submission(kept, env=env).dropped_defaults is None
    assert prepare_submission(job(), env={"PATH": "/usr/bin"}).dropped_defaults is None


def test_dry_run_prints_the_warning_line() -> None:
    result = _cli(
        "submit", "--dry-run", "--name", "x", "--", "true",
        env={"SBATCH_ACCOUNT": "proj42", "SBATCH_PARTITION": "gpu"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    warning = [line for line in result.stdout.splitlines() if line.startswith("# warning:")]
    assert warning == [
        "# warning: the caller's sbatch defaults SBATCH_ACCOUNT='proj42', "
        "SBATCH_PARTITION='gpu' are not passed on (pd-launch submits without SBATCH_* "
        "variables, which would override the job's own #SBATCH lines); to keep them, set "
        "account='proj42', partition='gpu' in the job"
    ]


# ------------------------------------------------------------------ GPU visibility, TMPDIR
ALLOCATED = {
    "CUDA_VISIBLE_DEVICES": "0,1",
    "NVIDIA_VISIBLE_DEVICES": "0,1",
    "ROCR_VISIBLE_DEVICES": "0,1",
    "HIP_VISIBLE_DEVICES": "0,1",
    "GPU_DEVICE_ORDINAL": "0,1",
    "ZE_AFFINITY_MASK": "0,1",
    "TMPDIR": "/local/slurm-41",
}


def test_allocation_names_are_dropped_inside_a_job() -> None:
    assert set(ALLOCATED) == ALLOCATION_NAMES
    caller = {**ALLOCATED, "SLURM_JOB_ID": "41", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert in_allocation(caller)
    scrubbed = scrub_environment(caller)
    assert dict(scrubbed.env) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert set(scrubbed.removed) == {*ALLOCATED, "SLURM_JOB_ID"}
    # The older spelling alone says the same.
    assert not set(ALLOCATED) & set(scrub_environment({**ALLOCATED, "SLURM_JOBID": "41"}).env)


def test_allocation_names_are_kept_outside_a_job() -> None:
    assert not in_allocation(ALLOCATED) and not in_allocation({"SLURM_JOB_ID": ""})
    scrubbed = scrub_environment(ALLOCATED)
    assert dict(scrubbed.env) == ALLOCATED and scrubbed.removed == ()


def test_a_job_may_set_them_itself() -> None:
    prepared = prepare_submission(
        job(env={"CUDA_VISIBLE_DEVICES": "3", "TMPDIR": "/scratch/me"}),
        env={**ALLOCATED, "SLURM_JOB_ID": "41"},
    )
    assert prepared.env["CUDA_VISIBLE_DEVICES"] == "3" and prepared.env["TMPDIR"] == "/scratch/me"
    assert "CUDA_VISIBLE_DEVICES" not in prepared.removed
    assert "ROCR_VISIBLE_DEVICES" in prepared.removed


# ------------------------------------------------------------------ SLURM_CONF
@pytest.mark.parametrize(
    ("conf", "says"),
    [("/nonexistent/slurm.conf", "does not exist"), ("", "is empty"), ("/", "is not a file")],
)
def test_unreadable_slurm_conf_fails_at_once(conf: str, says: str) -> None:
    with pytest.raises(SlurmConfigError, match=f"SLURM_CONF='{conf}' {says}; SLURM's commands"):
        check_slurm_conf({"SLURM_CONF": conf})
    start = time.monotonic()
    with pytest.raises(SlurmConfigError):
        job_status(5, env={"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"})
    assert time.monotonic() - start < 5


def test_readable_or_unset_slurm_conf_passes(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    check_slurm_conf({"SLURM_CONF": str(conf)})
    check_slurm_conf({})


def test_unreadable_slurm_conf_on_the_command_line_exits_2(tmp_path: Path) -> None:
    bin_dir = _fake_squeue(tmp_path)
    env = {"SLURM_CONF": "/nonexistent", "PATH": f"{bin_dir}:/usr/bin:/bin"}
    for args in (("status", "5"), ("cancel", "5"), ("wait", "5", "--timeout", "5")):
        result = _cli(*args, env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert "SLURM_CONF='/nonexistent' does not exist" in result.stderr
    assert not (tmp_path / "squeue.env").exists()  # no SLURM command ran


def test_help_lists_the_exit_codes() -> None:
    for args in ((), ("submit",), ("wait",)):
        text = _cli(*args, "--help", env={}).stdout
        assert "3  sbatch rejected the submission" in text
        assert "2  bad input" in text
