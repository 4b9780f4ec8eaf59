"""The README's dry-run example is what render_script produces for its job."""

from pathlib import Path

from pd_launch import JobSpec, render_script

README = Path(__file__).resolve().parents[2] / "packages" / "pd-launch" / "README.md"


def test_readme_dry_run_script_is_current() -> None:
    text = README.read_text()
    start = text.index("$ pd-launch submit --dry-run --job job.toml\n")
    block = text[start:].split("\n", 1)[1]
    script = block[: block.index("# --dry-run: nothing submitted.")]
    job = JobSpec(
        name="llama8b-spd",
        command=["pd-train", "run", "configs/llama8b.yaml", "--distributed", "slurm"],
        nodes=4,
        tasks_per_node=8,
        cpus_per_task=12,
        gpus_per_node=8,
        memory="0",
        time="1-12:00:00",
        partition="gpu",
        signal="TERM@300",
        requeue=True,
        output="runs/llama8b-spd/slurm-%j.out",
        env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.92"},
    )
    assert script == render_script(job)
