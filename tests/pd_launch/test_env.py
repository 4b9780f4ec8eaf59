"""The scrub rule for the submission environment."""

from pd_launch import KEPT_NAMES, SCRUBBED_PREFIXES, scrub_environment

# Captured from `salloc --mem-per-cpu=100 -n 2` on the test cluster, plus variables other
# launchers and sbatch itself read.
INSIDE_SALLOC = {
    "HOME": "/root",
    "PATH": "/usr/bin:/bin",
    "SLURM_CONF": "/tmp/pd-slurm-test/etc/slurm.conf",
    "SLURM_JOB_ID": "2",
    "SLURM_JOBID": "2",
    "SLURM_MEM_PER_CPU": "100",
    "SLURM_NTASKS": "2",
    "SLURM_NPROCS": "2",
    "SLURM_CPU_BIND": "map_cpu:0,1,2,3",
    "SLURM_CPUS_PER_TASK": "4",
    "SBATCH_PARTITION": "debug",
    "SRUN_CPUS_PER_TASK": "4",
    "SALLOC_PARTITION": "debug",
    "PMIX_RANK": "0",
    "MY_SLURM_NOTE": "not a SLURM variable: prefix only counts at the start",
    "XLA_FLAGS": "--x",
}


def test_removes_every_scrubbed_prefix_and_keeps_the_rest() -> None:
    scrubbed = scrub_environment(INSIDE_SALLOC)
    assert scrubbed.removed == (
        "PMIX_RANK",
        "SALLOC_PARTITION",
        "SBATCH_PARTITION",
        "SLURM_CPUS_PER_TASK",
        "SLURM_CPU_BIND",
        "SLURM_JOBID",
        "SLURM_JOB_ID",
        "SLURM_MEM_PER_CPU",
        "SLURM_NPROCS",
        "SLURM_NTASKS",
        "SRUN_CPUS_PER_TASK",
    )
    assert dict(scrubbed.env) == {
        "HOME": "/root",
        "PATH": "/usr/bin:/bin",
        "SLURM_CONF": "/tmp/pd-slurm-test/etc/slurm.conf",
        "MY_SLURM_NOTE": INSIDE_SALLOC["MY_SLURM_NOTE"],
        "XLA_FLAGS": "--x",
    }
    assert not any(k.startswith(SCRUBBED_PREFIXES) for k in scrubbed.env if k not in KEPT_NAMES)


def test_input_is_not_modified() -> None:
    before = dict(INSIDE_SALLOC)
    scrub_environment(INSIDE_SALLOC)
    assert before == INSIDE_SALLOC


def test_keep_and_overrides() -> None:
    scrubbed = scrub_environment(
        INSIDE_SALLOC,
        keep=["SLURM_CPU_BIND"],
        overrides={"SLURM_NTASKS": "1", "PD_RUN": "demo"},
    )
    assert scrubbed.env["SLURM_CPU_BIND"] == "map_cpu:0,1,2,3"
    # Set explicitly by the job: present, with the job's value, and not reported as removed.
    assert scrubbed.env["SLURM_NTASKS"] == "1"
    assert scrubbed.env["PD_RUN"] == "demo"
    assert "SLURM_NTASKS" not in scrubbed.removed
    assert "SLURM_CPU_BIND" not in scrubbed.removed
    assert "SLURM_MEM_PER_CPU" in scrubbed.removed


def test_clean_environment_removes_nothing() -> None:
    scrubbed = scrub_environment({"PATH": "/bin", "SLURM_CONF": "/etc/slurm/slurm.conf"})
    assert scrubbed.removed == ()
    assert dict(scrubbed.env) == {"PATH": "/bin", "SLURM_CONF": "/etc/slurm/slurm.conf"}
