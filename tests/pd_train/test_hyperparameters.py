"""Every config field is classified structural, value or outside, once; the docs' table is the
code's list; concrete config paths map onto the schema's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pd_train.config import hyperparameters
from pd_train.config.io import unstructure
from pd_train.config.run import load_config
from pd_train.configs import builtin_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "hyperparameters.md"


def test_every_config_field_is_classified_exactly_once() -> None:
    schema = hyperparameters.schema_paths()
    classified = Counter(f.path for f in hyperparameters.FIELDS)
    twice = sorted(p for p, n in classified.items() if n > 1)
    assert not twice, f"classified twice in pd_train.config.hyperparameters.FIELDS: {twice}"
    missing = sorted(set(schema) - set(classified))
    assert not missing, (
        f"config fields in no list of pd_train.config.hyperparameters.FIELDS: {missing}; classify each "
        "as structural (changes a program), value (a scalar that must not) or outside"
    )
    stale = sorted(set(classified) - set(schema))
    assert not stale, f"classified but not in the config schema (renamed?): {stale}"
    assert set(hyperparameters.DATA_VALUE_FIELDS) <= set(hyperparameters.value_fields())


def test_the_issue_s_examples_are_classified_as_it_says() -> None:
    structural = set(hyperparameters.structural_fields())
    values = set(hyperparameters.value_fields())
    assert {
        "pd.batch_size",
        "data.seq_len",
        "pd.decomposition_targets[*].C",
        "runtime.compute_dtype",
        "runtime.mesh.data",
        "pd.loss_metrics[type=pgd_recon].n_steps",
        "pd.loss_metrics[type=chunkwise_subset_recon].sites_per_chunk",
    } <= structural
    assert {
        "seed",
        "pd.steps",
        "pd.components.lr",
        "pd.ci_fn.warmup_steps",
        "pd.loss_metrics[type=importance_minimality].coeff",
        "pd.loss_metrics[type=importance_minimality].anneal_end_frac",
        "pd.loss_metrics[type=persistent_pgd_recon].optimizer.lr",
        "pd.loss_metrics[type=pgd_recon].step_size",
    } <= values


def test_the_docs_table_is_the_code_s_list() -> None:
    text = DOC.read_text()
    start = text.index("<!-- generated: pd_train.config.hyperparameters.markdown_table() -->\n")
    end = text.index("<!-- end generated -->")
    table = text[start:end].split("\n", 1)[1]
    assert table == hyperparameters.markdown_table(), (
        "docs/hyperparameters.md's table is stale: regenerate it from "
        "pd_train.config.hyperparameters.markdown_table()"
    )


def test_concrete_paths_name_their_schema_field() -> None:
    config, _ = load_config(builtin_config("default"))
    raw = unstructure(config)
    leaves = hyperparameters.config_leaves(raw)
    assert leaves["pd.loss_metrics[1].coeff"] == raw["pd"]["loss_metrics"][1]["coeff"]
    assert (
        hyperparameters.schema_path("pd.loss_metrics[1].anneal_end_frac", raw)
        == "pd.loss_metrics[type=importance_minimality].anneal_end_frac"
    )
    assert hyperparameters.leaf_class("pd.loss_metrics[4].optimizer.lr", raw).kind == "value"
    assert hyperparameters.leaf_class("pd.decomposition_targets[1].C", raw).kind == "structural"
    assert hyperparameters.leaf_class("pd.ci.hidden_dims", raw).kind == "structural"
    assert hyperparameters.leaf_class("pd.loss_metrics[2].type", raw).kind == "structural"
    assert hyperparameters.leaf_class("cadence.eval_every", raw).kind == "outside"
    # Every leaf of a real config is classified (a mapping field is one leaf).
    assert "target.architecture" in leaves and "pd.l0_groups" in leaves
    for path in leaves:
        hyperparameters.leaf_class(path, raw)
