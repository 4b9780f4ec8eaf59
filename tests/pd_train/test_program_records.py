"""On a compile-cache miss, `pd-train compile` says which structural fields differ from the
nearest cached program (or that nothing of that jit was cached before)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pd_train.cli import main
from pd_train.program_records import RECORDS_DIR

from ._cli import tiny_config


def _explanations(err: str, jit: str = "train_step") -> list[str]:
    return [line for line in err.splitlines() if line.startswith(f"cache miss: {jit}:")]


def test_a_miss_names_the_structural_field_that_differs(tmp_path: Path, capsys) -> None:
    cache = tmp_path / "cache"
    config = tiny_config(tmp_path, cache)
    config["data"]["path"] = None
    config["pd"]["faithfulness_warmup"] = {"steps": 0}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))

    # A first compile into an empty cache: nothing to compare with, and it says so.
    assert main(["compile", str(path)]) == 0
    first = capsys.readouterr().err
    # A new cache: one line for all the jits, none per jit.
    (line,) = [x for x in first.splitlines() if x.startswith("cache miss: ")]
    assert "holds no programs yet" in line, first
    records = [json.loads(p.read_text()) for p in (cache / RECORDS_DIR).glob("*.json")]
    (step,) = [r for r in records if r["jit"] == "train_step"]
    assert step["structural"]["pd.batch_size"] == 8
    assert step["structural"]["data.seq_len"] == 16
    assert step["values"]["pd.components.lr"] == 1e-3

    # The same config again: every jit hits, nothing to explain.
    assert main(["compile", str(path)]) == 0
    assert "cache miss:" not in capsys.readouterr().err

    # Another batch size: the step misses, and the line names the field and both values.
    assert main(["compile", str(path), "--set", "pd.batch_size=16"]) == 0
    err = capsys.readouterr().err
    (line,) = _explanations(err)
    assert "differs in structural fields: pd.batch_size (8 there, 16 here)" in line, err
    assert "data.seq_len" not in line  # only what differs

    # Another C and seq_len from the first config: both named, nearest is the first config
    # (one field apart from it, two from the batch-16 one).
    overrides = ["--set", "pd.decomposition_targets[1].C=24", "--set", "data.seq_len=8"]
    assert main(["compile", str(path), *overrides]) == 0
    (line,) = _explanations(capsys.readouterr().err)
    assert "pd.decomposition_targets[1].C (16 there, 24 here)" in line, line
    assert "data.seq_len (16 there, 8 here)" in line, line
    assert "pd.batch_size" not in line, line

    # A learning rate is data of the step (issue 27): its change loads the step from the
    # cache, so no line explains a train_step miss.
    assert main(["compile", str(path), "--set", "pd.components.lr=0.004"]) == 0
    lines = _explanations(capsys.readouterr().err)
    assert not [line for line in lines if "train_step" in line], lines


def _here(**changes: dict) -> dict:
    here = {
        "structural": {"pd.batch_size": 8, "data.seq_len": 16},
        "values": {"seed": 0, "pd.steps": 100},
        "environment": {"jax": "0.10.2", "pd source": "aaaa"},
    }
    for section, values in changes.items():
        here[section] = {**here[section], **values}
    return here


def test_the_nearest_record_decides_the_explanation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pd_train.config import hyperparameters
    from pd_train.program_records import ProgramRecords

    ProgramRecords(tmp_path, _here()).remember("train_step")
    ProgramRecords(tmp_path, _here(structural={"pd.batch_size": 16})).remember("train_step")

    def explain(**changes: dict) -> str:
        return ProgramRecords(tmp_path, _here(**changes)).explain("train_step")

    assert "no eval_metrics program was recorded" in ProgramRecords(tmp_path, _here()).explain(
        "eval_metrics"
    )
    line = explain(structural={"data.seq_len": 32})
    assert "structural fields: data.seq_len (16 there, 32 here);" in line  # nearest: batch 8
    line = explain(environment={"pd source": "bbbb"})
    assert 'another environment: pd source ("aaaa" there, "bbbb" here)' in line, line
    # Every value field is data today; were one still a constant of the program, a miss from
    # it alone is named as such.
    with monkeypatch.context() as m:
        m.setattr(hyperparameters, "CONSTANT_VALUE_FIELDS", frozenset({"pd.steps"}))
        line = explain(values={"pd.steps": 600})
    assert "still compiled in as constants: pd.steps (100 there, 600 here)" in line, line
    # Only a value that is data differs: that miss is not explained.
    line = explain(values={"pd.steps": 600})
    assert "differs in no structural field" in line and "unexpected" in line, line
    line = explain(values={"seed": 7})
    assert "differs in no structural field" in line and "unexpected" in line, line
    assert "seed (0 there, 7 here)" in line, line
