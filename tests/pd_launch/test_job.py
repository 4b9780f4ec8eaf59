"""JobSpec validation and the rendered sbatch script."""

import attrs
import pytest

from pd_launch import JobSpec, JobSpecError, render_script, time_limit_seconds

FULL = JobSpec(
    name="llama-spd",
    command=("pd-train", "run", "configs/llama 8b.yaml", "--distributed", "slurm"),
    nodes=4,
    tasks_per_node=8,
    cpus_per_task=12,
    gpus_per_node=8,
    memory="0",
    time="1-12:00:00",
    partition="gpu",
    account="interp",
    signal="TERM@300",
    requeue=True,
    output="runs/llama/%j.out",
    error="runs/llama/%j.err",
    chdir="/scratch/runs/llama",
    env={"XLA_FLAGS": "--xla_gpu_autotune_level=2", "PD_NOTE": "it's $HOME"},
    extra_directives=("--constraint=h100", "--exclusive"),
)

FULL_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=llama-spd
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --gpus-per-node=8
#SBATCH --mem=0
#SBATCH --time=1-12:00:00
#SBATCH --partition=gpu
#SBATCH --account=interp
#SBATCH --signal=TERM@300
#SBATCH --requeue
#SBATCH --output=runs/llama/%j.out
#SBATCH --error=runs/llama/%j.err
#SBATCH --open-mode=append
#SBATCH --chdir=/scratch/runs/llama
#SBATCH --constraint=h100
#SBATCH --exclusive

set -eu
export PD_NOTE='it'"'"'s $HOME'
export XLA_FLAGS=--xla_gpu_autotune_level=2
exec srun --kill-on-bad-exit=1 --cpus-per-task=12 pd-train run 'configs/llama 8b.yaml' --distributed slurm
"""


def test_full_script_text() -> None:
    assert render_script(FULL) == FULL_SCRIPT
    assert FULL.num_tasks == 32
    assert FULL.time_seconds == 36 * 3600


def test_minimal_script_text() -> None:
    job = JobSpec(name="hello", command=["echo", "hi"])
    assert render_script(job) == (
        "#!/bin/bash\n"
        "#SBATCH --job-name=hello\n"
        "#SBATCH --nodes=1\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --time=30\n"
        "#SBATCH --no-requeue\n"
        "#SBATCH --open-mode=append\n"
        "\n"
        "set -eu\n"
        "exec srun --kill-on-bad-exit=1 echo hi\n"
    )


def test_render_is_deterministic_and_env_order_free() -> None:
    a = attrs.evolve(FULL, env={"B": "2", "A": "1"})
    b = attrs.evolve(FULL, env={"A": "1", "B": "2"})
    assert render_script(a) == render_script(b)
    assert render_script(a).index("export A=1") < render_script(a).index("export B=2")


def test_tasks_per_node_none_leaves_task_count_to_slurm() -> None:
    script = render_script(JobSpec(name="x", command=["true"], tasks_per_node=None))
    assert "--ntasks-per-node" not in script
    assert "--ntasks" not in script


def test_mem_per_cpu_rendered() -> None:
    script = render_script(JobSpec(name="x", command=["true"], mem_per_cpu="2G"))
    assert "#SBATCH --mem-per-cpu=2G\n" in script
    assert "--mem=" not in script


@pytest.mark.parametrize(
    ("time", "seconds"),
    [
        ("30", 1800),
        ("90", 5400),
        ("5:30", 330),
        ("2:00:00", 7200),
        ("1-0", 86400),
        ("2-12", 2 * 86400 + 12 * 3600),
        ("1-02:30", 86400 + 2 * 3600 + 30 * 60),
        ("1-02:30:15", 86400 + 2 * 3600 + 30 * 60 + 15),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_time_formats(time: str, seconds: int | None) -> None:
    assert time_limit_seconds(time) == seconds
    assert JobSpec(name="x", command=["true"], time=time).time_seconds == seconds


@pytest.mark.parametrize(
    ("time", "fragment"),
    [
        ("1h", "not a SLURM time limit"),
        ("", "not a SLURM time limit"),
        ("1:2:3:4", "not a SLURM time limit"),
        ("-5", "not a SLURM time limit"),
        ("1-", "not a SLURM time limit"),
        ("10:60", "seconds must be below 60"),
        ("1:60:00", "minutes after hours must be below 60"),
        ("1-24", "hours after days must be below 24"),
        ("0", "is zero"),
        ("0:00:00", "is zero"),
    ],
)
def test_malformed_time(time: str, fragment: str) -> None:
    with pytest.raises(JobSpecError, match=fragment) as info:
        JobSpec(name="x", command=["true"], time=time)
    assert repr(time) in str(info.value)
    assert "HH:MM:SS" in str(info.value) or "zero" in str(info.value)


@pytest.mark.parametrize(
    "signal", ["TERM@300", "USR1", "B:USR1@60", "R:TERM@10", "SIGINT@5", "15@30"]
)
def test_signal_accepted(signal: str) -> None:
    job = JobSpec(name="x", command=["true"], signal=signal)
    assert f"#SBATCH --signal={signal}\n" in render_script(job)


@pytest.mark.parametrize(
    ("signal", "fragment"),
    [
        ("TERM@", "not a SLURM --signal value"),
        ("TERM 300", "not a SLURM --signal value"),
        ("X:TERM@300", "not a SLURM --signal value"),
        ("NOPE@300", "not a signal name or number"),
        ("999@1", "not a signal name or number"),
        ("TERM@70000", "at most 65535"),
    ],
)
def test_signal_rejected(signal: str, fragment: str) -> None:
    with pytest.raises(JobSpecError, match=fragment):
        JobSpec(name="x", command=["true"], signal=signal)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [
        ("name", "has space", "name='has space' is not allowed"),
        ("name", "", "name='' is not allowed"),
        ("nodes", 0, "nodes=0 must be a positive integer"),
        ("nodes", True, "nodes=True must be a positive integer"),
        ("tasks_per_node", -1, "tasks_per_node=-1"),
        ("cpus_per_task", 0, "cpus_per_task=0"),
        ("gpus_per_node", -1, "gpus_per_node=-1 must be an integer >= 0"),
        ("memory", "4GB", "memory='4GB' is not allowed; expected an integer with optional unit"),
        ("mem_per_cpu", "lots", "mem_per_cpu='lots'"),
        ("partition", "gpu;rm", "partition='gpu;rm'"),
        ("account", "a b", "account='a b'"),
        ("output", 'my "logs"/%j.out', "must not contain double quotes, backslashes"),
        ("output", "logs\\%j.out", "must not contain double quotes, backslashes"),
        ("error", "", "error='' must be a non-empty string"),
        ("chdir", "a\nb", "chdir="),
        ("command", [], r"command=\(\) must name a program"),
        ("command", "echo hi", "split it into arguments"),
        ("env", {"1BAD": "x"}, "env key '1BAD' is not a variable name"),
        ("env", {"OK": 1}, "env\\['OK'\\]=1 must be a string"),
        ("extra_directives", ("--time=5",), "sets --time, which the job description owns"),
        ("extra_directives", ("-p",), "sets -p, which the job description owns"),
        ("extra_directives", ("--export=NONE",), "pd-launch controls the submission environment"),
        ("extra_directives", ("constraint=a100",), "must be one sbatch option"),
        ("extra_directives", ("--qos=a b",), "must be one sbatch option"),
        ("extra_directives", ("--comment=x",), "pd-launch tags each submission"),
    ],
)
def test_bad_fields_name_field_and_value(field: str, value: object, fragment: str) -> None:
    kwargs: dict[str, object] = {"name": "x", "command": ["true"], field: value}
    with pytest.raises(JobSpecError, match=fragment):
        JobSpec(**kwargs)  # type: ignore[arg-type]


def test_memory_and_mem_per_cpu_are_exclusive() -> None:
    with pytest.raises(JobSpecError, match="only one of --mem and --mem-per-cpu"):
        JobSpec(name="x", command=["true"], memory="1G", mem_per_cpu="1G")


def test_frozen_keyword_only_and_env_read_only() -> None:
    job = JobSpec(name="x", command=["true"], env={"A": "1"})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        job.nodes = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        job.env["A"] = "2"  # type: ignore[index]
    with pytest.raises(TypeError):
        JobSpec("x", ["true"])  # type: ignore[misc]


def test_env_is_copied_from_the_callers_dict() -> None:
    env = {"A": "1"}
    job = JobSpec(name="x", command=["true"], env=env)
    env["A"] = "changed"
    assert job.env["A"] == "1"
    assert job == JobSpec(name="x", command=("true",), env={"A": "1"})
