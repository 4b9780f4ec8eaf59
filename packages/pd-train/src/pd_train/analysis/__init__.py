"""What a decomposition found: per-component statistics, a harvest of top-activating contexts,
the component table (``pd-train analyze``) and a static HTML report (``pd-train report``).

* :mod:`~pd_train.analysis.statistics` — traceable reductions of ``ci_lower`` (activation counts,
  CI sums) and CI-L0 groups (per layer, per kind, total, or ``pd.l0_groups``);
* :mod:`~pd_train.analysis.recon_eval` — the slow-eval metrics: hidden-activation recon per site
  and attention-pattern recon per layer, from one paired clean/masked layer scan;
* :mod:`~pd_train.analysis.harvest` — the jitted, sharded loop over eval batches with a running
  top-k per component (memory flat in the number of batches);
* :mod:`~pd_train.analysis.components` — a run dir + checkpoint → the component table (Parquet);
* :mod:`~pd_train.analysis.report` — a run dir → one self-contained HTML page;
* :mod:`~pd_train.analysis.tracking` — metrics.jsonl mirrored into Weights & Biases (optional).
"""

from pd_train.analysis.components import (
    AnalysisError,
    ComponentTable,
    analysis_path,
    analyze_run,
    build_table,
    read_table,
    write_table,
)
from pd_train.analysis.harvest import Harvester, HarvestResult, harvest_update, init_harvest_state
from pd_train.analysis.recon_eval import (
    RECON_MASKS,
    ReconStats,
    attention_kl,
    recon_batch_metrics,
    slow_eval_due,
)
from pd_train.analysis.statistics import (
    EvalComponentStats,
    ci_lower_of,
    component_counts,
    grouped_l0,
    l0_groups,
    resolve_l0_groups,
)
from pd_train.analysis.tracking import WandbConfig, parse_tracking, sync_wandb
from pd_train.analysis.vocab import Vocabulary, load_vocabulary

__all__ = [
    "RECON_MASKS",
    "AnalysisError",
    "ComponentTable",
    "EvalComponentStats",
    "HarvestResult",
    "Harvester",
    "ReconStats",
    "Vocabulary",
    "WandbConfig",
    "analysis_path",
    "analyze_run",
    "attention_kl",
    "build_table",
    "ci_lower_of",
    "component_counts",
    "grouped_l0",
    "harvest_update",
    "init_harvest_state",
    "l0_groups",
    "load_vocabulary",
    "parse_tracking",
    "read_table",
    "recon_batch_metrics",
    "resolve_l0_groups",
    "slow_eval_due",
    "sync_wandb",
    "write_table",
]
