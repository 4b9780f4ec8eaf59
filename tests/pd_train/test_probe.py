"""``pd-train probe``'s grid: every arm of the production config is a valid pd-train config that
means what its name says, and bad overrides fail when the grid is built, naming the field."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path

import pytest
import yaml

from pd_probe import GridError, parse_arm
from pd_train.cli import probe as probe_cli
from pd_train.decomposition import build_decomposition, site_name
from pd_train.losses.recon import chunkwise_plan
from pd_train.run import prepare

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ROOT / "configs" / "llama8b-full32L.yaml"
BASE_C = {
    "q_proj": 2048,
    "k_proj": 2048,
    "v_proj": 4096,
    "o_proj": 4096,
    "gate_proj": 8192,
    "up_proj": 8192,
    "down_proj": 10240,
}


@pytest.fixture(scope="module")
def production():
    raw, prepared = probe_cli.load_base(PRODUCTION)
    return raw, prepared, probe_cli.build_grid(raw, prepared)


def _decomposition(raw):
    prepared = prepare(raw, for_run=False)
    return prepared, build_decomposition(prepared.model, prepared.config.pd.decomposition_targets)


def _chunks(prepared, decomposition) -> int:
    """Chunks of the config's subset recon term (all-sites ``subset_recon``: 1)."""
    (term,) = [
        t
        for t in prepared.config.pd.loss_metrics
        if t.type in ("chunkwise_subset_recon", "subset_recon")
    ]
    if term.type == "subset_recon":
        return 1
    return chunkwise_plan(decomposition, term.sites_per_chunk).n_chunks


def test_production_config_is_the_design(production):
    raw, prepared, _ = production
    _, decomposition = _decomposition(raw)
    assert len(decomposition.sites) == 224
    assert {k.kind: k.C for k in decomposition.kinds} == BASE_C
    assert sum(k.C * len(k.layers) for k in decomposition.kinds) == 1_245_184
    assert _chunks(prepared, decomposition) == 1  # all sites in one forward (subset_recon)
    config = prepared.config
    assert (config.pd.batch_size, config.data.seq_len) == (128, 512)
    assert config.runtime.compute_dtype == "bfloat16"
    assert config.runtime.remat.recon and config.runtime.remat.ci_fn


def test_every_arm_of_the_production_config_is_valid_and_means_its_name(production):
    _, _, grid = production
    expected = {
        "baseline",
        *(f"layers_{n}" for n in (2, 8, 32)),
        *(f"chunks_{k}" for k in (1, 2, 4, 8)),
        *(f"chunks_{k}_unroll" for k in (1, 2, 4, 8)),
        "chunk_loop_scan",
        "chunk_loop_unroll",
        "layer_loop_scan",
        "layer_loop_unroll",
        "init_stacked",
        "init_per_array",
        *(f"autotune_{level}" for level in (0, 2, 4)),
        "cache_off",
        "cache_on",
    }
    assert set(grid.names) == expected
    # Arms that change nothing run once, as the baseline.
    for name in ("layers_32", "chunk_loop_scan", "layer_loop_scan", "init_stacked"):
        assert grid.aliases[name] == "baseline"

    for name, raw in grid.configs.items():
        prepared, decomposition = _decomposition(raw)  # raises if the arm's config is invalid
        config = prepared.config
        if name.startswith("layers_"):
            n = int(name.removeprefix("layers_"))
            assert {k.kind: k.layers for k in decomposition.kinds} == dict.fromkeys(
                BASE_C, tuple(range(n))
            ), name
            assert {k.kind: k.C for k in decomposition.kinds} == BASE_C
            assert _chunks(prepared, decomposition) == 1, name
        elif name.startswith("chunks_"):
            k = int(name.split("_")[1])
            assert len(decomposition.sites) == 224
            assert _chunks(prepared, decomposition) == k, name
            loop = "unroll" if name.endswith("_unroll") else "scan"
            assert config.pd.recon.chunk_loop == loop
        elif name.startswith(("chunk_loop_", "layer_loop_")):
            field = name.rsplit("_", 1)[0]
            assert getattr(config.pd.recon, field) == name.rsplit("_", 1)[1]
        elif name.startswith("init_"):
            assert config.runtime.init == name.removeprefix("init_")
            assert grid.arm(name).equivalence == "init"
        elif name == "cache_off":
            assert config.runtime.compile_cache.enabled is False
        if name.startswith("autotune_"):
            arm = grid.arm(name)
            assert arm.gpu_only
            assert arm.env["XLA_FLAGS"] == f"--xla_gpu_autotune_level={name[-1]}"
    assert grid.arm("cache_on").repeats == 2


def test_cpu_selection_drops_gpu_arms_and_keeps_the_baseline(production):
    _, _, grid = production
    picked = grid.select(["chunks_8", "autotune_2"], include_gpu_only=False)
    assert picked.names == ("baseline", "chunks_8")


@pytest.mark.parametrize(
    "layers",
    [range(2), range(8), range(16), range(32), [3], [0, 1, 2, 3, 5, 9, 10, 31], range(24, 32)],
)
def test_layer_patterns_match_exactly_the_layers(layers):
    patterns = probe_cli.layer_patterns(layers, 32)
    matched = {
        layer
        for layer in range(32)
        if any(
            fnmatch.fnmatchcase(site_name(layer, "down_proj"), f"layers.{p}.mlp.down_proj")
            for p in patterns
        )
    }
    assert matched == set(layers)


def test_layer_slices_take_the_first_decomposed_layers_of_a_partial_base():
    late = ["layers.2[4-9].*", "layers.3[01].*"]
    targets = ", ".join(f"{{module_pattern: '{p}', C: 512}}" for p in late)
    raw, prepared = probe_cli.load_base(PRODUCTION, [f"pd.decomposition_targets=[{targets}]"])
    grid = probe_cli.build_grid(raw, prepared)
    assert "layers_32" not in grid.names  # the base decomposes 8 layers: slices 2 and 8
    _, decomposition = _decomposition(grid.configs["layers_2"])
    assert {k.layers for k in decomposition.kinds} == {(24, 25)}
    assert grid.aliases["layers_8"] == "baseline"


def test_bad_override_fails_at_generation_with_its_field_path(production):
    raw, prepared, _ = production
    with pytest.raises(GridError, match=r"arm 'typo'.*pd\.recon\.chunk_looop does not exist"):
        probe_cli.build_grid(raw, prepared, extra_arms=[parse_arm("typo:pd.recon.chunk_looop=1")])
    # The path exists but pd-train's schema refuses the value: its message names the field.
    bad_value = parse_arm("sideways:pd.recon.chunk_loop=sideways")
    with pytest.raises(
        GridError, match=r"(?s)arm 'sideways'.*pd\.recon\.chunk_loop: got 'sideways'"
    ):
        probe_cli.build_grid(raw, prepared, extra_arms=[bad_value])
    zero = parse_arm("zero:pd.loss_metrics[2].n_samples=0")
    with pytest.raises(GridError, match=r"pd\.loss_metrics\[2\]\.n_samples: got 0"):
        probe_cli.build_grid(raw, prepared, extra_arms=[zero])
    # Free-form mappings take new keys.
    grid = probe_cli.build_grid(
        raw,
        prepared,
        extra_arms=[parse_arm("opt:runtime.compiler_options.xla_cpu_enable_fast_math=false")],
    )
    assert grid.configs["opt"]["runtime"]["compiler_options"] == {"xla_cpu_enable_fast_math": False}


def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "probe"
    code = probe_cli.main(
        [str(PRODUCTION), "--out", str(out), "--arm", "typo:pd.recon.chunk_looop=scan"]
    )
    assert code == 2
    assert "pd.recon.chunk_looop does not exist" in capsys.readouterr().err
    assert not out.exists()
    assert probe_cli.main([str(PRODUCTION), "--out", str(out), "--arms", "nope"]) == 2
    assert "unknown arm(s) nope" in capsys.readouterr().err
    assert not out.exists()


def test_cli_list_shows_validated_arms(capsys):
    assert probe_cli.main([str(PRODUCTION), "--list", "--arms", "chunks_8,layers_32"]) == 0
    text = capsys.readouterr().out
    assert "chunks_8\n    pd.loss_metrics[2]=" in text and '"sites_per_chunk": 28' in text
    assert "layers_32  (= baseline)" in text
    assert "autotune" not in text


def test_relative_paths_follow_the_base_config(tmp_path):
    config = yaml.safe_load(PRODUCTION.read_text())
    config["data"]["path"] = "tokens/train.npy"
    path = tmp_path / "sub" / "config.yaml"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    raw, _ = probe_cli.load_base(path)
    assert raw["data"]["path"] == str(path.parent / "tokens" / "train.npy")


def test_no_chunk_arms_without_a_chunkwise_term(production):
    _, _, grid = production
    raw = json.loads(json.dumps(grid.base))
    raw["pd"]["loss_metrics"] = [
        {"type": "faithfulness", "coeff": 1.0},
        {"type": "stochastic_recon", "coeff": 1.0},
    ]
    prepared = prepare(raw, for_run=False)
    names = probe_cli.build_grid(raw, prepared).names
    assert not [n for n in names if n.startswith(("chunks_", "chunk_loop_"))]
    assert "layer_loop_unroll" in names


def test_arm_command_templates():
    compile_cmd = probe_cli.arm_command("compile", simulate_devices=8)
    assert compile_cmd[1:] == [
        "-m",
        "pd_train.cli",
        "compile",
        "{config}",
        "--record",
        "{record}",
        "--simulate-devices",
        "8",
    ]
    steps_cmd = probe_cli.arm_command("steps", max_steps=2)
    assert steps_cmd[3:] == ["run", "{config}", "--run-dir", "{out}", "--max-steps", "2"]


def test_slurm_job_of_a_run_carries_the_arms_isolation(tmp_path):
    import pd_launch
    from pd_probe import Arm, arm_env, arm_paths

    template = pd_launch.JobSpec(name="probe", command=("true",), gpus_per_node=8, time="2:00:00")
    launcher = probe_cli.SlurmLauncher(template, env={"PATH": "/usr/bin", "HOME": "/root"})
    arm = Arm(name="chunks_8", env={"XLA_FLAGS": "--xla_gpu_autotune_level=0"})
    paths = arm_paths(tmp_path, arm.name)
    env = arm_env(arm, paths, 1, mode="compile", base_env={"PATH": "/usr/bin", "HOME": "/root"})
    command = ["python", "-m", "pd_train.cli", "compile", str(paths.config)]
    job = launcher.job_for(arm, command, env, paths.run(1).dir)
    assert job.name == "probe-chunks_8"
    assert job.command == tuple(command)
    assert (job.gpus_per_node, job.time, job.requeue) == (8, "2:00:00", False)
    assert job.output == str(paths.run(1).stdout)
    assert job.error == str(paths.run(1).stderr)
    # Exported: what the arm and its isolation changed; inherited unchanged: the rest.
    assert job.env["JAX_COMPILATION_CACHE_DIR"] == str(paths.cache_dir)
    assert job.env["PD_PROBE_ARM"] == "chunks_8"
    assert "--xla_gpu_autotune_level=0" in job.env["XLA_FLAGS"]
    assert f"--xla_gpu_per_fusion_autotune_cache_dir={paths.autotune_dir}" in job.env["XLA_FLAGS"]
    assert "PATH" not in job.env and "HOME" not in job.env
    script = pd_launch.render_script(job)
    assert f"export JAX_COMPILATION_CACHE_DIR={paths.cache_dir}" in script


def test_cli_slurm_launcher_input_errors(tmp_path, capsys):
    assert probe_cli.main([str(PRODUCTION), "--launcher", "slurm"]) == 2
    assert "--launcher slurm needs --slurm-job" in capsys.readouterr().err
    job = tmp_path / "job.toml"
    job.write_text('name = "probe"\ncommand = ["true"]\nnodes = 2\n')
    out = tmp_path / "probe"
    argv = [str(PRODUCTION), "--launcher", "slurm", "--slurm-job", str(job), "--out", str(out)]
    assert probe_cli.main(argv) == 2
    assert "asks for 2 tasks, but `pd-train compile` is one process" in capsys.readouterr().err
    assert not out.exists()
    job.write_text('name = "probe"\ncommand = ["true"]\ntime = "soon"\n')
    assert probe_cli.main(argv) == 2
    assert "time" in capsys.readouterr().err
