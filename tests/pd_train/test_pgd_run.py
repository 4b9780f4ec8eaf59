"""`pd-train run` with persistent PGD: the sources are checkpointed and a resume is bit-exact;
a checkpoint of the sources restores onto another device count; eval reports both PGD recons."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

import pd_sharding
from pd_train.outputs import read_metrics
from pd_train.run import _training_item
from pd_train.run.checkpoints import Checkpoints
from pd_train.train import Trainer

from ._cli import _cli, _finish, tiny_config, train_losses, write_config
from ._pgd import PPGD, TINY, _pd


def _config(tmp: Path, cache: Path) -> dict:
    config = tiny_config(tmp, cache)
    config["pd"]["loss_metrics"].append(PPGD)
    config["pd"]["eval_pgd"] = {"n_steps": 2, "step_size": 0.1}
    config["cadence"]["eval_every"] = 8
    return config


@pytest.mark.slow
def test_persistent_pgd_run_resumes_bit_exactly(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    config = write_config(tmp_path, _config(tmp_path, cache))
    full, part = tmp_path / "full", tmp_path / "part"
    _finish(_cli("run", str(config), "--run-dir", str(full)))
    _finish(_cli("run", str(config), "--run-dir", str(part), "--max-steps", "4"))
    _finish(_cli("run", "--resume", str(part)))

    want = train_losses(full)
    assert sorted(want) == list(range(8))
    assert train_losses(part) == want
    records = [r for r in read_metrics(full) if r["phase"] == "train"]
    ppgd = [r["loss/persistent_pgd_recon"] for r in records]
    assert all(np.isfinite(ppgd)) and ppgd[0] > 0
    assert records[0]["lr/ppgd"] == pytest.approx(0.05 / 2)  # warmup: 2 of 8 steps
    evals = [r for r in read_metrics(part) if r["phase"] == "eval"]
    assert evals, "no eval record"
    for name in ("eval/kl_ppgd", "eval/kl_pgd", "eval/kl_stochastic"):
        assert np.isfinite(evals[-1][name]), name
    assert evals[-1]["eval/kl_pgd"] > evals[-1]["eval/kl_stochastic"]


def test_sources_checkpoint_restores_onto_another_device_count(tmp_path: Path) -> None:
    def trainer(n: int) -> Trainer:
        mesh = pd_sharding.make_mesh(data=n, devices=jax.devices()[:n])
        return Trainer(TINY, _pd(), mesh=mesh, seq_len=8)

    four, two = trainer(4), trainer(2)
    state = four.init_state(key=jax.random.key(3))
    key_data = jax.device_put(jax.random.key_data(jax.random.key(0)), four.layout.replicated())
    with Checkpoints(tmp_path / "ckpt") as ckpts:
        ckpts.save(
            1, decomposition={"params": state.params}, training=_training_item(state, key_data)
        )
    abstract = two.abstract_state()
    key_abstract = jax.ShapeDtypeStruct(
        key_data.shape, key_data.dtype, sharding=two.layout.replicated()
    )
    with Checkpoints(tmp_path / "ckpt") as ckpts:
        _, training, step = ckpts.restore(
            decomposition={"params": abstract.params},
            training=_training_item(abstract, key_abstract),
        )
    assert step == 1
    got, want = training["adversary"], state.adversary
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w, a in zip(
        jax.tree.leaves(got),
        jax.tree.leaves(want),
        jax.tree.leaves(abstract.adversary),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        assert g.sharding == a.sharding
    sources = got["sources"]["q_proj"]
    assert sources.shape == (2, 8, 8, 5)
    assert len(sources.sharding.device_set) == 2


BAD = [
    ({"scope": "bc"}, "pd.loss_metrics[3].scope: got 'bc'; must be one of 'sc', 'bsc'"),
    ({"n_warmup_steps": -1}, "pd.loss_metrics[3].n_warmup_steps: got -1; must be >= 0"),
    ({"optimizer": {"type": "sgd", "lr": 0.1}}, "pd.loss_metrics[3].optimizer.type: got 'sgd'"),
    ({"coeff": 0.0}, "pd.loss_metrics[3].coeff: got 0.0; must be > 0"),
]


@pytest.mark.parametrize(("change", "message"), BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_pgd_config_is_reported_by_field_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, message: str
) -> None:
    from pd_train.cli import main

    config = _config(tmp_path, tmp_path / "cache")
    config["pd"]["loss_metrics"][3] = {**PPGD, **change}
    assert main(["run", str(write_config(tmp_path, config, "bad.yaml"))]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "runs").exists()


def test_negative_pgd_steps_are_reported_by_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pd_train.cli import main

    config = _config(tmp_path, tmp_path / "cache")
    config["pd"]["loss_metrics"].append({"type": "pgd_recon", "coeff": 1.0, "n_steps": -3})
    config["pd"]["eval_pgd"] = {"mask_scope": "per_token"}
    assert main(["run", str(write_config(tmp_path, config, "bad.yaml"))]) == 2
    err = capsys.readouterr().err
    assert "pd.loss_metrics[4].n_steps: got -3; must be >= 0" in err, err
    assert "pd.eval_pgd.mask_scope: got 'per_token'" in err, err
    assert not (tmp_path / "runs").exists()
