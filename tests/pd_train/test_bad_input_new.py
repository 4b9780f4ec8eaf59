"""Wrong values for the entry points and config fields added in the 1 Dec session: each is
refused by field path, with the bad value and what is allowed, before anything is written;
`pd-train config` agrees with what `pd-train run` would later refuse."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import yaml

from pd_train.cli import main
from pd_train.config.io import ConfigError, apply_overrides, structure
from pd_train.config.pd import (
    Faithfulness,
    ImportanceMinimality,
    PDConfig,
    SmoothL0ImportanceMinimality,
    SubsetRecon,
)
from pd_train.run import prepare
from pd_train.train import Trainer

from ._cli import _refused, tiny_config, write_config
from ._tiny import TINY, _pd


def _problems(raw: dict, *overrides: str) -> dict[str, str]:
    """{field path: message} of the config ``raw`` with ``overrides``, validated as
    `pd-train config` does (no weight or data file opened)."""
    with pytest.raises(ConfigError) as info:
        prepare(apply_overrides(raw, overrides), for_run=False)
    return dict(info.value.problems)


# --- seeds ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, 2**32, 2**32 - 1, 2**40])
def test_a_seed_outside_32_bits_is_refused(tiny_run_config: dict, seed: int) -> None:
    # jax.random.key(2**32) is key(0) (silently the same draws); numpy refuses a negative seed
    # only at the first batch; seed + 1 seeds the eval stream, so 2**32 - 1 aliases 0 there.
    problems = _problems(tiny_run_config, f"seed={seed}")
    assert problems["seed"].startswith(f"got {seed}; must be an int in [0, 4294967294]")
    prepare(apply_overrides(tiny_run_config, ["seed=4294967294"]), for_run=False)


def test_a_toy_seed_outside_32_bits_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "builtin:tms_5_2", "--set", f"seed={2**32}"]) == 2
    assert "seed: got 4294967296; must be an int in [0, 4294967294]" in capsys.readouterr().err


# --- config sections and paths -------------------------------------------------------------


def test_a_scalar_for_a_section_names_the_section_and_its_fields(tiny_run_config: dict) -> None:
    # cattrs said "argument of type 'float' is not iterable".
    problems = _problems(tiny_run_config, "pd.loss_metrics[1].frequency=1e-6")
    assert problems["pd.loss_metrics[1].frequency"] == (
        "got 1e-06 (float); expected a mapping of coeff, reference_token_count"
    )
    problems = _problems(tiny_run_config, "pd.components=5")
    assert problems["pd.components"].startswith("got 5 (int); expected a mapping of lr, ")


def test_a_dotted_list_index_says_to_use_brackets(tiny_run_config: dict) -> None:
    # It printed the whole loss list: "cannot set a field inside [{'type': ...}, ...]".
    with pytest.raises(ConfigError) as info:
        apply_overrides(tiny_run_config, ["pd.loss_metrics.1.coeff=2"])
    [(path, message)] = info.value.problems
    assert path == "pd.loss_metrics.1"
    n = len(tiny_run_config["pd"]["loss_metrics"])
    assert message == (
        f"pd.loss_metrics is a list ({n} items); index it with brackets: pd.loss_metrics[1]"
    )
    with pytest.raises(ConfigError) as info:
        apply_overrides(tiny_run_config, ["seed.x=2"])
    seed = tiny_run_config["seed"]
    assert info.value.problems == [
        ("seed.x", f"cannot set 'x': seed is {seed} (int), not a mapping")
    ]


@pytest.mark.parametrize("field", ["l0_threshold", "rounding_threshold"])
@pytest.mark.parametrize("value", [1.0, 2.5])
def test_a_threshold_of_one_or_more_is_refused(
    tiny_run_config: dict, field: str, value: float
) -> None:
    # ci_lower lies in [0, 1]: `ci_lower > t` holds nowhere at t >= 1 (every L0 0).
    problems = _problems(tiny_run_config, f"pd.{field}={value}")
    assert problems[f"pd.{field}"].startswith(f"got {value}; must be in [0.0, 1.0)")
    prepare(apply_overrides(tiny_run_config, [f"pd.{field}=0.99"]), for_run=False)


# --- loss terms' names ---------------------------------------------------------------------


def test_a_term_named_total_is_refused(tiny_run_config: dict) -> None:
    # loss/total is written after the terms: the term's own value was silently overwritten.
    term = "{type: faithfulness, coeff: 1.0, name: total}"
    problems = _problems(tiny_run_config, f"pd.loss_metrics[0]={term}")
    assert problems["pd.loss_metrics[0].name"] == (
        "got 'total'; loss/total is the sum of the terms: give the term another name"
    )


def test_named_terms_report_their_extra_metrics_under_their_names() -> None:
    # Two importance terms both reported `pnorm` (two smooth-L0 terms `gamma`): the later
    # silently hid the earlier.
    pd = _pd(
        loss_metrics=(
            Faithfulness(coeff=1.0),
            ImportanceMinimality(coeff=1e-3, pnorm_start=2.0, pnorm_end=1.0),
            ImportanceMinimality(coeff=1e-3, pnorm_start=1.0, pnorm_end=1.0, name="flat"),
            SmoothL0ImportanceMinimality(coeff=1e-3, name="l0a"),
            SmoothL0ImportanceMinimality(coeff=1e-3, gamma_start=0.5, name="l0b"),
            SubsetRecon(coeff=1.0),
        )
    )
    trainer = Trainer(TINY, pd)
    state = trainer.abstract_state()
    target = trainer.abstract_target(jnp.float32)
    tokens = jax.ShapeDtypeStruct((8, 16), jnp.int32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    _, aux = jax.eval_shape(trainer.loss, state.params, target, tokens, state.step, key)
    assert {"pnorm", "pnorm/flat", "gamma/l0a", "gamma/l0b"} <= set(aux)
    assert "gamma" not in aux
    assert set(aux["terms"]) == {
        "faithfulness",
        "importance_minimality",
        "flat",
        "l0a",
        "l0b",
        "subset_recon",
    }


def test_two_persistent_adversaries_are_refused_at_config_time(tiny_run_config: dict) -> None:
    # `pd-train config` called this valid; the Trainer refused it only when the run started.
    term = "{{type: persistent_pgd_recon, coeff: 0.5, name: {n}, optimizer: {{lr: 0.01}}}}"
    n = len(tiny_run_config["pd"]["loss_metrics"])
    problems = _problems(
        tiny_run_config,
        f"pd.loss_metrics[{n - 1}]={term.format(n='a')}",
        f"pd.loss_metrics[0]={term.format(n='b')}",
    )
    assert problems["pd.loss_metrics"] == (
        f"terms pd.loss_metrics[0], pd.loss_metrics[{n - 1}] each keep persistent sources; "
        "at most one may"
    )


# --- target architecture mappings ----------------------------------------------------------


@pytest.mark.parametrize("typo", ["num_key_value_head", "rope_thetha"])
def test_a_typo_in_the_architecture_mapping_is_refused(tiny_run_config: dict, typo: str) -> None:
    # It was ignored and the field it meant took transformers' default (num_key_value_heads:
    # as many as the heads; rope_theta 10000): a silent wrong model.
    raw = apply_overrides(tiny_run_config, ["target.checkpoint=null"])
    assert raw["target"]["architecture"] is not None
    problems = _problems(raw, f"target.architecture.{typo}=2")
    assert problems[f"target.architecture.{typo}"].startswith(
        "unknown field; this family reads architectures, "
    )
    assert "num_key_value_heads" in problems[f"target.architecture.{typo}"]
    # Bookkeeping fields of a config.json stay accepted (they say nothing about the forward).
    prepare(apply_overrides(raw, ["target.architecture.bos_token_id=1"]), for_run=False)


def test_a_typo_in_a_gpt2_architecture_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["config", "builtin:gpt2-tiny", "--set", "target.architecture.n_heads=8"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "target.architecture.n_heads: unknown field; this family reads " in err
    assert "n_head," in err


# --- toys through the decomposition commands -----------------------------------------------


def test_config_prints_a_toy_config_and_refuses_what_run_refuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # It said "no builtin config 'tms_5_2'; ... toys: ..., builtin:tms_5_2".
    assert main(["config", "builtin:tms_5_2", "--set", "seed=3"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["toy"] == "tms_5_2" and printed["seed"] == 3
    structure(printed["pd"], PDConfig)
    assert main(["config", "builtin:tms_5_2", "--set", "target.n_features=6"]) == 2
    assert "target.n_features: got 6; the shipped tms_5_2 weights have 5" in (
        capsys.readouterr().err
    )


def test_a_decomposition_command_names_a_toy_as_a_toy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    err = _refused(tmp_path, capsys, ["submit", "builtin:tms_5_2", "--dry-run"])
    assert "builtin:tms_5_2 is a toy; this command takes decomposition configs" in err
    # A toy sweep runs here: an array job of it is refused, naming --slurm.
    argv = ["sweep", "builtin:tms_5_2", "--set-grid", "seed=[0,1]", "--sweep-dir", "s", "--slurm"]
    err = _refused(tmp_path, capsys, argv)
    assert "--slurm: builtin:tms_5_2 is a toy: its points run here" in err
    assert not (tmp_path / "s").exists()


# --- pd-train sweep ------------------------------------------------------------------------


def _sweep_config(tmp: Path) -> Path:
    config = tiny_config(tmp, tmp / "cache", steps=2)
    config["cadence"] = {"train_log_every": 1, "save_every": 0}
    return write_config(tmp, config)


@pytest.mark.parametrize(
    ("grids", "words"),
    [
        # The same value twice: two identical runs.
        (["seed=[0,0]"], "seed: the value 0 appears twice in --set-grid seed"),
        (["pd.components.lr=[1e-3,1.0e-3]"], "the value 0.001 appears twice"),
        # One field set twice in a point, the later silently winning.
        (
            ["pd.loss_metrics[1]=[{type: faithfulness, coeff: 1}]", "pd.loss_metrics[1].coeff=[2]"],
            "pd.loss_metrics[1].coeff: overlaps --set-grid pd.loss_metrics[1]; one point would "
            "set the field twice",
        ),
    ],
)
def test_a_grid_that_would_repeat_a_run_or_a_field_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], grids: list[str], words: str
) -> None:
    path = _sweep_config(tmp_path)
    argv = ["sweep", str(path), "--sweep-dir", str(tmp_path / "sweep")]
    for grid in grids:
        argv += ["--set-grid", grid]
    _refused(tmp_path, capsys, argv, words)


def test_a_grid_inside_a_set_override_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _sweep_config(tmp_path)
    argv = ["sweep", str(path), "--sweep-dir", str(tmp_path / "sweep")]
    argv += ["--set", "pd.components={lr: 1.0e-3}", "--set-grid", "pd.components.lr=[1e-3,2e-3]"]
    _refused(
        tmp_path,
        capsys,
        argv,
        "pd.components.lr: overlaps --set pd.components; one point would set the field twice",
    )


# --- pd-train pull -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["offline", "disabled"])
def test_pulling_a_wandb_reference_offline_says_what_to_pull_instead(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    # It reached wandb.Api() and said "No API key configured. Use `wandb login`".
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", mode)
    argv = ["pull", "wandb:someone/project/runs/abc123", "--out", str(tmp_path / "out")]
    err = _refused(tmp_path, capsys, argv)
    assert f"WANDB_MODE={mode} reaches no W&B server; pull the run's offline directory" in err


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/outside.txt", ""])
def test_a_manifest_path_outside_the_run_dir_is_refused(tmp_path: Path, name: str) -> None:
    # dest / "../x" wrote beside the pulled run dir, dest / "/etc/x" anywhere.
    from types import SimpleNamespace

    from pd_train.analysis.wandb_io import PullError, _copy_offline

    staged = tmp_path / "staged"
    staged.write_text("data")
    entry = SimpleNamespace(path=name, local_path=str(staged), size=4, digest="")
    artifact = SimpleNamespace(manifest=SimpleNamespace(contents=[entry]))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(PullError, match="names a file outside the run dir"):
        _copy_offline(artifact, dest)
    assert not (tmp_path / "outside.txt").exists() and list(dest.iterdir()) == []


@pytest.mark.parametrize(
    ("kind", "fixture"),
    [
        ("gpt2", "gpt2"),
        ("gpt2", "gpt2_bare"),
        ("llama", "llama3_gqa"),
        ("llama", "tied"),
        ("qwen2", "qwen2"),
        ("qwen3", "qwen3"),
    ],
)
def test_a_whole_config_json_stays_a_valid_architecture_mapping(kind: str, fixture: str) -> None:
    # What a checkpoint's config.json says beside the architecture (token ids, dropout, ...) is
    # accepted and ignored; only fields no family reads are refused.
    import json

    from pd_train.config.run import target_architecture
    from pd_train.targets import target_kind

    fixtures = Path(__file__).parent / "fixtures"
    arch = json.loads((fixtures / fixture / "config.json").read_text())
    target_architecture(target_kind(kind).config(architecture=arch))
    with pytest.raises(ConfigError, match=r"target\.architecture\.n_heads: unknown field"):
        target_architecture(target_kind(kind).config(architecture={**arch, "n_heads": 1}))


def test_a_grid_over_a_structural_field_is_allowed_and_says_it_compiles_per_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _sweep_config(tmp_path)
    argv = ["sweep", str(path), "--sweep-dir", str(tmp_path / "sweep"), "--dry-run"]
    argv += ["--set-grid", "seed=[0,1]", "--set-grid", "pd.ci.type=[mlp, vector_mlp]"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if "is structural" in line]
    assert notes == [
        "# pd.ci.type is structural (which loss term or CI function this is): each of its "
        "values compiles its programs"
    ], out
    assert not (tmp_path / "sweep").exists()


# --- toys ----------------------------------------------------------------------------------


def test_a_toy_resume_keeps_the_frequency_ema(tmp_path: Path) -> None:
    # The toy runner's checkpoint left TrainState.term_state out: a resumed smooth-L0 run with
    # an EMA restarted it from zeros (the main run's checkpoint keeps it).
    import attrs
    import numpy as np

    from pd_train.config.pd import FaithfulnessWarmup
    from pd_train.run.checkpoints import Checkpoints
    from pd_train.targets.toys import decompose, make_target, toy_config, toy_data, toy_weights

    toy = toy_config("tms_5_2_fast")
    terms = tuple(
        SmoothL0ImportanceMinimality(coeff=t.coeff, frequency_coeff=1e-4, ema_halflife_steps=5.0)
        if t.type == "importance_minimality"
        else t
        for t in toy.pd.loss_metrics
    )
    pd = attrs.evolve(
        toy.pd,
        steps=20,
        batch_size=64,
        loss_metrics=terms,
        faithfulness_warmup=FaithfulnessWarmup(steps=0),
    )
    target = make_target(toy)
    trainer = Trainer(target, pd)

    def run(ckpt: Checkpoints, **kw: object) -> object:
        _, state = decompose(
            target, toy_weights("tms_5_2"), pd, seed=3, feature_probability=toy.feature_probability,
            data=toy_data(toy), trainer=trainer, steps_per_call=10, log_every=10,
            checkpoints=ckpt, **kw,
        )  # fmt: skip
        return jax.device_get(state)

    with Checkpoints(tmp_path / "straight") as ckpt:
        straight = run(ckpt, checkpoint_every=10)
    with Checkpoints(tmp_path / "stopped") as ckpt:
        run(ckpt, checkpoint_every=10, max_steps=10)
    with Checkpoints(tmp_path / "stopped") as ckpt:
        resumed = run(ckpt, resume=True)
    assert straight.term_state and int(resumed.step) == 20
    for a, b in zip(
        jax.tree_util.tree_leaves(straight), jax.tree_util.tree_leaves(resumed), strict=True
    ):
        np.testing.assert_array_equal(a, b)
