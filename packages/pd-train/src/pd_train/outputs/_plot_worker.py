"""A plot worker process (``python -m pd_train.outputs._plot_worker``): see
:mod:`pd_train.outputs._plot_workers` for the protocol."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

log = logging.getLogger("pd_train.outputs")


def main() -> int:
    """The worker process: import, say ``ready``, render one job, answer, exit."""
    import signal

    # Ctrl-C in a terminal reaches the whole process group: the run saves and then still
    # needs its plots; the run ends a worker through its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    names = set(sys.argv[1:])
    # pd's log lines as the run writes them (pd_train.process_env.setup_logging, which
    # imports jax).
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s pd %(levelname)s %(message)s"))
    pd_log = logging.getLogger("pd_train")
    pd_log.addHandler(handler)
    pd_log.setLevel(logging.INFO)
    pd_log.propagate = False
    # What rendering needs, imported before the job arrives: this is the ahead-of-time work.
    import matplotlib.backends.backend_agg
    import matplotlib.figure  # noqa: F401

    if names & {"plot_density", "plot_recon"}:
        # The pd_train.analysis package imports jax (~1.6 CPU s): only where it is drawn.
        import pd_train.analysis.density
        import pd_train.analysis.recon_plot  # noqa: F401
    from pd_train.outputs._metrics import read_metrics
    from pd_train.outputs.plots import PLOTS

    _draw_once()

    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line:
        return 0  # closed without a job
    job = json.loads(line)
    t0, cpu0 = time.perf_counter(), time.process_time()
    paths: list[str] = []
    records = read_metrics(job["run_dir"])
    for plot in PLOTS:
        if plot.__name__ not in names:
            continue
        try:
            paths += [str(p) for p in plot(records, job["out_dir"])]
        except Exception:
            log.warning("plots: %s failed; skipped", plot.__name__, exc_info=True)
    answer = {
        "paths": paths,
        "pid": os.getpid(),
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - cpu0,
    }
    print(json.dumps(answer), flush=True)
    return 0


def _draw_once() -> None:
    """Draw and encode a small throwaway figure (text, a log axis, constrained layout): the
    first figure of a process pays for matplotlib's font and renderer set-up."""
    import io

    from matplotlib.figure import Figure

    fig = Figure(figsize=(2, 2), layout="constrained")
    ax = fig.subplots()
    ax.plot([1, 2, 3], [1.0, 10.0, 100.0])
    ax.set_yscale("log")
    ax.set_title("warm-up")
    fig.savefig(io.BytesIO(), format="png", dpi=50)


if __name__ == "__main__":
    sys.exit(main())
