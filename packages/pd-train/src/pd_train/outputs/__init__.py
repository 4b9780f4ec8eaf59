"""What a run leaves behind and shows: ``metrics.jsonl``, the progress bar, plots, the summary.

No jax import: values from the step are converted with ``numpy.asarray``.
"""

from pd_train.outputs._alarm import AlarmFilter, xla_slow_compile_alarm_replaced
from pd_train.outputs._attempts import earlier_device_count, resume_device_warning
from pd_train.outputs._metrics import (
    METRICS_FILE,
    MetricsError,
    MetricsLog,
    read_metrics,
    to_json_value,
)
from pd_train.outputs._plot_workers import PlotWorkers
from pd_train.outputs._progress import DEFAULT_KEYS, Progress, format_metrics
from pd_train.outputs._terminal import (
    CompileLines,
    Terminal,
    compile_label,
    format_eval_table,
    labelled,
)
from pd_train.outputs.plots import (
    plot_ci_histograms,
    plot_eval_curves,
    plot_l0,
    plot_loss_curves,
    write_plots,
)
from pd_train.outputs.summary import render_summary

__all__ = [
    "DEFAULT_KEYS",
    "METRICS_FILE",
    "AlarmFilter",
    "CompileLines",
    "MetricsError",
    "MetricsLog",
    "PlotWorkers",
    "Progress",
    "Terminal",
    "compile_label",
    "earlier_device_count",
    "format_eval_table",
    "format_metrics",
    "labelled",
    "plot_ci_histograms",
    "plot_eval_curves",
    "plot_l0",
    "plot_loss_curves",
    "read_metrics",
    "render_summary",
    "resume_device_warning",
    "to_json_value",
    "write_plots",
    "xla_slow_compile_alarm_replaced",
]
