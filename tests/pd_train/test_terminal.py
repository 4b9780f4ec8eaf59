"""The run's one terminal writer (pd_train.outputs.Terminal): whole lines from every thread,
each compile's time beside its own name, distinct jit names, eval tables, a provisional ETA,
XLA's slow-compile alarm replaced; and `pd-train run` itself under a real pty, with and without
a window size, and stopped by Ctrl-C."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import random
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from pd_train.outputs import Progress, Terminal, compile_label, format_eval_table, labelled

from ._tiny import FAST

CLEAR = "\r\x1b[K"


def _visible_lines(out: str) -> list[str]:
    """The lines as they stay on screen: each raw line's text after its last status clear."""
    return [line.split(CLEAR)[-1] for line in out.replace("\r\n", "\n").split("\n")]


def _events(announce: Any, name: str, jit: str, seconds: float, cache: str = "miss") -> None:
    announce("start", {"name": name, "jit": jit, "cache_enabled": True})
    announce("cache", {"name": name, "jit": jit, "cache": cache})
    time.sleep(0.01)
    announce("done", {"name": name, "jit": jit, "cache": cache, "seconds": seconds})


def test_a_background_compile_and_a_main_thread_compile_each_keep_their_own_time() -> None:
    """The report: `compiling faithfulness_warmup: _warmup (cache miss)… cache miss: train_step
    …` then `9.9 s` and `90.4 s` on lines that named neither."""
    stream = io.StringIO()
    terminal = Terminal(stream, bar=False)
    announce = terminal.compile_announcer()
    started = threading.Event()

    def background() -> None:
        announce("start", {"name": "train_step", "jit": "train_step", "cache_enabled": True})
        announce("cache", {"name": "train_step", "jit": "train_step", "cache": "miss"})
        started.set()
        time.sleep(0.2)
        announce(
            "done", {"name": "train_step", "jit": "train_step", "cache": "miss", "seconds": 90.4}
        )

    thread = threading.Thread(target=background)
    thread.start()
    started.wait()
    assert terminal.background == {"train_step": pytest.approx(time.perf_counter(), abs=5)}
    _events(announce, "faithfulness_warmup", "_warmup", 9.9)
    thread.join()
    lines = stream.getvalue().splitlines()
    assert lines == [
        "compiling train_step in the background (cache miss)…",
        "compiling faithfulness_warmup: _warmup (cache miss)…",
        "compiled faithfulness_warmup: _warmup in 9.9 s (cache miss)",
        "compiled train_step in the background in 90.4 s (cache miss)",
    ]
    assert terminal.background == {}


def test_on_a_sized_terminal_a_compile_in_flight_is_the_status_line_not_a_fragment() -> None:
    stream = io.StringIO()
    terminal = Terminal(stream, bar=True)
    announce = terminal.compile_announcer()
    terminal.status("progress", "[#---] step 1/4")
    _events(announce, "init", "init_params", 0.5)
    terminal.line("a log line")
    terminal.close()
    out = stream.getvalue()
    assert "compiling init: init_params (cache miss)…" in out  # shown while it ran
    assert _visible_lines(out) == [
        "compiled init: init_params in 0.5 s (cache miss)",
        "a log line",
        "",
    ]


def test_two_jits_of_one_name_are_announced_by_the_names_the_trainer_gives_them() -> None:
    """pd-init names the params' and the persistent-PGD sources' jits both `stacked`."""
    stream = io.StringIO()
    announce = labelled(Terminal(stream, bar=False).compile_announcer())
    for name in ("init_params", "init_sources"):
        with compile_label(name):
            _events(announce, "init", "stacked", 1.0)
    _events(announce, "init", "stacked", 2.0)  # no label: the function's name
    done = [line for line in stream.getvalue().splitlines() if line.startswith("compiled")]
    assert done == [
        "compiled init: init_params in 1.0 s (cache miss)",
        "compiled init: init_sources in 1.0 s (cache miss)",
        "compiled init: stacked in 2.0 s (cache miss)",
    ]


def test_lines_from_many_threads_stay_whole_under_a_redrawn_status_line() -> None:
    stream = io.StringIO()
    terminal = Terminal(stream, bar=True)
    writer = terminal.writer()

    def log(k: int) -> None:
        for i in range(50):
            if i % 2:
                writer.write(f"thread {k} line {i} ")  # a line written in two parts
                writer.write("end\n")
            else:
                terminal.line(f"thread {k} line {i} end")
            terminal.status("progress", f"[##--] step {i}/50")

    threads = [threading.Thread(target=log, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    terminal.close()
    lines = [line for line in _visible_lines(stream.getvalue()) if line]
    assert len(lines) == 200
    assert all(re.fullmatch(r"thread \d line \d+ end", line) for line in lines), lines[:5]
    for raw in stream.getvalue().split("\n")[:-1]:  # what precedes a line: status draws only
        assert all(part == "" or part.startswith("[##--] step") for part in raw.split(CLEAR)[:-1])


def test_the_eta_is_provisional_while_a_background_compile_runs() -> None:
    stream = io.StringIO()
    terminal = Terminal(stream, bar=False)
    progress = Progress(100, log_every=10, terminal=terminal, keys=())
    progress.update(0)
    terminal.background["eval: eval_metrics"] = time.perf_counter()
    for step in range(1, 10):
        time.sleep(0.002)
        progress.update(step)
    del terminal.background["eval: eval_metrics"]
    for step in range(10, 20):
        time.sleep(0.002)
        progress.update(step)
    first, second = stream.getvalue().splitlines()
    assert first.startswith("step 10/100 (10%) | ")
    assert "(provisional: compiling eval: eval_metrics in the background)" in first
    assert second.startswith("step 20/100") and "provisional" not in second


def test_the_eval_table_lists_ce_and_kl_per_mask_clean_first() -> None:
    record = {
        "eval/ce_ci": np.float32(3.375),
        "eval/ce_clean": 2.737,
        "eval/kl_ci": 0.6464,
        "eval/ce_ones": 3.872,
        "eval/kl_ones": 1.097,
        "l0_group/total": 709.3359,
        "ci_hist/layers.0.mlp.up_proj": [1, 2, 3],
    }
    assert format_eval_table(99, record).splitlines() == [
        "eval after step 99 (total L0 709.3)",
        "  mask      CE      KL",
        "  clean  2.737       -",
        "  ci     3.375  0.6464",
        "  ones   3.872   1.097",
    ]


def test_xla_slow_compile_alarm_becomes_one_line_naming_the_compile_in_flight(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # What `pd-train run` does: write to a duplicate of fd 2, and route fd 2 through here.
    terminal = Terminal(os.fdopen(os.dup(2), "w"), bar=False, capture=True)
    announce = terminal.compile_announcer()
    with terminal.capture_stderr():
        announce("start", {"name": "train_step", "jit": "train_step", "cache_enabled": True})
        announce("cache", {"name": "train_step", "jit": "train_step", "cache": "miss"})
        os.write(2, b"before\n")
        os.write(2, b"E1201 12:00:00.0 123 slow_operation_alarm.cc:140]\n" + b"*" * 40 + b"\n")
        os.write(
            2,
            b"[Compiling module jit_step] Very slow compile? If you want to file a bug "
            b"run with: --xla_dump_to=/tmp/foo and attach the results.\n" + b"*" * 40 + b"\n",
        )
        os.write(2, b"after\n")
    terminal.close()
    err = capfd.readouterr().err
    assert "Very slow compile" not in err and "***" not in err
    lines = err.splitlines()
    assert lines[0] == "compiling train_step (cache miss)…"
    assert lines[1:3] == ["before", lines[2]]
    assert lines[2].startswith("pd: train_step still compiling (more than 2 min;")
    assert lines[3] == "after"


def test_a_child_process_holding_the_captured_stderr_does_not_delay_the_end(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """W&B's service process, or a plot worker, inherits fd 2 (the capture pipe) and may
    outlive the run: the capture ends once this process's own lines are forwarded."""
    terminal = Terminal(os.fdopen(os.dup(2), "w"), bar=False, capture=True)
    with terminal.capture_stderr():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            os.write(2, b"mine\n")
            t0 = time.monotonic()
        except BaseException:
            child.kill()
            raise
    elapsed = time.monotonic() - t0
    child.kill()
    child.wait()
    terminal.close()
    assert elapsed < 2.0
    assert capfd.readouterr().err == "mine\n"


# -- pd-train run under a real pty -----------------------------------------------------------

TINY_ARCH = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rope_theta": 10000.0,
}


#: Every run here has the same schedule (``pd.steps`` is compiled into the step), cut short with
#: ``--max-steps``, so that the first run's compiles serve the others.
STEPS = 2000


def _config(tmp: Path, cache: Path) -> Path:
    tokens = tmp / "tokens.npy"
    np.save(tokens, np.random.default_rng(0).integers(0, 64, size=20_000, dtype=np.uint16))
    config = {
        "run_name": "tiny",
        "seed": 3,
        "output_dir": str(tmp / "runs"),
        "target": {"architecture": TINY_ARCH},
        "data": {
            "path": str(tokens),
            "seq_len": 16,
            "eval_path": str(tokens),
            "eval_batches": 1,
        },
        "pd": {
            "steps": STEPS,
            "batch_size": 8,
            "decomposition_targets": [
                {"module_pattern": "layers.*.self_attn.*", "C": 8},
                {"module_pattern": "layers.*.mlp.*", "C": 16},
            ],
            "ci": {"type": "mlp", "hidden_dims": [4]},
            "loss_metrics": [
                {"type": "faithfulness", "coeff": 100.0},
                {"type": "importance_minimality", "coeff": 1e-3},
                {"type": "stochastic_recon", "coeff": 1.0},
            ],
            "components": {"lr": 1e-3, "warmup_steps": 2, "final_val_frac": 0.1, "clip": 1.0},
            "ci_fn": {"lr": 1e-3},
            "faithfulness_warmup": {"steps": 2, "lr": 1e-3},
        },
        "cadence": {"train_log_every": 5, "eval_every": 10, "save_every": 10},
        # Unoptimized XLA code (the same HLO) compiles about twice as fast on CPU.
        "runtime": {"compile_cache": {"dir": str(cache)}, "compiler_options": dict(FAST)},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class PtyRun:
    """`pd-train run` with stdout and stderr on a fresh pty (its own session, so a signal to
    its process group is what Ctrl-C in that terminal sends); ``size``: (rows, cols) or None
    for a pty with no window size."""

    def __init__(self, args: list[str], size: tuple[int, int] | None) -> None:
        master, slave = pty.openpty()
        if size is not None:
            fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[0], size[1], 0, 0))
        env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pd_train.cli", "run", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        self._master = master
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: every writer closed
                return
            if not data:
                return
            self._chunks.append(data)

    @property
    def out(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"pd-train run did not end in {timeout} s: {self.out[-3000:]}")
        self._reader.join(timeout=10)
        os.close(self._master)
        return code


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("compile-cache")


def _check_lines(out: str) -> list[str]:
    """The run's screen: no line with two announcements, none with progress glued to other
    text; returns the visible lines."""
    lines = _visible_lines(out)
    for line in lines:
        announcements = re.findall(r"\bcompil(?:ing|ed)\b", line)
        assert len(announcements) <= 1, line
        progress = re.match(r"(\[[#-]+\] )?step \d+/\d+ \(", line)
        if announcements and not progress:
            # At the line's start (or pd's alarm line, or a log line's message); a progress
            # line may name a background compile in its provisional ETA's note.
            assert re.match(r"(compil(ing|ed) |cache miss: |pd: |\d{4}-\d\d-\d\d )", line), line
        if re.search(r"step \d+/\d+ \(", line):
            assert re.match(r"(\[[#-]+\] )?step \d+/\d+ \(", line), line
        if re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ pd ", line):
            assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ pd ", line), line
    return lines


def _compiled(lines: list[str]) -> dict[str, float]:
    found = {}
    for line in lines:
        m = re.fullmatch(
            r"compiled (.+?)( in the background)? in ([\d.]+) s \((cache \w+|no cache)\)", line
        )
        if m:
            assert m.group(1) not in found, f"{m.group(1)} announced twice"
            found[m.group(1)] = float(m.group(3))
    return found


@pytest.mark.slow
def test_pd_train_run_on_a_sized_pty_names_each_compile_beside_its_time_under_a_status_bar(
    tmp_path: Path, cache: Path
) -> None:
    """The module's first run: every jit compiles (the cache is empty)."""
    config = _config(tmp_path, cache)
    args = [str(config), "--run-dir", str(tmp_path / "run"), "--max-steps", "20"]
    run = PtyRun(args, (40, 160))
    assert run.wait(timeout=900) == 0, run.out[-3000:]
    out = run.out
    (tmp_path / "pty.out").write_text(out)
    lines = _check_lines(out)
    compiled = _compiled(lines)
    for name in (
        "train_step",
        "eval: eval_metrics",
        "init: init_params",
        "init: opt_init",
        "faithfulness_warmup: warmup_step",
    ):
        assert name in compiled, (name, sorted(compiled))
    assert not any(name.endswith(": stacked") for name in compiled), sorted(compiled)
    assert "compiling train_step in the background (cache miss)…" in lines
    assert "compiling eval: eval_metrics in the background (cache miss)…" in lines
    assert any(line.startswith("eval after step 9 ") for line in lines)
    assert any(line.startswith("eval after step 19 ") for line in lines)
    assert "Traceback" not in out
    # The bar, on a status line redrawn in place; its last state stays as a line.
    assert re.search(re.escape(CLEAR) + r"\[[#-]{20}\] step \d+/20 ", out), out[-3000:]
    assert "[####################] step 20/20 (100%) | " in out
    assert any(line.startswith("step 20/20 (100%) | ") for line in lines)  # what stays


@pytest.mark.slow
def test_pd_train_run_on_a_pty_without_a_size_writes_plain_lines(
    tmp_path: Path, cache: Path
) -> None:
    """After the first run, with its persistent cache but not its executable cache (which
    would load the programs without compiling): each jit is still named beside its time."""
    import shutil

    from pd_train.process_env import EXECUTABLES_DIR

    jax_cache = tmp_path / "cache"
    shutil.copytree(cache, jax_cache, ignore=shutil.ignore_patterns(EXECUTABLES_DIR))
    config = _config(tmp_path, jax_cache)
    args = [str(config), "--run-dir", str(tmp_path / "run"), "--max-steps", "20"]
    run = PtyRun(args, None)
    assert run.wait(timeout=900) == 0, run.out[-3000:]
    out = run.out
    (tmp_path / "pty.out").write_text(out)
    lines = _check_lines(out)
    assert CLEAR not in out  # no status line: nothing to redraw
    compiled = _compiled(lines)
    for name in ("train_step", "eval: eval_metrics", "init: init_params", "init: opt_init"):
        assert name in compiled, (name, sorted(compiled))
    assert any(line.startswith("step 5/20 (25%) | ") for line in lines), out[-3000:]
    assert any(line.startswith("step 20/20 (100%) | ") for line in lines)
    assert any(line.startswith("eval after step 19 ") for line in lines)
    assert "Traceback" not in out


#: How long `pd-train run` may take from Ctrl-C to its exit on this loaded 2-core machine:
#: the step in flight, the checkpoint, summary.txt; the plots are skipped.
CTRL_C_BOUND_S = 20.0


@pytest.mark.slow
def test_ctrl_c_at_a_random_step_prints_no_traceback_and_returns_within_the_bound(
    tmp_path: Path, cache: Path
) -> None:
    config = _config(tmp_path, cache)
    run_dir = tmp_path / "run"
    run = PtyRun([str(config), "--run-dir", str(run_dir)], (40, 160))
    target = random.Random().randint(12, 40)
    deadline = time.monotonic() + 900
    while True:
        steps = [int(s) for s in re.findall(rf"step (\d+)/{STEPS}", run.out)]
        if steps and steps[-1] >= target:
            break
        assert run.proc.poll() is None, run.out[-3000:]
        assert time.monotonic() < deadline, run.out[-3000:]
        time.sleep(0.05)
    os.killpg(run.proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
    t0 = time.monotonic()
    code = run.wait(timeout=300)
    elapsed = time.monotonic() - t0
    out = run.out
    assert code == 130, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    print(f"Ctrl-C at step {target}: exit {elapsed:.1f} s later")
    assert elapsed < CTRL_C_BOUND_S, (elapsed, out[-3000:])
    saved = max(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved >= target
    assert (
        f"stopped by Ctrl-C: saved checkpoint step {saved} in {run_dir / 'checkpoints' / str(saved)}"
        in out
    ), out[-3000:]
    assert "plots skipped" in out
    _check_lines(out)


#: A toy run cut to a few calls of K = 5 steps (its programs compile in ~30 s here).
TOY_ARGS = [
    "builtin:tms_5_2_fast", "--set", "pd.steps=20", "--set", "pd.batch_size=32",
    "--set", "steps_per_call=5", "--set", "log_every=5",
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("size", [None, (40, 160)], ids=["no-size", "sized"])
def test_a_toy_run_writes_its_progress_through_the_terminal_writer_from_the_start(
    tmp_path: Path, size: tuple[int, int] | None
) -> None:
    """`pd-train run builtin:<toy>` under a pty: the plan first, each compile it waits on named
    beside its time, then a progress line per loss record (as `pd-train run` writes a Llama
    run's); with a window size the bar is the status line, redrawn in place, and its last state
    stays as a line."""
    cache = ["--set", f"compile_cache.dir={tmp_path / 'cache'}"]  # empty: every program a miss
    run = PtyRun([*TOY_ARGS, *cache, "--run-dir", str(tmp_path / "run")], size)
    assert run.wait(timeout=600) == 0, run.out[-3000:]
    out = run.out
    lines = [line for line in _check_lines(out) if line]
    assert "Traceback" not in out
    assert lines[0].startswith("tms_5_2_fast: 20 steps from step 0 at batch 32, K = 5 "), lines
    compiled = _compiled(lines)
    assert {"init_params", "opt_init", "train_step"} <= set(compiled), sorted(compiled)
    # The first step shown (a line, or the status line's first state) once its program compiled.
    first_step = out.index("step 1/20 (5%) | total=")
    assert out.index("compiled train_step in ") < first_step < out.index("eval after step 19")
    steps = [line.split(" | ")[0] for line in lines if re.match(r"step \d+/20 \(", line)]
    if size is None:
        assert CLEAR not in out  # no status line: nothing to redraw
        assert steps == [
            "step 1/20 (5%)",
            "step 6/20 (30%)",
            "step 11/20 (55%)",
            "step 16/20 (80%)",
            "step 20/20 (100%)",
        ]
        assert "compiling train_step (cache miss)…" in lines
    else:
        assert "[#-------------------] step 1/20 (5%) | total=" in out
        assert re.search(re.escape(CLEAR) + r"\[[#-]{20}\] step \d+/20 ", out), out[-3000:]
        assert "[####################] step 20/20 (100%) | " in out
        assert steps[-1] == "step 20/20 (100%)"  # what stays
    assert any(line.startswith("eval after step 19: IdentityCIError ") for line in lines)
    assert any(line.startswith("tms_5_2_fast: 20 steps in ") for line in lines)
