"""Time from launch to the end of step 0, cold (empty compile cache) and warm (same cache).

Launches `pd-train run` twice as fresh processes on the same config (the embedded default,
shortened: no eval, a short warmup, 2 steps) and reads step 0's wall-clock time from the run's
metrics.jsonl. Prints a table and, last:

    time to first step: cold C.Cs, warm W.Ws, warm/cold R.RR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def first_step_seconds(config: str, cache: Path, out: Path, overrides: list[str]) -> float:
    run_dir = out / f"run-{len(list(out.iterdir()))}"
    args = [
        sys.executable, "-m", "pd_train.cli", "run", config,
        "--run-dir", str(run_dir), "--max-steps", "1",
        "--set", f"runtime.compile_cache.dir={cache}",
        *[a for o in overrides for a in ("--set", o)],
    ]  # fmt: skip
    started = time.time()
    subprocess.run(args, check=True, capture_output=True, text=True)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step0 = next(r for r in records if r["phase"] == "train" and r["step"] == 0)
    return float(step0["time"]) - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="builtin:default")
    parser.add_argument("--devices", type=int, default=1, help="simulated CPU devices")
    args = parser.parse_args()
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    overrides = ["cadence.eval_every=0", "cadence.save_every=0", "pd.faithfulness_warmup.steps=3"]
    with tempfile.TemporaryDirectory() as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "runs"
        out.mkdir()
        cold = first_step_seconds(args.config, cache, out, overrides)
        warm = first_step_seconds(args.config, cache, out, overrides)
    print("| launch | compile cache | time to end of step 0 |")
    print("|---|---|---:|")
    print(f"| 1 | empty | {cold:.1f} s |")
    print(f"| 2 | warm | {warm:.1f} s |")
    print(f"time to first step: cold {cold:.1f}s, warm {warm:.1f}s, warm/cold {warm / cold:.2f}")


if __name__ == "__main__":
    main()
