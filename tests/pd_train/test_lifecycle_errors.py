"""Ordinary mistakes with `pd-train run` and `pd-train config` (issue 16, item 5): each is a
clear error naming the field or argument, exit 2, and nothing written — all decided before a
device is touched, so every case runs in-process in milliseconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pd_train.cli import main

from ._cli import _config, _refused, _snapshot


def test_output_dir_that_is_a_file_or_not_creatable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "afile").write_text("")
    config = _config(tmp_path, output_dir=str(tmp_path / "afile"))
    _refused(tmp_path, capsys, ["run", str(config)], "output_dir:", "is a file, not a directory")
    config = _config(tmp_path, output_dir=str(tmp_path / "afile" / "runs"))
    _refused(tmp_path, capsys, ["run", str(config)], "output_dir:", "cannot create")
    config = _config(tmp_path)
    _refused(
        tmp_path,
        capsys,
        ["run", str(config), "--run-dir", str(tmp_path / "afile" / "r")],
        "--run-dir",
        "cannot create",
    )


def test_builtin_typos_name_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path)
    _refused(
        tmp_path,
        capsys,
        ["run", str(config), "--set", "data.path=builtin:tiny_corpsu"],
        "data.path:",
        "builtin:tiny_corpus",
    )
    _refused(
        tmp_path,
        capsys,
        ["run", str(config), "--set", "target.checkpoint=builtin:tiny_lama"],
        "target.checkpoint:",
        "builtin:tiny_llama",
    )


@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_max_steps_must_be_a_whole_number_above_zero(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["run", str(config), "--max-steps", value])
    assert info.value.code == 2
    assert "--max-steps" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_a_config_path_that_is_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "configs").mkdir()
    for command in ("run", "config"):
        err = _refused(tmp_path, capsys, [command, str(tmp_path / "configs")], "is a directory")
        assert "does not exist" not in err


def test_a_file_named_npy_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    (tmp_path / "text.npy").write_text("the cat sat on the mat\n")
    (tmp_path / "empty.npy").write_bytes(b"")
    for name in ("text.npy", "empty.npy"):
        _refused(
            tmp_path,
            capsys,
            ["run", str(config), "--set", f"data.path={tmp_path / name}"],
            "data.path:",
            "not a NumPy .npy file",
        )


def test_seq_len_longer_than_the_target_allows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)  # the tiny architecture: max_position_embeddings 2048
    _refused(
        tmp_path,
        capsys,
        ["run", str(config), "--set", "data.seq_len=4096"],
        "data.seq_len: got 4096, more than the target's max_position_embeddings (2048)",
    )


def test_token_ids_at_or_above_the_vocabulary_are_refused_at_validation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny target's vocab is 64: a token 64 at the end of the file (never in the first
    batch) is refused before anything runs, naming the file and the id."""
    config = _config(tmp_path)
    tokens = np.random.default_rng(1).integers(0, 64, size=20_000, dtype=np.uint16)
    tokens[-1] = 64
    np.save(tmp_path / "big.npy", tokens)
    _refused(
        tmp_path,
        capsys,
        ["run", str(config), "--set", f"data.path={tmp_path / 'big.npy'}"],
        f"data.path: {tmp_path / 'big.npy'} holds token ids up to 64",
        "at position 19999",
        "vocab_size is 64",
    )


@pytest.mark.parametrize("ci_type", ["mlp", "vector_mlp", "shared_mlp"])
def test_ci_hidden_dims_must_name_at_least_one_layer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ci_type: str
) -> None:
    """`hidden_dims: []` was printed as valid by `pd-train config`, then an IndexError."""
    config = _config(tmp_path)
    sets = ["--set", f"pd.ci.type={ci_type}", "--set", "pd.ci.hidden_dims=[]"]
    for command in ("config", "run"):
        _refused(
            tmp_path,
            capsys,
            [command, str(config), *sets],
            "pd.ci.hidden_dims: got []; must be a non-empty list of positive ints",
        )


@pytest.mark.parametrize("command", ["run", "compile", "analyze", "probe"])
def test_simulate_devices_must_be_at_least_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """0 used to mean "no simulation" (`pd-train run`) without a word."""
    config = _config(tmp_path)
    target = str(tmp_path) if command == "analyze" else str(config)
    before = _snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main([command, target, "--simulate-devices", "0"])
    assert exit_info.value.code == 2
    assert "argument --simulate-devices: got 0; must be >= 1" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_resume_of_a_toy_run_advises_a_command_that_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A toy run dir without a checkpoint (an interrupted start): `--resume` of it used to
    advise `pd-train run DIR/config.yaml --run-dir DIR`, which is then refused (the dir is not
    empty)."""
    from pd_train.cli.toy import load_toy_config

    # The toy run dir as the toy runner leaves it after an interrupted start (its config.yaml
    # written by the same function; no checkpoint yet).
    run_dir = tmp_path / "toy"
    run_dir.mkdir()
    raw = load_toy_config("builtin:tms_5_2", ["pd.steps=4", "pd.batch_size=16"])
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    (run_dir / "metrics.jsonl").write_text("")
    assert main(["run", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"{run_dir} is a toy run without a checkpoint" in err
    advised = f"pd-train run {run_dir / 'config.yaml'} --run-dir NEW_DIR"
    assert advised in err, err
    # The advice, followed, is accepted.
    argv = advised.split()[1:]
    argv[-1] = str(tmp_path / "again")
    assert main([*argv, "--max-steps", "1"]) == 0
    assert (tmp_path / "again" / "summary.txt").is_file()


@pytest.mark.parametrize("case", ["missing", "extra_layer", "wrong_shape"])
def test_safetensors_tensor_errors_stop_the_run_before_its_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """The loader's refusals (see test_hf_strict) now come at validation: exit 2 naming the
    file and tensor, no run dir. Was: raised once the run dir was made and compiling began."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from pd_train.config.run import resolve_path

    checkpoint = tmp_path / "ckpt"
    shutil.copytree(resolve_path("builtin:tiny_llama"), checkpoint)
    tensors = load_file(checkpoint / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    if case == "missing":
        del tensors[name]
        words = [f"tensor {name!r} is missing from"]
    elif case == "extra_layer":
        tensors["model.layers.4.mlp.up_proj.weight"] = tensors[name]
        words = ["model.layers.4.mlp.up_proj.weight", "target.strict: false"]
    else:
        tensors[name] = tensors[name][:, :-1].copy()
        words = [f"tensor {name!r}", "config.json implies"]
    save_file(tensors, checkpoint / "model.safetensors")
    config = _config(tmp_path, target={"checkpoint": str(checkpoint)})
    _refused(tmp_path, capsys, ["run", str(config)], "target.checkpoint:", str(checkpoint), *words)


def test_pd_train_config_validates_what_it_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path)
    pattern = "pd.decomposition_targets[0].module_pattern=layers.*.nothing"
    _refused(tmp_path, capsys, ["config", str(config), "--set", pattern], "decomposition_targets")
    assert main(["config", str(config)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["path"] == str(tmp_path / "tokens.npy")


def test_all_problems_of_a_section_are_reported_together(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """attrs stops at a section's first failing validator, and at a type error before any;
    every problem is listed, each with its field."""
    config = _config(tmp_path)
    sets = ["pd.steps=-1", "pd.batch_size=0", "pd.components.lr=fast", "cadence.eval_every=-2"]
    argv = ["config", str(config)] + [a for s in sets for a in ("--set", s)]
    _refused(
        tmp_path,
        capsys,
        argv,
        "pd.steps: got -1; must be > 0",
        "pd.batch_size: got 0; must be > 0",
        "pd.components.lr: got 'fast' (str); expected float",
        "cadence.eval_every: got -2; must be >= 0",
    )


def test_tokens_fixture_is_valid(tmp_path: Path) -> None:
    """The baseline every case above changes one thing of: it passes validation."""
    from pd_train.run import prepare

    config = _config(tmp_path)
    assert np.load(tmp_path / "tokens.npy").size == 20_000
    prepare(config)


def test_ctrl_c_before_the_step_loop_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while the config loads or the runtime starts (before the loop's handler, which
    saves first): one line, no traceback, the interrupted exit code."""
    from pd_train.cli import config as config_command

    def interrupted(_args: Any) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(config_command, "config", interrupted)
    assert main(["config"]) == 130
    err = capsys.readouterr().err
    assert err == "pd-train: interrupted (Ctrl-C)\n"
