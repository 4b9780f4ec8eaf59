"""metrics.jsonl (MetricsLog, read_metrics) and the step-loop progress display."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from pd_train.outputs import (
    DEFAULT_KEYS,
    METRICS_FILE,
    MetricsError,
    MetricsLog,
    Progress,
    format_metrics,
    read_metrics,
)

# ------------------------------------------------------------------------------ MetricsLog


def test_log_converts_jax_and_numpy_values_and_flushes_each_line(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, is_primary=True)
    log.log(
        0,
        "train",
        {
            "loss/total": jnp.float32(0.25),
            "loss/faithfulness": np.float64(1e-5),
            "count": np.int32(7),
            "ok": np.bool_(True),
            "l0": jnp.arange(3, dtype=jnp.float32),
            "ci_hist/layers.0.mlp.up_proj": {
                "edges": np.linspace(0.0, 1.0, 3),
                "counts": jnp.array([5, 1]),
            },
            "pnorm": 2,
        },
    )
    log.log(1, "eval", {"eval/kl_rounded": float("nan")})
    # Flushed: the file is complete while the log is still open (a killed run keeps it).
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["step"] == 0 and first["phase"] == "train"
    assert isinstance(first["time"], float)
    assert first["loss/total"] == 0.25
    assert first["loss/faithfulness"] == 1e-5
    assert first["count"] == 7 and type(first["count"]) is int
    assert first["ok"] is True
    assert first["l0"] == [0.0, 1.0, 2.0]
    assert first["ci_hist/layers.0.mlp.up_proj"] == {"edges": [0.0, 0.5, 1.0], "counts": [5, 1]}
    assert first["pnorm"] == 2
    log.close()

    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [0, 1]
    assert math.isnan(records[1]["eval/kl_rounded"])  # a diverged value is kept, not dropped


def test_only_the_primary_process_writes(tmp_path: Path) -> None:
    with MetricsLog(tmp_path, is_primary=False) as log:
        assert log.log(0, "train", {"loss/total": 1.0}) is None
        assert log.truncate_from(0) == 0
    assert not (tmp_path / METRICS_FILE).exists()
    with MetricsLog(tmp_path, is_primary=True) as log:
        assert log.log(0, "train", {"loss/total": 1.0}) is not None
    assert len(read_metrics(tmp_path)) == 1


def test_non_primary_still_rejects_bad_metrics(tmp_path: Path) -> None:
    # Every process must fail alike, or process 0 raises while the others hang in a collective.
    with pytest.raises(MetricsError, match="'blob'"):
        MetricsLog(tmp_path, is_primary=False).log(0, "train", {"blob": object()})


@pytest.mark.parametrize(
    ("step", "phase", "metrics", "match"),
    [
        (0, "test", {}, r"phase must be one of \('train', 'eval', 'warmup'\), got 'test'"),
        (1.5, "train", {}, r"step must be an int, got 1.5"),
        (True, "train", {}, r"step must be an int, got True"),
        (0, "train", {"step": 3}, r"\['step'\] are reserved"),
        (0, "train", {"ci": np.zeros(5000)}, r"'ci'.*shape \(5000,\).*at most 4096"),
        (0, "train", {"names": np.array(["a"])}, r"'names'.*numeric or bool.*<U1"),
        (0, "train", {"h": {"edges": {1, 2}}}, r"'h.edges'.*cannot log a set"),
    ],
)
def test_bad_records_name_the_problem_and_write_nothing(
    tmp_path: Path, step: object, phase: str, metrics: dict, match: str
) -> None:
    log = MetricsLog(tmp_path, is_primary=True)
    log.log(0, "train", {"loss/total": 1.0})
    with pytest.raises(MetricsError, match=match):
        log.log(step, phase, metrics)  # type: ignore[arg-type]
    log.close()
    assert len(read_metrics(tmp_path)) == 1


def _write_run(log: MetricsLog) -> None:
    for w in range(3):
        log.log(w, "warmup", {"loss/faithfulness": 1.0 / (w + 1)})
    for step in range(10):
        log.log(step, "train", {"loss/total": float(step)})
        if step % 5 == 0:
            log.log(step, "eval", {"eval/ce_unmasked": float(step)})


def test_truncate_from_drops_records_at_and_after_the_resume_step(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, is_primary=True)
    _write_run(log)
    assert log.truncate_from(6) == 4  # train 6..9; the evals at 0 and 5 stay
    # The resumed run appends after the kept records through the same object.
    log.log(6, "train", {"loss/total": 60.0})
    log.close()
    records = read_metrics(tmp_path)
    assert [(r["phase"], r["step"]) for r in records] == [
        *[("warmup", w) for w in range(3)],
        ("train", 0),
        ("eval", 0),
        *[("train", s) for s in range(1, 5)],
        ("train", 5),
        ("eval", 5),
        ("train", 6),
    ]
    assert records[-1]["loss/total"] == 60.0
    # Warmup records precede every checkpoint, so a resume at step 0 keeps them.
    assert MetricsLog(tmp_path, is_primary=True).truncate_from(0) == 9  # train 0..6, eval 0 and 5
    assert [r["phase"] for r in read_metrics(tmp_path)] == ["warmup"] * 3


def test_a_killed_run_keeps_its_lines_and_resumes_cleanly(tmp_path: Path) -> None:
    # A real process logs, then dies by SIGKILL without closing anything.
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from pd_train.outputs import MetricsLog
        log = MetricsLog({str(tmp_path)!r}, is_primary=True)
        for step in range(5):
            log.log(step, "train", {{"loss/total": step / 10}})
        # Importing the package must not pull in matplotlib (seconds before step 0).
        assert "matplotlib" not in sys.modules
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4]

    # A kill in the middle of a write leaves a partial last line: the reader skips it ...
    path = tmp_path / METRICS_FILE
    with path.open("a") as f:
        f.write('{"step": 5, "phase": "tr')
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4]
    # ... and a log opened afterwards (resuming without truncating) starts a fresh line.
    with MetricsLog(tmp_path, is_primary=True) as log:
        log.log(5, "train", {"loss/total": 0.5})
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2, 3, 4, 5]
    # truncate_from drops the partial line from the file for good.
    MetricsLog(tmp_path, is_primary=True).truncate_from(5)
    assert path.read_text().count("\n") == 5
    assert all(json.loads(line)["step"] < 5 for line in path.read_text().splitlines())


def test_read_metrics_without_a_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no metrics file at .*metrics\.jsonl"):
        read_metrics(tmp_path)


# ------------------------------------------------------------------------------ Progress

KEYS = ("loss/total", "loss/faithfulness", "loss/chunkwise_subset_recon")


def _metrics(step: int) -> dict[str, float]:
    return {
        "loss/total": 0.123,
        "loss/faithfulness": 4.5e-05,
        "loss/chunkwise_subset_recon": 0.031,
        "loss/importance_minimality": 9.0,  # not in KEYS: not shown
        "step_metric": float(step),
    }


def test_format_metrics_is_compact_and_keeps_key_order() -> None:
    text = format_metrics(_metrics(0), KEYS)
    assert text == "total=0.123 faith=4.5e-05 chunk_recon=0.031"
    assert format_metrics({"grad_norm/components": 12345.0}, ["grad_norm/components", "x"]) == (
        "components=1.23e+04"
    )


def test_progress_without_a_terminal_writes_a_line_every_n_steps() -> None:
    stream = io.StringIO()  # not a TTY
    with Progress(25, keys=KEYS, log_every=10, stream=stream) as progress:
        for step in range(25):
            progress.update(step, _metrics(step))
    lines = stream.getvalue().splitlines()
    # Every 10 steps, and the last step (25 is not a multiple of 10).
    assert [line.split(" | ")[0] for line in lines] == [
        "step 10/25 (40%)",
        "step 20/25 (80%)",
        "step 25/25 (100%)",
    ]
    for line in lines:
        assert line.endswith("total=0.123 faith=4.5e-05 chunk_recon=0.031")
        assert " it/s | ETA " in line
    assert "imp_min" not in stream.getvalue()
    assert "\r" not in stream.getvalue()


def test_progress_resumed_counts_from_the_start_step_and_close_adds_the_last_line() -> None:
    stream = io.StringIO()
    progress = Progress(100, start_step=40, keys=KEYS, log_every=25, stream=stream)
    for step in range(40, 70):
        # Metrics only on some steps (the loop fetches them only when it logs).
        progress.update(step, _metrics(step) if step % 5 == 4 else None)
    progress.close()
    progress.close()  # idempotent
    lines = stream.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["step 65/100 (65%)", "step 70/100 (70%)"]
    assert all("total=0.123" in line for line in lines)


def test_progress_off_the_primary_process_is_silent() -> None:
    for bar in (True, False):
        stream = io.StringIO()
        with Progress(10, keys=KEYS, log_every=1, is_primary=False, stream=stream, bar=bar) as p:
            for step in range(10):
                p.update(step, _metrics(step))
        assert stream.getvalue() == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_draws_a_tqdm_bar_with_the_losses() -> None:
    stream = _Terminal()
    with Progress(30, start_step=10, keys=KEYS, log_every=5, stream=stream) as progress:
        for step in range(10, 30):
            progress.update(step, _metrics(step))
    out = stream.getvalue()
    assert "\r" in out  # redrawn in place, not one line per step
    final = out.rsplit("\r", 1)[-1]
    assert "30/30" in final
    assert "total=0.123 faith=4.5e-05 chunk_recon=0.031" in final
    assert "step 10/" not in out  # no plain lines


def test_progress_bar_rate_and_eta_leave_out_the_first_steps_compile() -> None:
    """A resumed bar (from step 50 of 100) whose first step took 1 s to compile and whose next
    steps take ~10 ms: it starts at the resumed step and its ETA is that of the fast steps."""
    import time

    stream = _Terminal()
    progress = Progress(100, start_step=50, keys=KEYS, log_every=5, stream=stream)
    time.sleep(1.0)  # the first step: compile
    progress.update(50, _metrics(50))
    for step in range(51, 61):
        time.sleep(0.01)
        progress.update(step)
    bar = progress._bar
    assert bar is not None
    d = bar.format_dict
    assert d["initial"] == 51  # the bar begins at the resumed (and compiled) step
    rate = (d["n"] - d["initial"]) / d["elapsed"]
    eta = (d["total"] - d["n"]) / rate
    assert eta < 2.0, (rate, eta)  # counting the 1 s compile it would be > 4 s
    progress.close()
    assert "/100" in stream.getvalue() and " 50/100" not in stream.getvalue()


def test_the_default_keys_show_the_default_recon_term_subset_recon() -> None:
    metrics = {"loss/total": 1.5, "loss/subset_recon": 0.25, "loss/stochastic_recon": 0.5}
    assert format_metrics(metrics, DEFAULT_KEYS) == "total=1.5 stoch_recon=0.5 subset_recon=0.25"


@pytest.mark.parametrize("bar", [True, False])
def test_the_last_progress_line_has_the_rate_of_the_steps_not_of_what_ran_after_them(
    monkeypatch: pytest.MonkeyPatch, bar: bool
) -> None:
    """10 steps in 1 s after the first, then 100 s of saving and eval before ``close``: the line
    ``close`` leaves says 9 it/s (from the first update to the last), not 0.09."""
    import time

    from pd_train.outputs import Terminal

    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    stream = io.StringIO()
    terminal = Terminal(stream, bar=bar)
    progress = Progress(20, keys=KEYS, log_every=100, terminal=terminal)
    for step in range(10):
        clock[0] = step / 9
        progress.update(step, _metrics(step))
    clock[0] = 101.0
    progress.close()
    last = stream.getvalue().split("\r\x1b[K")[-1].splitlines()[-1]
    assert last.startswith("step 10/20 (50%) | 9 it/s | "), last


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"total_steps": -1}, "total_steps must be >= 0, got -1"),
        ({"total_steps": 10, "start_step": 11}, r"start_step must be in \[0, total_steps=10\]"),
        ({"total_steps": 10, "log_every": 0}, "log_every must be >= 1, got 0"),
    ],
)
def test_progress_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Progress(stream=io.StringIO(), **kwargs)
