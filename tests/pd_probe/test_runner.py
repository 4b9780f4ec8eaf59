"""The runner with real processes: isolation of every arm, failures recorded per arm,
timeouts, warm re-runs, launchers, and the loss-equivalence check of steps mode."""

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from pd_probe import (
    Arm,
    GridError,
    LocalLauncher,
    ProbeError,
    arm_env,
    arm_paths,
    check_isolation,
    make_grid,
    merge_xla_flags,
    run_probe,
    write_report,
)

FAKE = str(Path(__file__).with_name("fake_arm.py"))
COMMAND = [sys.executable, FAKE, "{config}", "{record}", "{out}"]
BASE_ENV = {"PATH": os.environ.get("PATH", ""), "XLA_FLAGS": "--xla_inherited=1 --xla_shared=a"}


def _cache_dir_override(paths):
    return {"runtime.cache_dir": str(paths.cache_dir)}


def test_merge_xla_flags_later_wins_in_place():
    assert merge_xla_flags("--a=1 --b=2", None, "--a=3 --c") == "--a=3 --b=2 --c"
    assert merge_xla_flags("", "--x='a b'") == "'--x=a b'"


def test_arm_env_isolates_caches_and_refuses_overrides(tmp_path):
    arm = Arm(name="a", env={"XLA_FLAGS": "--xla_shared=b --xla_arm=1", "JAX_X": "1"})
    paths = arm_paths(tmp_path, "a")
    env = arm_env(arm, paths, 2, mode="compile", base_env=BASE_ENV)
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(paths.cache_dir)
    assert env["XLA_FLAGS"] == (
        f"--xla_inherited=1 --xla_shared=b --xla_arm=1 "
        f"--xla_gpu_per_fusion_autotune_cache_dir={paths.autotune_dir}"
    )
    assert env["JAX_X"] == "1" and env["PD_PROBE_RUN"] == "2"
    assert env["PD_PROBE_RECORD"] == str(paths.run(2).record)
    other = arm_env(Arm(name="b"), arm_paths(tmp_path, "b"), 1, mode="compile", base_env=BASE_ENV)
    assert other["JAX_COMPILATION_CACHE_DIR"] != env["JAX_COMPILATION_CACHE_DIR"]
    with pytest.raises(ProbeError, match="sets JAX_COMPILATION_CACHE_DIR"):
        arm_env(Arm(name="c", env={"JAX_COMPILATION_CACHE_DIR": "/x"}), paths, 1, mode="compile")
    bad = Arm(name="c", env={"XLA_FLAGS": "--xla_gpu_per_fusion_autotune_cache_dir=/x"})
    with pytest.raises(ProbeError, match="its own autotune cache"):
        arm_env(bad, paths, 1, mode="compile")


def test_failures_timeouts_and_skips_are_recorded_and_others_run(tmp_path, toy):
    arms = [
        Arm(name="baseline", env={"XLA_FLAGS": "--xla_arm=1"}),
        Arm(name="boom", overrides="runtime.steps=4", env={"FAKE_BEHAVIOR": "fail"}),
        Arm(name="hang", overrides="runtime.steps=5", env={"FAKE_BEHAVIOR": "sleep"}, timeout_s=1),
        Arm(name="silent", overrides="runtime.steps=6", env={"FAKE_BEHAVIOR": "norecord"}),
        Arm(name="gpu", overrides="runtime.steps=7", gpu_only=True),
        Arm(name="same", env={"XLA_FLAGS": "--xla_arm=1"}),
        Arm(name="last", overrides="runtime.steps=8"),
    ]
    grid = make_grid(toy.base, arms, validate=toy.validate)
    assert grid.aliases == {"same": "baseline"}
    lines = []
    result = run_probe(
        grid,
        tmp_path / "probe",
        command=COMMAND,
        include_gpu_only=False,
        path_overrides=_cache_dir_override,
        base_env=BASE_ENV,
        progress=lines.append,
    )
    status = {name: s.status for name, s in result.arms.items()}
    assert status == {
        "baseline": "ok",
        "boom": "failed",
        "hang": "timeout",
        "silent": "failed",
        "gpu": "skipped",
        "same": "alias",
        "last": "ok",
    }
    assert "exit code 3" in result.arms["boom"].error
    assert "failing on purpose" in result.arms["boom"].error
    assert "no record" in result.arms["silent"].error
    assert result.arms["same"].alias_of == "baseline"
    assert result.failed == ["boom", "hang", "silent"]
    finished = [line for line in lines if not line.endswith(": started")]
    assert len(finished) == 5 and finished[0].startswith("baseline run 1: ok")
    # A line as each run starts, so a long compile shows which arm is busy.
    assert "baseline run 1: started" in lines
    assert lines.index("baseline run 1: started") < lines.index(finished[0])

    probe = tmp_path / "probe"
    paths = arm_paths(probe, "baseline")
    config = json.loads(paths.config.read_text())
    assert config["runtime"]["cache_dir"] == str(paths.cache_dir)
    env = json.loads((paths.run(1).out / "env.json").read_text())
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(paths.cache_dir)
    assert "--xla_inherited=1" in env["XLA_FLAGS"] and "--xla_arm=1" in env["XLA_FLAGS"]
    assert f"--xla_gpu_per_fusion_autotune_cache_dir={paths.autotune_dir}" in env["XLA_FLAGS"]
    assert json.loads(arm_paths(probe, "hang").status.read_text())["status"] == "timeout"
    assert not arm_paths(probe, "gpu").run(1).dir.exists()
    grid_json = json.loads((probe / "grid.json").read_text())
    assert grid_json["mode"] == "compile" and grid_json["aliases"] == {"same": "baseline"}

    report = write_report(probe)
    assert "| boom | failed |" in report.markdown
    assert "| same | = baseline |" in report.markdown
    assert "| gpu | skipped |" in report.markdown


def test_isolation_check_finds_shared_files_and_first_hits(tmp_path, toy):
    grid = make_grid(
        toy.base,
        [Arm(name="baseline"), Arm(name="b", overrides="runtime.steps=1")],
        validate=toy.validate,
    )
    probe = tmp_path / "probe"
    run_probe(grid, probe, command=COMMAND, base_env=BASE_ENV)
    check = check_isolation(probe)
    assert check.ok, check.problems
    assert check.arms == ("baseline", "b")
    a, b = arm_paths(probe, "baseline"), arm_paths(probe, "b")
    assert [p.name for p in a.cache_dir.iterdir()] == ["entry-run1"]

    # A file reachable from both arms' caches (a hard link) breaks isolation.
    os.link(a.cache_dir / "entry-run1", b.autotune_dir / "linked")
    check = check_isolation(probe)
    assert not check.ok
    assert "arms 'baseline' and 'b' share 1 cache file(s)" in check.problems[0]
    (b.autotune_dir / "linked").unlink()

    # A first compile that hit the cache means the arm saw a cache it should not have.
    record = json.loads(b.run(1).record.read_text())
    record["jits"] = {"step": {"first_compile_cache": "hit"}}
    b.run(1).record.write_text(json.dumps(record))
    check = check_isolation(probe)
    assert check.problems == (
        "arm 'b': the first compile of jit 'step' was a persistent-cache hit",
    )
    with pytest.raises(Exception, match="arms were not isolated"):
        check.raise_if_failed()


def test_repeats_run_in_order_in_the_same_caches(tmp_path, toy):
    grid = make_grid(toy.base, [Arm(name="baseline", repeats=3)], validate=toy.validate)
    probe = tmp_path / "probe"
    result = run_probe(grid, probe, command=COMMAND, base_env=BASE_ENV)
    assert [r.run for r in result.arms["baseline"].runs] == [1, 2, 3]
    paths = arm_paths(probe, "baseline")
    seen = [json.loads(paths.run(i).record.read_text())["notes"]["saw_previous"] for i in (1, 2, 3)]
    assert seen == [[], ["entry-run1"], ["entry-run1", "entry-run2"]]


def test_steps_mode_checks_equivalent_arms(tmp_path, toy):
    arms = [
        Arm(name="baseline", equivalence="chunk_loop"),
        Arm(name="unroll", overrides="recon.loop=unroll", equivalence="chunk_loop"),
        Arm(name="per_array", overrides="init.mode=per_array", equivalence="init"),
        Arm(name="stacked", env={"FAKE_LOSS_SHIFT": "1e-7"}, equivalence="init"),
    ]
    grid = make_grid(toy.base, arms, validate=toy.validate)
    probe = tmp_path / "probe"
    result = run_probe(grid, probe, command=COMMAND, mode="steps", base_env=BASE_ENV)
    checks = {c.group: c for c in result.equivalence}
    assert checks["chunk_loop"].identical, checks["chunk_loop"].detail
    assert checks["chunk_loop"].detail == "3 loss values identical"
    assert not checks["init"].identical
    assert checks["init"].detail.startswith("stacked differs from per_array at step 0 loss: 4.0 vs")
    write_report(probe)
    assert "init (per_array, stacked): DIFFER" in (probe / "report.md").read_text()


def test_nothing_is_written_when_inputs_are_bad(tmp_path, toy):
    grid = make_grid(toy.base, [Arm(name="baseline")], validate=toy.validate)
    probe = tmp_path / "probe"
    with pytest.raises(ProbeError, match=r"unknown placeholder \{cfg\}"):
        run_probe(grid, probe, command=["x", "{cfg}"])
    with pytest.raises(GridError, match=r"runtime\.cache_directory does not exist"):
        run_probe(
            grid, probe, command=COMMAND, path_overrides=lambda p: {"runtime.cache_directory": 1}
        )
    with pytest.raises(ProbeError, match="mode 'fast' is not one of compile, steps"):
        run_probe(grid, probe, command=COMMAND, mode="fast")
    assert not probe.exists()
    (probe / "x").mkdir(parents=True)
    with pytest.raises(ProbeError, match="is not empty"):
        run_probe(grid, probe, command=COMMAND)


class CountingLauncher:
    """A launcher of its own (as pd-train's SLURM one would be), delegating process handling
    to LocalLauncher and counting how many runs are in flight at once."""

    def __init__(self):
        self.local = LocalLauncher()
        self.in_flight = 0
        self.most = 0
        self.launched = []
        self.lock = threading.Lock()

    def launch(self, arm, command, env, out_dir):
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.launched.append((arm.name, env["PD_PROBE_RUN"], out_dir.name))
        return self.local.launch(arm, command, env, out_dir)

    def wait(self, handle, *, timeout_s):
        try:
            return self.local.wait(handle, timeout_s=timeout_s)
        finally:
            with self.lock:
                self.in_flight -= 1


def test_custom_launcher_with_parallel_arms(tmp_path, toy):
    arms = [Arm(name="baseline", repeats=2)] + [
        Arm(name=f"a{i}", overrides=f"runtime.steps={i}") for i in range(1, 4)
    ]
    grid = make_grid(toy.base, arms, validate=toy.validate)
    launcher = CountingLauncher()
    result = run_probe(
        grid,
        tmp_path / "probe",
        command=COMMAND,
        launcher=launcher,
        max_parallel=2,
        base_env=BASE_ENV,
    )
    assert all(s.status == "ok" for s in result.arms.values())
    assert launcher.most == 2
    assert sorted(launcher.launched) == [
        ("a1", "1", "run-1"),
        ("a2", "1", "run-1"),
        ("a3", "1", "run-1"),
        ("baseline", "1", "run-1"),
        ("baseline", "2", "run-2"),
    ]
    # Runs of one arm never overlap: run 2 is launched after run 1 was awaited.
    order = [(n, r) for n, r, _ in launcher.launched]
    assert order.index(("baseline", "2")) > order.index(("a1", "1"))
