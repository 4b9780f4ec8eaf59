"""``pd-train submit`` without a cluster: dry run, validation before anything is written, the run
dir's contents, and what is left when sbatch is missing or refuses the job.

Where sbatch's answer matters, a stand-in ``sbatch`` script on PATH records its arguments and
either accepts (prints a job id) or rejects the job the way sbatch does; the real cluster is
exercised in tests/slurm/test_pd_train_submit.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pd_train import cli
from pd_train.cli.submit import snapshot_code
from pd_train.config import io as _config_io
from pd_train.config.launch import LaunchConfig

TINY = {
    "run_name": "tiny-submit",
    "output_dir": "runs",
    "target": {"checkpoint": "builtin:tiny_llama"},
    "data": {"path": "builtin:tiny_corpus", "seq_len": 16},
    "pd": {
        "steps": 4,
        "batch_size": 4,
        "decomposition_targets": [{"module_pattern": "layers.*.mlp.*", "C": 8}],
        "loss_metrics": [
            {"type": "faithfulness", "coeff": 1.0},
            {"type": "stochastic_recon", "coeff": 1.0},
        ],
        "components": {"lr": 1e-3},
        "ci_fn": {"lr": 1e-3},
    },
    "cadence": {"train_log_every": 1},
    "launch": {"time": "10", "tasks_per_node": 2, "env": {"JAX_PLATFORMS": "cpu"}},
}

ACCEPT = '#!/bin/bash\nprintf \'%s\\n\' "$@" > "$0.args"\necho 4242\n'
# Records the environment sbatch runs with (bash builtins only: PATH holds nothing else), then
# accepts.
ENV_RECORDING = (
    '#!/bin/bash\nfor n in $(compgen -e); do echo "$n=${!n}"; done > "$0.env"\n'
    'printf \'%s\\n\' "$@" > "$0.args"\necho 4242\n'
)
REJECT = (
    '#!/bin/bash\nprintf \'%s\\n\' "$@" > "$0.args"\n'
    "echo 'sbatch: error: Batch job submission failed: Invalid account or account/partition "
    "combination specified' >&2\nexit 1\n"
)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean working directory holding ``tiny.yaml``; no caller SLURM variables."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    monkeypatch.chdir(work)
    from pd_launch import is_scrubbed

    for name in list(os.environ):
        if is_scrubbed(name):
            monkeypatch.delenv(name)
    return work


def _fake_sbatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str | None
) -> Path | None:
    """PATH holds only a stand-in sbatch (or nothing at all when ``script`` is None)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    if script is None:
        return None
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(script)
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IXUSR)
    return sbatch


def _everything_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_dry_run_prints_script_and_scrubbed_variables_and_writes_nothing(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_MEM_PER_CPU", "100")
    monkeypatch.setenv("SBATCH_PARTITION", "debug")
    code = cli.main(
        ["submit", "tiny.yaml", "--dry-run", "--set", "launch.nodes=2", "--run-dir", "r1"]
    )
    out = capsys.readouterr().out
    assert code == 0
    run_dir = workdir / "r1"
    assert out.startswith("#!/bin/bash\n#SBATCH --job-name=tiny-submit\n#SBATCH --nodes=2\n")
    assert "#SBATCH --ntasks-per-node=2\n" in out
    assert "#SBATCH --signal=TERM@300\n#SBATCH --requeue\n" in out
    assert f"#SBATCH --output={run_dir}/logs/slurm-%j.out\n" in out
    assert f"#SBATCH --chdir={workdir}\n" in out
    assert f"export PD_RUN_DIR={run_dir}\n" in out
    assert "--distributed slurm --process-per node" in out
    assert '-m pd_train.cli run "$PD_RUN_DIR/config.yaml" --run-dir "$PD_RUN_DIR"' in out
    assert "# --dry-run: nothing written, nothing submitted." in out
    assert f"# run dir: {run_dir}" in out
    removed = out.split("caller variables:\n", 1)[1].split("# Set by")[0]
    assert removed.split() == [
        "#",
        "SBATCH_PARTITION",
        "#",
        "SLURM_JOB_ID",
        "#",
        "SLURM_MEM_PER_CPU",
    ]
    assert _everything_under(workdir) == ["tiny.yaml"]


def test_dry_run_needs_no_sbatch(
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _fake_sbatch(tmp_path, monkeypatch, None)
    assert cli.main(["submit", "tiny.yaml", "--dry-run"]) == 0
    assert "#SBATCH --time=10\n" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("override", "path", "words"),
    [
        ("launch.time='1:99:00'", "launch.time", "minutes after hours must be below 60"),
        ("launch.time=14400", "launch.time", "got the number 14400; a time limit is a string"),
        ("launch.time=٣٠", "launch.time", "must be ASCII"),
        ("launch.signal=TERM@３0", "launch.signal", "not a SLURM --signal value"),
        ("launch.mem=٣G", "launch.mem", "(ASCII)"),
        ("launch.job_name='my job'", "launch.job_name", "job_name='my job' is not allowed"),
        ("launch.extra_directives=[--job-na=x]", "launch.extra_directives", "--job-name"),
        ("launch.extra_directives=[-n4]", "launch.extra_directives", "sets -n"),
        ("launch.extra_directives=[--mem-per-gpu=1G]", "launch.extra_directives", "memory"),
        ("launch.nodes=0", "launch.nodes", "must be > 0"),
        ("launch.signal=TERM@600", "launch.signal", "told to stop as it starts"),
        ("launch.gpus=1", "launch.gpus", "unknown field"),
        ("launch.tasks_per_node=3", "launch.tasks_per_node", "pd.batch_size=4"),
        ("launch.extra_directives=[--time=5]", "launch.extra_directives", "use the field 'time'"),
        ("pd.steps=0", "pd.steps", "must be > 0"),
        ("data.path=missing.npy", "data.path", "does not exist"),
    ],
)
def test_bad_config_exits_2_before_anything_is_written_or_submitted(
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    override: str,
    path: str,
    words: str,
) -> None:
    sbatch = _fake_sbatch(tmp_path, monkeypatch, ACCEPT)
    assert sbatch is not None
    assert cli.main(["submit", "tiny.yaml", "--set", override]) == 2
    err = capsys.readouterr().err
    assert f"{path}:" in err and words in err, err
    assert _everything_under(workdir) == ["tiny.yaml"]
    assert not Path(f"{sbatch}.args").exists()


def test_existing_run_dir_is_refused(
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sbatch = _fake_sbatch(tmp_path, monkeypatch, ACCEPT)
    (workdir / "taken").mkdir()
    assert cli.main(["submit", "tiny.yaml", "--run-dir", "taken"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert _everything_under(workdir) == ["taken", "tiny.yaml"]
    assert not Path(f"{sbatch}.args").exists()


def test_no_sbatch_on_path_is_a_clear_error_and_leaves_no_run_dir(
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _fake_sbatch(tmp_path, monkeypatch, None)
    assert cli.main(["submit", "tiny.yaml"]) == 1
    err = capsys.readouterr().err
    assert "sbatch is not on PATH" in err and "Nothing was written" in err
    assert _everything_under(workdir) == ["tiny.yaml"]


def test_rejected_submission_carries_sbatchs_message_and_removes_the_run_dir(
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sbatch = _fake_sbatch(tmp_path, monkeypatch, REJECT)
    assert cli.main(["submit", "tiny.yaml", "--run-dir", "r"]) == 1
    err = capsys.readouterr().err
    assert "Invalid account or account/partition combination specified" in err
    assert "was removed" in err
    # sbatch did get the script inside the run dir: the dir existed, and is gone again.
    args = Path(f"{sbatch}.args").read_text().split()
    assert args[-1] == str(workdir / "r" / "job.sh")
    assert _everything_under(workdir) == ["tiny.yaml"]


def test_accepted_submission_leaves_a_complete_run_dir(
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pd_launch import render_script
    from pd_train.cli.submit import build_job
    from pd_train.config.run import load_config

    sbatch = _fake_sbatch(tmp_path, monkeypatch, ACCEPT)
    monkeypatch.setenv("SLURM_NTASKS", "2")  # as if submitted from inside an allocation
    assert cli.main(["submit", "tiny.yaml", "--run-dir", "r", "--set", "launch.mem=1G"]) == 0
    out = capsys.readouterr().out
    run_dir = workdir / "r"
    assert "submitted job 4242" in out
    assert f"log:     {run_dir}/logs/slurm-4242.out" in out
    names = {p.name for p in run_dir.iterdir()} - {"code.diff", "code-untracked.tar.gz"}
    assert names == {"config.yaml", "code.json", "job.sh", "logs", "submission.json"}
    assert not [p for p in workdir.iterdir() if p.name.startswith(".")]

    config, _ = load_config(run_dir / "config.yaml")
    assert config.launch.mem == "1G" and config.pd.steps == 4
    assert (run_dir / "job.sh").read_text() == render_script(
        build_job(config, run_dir, chdir=workdir)
    )
    assert Path(f"{sbatch}.args").read_text().split()[-1] == str(run_dir / "job.sh")

    record = json.loads((run_dir / "submission.json").read_text())
    assert record["job_id"] == "4242"
    assert record["log"] == str(run_dir / "logs" / "slurm-4242.out")
    assert record["removed_env"] == ["SLURM_NTASKS"]
    assert record["overrides"] == ["launch.mem=1G"]
    assert record["job_env"]["PD_RUN_DIR"] == str(run_dir)
    code = json.loads((run_dir / "code.json").read_text())
    assert code["packages"]["pd-train"]["version"] and code["packages"]["pd-launch"]["version"]


def test_config_relative_paths_become_absolute_in_the_run_dir(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pd_train.assets import tiny_corpus_path
    from pd_train.run import prepare

    configs = tmp_path / "configs"
    (configs / "data").mkdir(parents=True)
    shutil.copy(tiny_corpus_path(), configs / "data" / "corpus.npy")
    raw = {**TINY, "data": {**TINY["data"], "path": "data/corpus.npy"}}
    (configs / "tiny.yaml").write_text(yaml.safe_dump(raw))
    _fake_sbatch(tmp_path, monkeypatch, ACCEPT)
    assert cli.main(["submit", str(configs / "tiny.yaml"), "--run-dir", "r"]) == 0
    saved = workdir / "r" / "config.yaml"
    assert yaml.safe_load(saved.read_text())["data"]["path"] == str(configs / "data/corpus.npy")
    # The saved copy validates on its own, as the job will read it.
    assert prepare(saved, for_run=True).data_path == configs / "data" / "corpus.npy"


def test_launch_section_errors_name_the_field() -> None:
    def problems(raw: dict[str, object]) -> list[tuple[str, str]]:
        with pytest.raises(_config_io.ConfigError) as info:
            _config_io.structure(raw, LaunchConfig)
        return info.value.problems

    ((path, message),) = problems({"mem": "1G", "mem_per_cpu": "2G"})
    assert path == "mem_per_cpu" and "only one of --mem and --mem-per-cpu" in message
    ((path, message),) = problems({"env": {"BAD NAME": "1"}})
    assert path == "env" and "'BAD NAME' is not a variable name" in message
    ((path, message),) = problems({"process_per": "device"})
    assert path == "process_per" and "set gpus_per_node or tasks_per_node" in message
    ((path, _),) = problems({"setup": ["  "]})
    assert path == "setup[0]"
    ((path, message),) = problems({"time": "1", "signal": "USR1"})  # 60 s lead by default
    assert path == "signal" and "60 s before the time limit" in message
    assert _config_io.structure({"time": "2", "signal": "USR1"}, LaunchConfig).signal == "USR1"


def test_processes_per_node() -> None:
    assert LaunchConfig().processes_per_node == 1
    assert LaunchConfig(gpus_per_node=8).processes_per_node == 1
    assert LaunchConfig(gpus_per_node=8, process_per="device").processes_per_node == 8
    assert LaunchConfig(tasks_per_node=2, process_per="device").processes_per_node == 2


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        timeout=30,
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_code_snapshot_of_a_git_checkout(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("ignored.txt\n")
    (repo / "model.py").write_text("x = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    (repo / "model.py").write_text("x = 2\n")
    (repo / "new.py").write_text("y = 3\n")
    (repo / "ignored.txt").write_text("secret\n")
    (repo / "big.bin").write_bytes(b"\0" * ((1 << 20) + 1))
    dest = tmp_path / "dest"
    dest.mkdir()

    record = snapshot_code(dest, search=[tmp_path / "not-a-dir", repo])

    git = record["git"]
    assert git["root"] == str(repo) and len(git["commit"]) == 40 and git["dirty"]
    assert "-x = 1\n+x = 2" in (dest / "code.diff").read_text()
    assert git["untracked_files"] == ["new.py"] and git["untracked_skipped"] == ["big.bin"]
    with tarfile.open(dest / "code-untracked.tar.gz") as tar:
        assert tar.getnames() == ["new.py"]
        member = tar.extractfile("new.py")
        assert member is not None and member.read() == b"y = 3\n"
    assert record["packages"]["pd-train"]["version"]


def test_code_snapshot_outside_git_still_records_packages(tmp_path: Path) -> None:
    record = snapshot_code(tmp_path, search=[tmp_path])
    assert record["git"] is None and "pd-launch" in record["packages"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("entries", "resumes"),
    [
        ([], False),
        (["3.orbax-checkpoint-tmp-1712"], False),  # a save that never finished
        (["3"], True),
        (["2", "4"], True),
    ],
)
def test_job_command_resumes_from_a_finished_checkpoint(
    tmp_path: Path, entries: list[str], resumes: bool
) -> None:
    from pd_train.cli.submit import job_command

    run_dir = tmp_path / "run dir"  # a space survives the quoting
    (run_dir / "checkpoints").mkdir(parents=True)
    for name in entries:
        (run_dir / "checkpoints" / name).mkdir()
    launch = LaunchConfig(
        python="echo", setup=("echo setup ran",), process_per="device", gpus_per_node=2
    )
    result = subprocess.run(
        job_command(launch, run_dir),
        env={"PATH": os.environ["PATH"], "PD_RUN_DIR": str(run_dir)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    flags = "--distributed slurm --process-per device"
    if resumes:
        expected = f"-m pd_train.cli run --resume {run_dir} {flags}"
    else:
        expected = f"-m pd_train.cli run {run_dir}/config.yaml --run-dir {run_dir} {flags}"
    assert result.stdout == f"setup ran\n{expected}\n"


# --------------------------------------------------------------------- issue 14, item 5


def test_a_config_that_sets_job_name_loads_and_names_the_job(
    workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It failed to load: the name was passed twice to pd-launch's JobSpec check."""
    assert LaunchConfig(job_name="my-job").job_name == "my-job"
    assert _config_io.structure({"job_name": "my-job"}, LaunchConfig).job_name == "my-job"
    assert cli.main(["submit", "tiny.yaml", "--dry-run", "--set", "launch.job_name=my-job"]) == 0
    assert "#SBATCH --job-name=my-job\n" in capsys.readouterr().out


def test_pmi_variables_of_the_caller_do_not_reach_the_job(
    workdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submitted from inside a PMI-2 step (srun --mpi=pmi2), the job inherited its rank."""
    sbatch = _fake_sbatch(tmp_path, monkeypatch, ENV_RECORDING)
    assert sbatch is not None
    for name, value in (("PMI_RANK", "3"), ("PMI_SIZE", "8"), ("PMI_FD", "5"), ("PMI_JOBID", "9")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    assert cli.main(["submit", "tiny.yaml", "--run-dir", "r"]) == 0
    seen = Path(f"{sbatch}.env").read_text().splitlines()
    assert not [line for line in seen if line.startswith(("PMI_", "OMPI_COMM_WORLD_"))], seen
    assert "NCCL_DEBUG=INFO" in seen
    record = json.loads((workdir / "r" / "submission.json").read_text())
    assert record["removed_env"] == [
        "OMPI_COMM_WORLD_RANK",
        "PMI_FD",
        "PMI_JOBID",
        "PMI_RANK",
        "PMI_SIZE",
    ]


def test_run_dir_and_working_directory_with_spaces_are_submitted_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """They were refused as a problem with output=/chdir=, fields the user never set."""
    work = tmp_path / "my work"
    work.mkdir()
    (work / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    monkeypatch.chdir(work)
    _fake_sbatch(tmp_path, monkeypatch, ACCEPT)
    assert cli.main(["submit", "tiny.yaml", "--run-dir", "my runs/r 1"]) == 0, capsys.readouterr()
    run_dir = work / "my runs" / "r 1"
    script = (run_dir / "job.sh").read_text()
    assert f'#SBATCH --output="{run_dir}/logs/slurm-%j.out"\n' in script
    assert f'#SBATCH --chdir="{work}"\n' in script
    assert f"export PD_RUN_DIR='{run_dir}'\n" in script
    assert (run_dir / "logs").is_dir()


@pytest.mark.parametrize(
    ("run_dir", "cwd_name", "names"),
    [
        ('r"1', "work", "--run-dir: the run dir"),
        ("r", 'wo"rk', "the working directory"),
    ],
)
def test_a_path_sbatch_cannot_read_back_names_what_the_user_set(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    run_dir: str,
    cwd_name: str,
    names: str,
) -> None:
    work = tmp_path / cwd_name
    work.mkdir()
    (work / "tiny.yaml").write_text(yaml.safe_dump(TINY))
    monkeypatch.chdir(work)
    sbatch = _fake_sbatch(tmp_path, monkeypatch, ACCEPT)
    assert cli.main(["submit", "tiny.yaml", "--run-dir", run_dir]) == 2
    err = capsys.readouterr().err
    assert names in err and "double quotes" in err, err
    assert "output=" not in err and "chdir=" not in err
    assert _everything_under(work) == ["tiny.yaml"]
    assert not Path(f"{sbatch}.args").exists()


# Around a valid launch section, one field changed at a time (issue 14, item 8): either a
# ConfigError naming that field (or the field it is checked against), or a section holding
# exactly the value given that builds a job whose script renders.
_LAUNCH_VALID: dict[str, object] = {
    "job_name": "spd",
    "nodes": 2,
    "tasks_per_node": 2,
    "cpus_per_task": 4,
    "gpus_per_node": 2,
    "mem": "8G",
    "time": "2:00:00",
    "partition": "gpu",
    "account": "interp",
    "signal": "TERM@300",
    "requeue": True,
    "env": {"A": "1"},
    "python": "/usr/bin/python3",
    "setup": ["module load cuda"],
    "log_dir": "/scratch/logs",
    "extra_directives": ["--constraint=a100"],
}
# Fields checked against each other: an error may name the partner.
_RELATED = {
    "time": {"signal"},
    "mem_per_cpu": {"mem"},
    "mem": {"mem_per_cpu"},
    "gpus_per_node": {"process_per", "tasks_per_node"},
    "tasks_per_node": {"process_per"},
    "process_per": {"tasks_per_node"},
}
_LAUNCH_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 3, 2**31, 2**63, 1.5, float("nan")]),
    st.text(max_size=10),
    st.sampled_from(
        [
            "",
            "٣٠",
            "３0",
            "30",
            "UNLIMITED",
            "1-00:00:00",
            "0",
            "64G",
            "TERM@60",
            "TERM@９",
            "device",
            "node",
            "my job",
            "/tmp/my logs",
            'a"b',
            "--job-na=x",
        ]
    ),
    st.lists(
        st.sampled_from(["--qos=high", "--ntasks=2", "-n2", "--partiti=x", "x", 3]), max_size=2
    ),
    st.dictionaries(
        st.sampled_from(["A", "B C", "٣"]), st.sampled_from(["1", 2, "\0"]), max_size=2
    ),
)


@settings(max_examples=120, derandomize=True, deadline=None)
@given(
    field=st.sampled_from([*_LAUNCH_VALID, "process_per", "mem_per_cpu"]),
    value=_LAUNCH_VALUES,
)
def test_launch_section_around_a_valid_one(field: str, value: object) -> None:
    import attrs

    from pd_launch import render_script
    from pd_train.cli.submit import build_job
    from pd_train.config.run import Config

    raw = {**_LAUNCH_VALID, field: value}
    try:
        launch = _config_io.structure(raw, LaunchConfig)
    except _config_io.ConfigError as e:
        named = {path.split(".")[0].split("[")[0] for path, _ in e.problems}
        assert named & ({field} | _RELATED.get(field, set())), (field, value, e.problems)
        return
    held = getattr(launch, field)
    if field in ("setup", "extra_directives"):
        assert held == tuple(value)  # type: ignore[arg-type]
    else:
        assert held == value and type(held) is type(value), (field, value, held)
    config = attrs.evolve(_config_io.structure(TINY, Config), launch=launch)
    job = build_job(config, Path("/runs/r"), chdir=Path("/work dir"))
    render_script(job)
    assert job.name == (launch.job_name or config.run_name)
    assert job.time == str(launch.time) and job.memory == launch.mem
    assert job.extra_directives == launch.extra_directives


@pytest.mark.parametrize("timeout", ["nan", "inf", "-5", "٣"])
def test_wait_timeout_must_be_a_finite_number(
    workdir: Path, capsys: pytest.CaptureFixture[str], timeout: str
) -> None:
    """float() takes 'nan', with which --wait would poll forever; and '٣' as 3.0."""
    with pytest.raises(SystemExit) as info:
        cli.main(["submit", "tiny.yaml", "--wait", "--timeout", timeout])
    assert info.value.code == 2
    assert "is not a finite number of seconds" in capsys.readouterr().err
    assert _everything_under(workdir) == ["tiny.yaml"]


PRODUCTION = Path(__file__).resolve().parents[2] / "configs" / "llama8b-full32L.yaml"


def test_the_production_config_dry_run_shows_its_gpu_job_and_what_is_missing(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped 8B config is ready to submit but for its data path: the dry run shows the
    64-GPU job of its launch section and says how to name the tokens (issue 31, item 7)."""
    code = cli.main(["submit", str(PRODUCTION), "--dry-run", "--run-dir", "r"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = captured.out
    for directive in ("--nodes=8", "--gpus-per-node=8", "--time=2-00:00:00"):
        assert f"#SBATCH {directive}\n" in out, out
    assert "#SBATCH --signal=TERM@600\n#SBATCH --requeue\n" in out
    # 58 GiB per device of the train step need more than JAX's default 75 % of 80 GB.
    assert "export XLA_PYTHON_CLIENT_MEM_FRACTION=0.92\n" in out
    assert "# Not ready to submit: data.path is null" in out
    assert "--set data.path=/path/to/tokens" in out
    assert "# target.checkpoint is null: the job decomposes random weights" in out
    assert _everything_under(workdir) == ["tiny.yaml"]


def test_the_production_config_takes_npy_tokens_of_any_token_dtype(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With data.path set, the dry run passes: the config no longer insists on one dtype for
    .npy files (the shipped corpus is uint16), and the note about data.path is gone."""
    code = cli.main(
        [
            "submit",
            str(PRODUCTION),
            "--dry-run",
            "--run-dir",
            "r",
            *("--set", "data.path=builtin:tiny_corpus"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "#SBATCH --nodes=8\n" in captured.out
    assert "data.path is null" not in captured.out


def test_submitting_without_a_data_path_is_refused_naming_the_field(
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sbatch = _fake_sbatch(tmp_path, monkeypatch, ACCEPT)
    assert sbatch is not None
    code = cli.main(["submit", "tiny.yaml", "--set", "data.path=null"])
    err = capsys.readouterr().err
    assert code == 2
    assert "data.path" in err
    assert not sbatch.with_name("sbatch.args").exists()
    assert _everything_under(workdir) == ["tiny.yaml"]


def test_a_dry_run_still_refuses_other_errors_beside_an_unset_data_path(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        ["submit", "tiny.yaml", "--dry-run", "--set", "data.path=null", "--set", "pd.steps=0"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "pd.steps" in err


def test_a_gpu_count_that_differs_from_the_mesh_is_an_error_naming_both(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        [
            "submit",
            "tiny.yaml",
            "--dry-run",
            "--set",
            "launch.gpus_per_node=4",
            *("--set", "runtime.mesh.data=2"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "launch.gpus_per_node: asks for 4 GPUs (1 nodes × 4)" in err
    assert "runtime.mesh is 1 × 2 × 1 = 2 devices" in err
