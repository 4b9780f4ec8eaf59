"""Issue 14, item 5: inputs pd-launch used to accept and hand to sbatch (or to the job) wrongly.

Non-ASCII digits, sbatch's abbreviated long options, options that change the task count or the
memory request, the caller's PMI/PMIx/MPI rank variables, and paths with spaces. Where sbatch's
own behaviour is the question, the expectations were checked against Debian 12's sbatch 22.05
(its option parser and its ``#SBATCH`` line reader; see the comments in ``_job.py``).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pd_launch import JobSpec, JobSpecError, path_problem, render_script, scrub_environment
from pd_launch._cli import main


def job(**fields: object) -> JobSpec:
    return JobSpec(name="x", command=["true"], **fields)  # type: ignore[arg-type]


# ------------------------------------------------------------------ non-ASCII digits
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("time", "٣٠"),  # Arabic-Indic 30: \d and int() accept it
        ("time", "３0"),  # fullwidth 3
        ("time", "1-٠٢"),
        ("time", "ınfınıte"),  # dotless i: .upper() gives INFINITE
        ("memory", "٣G"),
        ("mem_per_cpu", "１00M"),
        ("signal", "TERM@３00"),
        ("signal", "USR1@٦٠"),
        ("signal", "１5"),
    ],
)
def test_non_ascii_digits_are_refused_before_sbatch(field: str, value: str) -> None:
    with pytest.raises(JobSpecError, match=rf"{field}=.*(ASCII|not a SLURM --signal value)"):
        job(**{field: value})


def test_non_ascii_time_on_the_command_line_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--dry-run", "--name", "x", "--time", "٣٠", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "time='٣٠' must be ASCII" in err


# ------------------------------------------------------------------ the extra-directive guard
@pytest.mark.parametrize(
    ("directive", "sets"),
    [
        ("--job-na=other", "--job-name (abbreviated --job-na)"),
        ("--partiti=gpu", "--partition (abbreviated --partiti)"),
        ("--sig=TERM@60", "--signal (abbreviated --sig)"),
        ("--acco=x", "--account (abbreviated --acco)"),
        ("--req", "--requeue (abbreviated --req)"),
        ("--ntasks=4", "--ntasks"),
        ("--tasks=4", "--tasks-per-node (abbreviated --tasks)"),
        ("-n4", "-n"),
        ("-n", "-n"),
        ("--mem-per-gpu=10G", "--mem-per-gpu"),
        ("--mem-per-g=10G", "--mem-per-gpu (abbreviated --mem-per-g)"),
        ("--gpus=8", "--gpus"),
        ("-G8", "-G"),
        ("--cpus-per-gpu=4", "--cpus-per-gpu"),
        ("--array=0-3", "--array"),
        ("--wait", "--wait"),
        ("--parsable", "--parsable"),
        ("--get-user-env", "--get-user-env"),
    ],
)
def test_directives_the_launcher_controls_are_refused_however_spelled(
    directive: str, sets: str
) -> None:
    with pytest.raises(JobSpecError, match="which the job description owns") as info:
        job(extra_directives=[directive])
    assert f"sets {sets}," in str(info.value)


@pytest.mark.parametrize(
    ("directive", "candidates"),
    [
        ("--nta=2", "--ntasks, --ntasks-per-core"),
        ("--mem-p=1G", "--mem-per-cpu, --mem-per-gpu"),
        ("--gpu=1", "--gpu-bind, --gpu-freq, --gpus"),
        ("--par", "--parsable, --partition"),
    ],
)
def test_ambiguous_abbreviations_are_refused_as_sbatch_would(
    directive: str, candidates: str
) -> None:
    with pytest.raises(JobSpecError, match="write the option in full") as info:
        job(extra_directives=[directive])
    assert candidates in str(info.value)


@pytest.mark.parametrize(
    "directive",
    [
        "--constraint=a100",
        "--exclusive",
        "--qos=high",
        "--gres=gpu:8",
        "--ntasks-per-core=1",
        "--nodelist=gpu[01-04]",
        "--cons=h100",  # unambiguous abbreviation of --constraint, not owned
        "--some-future-option=1",  # unknown here: sbatch judges it
    ],
)
def test_other_directives_pass_unchanged(directive: str) -> None:
    rendered = render_script(job(extra_directives=[directive]))
    assert f"#SBATCH {directive}\n" in rendered


# ------------------------------------------------------------------ the scrub rule
LAUNCHED = {
    # srun --mpi=pmi2 (SLURM's PMI-2 plugin) in a task of another job
    "PMI_RANK": "3",
    "PMI_SIZE": "8",
    "PMI_FD": "5",
    "PMI_JOBID": "77.0",
    "PMI_SPAWNED": "0",
    # PMIx / PRRTE
    "PMIX_NAMESPACE": "slurm.pmix.77.0",
    "PMIX_SERVER_URI41": "pmix-server.1;tcp4://127.0.0.1:1",
    "PRTE_MCA_prte_base_jobid": "1",
    # Open MPI's mpirun
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3",
    "OMPI_MCA_orte_hnp_uri": "123.0;tcp://10.0.0.1:5000",
    "OMPI_MCA_ess_base_vpid": "3",
    "OMPI_MCA_pmix": "^s1,s2,cray,isolated",
    "OMPI_UNIVERSE_SIZE": "8",
    # MVAPICH2, Hydra, Cray PALS, slurmd
    "MV2_COMM_WORLD_RANK": "3",
    "MPIRUN_RANK": "3",
    "MPI_LOCALRANKID": "3",
    "PALS_RANKID": "3",
    "SLURMD_NODENAME": "gpu07",
}
USER_SETTINGS = {
    "OMPI_MCA_btl_tcp_if_include": "eth0",
    "I_MPI_FABRICS": "shm:ofi",
    "NCCL_DEBUG": "INFO",
    "UCX_TLS": "rc",
    "MY_PMI_NOTE": "prefix only counts at the start",
    "PATH": "/usr/bin",
}


def test_rank_variables_of_every_launcher_are_scrubbed_and_settings_kept() -> None:
    scrubbed = scrub_environment({**LAUNCHED, **USER_SETTINGS})
    assert scrubbed.removed == tuple(sorted(LAUNCHED))
    assert dict(scrubbed.env) == USER_SETTINGS


def test_a_job_may_still_set_a_scrubbed_name_itself() -> None:
    scrubbed = scrub_environment({"PMI_RANK": "3"}, overrides={"PMI_RANK": "0"})
    assert scrubbed.removed == () and scrubbed.env["PMI_RANK"] == "0"


# ------------------------------------------------------------------ paths with spaces
def sbatch_arguments(line: str) -> list[str]:
    """The words sbatch reads from an ``#SBATCH`` line's options: quotes group, a backslash
    escapes the next character, an unquoted ``#`` starts a comment (as sbatch's reader does)."""
    words: list[str] = []
    current: list[str] = []
    started = escape = False
    quote = ""
    for ch in line:
        if escape:
            current.append(ch)
            escape = False
        elif ch == "\\":
            escape = started = True
        elif quote:
            if ch == quote:
                quote = ""
            else:
                current.append(ch)
        elif ch in "\"'":
            quote, started = ch, True
        elif ch == "#":
            break
        elif ch.isspace():
            if started:
                words.append("".join(current))
                current, started = [], False
        else:
            current.append(ch)
            started = True
    if started:
        words.append("".join(current))
    return words


def directive_values(script: str) -> dict[str, str]:
    values = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            for word in sbatch_arguments(line.removeprefix("#SBATCH ")):
                option, _, value = word.partition("=")
                values[option] = value
    return values


@pytest.mark.parametrize(
    "path",
    ["/scratch/my runs/r 1/logs/slurm-%j.out", "/tmp/it's here/x", "/data/#7/out", "plain/%j.out"],
)
def test_paths_with_spaces_quotes_and_hashes_reach_sbatch_intact(path: str) -> None:
    script = render_script(job(output=path, error=path, chdir=path))
    values = directive_values(script)
    assert values["--output"] == values["--error"] == values["--chdir"] == path


@pytest.mark.parametrize("path", ['/a "b"/c', "/a\\b", "/a\nb", "/a\tb", ""])
def test_paths_sbatch_cannot_read_back_are_refused(path: str) -> None:
    assert path_problem(path) is not None
    with pytest.raises(JobSpecError, match="chdir="):
        job(chdir=path)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    path=st.one_of(
        st.text(max_size=20),
        st.text(alphabet=" #'\"\\%/ab\t\n", max_size=12),
    )
)
def test_any_path_is_refused_or_reaches_sbatch_intact(path: str) -> None:
    try:
        spec = job(output=path, chdir=path)
    except JobSpecError as e:
        assert path_problem(path) is not None and "output=" in str(e)
        return
    values = directive_values(render_script(spec))
    assert values["--output"] == values["--chdir"] == path


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "--dry-run", "--name", "x", "--nodes", "٣", "--", "true"],
        ["submit", "--dry-run", "--name", "x", "--nodes", "3_0", "--", "true"],
        ["submit", "--dry-run", "--name", "x", "--cpus-per-task", "+4", "--", "true"],
        ["submit", "--dry-run", "--name", "x", "--wait", "nan", "--", "true"],
        ["wait", "12", "--timeout", "nan"],
        ["wait", "12", "--timeout", "-1"],
        ["wait", "12", "--timeout", "inf"],
        ["wait", "12", "--timeout", "٣"],
    ],
)
def test_command_line_numbers_are_ascii_and_finite(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """int() read '٣' as 3 and '3_0' as 30; float() read 'nan', with which wait never ends."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "is not an integer (ASCII digits)" in err or "is not a finite number" in err, err


def test_wait_refuses_a_timeout_that_cannot_end() -> None:
    from pd_launch._slurm import wait

    for timeout in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match=r"timeout=.* must be a finite number of seconds"):
            wait("12", timeout=timeout, env={"PATH": ""})


STEP_TASK_0 = {
    "SLURM_JOB_ID": "19",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NODELIST": "vm",
    "SLURM_STEP_TASKS_PER_NODE": "2",
}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SLURM_PROCID", "٠"),
        ("SLURM_PROCID", " 0"),
        ("SLURM_STEP_NUM_TASKS", "2_0"),
        ("SLURM_STEP_NUM_TASKS", "+2"),
        ("SLURM_JOB_ID", "١٩"),
    ],
)
def test_step_variables_are_ascii_integers(name: str, value: str) -> None:
    from pd_launch import SlurmStepError, slurm_process

    assert slurm_process(STEP_TASK_0).num_processes == 2
    with pytest.raises(SlurmStepError, match=name):
        slurm_process({**STEP_TASK_0, name: value})


@pytest.mark.parametrize("port", [True, 0, 65536, 1.5, "1234"])
def test_port_must_be_an_integer_port(port: object) -> None:
    from pd_launch import SlurmStepError, slurm_process

    with pytest.raises(SlurmStepError, match="is not a TCP port"):
        slurm_process(STEP_TASK_0, port=port)  # type: ignore[arg-type]
