"""MFU in every run: the meter's arithmetic, the peak table, and a real run's metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml

from pd_train.cli import main
from pd_train.flops import (
    CPU_PEAK_FILE,
    MFUMeter,
    cpu_peak_key,
    measured_cpu_peak,
    peak_flops_per_device,
)
from pd_train.outputs import read_metrics

from ._cli import tiny_config


class _Device:
    def __init__(self, kind: str) -> None:
        self.device_kind = kind


def test_peaks_come_from_the_datasheet_table_or_a_measured_cpu() -> None:
    assert peak_flops_per_device(_Device("NVIDIA H100 80GB HBM3"), "bfloat16")[0] == 989e12
    assert peak_flops_per_device(_Device("NVIDIA H200"), "float32")[0] == 495e12
    assert peak_flops_per_device(_Device("NVIDIA A100-SXM4-80GB"), "bfloat16")[0] == 312e12
    assert peak_flops_per_device(_Device("NVIDIA H100 PCIe"), "bfloat16")[0] == 756e12
    one, source = peak_flops_per_device(_Device("cpu"), "float32", n_local_devices=1)
    four, _ = peak_flops_per_device(_Device("cpu"), "float32", n_local_devices=4)
    assert "measured" in source and math.isfinite(one) and one > 1e8
    assert four == one / 4  # measured once per process, shared by the simulated devices


def test_the_cpu_peak_keeps_the_best_figure_measured_on_this_host(tmp_path: Path) -> None:
    file = tmp_path / CPU_PEAK_FILE
    key = cpu_peak_key("float32", 1024)
    fresh = measured_cpu_peak("float32", store=tmp_path)
    assert json.loads(file.read_text()) == {key: fresh}
    # This process's figure was taken while another thread held a core (it reads low): the
    # host's best stands, so the MFU does not jump with one busy measurement.
    file.write_text(json.dumps({key: fresh * 3, "another host": 1.0}))
    assert measured_cpu_peak("float32", store=tmp_path) == fresh * 3
    assert json.loads(file.read_text())[key] == fresh * 3
    # A lower stored figure gives way to this process's; other hosts' entries are kept.
    file.write_text(json.dumps({key: fresh / 3, "another host": 1.0}))
    assert measured_cpu_peak("float32", store=tmp_path) == fresh
    assert json.loads(file.read_text()) == {key: fresh, "another host": 1.0}
    # A damaged file is replaced, and no temporary file is left beside it.
    file.write_text("{not json")
    assert measured_cpu_peak("float32", store=tmp_path) == fresh
    assert json.loads(file.read_text()) == {key: fresh}
    assert sorted(p.name for p in tmp_path.iterdir()) == [CPU_PEAK_FILE]
    assert measured_cpu_peak("float32") == fresh  # no store: this process's figure


def test_mfu_is_useful_flops_per_second_per_device_over_the_peak() -> None:
    meter = MFUMeter(6e12, devices=2, peak=1e12)
    assert meter.measure(0, now=10.0) == {}  # the baseline (the first step compiled)
    perf = meter.measure(4, now=16.0)  # 4 steps in 6 s: 1.5 s per step
    assert perf["perf/step_s"] == 1.5
    assert perf["perf/useful_tflops_per_device"] == 2.0  # 6e12 / 1.5 / 2
    assert perf["perf/mfu"] == 2.0
    # a target the census does not count (a toy): no perf metrics rather than wrong ones
    blind = MFUMeter(None, devices=1, peak=1e12)
    assert blind.measure(0, now=1.0) == {} and blind.measure(1, now=2.0) == {}


def test_a_run_logs_mfu_in_metrics_and_finite(tmp_path: Path, capsys) -> None:
    config = tiny_config(
        tmp_path,
        tmp_path / "cache",
        steps=3,
        decomposition_targets=[{"module_pattern": "layers.*.mlp.down_proj", "C": 8}],
        loss_metrics=[
            {"type": "importance_minimality", "coeff": 1e-3},
            {"type": "stochastic_recon", "coeff": 1.0},
        ],
        faithfulness_warmup={"steps": 0},
    )
    config["cadence"] = {"train_log_every": 1, "save_every": 0}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run")]) == 0
    train = [r for r in read_metrics(tmp_path / "run") if r["phase"] == "train"]
    assert [r["step"] for r in train] == [0, 1, 2]
    assert "perf/mfu" not in train[0]  # step 0 compiles: the meter's baseline
    for r in train[1:]:
        assert math.isfinite(r["perf/mfu"]) and r["perf/mfu"] > 0
        assert math.isfinite(r["perf/useful_tflops_per_device"])
        assert r["perf/step_s"] > 0
    assert "mfu=" in capsys.readouterr().err
    # The host's CPU peak is kept beside the run's compile cache, and the next run's MFU is
    # measured against the best one stored there.
    file = tmp_path / "cache" / CPU_PEAK_FILE
    stored = json.loads(file.read_text())
    assert list(stored) == [cpu_peak_key("float32", 1024)]
    file.write_text(json.dumps({key: value * 1e6 for key, value in stored.items()}))
    assert main(["run", str(path), "--run-dir", str(tmp_path / "run2")]) == 0
    again = [r for r in read_metrics(tmp_path / "run2") if r["phase"] == "train"]
    assert max(r["perf/mfu"] for r in again[1:]) < 1e-5 * min(r["perf/mfu"] for r in train[1:])
