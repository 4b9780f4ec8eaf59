"""What ``pd-train compile`` prints for a person (issue 31, item 7): FLOPs in T/P units, each
jit's memory per device against a named device's memory with a yes/no, and XLA's slow-compile
alarm replaced by one line of pd's own."""

from __future__ import annotations

import os
import sys

import pytest

from pd_train.flops import CompiledCost
from pd_train.outputs import xla_slow_compile_alarm_replaced
from pd_train.run.compile import (
    REFERENCE_GPU,
    CompileRow,
    Device,
    format_compile_table,
    format_flops,
)

GIB = 2**30


def _cost(lo: float, hi: float, peak: int | None = None) -> CompiledCost:
    return CompiledCost(
        matmul_flops=hi,
        matmul_flops_min=lo,
        xla_flops=None,
        bytes_accessed=None,
        unknown_loops=0,
        argument_bytes=None,
        output_bytes=None,
        temp_bytes=None,
        peak_bytes=peak,
    )


def _memory(args: float, out: float, temp: float, alias: float = 0.0) -> dict[str, int]:
    return {
        "argument_size_in_bytes": int(args * GIB),
        "output_size_in_bytes": int(out * GIB),
        "temp_size_in_bytes": int(temp * GIB),
        "alias_size_in_bytes": int(alias * GIB),
    }


@pytest.mark.parametrize(
    ("lo", "hi", "text"),
    [
        # The figure: 6685580.453-14351375.522 GFLOP.
        (6685580.453e9, 14351375.522e9, "6.69-14.4 PFLOP"),
        (312e12, 312e12, "312 TFLOP"),
        (2.5e12, 2.5e12, "2.5 TFLOP"),
        (0.912e9, 7.48e9, "0.912-7.48 GFLOP"),
        (999.6e12, 999.6e12, "1 PFLOP"),
    ],
)
def test_flops_are_written_in_the_unit_that_fits(lo: float, hi: float, text: str) -> None:
    assert format_flops(lo, hi) == text


def test_memory_is_held_against_the_named_gpu_with_a_yes_or_no() -> None:
    # The production step at 8 devices (189 + 241 GiB) and at 64 (23.7 + 34.7 GiB, donated
    # outputs aliasing 20 GiB of the arguments).
    at_8 = CompileRow("train_step", 1.0, 2.0, _memory(189, 180, 241, alias=180), devices=8)
    out = format_compile_table([at_8], REFERENCE_GPU)
    assert "Memory per device against an 80 GB GPU (80 GiB) at 8 devices:" in out
    assert "train_step" in out and "430.0 GiB" in out and "fits: no" in out
    assert "Fits an 80 GB GPU at 8 devices: no" in out

    at_64 = CompileRow("train_step", 1.0, 2.0, _memory(23.7, 20, 34.7, alias=20), devices=64)
    out = format_compile_table([at_64], REFERENCE_GPU)
    assert "58.4 GiB" in out and "fits: yes" in out
    assert "Fits an 80 GB GPU at 64 devices: yes" in out


def test_a_reported_peak_is_what_a_device_must_hold() -> None:
    row = CompileRow("eval_metrics", 0.1, 0.2, _memory(1, 0, 1), cost=_cost(1e9, 1e9, 90 * GIB))
    out = format_compile_table([row], Device("H100 test part", 100 * GIB))
    assert "against an H100 test part (100 GiB)" in out
    assert "90.0 GiB" in out and "90.0 %" in out and "fits: yes" in out


def test_a_peak_below_arguments_and_temporaries_does_not_hide_them() -> None:
    """XLA:CPU's peak for the production step is its arguments alone (23.7 GiB); the device
    holds its 34.7 GiB of temporaries too."""
    memory = _memory(23.687, 23.452, 34.702, alias=23.452)
    row = CompileRow("train_step", 1, 2, memory, cost=_cost(1, 1, int(23.687 * GIB)), devices=64)
    out = format_compile_table([row], REFERENCE_GPU)
    assert "58.4 GiB" in out and "73.0 %" in out and "fits: yes" in out


def test_flops_per_device_and_on_all_devices_beside_the_useful_count() -> None:
    row = CompileRow(
        "train_step", 1.0, 2.0, None, cost=_cost(104.5e12, 224.2e12), useful=5.2e15, devices=64
    )
    out = format_compile_table([row], REFERENCE_GPU)
    line = next(x for x in out.splitlines() if x.strip().startswith("train_step") and "FLOP" in x)
    assert "104-224 TFLOP per device" in line, line
    assert "6.69-14.3 PFLOP on 64" in line, line
    assert "useful 5.2 PFLOP (compiled/useful 1.29-2.76x)" in line, line
    assert "GFLOP" not in out


# XLA writes from C++ to file descriptor 2; os.write(2, ...) is the same path.
ALARM = (
    b"E1201 15:22:00.123456   4242 slow_operation_alarm.cc:73] \n"
    b"********************************\n"
    b"[Compiling module jit_train_step] Very slow compile? If you want to file a bug, run with "
    b"envvar XLA_FLAGS=--xla_dump_to=/tmp/foo and attach the results.\n"
    b"********************************\n"
)


def test_xlas_slow_compile_alarm_becomes_one_line_of_pds_own(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with xla_slow_compile_alarm_replaced("train_step"):
        os.write(2, b"before\n")
        os.write(2, ALARM[:70])  # the alarm may arrive in pieces
        os.write(2, ALARM[70:])
        os.write(2, b"**********\nafter\n")  # asterisks of someone else's go through
    err = capfd.readouterr().err
    assert "file a bug" not in err and "slow_operation_alarm" not in err, err
    lines = err.splitlines()
    assert lines[0] == "before"
    assert lines[1].startswith("pd: train_step is still compiling (more than 2 min"), lines
    assert lines[2:] == ["**********", "after"], lines


def test_stderr_is_whole_again_after_the_compile(capfd: pytest.CaptureFixture[str]) -> None:
    with xla_slow_compile_alarm_replaced("eval_metrics"):
        print("inside", file=sys.stderr, flush=True)
    os.write(2, ALARM)  # outside: untouched
    err = capfd.readouterr().err
    assert err.startswith("inside\n")
    assert "Very slow compile?" in err
