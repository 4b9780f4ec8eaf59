"""Toy runs are first-class runs: `pd-train run builtin:<toy>` goes through the run loop with a
K-step step function and writes the run-dir layout (config, metrics.jsonl with phases, orbax
checkpoints), prints progress from the start, resumes bit-exact with `--resume`, and `pd-train
analyze` / `pd-train report` work on its dir (the ground-truth table and the toy's plots)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml

from pd_train.analysis.ground_truth import describe_identity_failures
from pd_train.cli import main
from pd_train.run.checkpoints import Checkpoints

SETS = [
    "--set", "pd.steps=20", "--set", "pd.batch_size=32", "--set", "steps_per_call=5",
    "--set", "log_every=5", "--set", "save_every=10",
]  # fmt: skip


def _params(run_dir: Path, step: int) -> list[np.ndarray]:
    from pd_train.cli.toy import load_toy_config, toy_pd_config
    from pd_train.run.checkpoints import abstract_like
    from pd_train.targets.toys import make_target, toy_config, toy_training_item
    from pd_train.train import Trainer

    raw = load_toy_config(str(run_dir / "config.yaml"))
    trainer = Trainer(make_target(toy_config(raw["toy"])), toy_pd_config(raw))
    state = trainer.init_state(key=jax.random.key(0))
    with Checkpoints(run_dir / "checkpoints") as ck:
        params, _, _ = ck.restore(
            decomposition=abstract_like(state.params),
            training=abstract_like(toy_training_item(state)),
            step=step,
        )
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(jax.device_get(params))]


def test_a_toy_run_is_a_run_resumed_analyzed_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole, part = tmp_path / "whole", tmp_path / "part"
    assert main(["run", "builtin:tms_5_2_fast", *SETS, "--run-dir", str(whole)]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    # Progress from the start: the plan before the first (compiling) call, then each record.
    first = next(i for i, line in enumerate(lines) if line.startswith("tms_5_2_fast: 20 steps"))
    assert "K = 5" in lines[first]
    assert any(line.startswith("step 1/20 (5%) | total=") for line in lines[first + 1 :]), err
    records = [json.loads(x) for x in (whole / "metrics.jsonl").read_text().splitlines()]
    train = [r["step"] for r in records if r["phase"] == "train"]
    assert train == [0, 5, 10, 15, 19]
    assert [r["phase"] for r in records][-1] == "eval" and "gt/identity_ci_error" in records[-1]
    assert Checkpoints(whole / "checkpoints").steps() == [10, 20]
    # What each site's nonzero IdentityCIError is made of, in the summary and its text.
    summary = json.loads((whole / "summary.json").read_text())
    text = (whole / "summary.txt").read_text()
    for site in ("layers.0.linear1", "layers.0.linear2"):
        count = summary[f"gt/identity_ci_error/{site}"]
        failures = summary["identity_failures"].get(site)
        assert (failures is not None) == (count > 0), (site, count)
        if failures:
            assert len(failures["without_own"]) + len(failures["extra"]) == count
            assert len(failures["without_own_rank"]) == len(failures["without_own"])
            assert describe_identity_failures(failures)[0] in text

    # Stopped after 10 steps, then resumed: the same params as the run that went through.
    assert (
        main(["run", "builtin:tms_5_2_fast", *SETS, "--run-dir", str(part), "--max-steps", "10"])
        == 0
    )
    assert Checkpoints(part / "checkpoints").steps() == [10]
    assert main(["run", "--resume", str(part)]) == 0
    assert Checkpoints(part / "checkpoints").steps() == [10, 20]
    for a, b in zip(_params(whole, 20), _params(part, 20), strict=True):
        np.testing.assert_array_equal(a, b)
    resumed = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed if r["phase"] == "train"] == [0, 5, 9, 10, 15, 19]
    capsys.readouterr()

    assert main(["analyze", str(whole)]) == 0
    out = capsys.readouterr().out
    assert "tms_5_2_fast at step 20: IdentityCIError" in out, out
    analysis = json.loads((whole / "analysis" / "ground_truth-20.json").read_text())
    summary = json.loads((whole / "summary.json").read_text())
    assert analysis["gt/identity_ci_error"] == summary["gt/identity_ci_error"]
    assert (whole / "plots" / "tms_5_2_fast_uv.png").read_bytes()[:4] == b"\x89PNG"

    assert main(["report", str(whole)]) == 0
    page = (whole / "report.html").read_text()
    assert "Ground truth (the reference&#x27;s metrics)" in page or "Ground truth" in page
    assert 'id="ground-truth"' in page and "layers.0.linear2" in page
    assert 'alt="permuted ci"' in page and 'alt="uv"' in page
    assert ('id="identity-failures"' in page) == bool(summary["identity_failures"])
    assert "No metrics recorded yet" not in page


def test_a_failed_plot_loses_no_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plots are drawn after the summary and the last checkpoint are written: a plot that
    fails (here: matplotlib missing, as on a bare accelerator machine) raises, and what the run
    measured is on disk."""
    import pd_train.targets.toys as toys

    def no_matplotlib(*args: object, **kwargs: object) -> None:
        raise ModuleNotFoundError("No module named 'matplotlib'")

    monkeypatch.setattr(toys, "write_plots", no_matplotlib)
    run = tmp_path / "run"
    with pytest.raises(ModuleNotFoundError, match="matplotlib"):
        main(["run", "builtin:tms_5_2_fast", *SETS, "--run-dir", str(run)])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 20 and "gt/identity_ci_error" in summary
    assert "reproduced by the reference's criteria" in (run / "summary.txt").read_text()
    assert Checkpoints(run / "checkpoints").steps() == [10, 20]
    assert not (run / "plots").exists()


def _resid_mlp_by_hand(raw: Any, x: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """A residual-MLP toy's shipped weights ``raw`` run by hand in numpy (float64) on the
    inputs x [N, n_features]: per layer, the residual stream it reads (the embedding plus the
    earlier MLPs' outputs) and its ``mlp_in`` output, the pre-activation."""
    stream = x @ raw["embed"].astype(np.float64)
    layers = []
    for layer in range(raw["layers.mlp_in"].shape[0]):
        pre = stream @ raw["layers.mlp_in"][layer]
        layers.append((stream, pre))
        stream = stream + np.maximum(pre, 0.0) @ raw["layers.mlp_out"][layer]
    return layers


def _ci_mlps_by_hand(params: Any, kind: str, layer: int, x: np.ndarray) -> np.ndarray:
    """The per-component CI MLPs (``mlp``) of ``kind`` in ``layer`` run by hand in numpy
    (float64) on the site's inputs x [N, d_in]: Σ_h w_out·gelu((x @ V)_c·w0 + b0) + b_out
    (exact GELU), clipped to [0, 1], [N, C]."""
    from scipy.special import erf

    v = np.asarray(params["components"][kind]["V"][layer], np.float64)
    p = {k: np.asarray(a[layer], np.float64) for k, a in params["ci_fn"][kind].items()}
    pre = (x @ v)[..., None] * p["w0"] + p["b0"]  # [N, C, H]
    gelu = pre * 0.5 * (1.0 + erf(pre / np.sqrt(2.0)))
    return np.clip((gelu * p["w_out"]).sum(-1) + p["b_out"], 0.0, 1.0)


def test_one_hot_output_norms_are_the_targets_own() -> None:
    """Each site's ‖x @ W‖ on the inputs 0.75·e_i, against the shipped weights run by hand in
    numpy: TMS 5-2 (linear1 reads the input, linear2 the hidden x @ W1) and the 3-layer
    residual MLP (each layer reads the residual stream, embed plus the earlier MLPs' outputs)."""
    from pd_train.targets.toys import (
        make_target,
        one_hot_output_norms,
        toy_config,
        toy_trainer,
        toy_weights,
        toy_weights_path,
    )

    for name in ("tms_5_2", "resid_mlp3"):
        toy = toy_config(name)
        trainer = toy_trainer(make_target(toy), toy.pd)
        raw = np.load(toy_weights_path(name))
        got = one_hot_output_norms(trainer, toy_weights(name), toy.target.n_features)
        x = 0.75 * np.eye(toy.target.n_features)
        want = {}
        if name == "tms_5_2":
            w1, w2 = raw["layers.linear1"][0], raw["layers.linear2"][0]
            want["layers.0.linear1"] = np.linalg.norm(x @ w1, axis=1)
            want["layers.0.linear2"] = np.linalg.norm(x @ w1 @ w2, axis=1)
        else:
            for layer, (_, pre) in enumerate(_resid_mlp_by_hand(raw, x)):
                out = np.maximum(pre, 0.0) @ raw["layers.mlp_out"][layer]
                want[f"layers.{layer}.mlp_in"] = np.linalg.norm(pre, axis=1)
                want[f"layers.{layer}.mlp_out"] = np.linalg.norm(out, axis=1)
        assert sorted(got) == sorted(want)
        for site, value in want.items():
            np.testing.assert_allclose(got[site], value, rtol=1e-5, err_msg=f"{name} {site}")


def test_identity_failures_name_the_even_part_of_resid_mlp3s_later_layers() -> None:
    """resid_mlp3's sites at ±0.75·e_i against the shipped weights run by hand in numpy: each
    layer's ``mlp_in`` output at -0.75 is the forward's (``one_hot_site_outputs``), and a CI with
    one component shared by two features in every layer gets ``even_part`` in layers 1 and 2
    only (layer 0 reads the embedding alone: linear in the feature's value), with the median
    ‖even‖/‖odd‖ and the shared component's |cos| with the even parts' first singular
    direction, that component's U set along it (1) in layer 1 and along a neuron (its |cos|
    with the direction, by hand) in layer 2."""
    from pd_train.targets.toys import (
        make_target,
        one_hot_site_outputs,
        toy_config,
        toy_identity_failures,
        toy_trainer,
        toy_weights,
        toy_weights_path,
    )

    toy = toy_config("resid_mlp3")
    trainer = toy_trainer(make_target(toy), toy.pd)
    raw = np.load(toy_weights_path("resid_mlp3"))
    f = toy.target.n_features
    pre = {
        (sign, layer): layer_pre
        for sign in (1.0, -1.0)
        for layer, (_, layer_pre) in enumerate(_resid_mlp_by_hand(raw, sign * 0.75 * np.eye(f)))
    }
    neg = one_hot_site_outputs(trainer, toy_weights("resid_mlp3"), f, magnitude=-0.75)
    for layer in range(3):
        np.testing.assert_allclose(neg[f"layers.{layer}.mlp_in"], pre[-1.0, layer], atol=1e-5)

    params = jax.device_get(trainer.init_state(key=jax.random.key(0)).params)
    u = np.array(params["components"]["mlp_in"]["U"])  # [3, C, 17]
    even_dir, ratio = {}, {}
    for layer in (1, 2):
        odd = (pre[1.0, layer] - pre[-1.0, layer]) / 2
        even = (pre[1.0, layer] + pre[-1.0, layer]) / 2
        ratio[layer] = np.median(np.linalg.norm(even, axis=1) / np.linalg.norm(odd, axis=1))
        even_dir[layer] = np.linalg.svd(even)[2][0]
    u[1, 5] = 3.0 * even_dir[1]
    u[2, 5] = np.eye(17)[4]
    params["components"]["mlp_in"]["U"] = u
    c = u.shape[1]
    ci = {}
    for layer in range(3):  # features 0 and 1 on component 5, every other feature on its own
        m = np.zeros((f, c))
        m[np.arange(2, f), np.arange(10, f + 8)] = 1.0
        m[0, 5] = m[1, 5] = 1.0
        ci[f"layers.{layer}.mlp_in"] = m
    failures = toy_identity_failures(toy, trainer, toy_weights("resid_mlp3"), ci, params)
    assert sorted(failures) == [f"layers.{layer}.mlp_in" for layer in range(3)]
    assert "even_part" not in failures["layers.0.mlp_in"]
    for layer, cos in ((1, 1.0), (2, abs(even_dir[2][4]))):
        even = failures[f"layers.{layer}.mlp_in"]["even_part"]
        assert ratio[layer] > 0.1
        assert even["even_to_odd"] == pytest.approx(ratio[layer], rel=1e-3)
        assert even["shared_alignment"] == [[5, pytest.approx(cos, abs=1e-3)]]


def test_identity_failures_count_the_own_components_on_at_both_signs() -> None:
    """``two_sided`` of resid_mlp3's layers 1 and 2 (C 500) against the target and the CI MLPs
    run by hand in numpy at ±0.75·e_i: of the features whose top component is ≥ 0.9 at +0.75,
    those with that component > 0.1 at -0.75. Each component's CI MLP is set to ~1 where its
    inner activation has one sign (each component's own, at random) and 0 at the other, so
    that a feature's top component is off at -0.75 where the inner activation flips with the
    feature's sign and on where the even part keeps it."""
    from pd_train.targets.toys import (
        make_target,
        toy_config,
        toy_identity_failures,
        toy_trainer,
        toy_weights,
        toy_weights_path,
    )

    toy = toy_config("resid_mlp3")
    trainer = toy_trainer(make_target(toy), toy.pd)
    params = jax.device_get(trainer.init_state(key=jax.random.key(0)).params)
    rng = np.random.default_rng(0)
    ci_fn = {}
    for kind, p in params["ci_fn"].items():  # CI = clip(gelu(±50·inner), 0, 1)
        sign = rng.choice([-1.0, 1.0], size=p["w0"].shape[:-1])
        ci_fn[kind] = {
            "w0": np.zeros(p["w0"].shape, np.float32),
            "b0": np.zeros(p["b0"].shape, np.float32),
            "w_out": np.zeros(p["w_out"].shape, np.float32),
            "b_out": np.zeros(p["b_out"].shape, np.float32),
        }
        ci_fn[kind]["w0"][..., 0] = 50.0 * sign
        ci_fn[kind]["w_out"][..., 0] = 1.0
    params = {**params, "ci_fn": ci_fn}
    raw = np.load(toy_weights_path("resid_mlp3"))
    f = toy.target.n_features
    ci = {}
    for sign in (1.0, -1.0):
        for layer, (stream, _) in enumerate(_resid_mlp_by_hand(raw, sign * 0.75 * np.eye(f))):
            ci[sign, layer] = _ci_mlps_by_hand(params, "mlp_in", layer, stream)
    positive = {f"layers.{layer}.mlp_in": ci[1.0, layer] for layer in range(3)}
    failures = toy_identity_failures(toy, trainer, toy_weights("resid_mlp3"), positive, params)
    assert "even_part" not in failures["layers.0.mlp_in"]
    for layer in (1, 2):  # the CI at +0.75 is the test's; pd computes the one at -0.75
        pos, neg = ci[1.0, layer], ci[-1.0, layer]
        own = [(i, int(pos[i].argmax())) for i in range(f) if pos[i].max() >= 0.9]
        assert min(abs(neg[i, c] - 0.1) for i, c in own) > 1e-3  # none within float rounding
        k = sum(neg[i, c] > 0.1 for i, c in own)
        assert 0 < k < len(own), (k, len(own))  # both kinds present: the count can be wrong
        assert failures[f"layers.{layer}.mlp_in"]["even_part"]["two_sided"] == [k, len(own)]


def test_one_hot_ci_is_the_ci_mlps_written_out_past_component_256() -> None:
    """``one_hot_ci`` of resid_mlp3 at the paper's C 500, every component of every site, against
    the CI MLPs run by hand in numpy (float64) on the shipped weights: residual stream, each
    site's x @ V, Σ_h w_out·gelu(inner·w0 + b0) + b_out, clipped to [0, 1]. With XLA:CPU's
    YNN fusions (its default) jax 0.10.2 computed every ``mlp_out`` component past the 256th
    wrong here; ``pd-train analyze`` builds a plain Trainer, as this test does."""
    from pd_train.targets.toys import (
        make_target,
        one_hot_ci,
        toy_config,
        toy_weights,
        toy_weights_path,
    )
    from pd_train.train import Trainer

    toy = toy_config("resid_mlp3")
    trainer = Trainer(make_target(toy), toy.pd)
    params = jax.device_get(trainer.init_state(key=jax.random.key(0)).params)
    rng = np.random.default_rng(0)
    ci_fn = {}  # CI MLPs whose outputs spread over [0, 1] (at init they are ~0 everywhere)
    for kind, p in params["ci_fn"].items():
        h = p["w0"].shape[-1]
        ci_fn[kind] = {
            "w0": rng.normal(size=p["w0"].shape).astype(np.float32),
            "b0": rng.normal(size=p["b0"].shape).astype(np.float32),
            "w_out": (rng.normal(size=p["w_out"].shape) / h**0.5).astype(np.float32),
            "b_out": np.full(p["b_out"].shape, 0.5, np.float32),
        }
    params = {**params, "ci_fn": ci_fn}
    got = one_hot_ci(trainer, params, toy_weights("resid_mlp3"), toy.target.n_features)

    raw = np.load(toy_weights_path("resid_mlp3"))
    checked = 0
    for layer, (stream, pre_act) in enumerate(
        _resid_mlp_by_hand(raw, 0.75 * np.eye(toy.target.n_features))
    ):
        for kind, x in (("mlp_in", stream), ("mlp_out", np.maximum(pre_act, 0.0))):
            want = _ci_mlps_by_hand(params, kind, layer, x)
            have = got[f"layers.{layer}.{kind}"]
            assert have.shape == want.shape == (102, 500)
            assert np.mean((want > 0) & (want < 1)) > 0.05, "the CI spread over (0, 1)"
            np.testing.assert_allclose(have, want, atol=2e-4, err_msg=f"layers.{layer}.{kind}")
            checked += 1
    assert checked == 6


def test_a_toy_eval_compiles_each_of_its_programs_once() -> None:
    """The metrics a toy run computes at each eval (``ground_truth_metrics``, in the run's
    announced ``toy`` phase): no program compiled twice under one name (a run shows each
    compile of 0.5 s or more by that name, so two would read as one program announced twice:
    the eager alive-window draws compiled a ``scan`` per uniform, and the one-hot and window CI
    were two shapes of one ``ci_lower``), and a second eval compiles nothing."""
    from pd_probe import Recorder
    from pd_train.targets.toys import (
        ground_truth_metrics,
        make_target,
        toy_config,
        toy_trainer,
        toy_weights,
    )

    toy = toy_config("tms_5_2")
    trainer = toy_trainer(make_target(toy), toy.pd)
    params = trainer.init_state(key=jax.random.key(0)).params
    compiled: list[list[str]] = [[], []]
    for evaluation in compiled:

        def on_compile(event: str, info: dict[str, Any], into: list[str] = evaluation) -> None:
            if event == "done":
                into.append(str(info["jit"]))

        recorder = Recorder(None, mode="run", on_compile=on_compile)
        with recorder, recorder.phase("toy"):
            metrics, _ = ground_truth_metrics(toy, trainer, params, toy_weights("tms_5_2"))
        assert "gt/identity_ci_error" in metrics
    first, second = compiled
    assert "ci_lower" in first
    assert len(first) == len(set(first)), first
    assert second == []


def _train_records(run_dir: Path) -> list[dict[str, Any]]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time"} for r in records if r["phase"] == "train"]


def test_a_toy_run_whose_config_differs_in_values_only_loads_its_programs_from_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three toy runs sharing ``compile_cache.dir``: the first compiles its K-step program (a
    miss); the second, with another learning rate, importance coefficient and seed (values:
    the program takes them as data), loads it (a hit) and trains differently; the third, the
    first's config again, loads it and logs the first's losses exactly."""
    cache = ["--set", f"compile_cache.dir={tmp_path / 'cache'}"]
    other = ["--set", "pd.components.lr=0.02", "--set", "pd.loss_metrics[0].coeff=1e-2"]
    other += ["--set", "seed=3"]
    step_compiles = []
    for name, sets in (("first", []), ("other", other), ("again", [])):
        argv = ["run", "builtin:tms_5_2_fast", *SETS, *cache, *sets]
        assert main([*argv, "--run-dir", str(tmp_path / name)]) == 0
        err = capsys.readouterr().err
        step_compiles.append(re.findall(r"compiled train_step in [\d.]+ s \((.+?)\)", err))
    assert step_compiles == [["cache miss"], ["cache hit"], ["cache hit"]]
    assert list((tmp_path / "cache").iterdir())
    first, other_run, again = (_train_records(tmp_path / n) for n in ("first", "other", "again"))
    assert again == first
    assert [r["step"] for r in other_run] == [r["step"] for r in first]
    assert other_run[-1]["loss/total"] != first[-1]["loss/total"]
    config = yaml.safe_load((tmp_path / "other" / "config.yaml").read_text())
    assert config["compile_cache"] == {"enabled": True, "dir": str(tmp_path / "cache")}


def test_a_toy_run_without_its_compile_cache_compiles_and_leaves_the_process_s_cache_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``compile_cache.enabled=false``: every compile shown as ``no cache`` and nothing
    written to the cache dir; after a run (with or without its cache) JAX's cache settings are
    the process's own again."""
    names = ("jax_enable_compilation_cache", "jax_compilation_cache_dir")
    before = {name: jax.config.values[name] for name in names}
    cache = tmp_path / "cache"
    off = ["--set", "compile_cache.enabled=false", "--set", f"compile_cache.dir={cache}"]
    argv = ["run", "builtin:tms_5_2_fast", *SETS, *off, "--run-dir", str(tmp_path / "off")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert re.search(r"compiled train_step in [\d.]+ s \(no cache\)", err), err
    assert not cache.exists() or not list(cache.iterdir())
    assert {name: jax.config.values[name] for name in names} == before
    on = ["--set", f"compile_cache.dir={cache}"]
    assert main(["run", "builtin:tms_5_2_fast", *SETS, *on, "--run-dir", str(tmp_path / "on")]) == 0
    assert list(cache.iterdir())
    assert {name: jax.config.values[name] for name in names} == before


def test_a_compile_cache_dir_that_cannot_be_a_directory_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``compile_cache.dir`` naming a file: exit 2 naming the field and the path, no run dir."""
    afile = tmp_path / "afile"
    afile.write_text("")
    run_dir = tmp_path / "run"
    argv = ["run", "builtin:tms_5_2_fast", *SETS, "--set", f"compile_cache.dir={afile}"]
    assert main([*argv, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"compile_cache.dir: {str(afile)!r} is a file, not a directory" in err, err
    assert not run_dir.exists()
