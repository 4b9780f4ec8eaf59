"""pd-probe: compile probes of a config — arms, isolated caches, a compile recorder, a report.

pd-probe knows no config schema: arms are overrides on a raw config, the caller's ``validate``
judges every arm's config, and the caller gives the command that compiles or steps one arm.
jax is imported only by the :class:`Recorder`, inside the arm's process.
"""

from pd_probe._arm import Arm, parse_arm
from pd_probe._checks import (
    EquivalenceCheck,
    IsolationCheck,
    check_equivalence,
    check_isolation,
    read_losses,
)
from pd_probe._errors import GridError, IsolationError, OverrideError, ProbeError
from pd_probe._grid import Grid, autotune_arms, cache_arms, make_grid, standard_grid
from pd_probe._isolation import ArmPaths, RunPaths, arm_env, arm_paths, merge_xla_flags
from pd_probe._overrides import (
    Override,
    apply_overrides,
    format_path,
    parse_path,
    parse_scalar,
    to_overrides,
)
from pd_probe._recorder import CompileAnnouncer, Recorder, jit_name, peak_rss_bytes
from pd_probe._report import Report, load_rows, write_report
from pd_probe._runner import (
    PLACEHOLDERS,
    ArmStatus,
    Launcher,
    LocalLauncher,
    ProbeResult,
    RunStatus,
    run_probe,
)

__version__ = "0.1.0"

__all__ = [
    "PLACEHOLDERS",
    "Arm",
    "ArmPaths",
    "ArmStatus",
    "CompileAnnouncer",
    "EquivalenceCheck",
    "Grid",
    "GridError",
    "IsolationCheck",
    "IsolationError",
    "Launcher",
    "LocalLauncher",
    "Override",
    "OverrideError",
    "ProbeError",
    "ProbeResult",
    "Recorder",
    "Report",
    "RunPaths",
    "RunStatus",
    "__version__",
    "apply_overrides",
    "arm_env",
    "arm_paths",
    "autotune_arms",
    "cache_arms",
    "check_equivalence",
    "check_isolation",
    "format_path",
    "jit_name",
    "load_rows",
    "make_grid",
    "merge_xla_flags",
    "parse_arm",
    "parse_path",
    "parse_scalar",
    "peak_rss_bytes",
    "read_losses",
    "run_probe",
    "standard_grid",
    "to_overrides",
    "write_report",
]
