"""The toy runner's K-step programs (a lax.scan over K steps, data drawn on device): the state
after N steps matches one step per call within float rounding, a resume from a real orbax
checkpoint at the same K is bit-exact, a K that breaks a cadence is refused by field path, a run
of N steps makes N / K program calls (and the step rate counts the steps of the calls it times),
and keep_freed_memory stops the page faults of temporaries allocated on every call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs
import jax
import numpy as np
import pytest

from pd_train.cli.toy import load_toy_config
from pd_train.config.io import ConfigError
from pd_train.config.pd import FaithfulnessWarmup, ReconConfig
from pd_train.run.checkpoints import Checkpoints
from pd_train.run.hooks import Hook, StepInfo
from pd_train.targets.toys import (
    YNN_FUSIONS_FLAG,
    CallTimes,
    KStepPrograms,
    decompose,
    make_target,
    toy_compiler_options,
    toy_config,
    toy_data,
    toy_trainer,
    toy_weights,
)
from pd_train.train import Trainer

from ._toy_params import final_params

TOY = toy_config("tms_5_2_fast")
PD = attrs.evolve(
    TOY.pd, steps=40, batch_size=64, faithfulness_warmup=FaithfulnessWarmup(steps=3, lr=1e-2)
)
TARGET = make_target(TOY)


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    return Trainer(TARGET, PD)


def _run(trainer: Trainer, k: int, **kw: object) -> tuple[object, list[int]]:
    seen: list[int] = []
    _, state = decompose(
        TARGET, toy_weights("tms_5_2"), PD, seed=3, feature_probability=TOY.feature_probability,
        data=toy_data(TOY), trainer=trainer, steps_per_call=k,
        on_step=lambda i, m: seen.append(i), **kw,
    )  # fmt: skip
    return jax.device_get(state), seen


def test_k_step_programs_match_one_step_per_call(trainer: Trainer) -> None:
    one, seen_one = _run(trainer, 1, log_every=10)
    many, seen_many = _run(trainer, 10, log_every=10)
    assert seen_one == seen_many == [0, 10, 20, 30, 39]  # the cadence, then the last step
    assert int(one.step) == int(many.step) == 40
    leaves_one = jax.tree_util.tree_leaves(one.params)
    leaves_many = jax.tree_util.tree_leaves(many.params)
    for a, b in zip(leaves_one, leaves_many, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)
    # It is a real 40-step trajectory: the params moved far more than that tolerance.
    init = jax.device_get(trainer.init_state(key=jax.random.fold_in(jax.random.key(3), 0)))
    moved = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(jax.tree_util.tree_leaves(init.params), leaves_one, strict=True)
    )
    assert moved > 1e-2


def test_resume_at_the_same_k_is_bit_exact(trainer: Trainer, tmp_path: Path) -> None:
    with Checkpoints(tmp_path / "straight") as ckpt:
        straight, _ = _run(trainer, 10, log_every=10, checkpoints=ckpt, checkpoint_every=20)
        assert ckpt.steps()[-1] == 40
    with Checkpoints(tmp_path / "stopped") as ckpt:
        _run(trainer, 10, log_every=10, checkpoints=ckpt, checkpoint_every=20, max_steps=20)
        assert ckpt.latest_step() == 20
    with Checkpoints(tmp_path / "stopped") as ckpt:
        resumed, seen = _run(trainer, 10, log_every=10, checkpoints=ckpt, resume=True)
    assert seen[0] == 20  # continued from step 20 (no warmup, no steps again)
    assert int(resumed.step) == 40
    for a, b in zip(
        jax.tree_util.tree_leaves(straight), jax.tree_util.tree_leaves(resumed), strict=True
    ):
        np.testing.assert_array_equal(a, b)


def test_a_k_that_breaks_a_cadence_is_refused_by_field(trainer: Trainer) -> None:
    for kw, field in (
        ({"steps_per_call": 3, "log_every": 10}, "log_every"),
        ({"steps_per_call": 4, "log_every": 8, "eval_every": 6}, "eval_every"),
        ({"steps_per_call": 4, "log_every": 8, "checkpoint_every": 10}, "checkpoint_every"),
        ({"steps_per_call": 0}, "steps_per_call"),
    ):
        with pytest.raises(ConfigError, match=field):
            decompose(TARGET, toy_weights("tms_5_2"), PD, seed=0, feature_probability=0.05,
                      trainer=trainer, **kw)  # type: ignore[arg-type]  # fmt: skip
    for overrides, field in (
        (["steps_per_call=7"], "log_every"),
        (["steps_per_call=0"], "steps_per_call"),
        (["steps_per_call=10", "eval_every=15"], "eval_every"),
        (["eval_every=-1"], "eval_every"),
        (["steps_per_call=10", "save_every=15"], "save_every"),
        (["target.n_hidden_layers=1"], "target.n_hidden_layers"),
    ):
        with pytest.raises(ConfigError, match=field):
            load_toy_config("builtin:tms_5_2", overrides)


def test_toy_programs_compile_without_ynn_fusions_unless_xla_flags_names_the_flag(
    trainer: Trainer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The K-step programs and a toy run's trainer take ``toy_compiler_options``: XLA:CPU's YNN
    fusions off, unless the user's XLA_FLAGS names the flag (then XLA's own flags apply)."""
    flags = os.environ.get("XLA_FLAGS", "")
    monkeypatch.setenv("XLA_FLAGS", flags)
    assert toy_compiler_options() == {YNN_FUSIONS_FLAG: ""}
    assert toy_trainer(TARGET, PD).compiler_options == {YNN_FUSIONS_FLAG: ""}
    key = jax.random.key(0)
    state = trainer.init_state(key=key)
    weights = jax.tree_util.tree_map(jax.numpy.asarray, toy_weights("tms_5_2"))

    def compiled_text() -> str:
        programs = KStepPrograms(
            trainer=trainer, draw=toy_data(TOY), data_key=key, train_key=key,
            batch_size=PD.batch_size, n_features=5, feature_probability=TOY.feature_probability,
        )  # fmt: skip
        values = programs.values()
        return str(programs.program(2).lower(state, weights, values).compile().as_text())

    assert "%ynn_fusion" not in compiled_text()
    monkeypatch.setenv("XLA_FLAGS", f"{flags} --{YNN_FUSIONS_FLAG}=reduce")
    assert toy_compiler_options() == {}
    if YNN_FUSIONS_FLAG not in flags:  # the process runs XLA's defaults: YNN fusions on
        assert "%ynn_fusion" in compiled_text()


def test_the_tms_recipes_unrolled_chunk_loop_matches_the_scan() -> None:
    """The TMS recipes run the layerwise recon's chunk loop unrolled (cheaper per step): the
    state after N steps matches the ``lax.scan`` chunk loop's within float rounding."""
    toy = toy_config("tms_5_2")
    assert toy.pd.recon.chunk_loop == "unroll" == toy_config("tms_40_10_fast").pd.recon.chunk_loop
    pd = attrs.evolve(toy.pd, steps=20, batch_size=64, faithfulness_warmup=FaithfulnessWarmup())
    states = []
    for recon in (pd.recon, ReconConfig(chunk_loop="scan")):
        states.append(final_params(toy, TARGET, attrs.evolve(pd, recon=recon), seed=1))
    for a, b in zip(*states, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)


class _Calls(Hook):
    """Notes (steps finished, steps run) after every call of the step program."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, info: StepInfo) -> None:
        self.calls.append((info.step, info.ran))


def test_a_run_of_n_steps_at_k_makes_n_over_k_calls_and_evals_at_its_cadence(
    trainer: Trainer,
) -> None:
    calls, times, evals = _Calls(), CallTimes(10), []
    _, seen = _run(
        trainer, 10, log_every=10, eval_every=20, hooks=(calls, times),
        on_eval=lambda n, state: evals.append(n),
    )  # fmt: skip
    assert calls.calls == [(10, 10), (20, 10), (30, 10), (40, 10)]  # 40 / K program calls
    assert evals == [20, 40]
    assert seen == [0, 10, 20, 30, 39]
    # The rate's stamps name the steps finished when each call's program has finished; the
    # window leaves out the first (compiling) call: 30 steps, not the 29 between the loss
    # records' indices 10 and 39 (which the benchmark once divided by one call's time).
    assert [s for s, _, _ in times.stamps] == [10, 20, 30, 40]
    steps, rate, per_cpu = times.rate()
    (_, t0, c0), (_, t1, c1) = times.stamps[0], times.stamps[-1]
    assert steps == 30
    assert rate == pytest.approx(30 / (t1 - t0))
    assert per_cpu == pytest.approx(30 / (c1 - c0))


_REALLOCATE = """
import ctypes, ctypes.util, resource, sys
from pd_train.targets.toys import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
n = 64 << 20  # a program's temporaries: allocated, written, freed on every call

def call():
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)

call()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    call()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_stops_the_page_faults_of_temporaries_allocated_every_call() -> None:
    faults = {}
    for arm in ("default", "keep"):
        out = subprocess.run(
            [sys.executable, "-c", _REALLOCATE, arm], capture_output=True, text=True, check=True
        )
        faults[arm] = int(out.stdout.split()[-1])
    # By default each 64 MB block is a fresh mmap: its 16 384 pages fault in again every call.
    assert faults["default"] >= 5 * 16_384 // 2, faults
    assert faults["keep"] < 500, faults  # the heap's pages are reused


class _Behind(Hook):
    """After every call: whether each earlier call's program had finished by then."""

    def __init__(self) -> None:
        self.metrics: list[object] = []
        self.ready: list[list[bool]] = []

    def __call__(self, info: StepInfo) -> None:
        self.ready.append([bool(m.is_ready()) for m in jax.tree_util.tree_leaves(self.metrics)])
        self.metrics.append(info.metrics)


def test_the_loop_stays_within_one_call_of_the_device(trainer: Trainer) -> None:
    # Without the bound the host queued every call up to the next loss record before waiting,
    # so a stop signal was seen that many steps of compute late; now, after each call, every
    # call before it has finished.
    behind = _Behind()
    _run(trainer, 5, log_every=40, hooks=(behind,))
    assert len(behind.ready) == 8
    assert all(all(ready) for ready in behind.ready), behind.ready
