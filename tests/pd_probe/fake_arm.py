"""A jax-free arm program for runner tests: a real process that reads its config and the
environment the runner gave it, and writes what pd-train would (a record, metrics.jsonl).

Usage: fake_arm.py CONFIG RECORD OUT. FAKE_BEHAVIOR (from the arm's env) picks a failure:
ok (default), fail (exit 3), sleep (hang), norecord (exit 0 without a record).
FAKE_LOSS_SHIFT is added to every loss, making an arm numerically different.
"""

import json
import os
import sys
import time
from pathlib import Path

config_path, record_path, out = (Path(a) for a in sys.argv[1:4])
config = json.loads(config_path.read_text())
behavior = os.environ.get("FAKE_BEHAVIOR", "ok")
if behavior == "fail":
    print("fake arm: failing on purpose", file=sys.stderr)
    sys.exit(3)
if behavior == "sleep":
    time.sleep(600)

cache_dir = Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
run = int(os.environ["PD_PROBE_RUN"])
saw_previous = sorted(p.name for p in cache_dir.iterdir())
# Stand-in for an executable JAX would write into the arm's compilation cache.
(cache_dir / f"entry-run{run}").write_text(os.environ["PD_PROBE_ARM"])

out.mkdir(parents=True, exist_ok=True)
keys = ("JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS", "PD_PROBE_ARM", "PD_PROBE_MODE", "PD_PROBE_OUT")
(out / "env.json").write_text(json.dumps({k: os.environ.get(k) for k in keys}))
if os.environ["PD_PROBE_MODE"] == "steps":
    shift = float(os.environ.get("FAKE_LOSS_SHIFT", "0"))
    layers = len(config["decomposition"]["layers"])
    with open(out / "metrics.jsonl", "w") as f:
        for step in range(config["runtime"]["steps"]):
            f.write(json.dumps({"step": step, "loss": layers / (step + 1) + shift}) + "\n")

if behavior != "norecord":
    record = {
        "schema": "pd-probe/arm-record/1",
        "arm": os.environ["PD_PROBE_ARM"],
        "run": run,
        "peak_rss_bytes": 0,
        "jits": {},
        "notes": {"saw_previous": saw_previous, "record_env": os.environ["PD_PROBE_RECORD"]},
        "error": None,
    }
    record_path.write_text(json.dumps(record))
