"""``pd-train probe``: compile probes of a config through pd-probe.

pd-probe owns arms, isolated caches, the runner, the recorder and the report; this module owns
what only pd-train knows: the schema every arm is validated by (:func:`pd_train.run.prepare`),
how each knob is spelled as overrides of a pd-train config, and the command that compiles
(``pd-train compile``) or steps (``pd-train run``) one arm.

The standard grid over a base config (every arm is the base plus overrides):

* ``baseline`` — the base config.
* ``layers_{n}`` (n in 2, 8, 32, capped at the decomposed layers) — decompose only the first n
  of the base's decomposed layers; the rest of the model runs frozen. The decomposition targets
  are rewritten per kind (same C) with fnmatch layer classes, e.g.
  ``layers.[0-7].mlp.down_proj``, and each chunkwise recon term keeps its number of chunks.
* ``chunks_{k}`` (k in 1, 2, 4, 8) — each chunkwise recon term cut into k chunks
  (``sites_per_chunk = ceil(sites / k)``); ``chunks_{k}_unroll`` the same with the chunk loop
  unrolled.
* ``chunk_loop_scan`` / ``chunk_loop_unroll`` and ``layer_loop_scan`` / ``layer_loop_unroll``
  (``pd.recon.*_loop``) — numerically equivalent pairs: in steps mode their losses must match.
* ``init_stacked`` / ``init_per_array`` (``runtime.init``) — pd-init's stacked jit vs its
  per-array reference jit (one output per array) plus a stacking jit; an equivalent pair.
* ``autotune_{0,2,4}`` (GPU only) — ``--xla_gpu_autotune_level`` in XLA_FLAGS.
* ``cache_off`` / ``cache_on`` — ``runtime.compile_cache.enabled``; ``cache_on`` runs twice in
  the same cache, so its second run shows what a warm persistent cache saves.

Every arm's ``runtime.compile_cache.dir`` and ``output_dir`` point into its own directory of
the probe (pd-train sets the cache from its config, so pd-probe's JAX_COMPILATION_CACHE_DIR
alone would not isolate it).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pd_train.config.io import add_override_argument

if TYPE_CHECKING:  # pd_train.run imports JAX: `pd-train run` imports it later (pd_train.cli.run)
    from pd_train.run import Prepared

__all__ = [
    "DEFAULT_PROBE_CONFIG",
    "LOSS_KEYS",
    "SlurmLauncher",
    "add_parser",
    "arm_command",
    "build_grid",
    "chunks_overrides",
    "layer_patterns",
    "layers_overrides",
    "load_base",
    "probe",
    "validator",
]

DEFAULT_PROBE_CONFIG = "configs/llama8b-full32L.yaml"
_DEFAULT_BUILTIN = "builtin:llama8b-full32L"

FREE_FORM = ("runtime.compiler_options", "runtime.launch_env.env")
"""Mapping fields whose keys are free: an arm may add keys there."""

LAYER_SLICES = (2, 8, 32)
CHUNK_COUNTS = (1, 2, 4, 8)
LOSS_KEYS = ("loss/total", "grad_norm/components", "grad_norm/ci_fn")
"""metrics.jsonl keys that equivalent arms must log bit-identically at every step (steps mode):
the loss and the gradient norms, since scan and unroll must agree on both."""

INIT_FIELD = "runtime.init"
"""The init switch (``stacked`` | ``per_array``); init arms exist only if the schema has it."""


class ProbeInputError(ValueError):
    """Bad input to ``pd-train probe`` (arguments, a base config that cannot be probed)."""


# ---------------------------------------------------------------------------------------------
# The base config and the schema


def validator(*, for_run: bool = False) -> Callable[[dict[str, Any]], Prepared]:
    """pd-train's schema as pd-probe's ``validate``: ``prepare(raw, for_run=…)``, raising
    :class:`~pd_train.config.io.ConfigError` with field paths. ``for_run=True`` (steps mode)
    also checks that the weights and token files exist."""
    from pd_train.run import prepare

    def validate(raw: dict[str, Any]) -> Prepared:
        return prepare(raw, for_run=for_run)

    return validate


def load_base(
    source: str | Path | dict[str, Any], overrides: Sequence[str] = (), *, for_run: bool = False
) -> tuple[dict[str, Any], Prepared]:
    """Validate the base config and return its fully populated raw form (every field, defaults
    filled in, so that an override path exists exactly when the schema has that field) and the
    prepared config the override builders read."""
    from pd_train.config.io import unstructure
    from pd_train.run import prepare

    prepared = prepare(source, overrides, for_run=for_run)
    return unstructure(prepared.config), prepared  # prepare() made its paths absolute


def _decomposition(prepared: Prepared) -> Any:
    from pd_train.decomposition import build_decomposition

    return build_decomposition(prepared.model, prepared.config.pd.decomposition_targets)


def _chunkwise_terms(prepared: Prepared) -> list[tuple[int, int]]:
    """(index in pd.loss_metrics, sites_per_chunk) of every chunkwise subset recon term."""
    from pd_train.config.pd import ChunkwiseSubsetRecon

    return [
        (i, term.sites_per_chunk)
        for i, term in enumerate(prepared.config.pd.loss_metrics)
        if isinstance(term, ChunkwiseSubsetRecon)
    ]


def _decomposed_layers(decomposition: Any) -> list[int]:
    return sorted({layer for kind in decomposition.kinds for layer in kind.layers})


# ---------------------------------------------------------------------------------------------
# Override builders


def _char_class(digits: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 5]`` → ``[0-35]``; one digit stays bare."""
    if len(digits) == 1:
        return str(digits[0])
    parts, start = [], digits[0]
    for prev, cur in zip(digits, [*digits[1:], None], strict=True):
        if cur is None or cur != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur if cur is not None else start
    return "[" + "".join(parts) + "]"


def layer_patterns(layers: Iterable[int], n_layers: int) -> list[str]:
    """fnmatch patterns for the layer field of site names matching exactly ``layers``.

    ``layer_patterns(range(8), 32) == ["[0-7]"]``; ``range(16)`` gives ``["[0-9]", "1[0-5]"]``;
    every layer of the model gives ``["*"]``.
    """
    wanted = sorted(set(layers))
    if wanted == list(range(n_layers)):
        return ["*"]
    by_prefix: dict[str, list[int]] = {}
    for layer in wanted:
        text = str(layer)
        by_prefix.setdefault(text[:-1], []).append(int(text[-1]))
    return [prefix + _char_class(digits) for prefix, digits in by_prefix.items()]


def layers_overrides(prepared: Prepared, n: int) -> dict[str, Any]:
    """Overrides decomposing only the first ``n`` of the base's decomposed layers.

    Per decomposed kind the targets keep the kind's C and cover the kept layers; every chunkwise
    recon term keeps its number of chunks (so the arm varies layers, not chunking). ``n`` equal
    to the base's decomposed layers gives no overrides (the arm is the baseline).
    """
    from pd_train.decomposition import site_name

    decomposition = _decomposition(prepared)
    layers = _decomposed_layers(decomposition)
    if not 1 <= n <= len(layers):
        msg = (
            f"{n} layers asked; the base config decomposes {len(layers)} layers "
            f"({layers[0]}..{layers[-1]})"
        )
        raise ValueError(msg)
    if n == len(layers):
        return {}
    keep = set(layers[:n])
    n_layers = prepared.model.num_hidden_layers
    targets = []
    n_sites = 0
    for kind in decomposition.kinds:
        kept = [layer for layer in kind.layers if layer in keep]
        n_sites += len(kept)
        module = site_name(0, kind.kind).split(".", 2)[2]  # "mlp.down_proj"
        for pattern in layer_patterns(kept, n_layers) if kept else []:
            targets.append({"module_pattern": f"layers.{pattern}.{module}", "C": kind.C})
    overrides: dict[str, Any] = {"pd.decomposition_targets": targets}
    base_sites = len(decomposition.sites)
    for i, sites_per_chunk in _chunkwise_terms(prepared):
        chunks = math.ceil(base_sites / sites_per_chunk)
        overrides[f"pd.loss_metrics[{i}].sites_per_chunk"] = math.ceil(n_sites / chunks)
    return overrides


def chunks_overrides(prepared: Prepared, k: int) -> dict[str, Any]:
    """Overrides cutting every chunkwise recon term into ``k`` chunks of consecutive sites
    (``sites_per_chunk = ceil(sites / k)``; the last chunk may be smaller). A ``subset_recon``
    term (all sites in one forward) becomes the chunked ``chunkwise_subset_recon`` with the
    same coeff and n_samples."""
    from pd_train.config.pd import SubsetRecon

    n_sites = len(_decomposition(prepared).sites)
    terms = _chunkwise_terms(prepared)
    subset = [
        (i, t) for i, t in enumerate(prepared.config.pd.loss_metrics) if isinstance(t, SubsetRecon)
    ]
    if not terms and not subset:
        msg = (
            "the base config has no chunkwise_subset_recon or subset_recon term in pd.loss_metrics"
        )
        raise ValueError(msg)
    if not 1 <= k <= n_sites:
        msg = f"{k} chunks asked; the base config decomposes {n_sites} sites"
        raise ValueError(msg)
    out: dict[str, Any] = {
        f"pd.loss_metrics[{i}].sites_per_chunk": math.ceil(n_sites / k) for i, _ in terms
    }
    for i, term in subset:
        out[f"pd.loss_metrics[{i}]"] = {
            "type": "chunkwise_subset_recon",
            "coeff": term.coeff,
            "sites_per_chunk": math.ceil(n_sites / k),
            "n_samples": term.n_samples,
        }
    return out


def _with(overrides: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    return {**overrides, path: value}


def _field_exists(raw: dict[str, Any], dotted: str) -> bool:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


# ---------------------------------------------------------------------------------------------
# The grid


def build_grid(
    raw: dict[str, Any],
    prepared: Prepared,
    *,
    for_run: bool = False,
    extra_arms: Sequence[Any] = (),
    layer_slices: Sequence[int] = LAYER_SLICES,
    chunk_counts: Sequence[int] = CHUNK_COUNTS,
) -> Any:
    """pd-probe's standard grid over ``raw`` with pd-train's override builders; every arm's
    config is validated by :func:`pd_train.run.prepare` here (a bad override raises
    :class:`pd_probe.GridError` naming the arm and the field path).

    Layer slices above the base's decomposed layers become that number (its arm is then the
    baseline's alias); chunk counts above the number of sites are dropped.
    """
    from pd_probe import standard_grid

    decomposition = _decomposition(prepared)
    n_layers = len(_decomposed_layers(decomposition))
    n_sites = len(decomposition.sites)
    # A subset_recon term (all sites in one forward) counts as one chunk of every site.
    terms = _chunkwise_terms(prepared) or [
        (i, n_sites)
        for i, t in enumerate(prepared.config.pd.loss_metrics)
        if t.type == "subset_recon"
    ]
    slices = sorted({min(n, n_layers) for n in layer_slices})
    counts = [k for k in chunk_counts if k <= n_sites] if terms else []
    baseline_meta: dict[str, Any] = {"layers": n_layers}
    if terms:
        baseline_meta["chunks"] = math.ceil(n_sites / terms[0][1])

    chunk_loop = _loop_arms("chunk_loop", "loop") if terms else []
    unrolled = _unrolled_arms(prepared, counts)
    init = _init_arms() if _field_exists(raw, INIT_FIELD) else []
    cache = _cache_arms()
    return standard_grid(
        raw,
        validate=validator(for_run=for_run),
        layers_override=lambda n: layers_overrides(prepared, n),
        chunks_override=(lambda k: chunks_overrides(prepared, k)) if counts else None,
        layer_slices=slices,
        chunk_counts=counts,
        chunk_loop_arms=chunk_loop,
        init_arms=init,
        autotune=None,
        cache=cache,
        extra_arms=[
            *unrolled,
            *_loop_arms("layer_loop", "layer_loop"),
            *extra_arms,
        ],
        baseline_meta=baseline_meta,
        free_form=FREE_FORM,
    )


def _loop_arms(loop: str, meta_key: str) -> list[Any]:
    """``pd.recon.{loop}`` scanned and unrolled: two arms that must agree."""
    from pd_probe import Arm

    return [
        Arm(
            name=f"{loop}_{how}",
            overrides={f"pd.recon.{loop}": how},
            meta={meta_key: how},
            equivalence=loop,
            description=f"pd.recon.{loop} = {how}",
        )
        for how in ("scan", "unroll")
    ]


def _unrolled_arms(prepared: Prepared, counts: Sequence[int]) -> list[Any]:
    """One arm per recon chunk count with the chunk loop unrolled."""
    from pd_probe import Arm

    return [
        Arm(
            name=f"chunks_{k}_unroll",
            overrides=_with(chunks_overrides(prepared, k), "pd.recon.chunk_loop", "unroll"),
            meta={"chunks_unrolled": k, "loop": "unroll"},
            description=f"{k} recon chunks, chunk loop unrolled",
        )
        for k in counts
    ]


def _init_arms() -> list[Any]:
    """The init path stacked and per array: two arms that must agree."""
    from pd_probe import Arm

    return [
        Arm(
            name=f"init_{how}",
            overrides={INIT_FIELD: how},
            meta={"init": how},
            equivalence="init",
            description=f"{INIT_FIELD} = {how}",
        )
        for how in ("stacked", "per_array")
    ]


def _cache_arms() -> list[Any]:
    """The persistent compilation cache off, and on (run twice: cold, then warm)."""
    from pd_probe import Arm

    return [
        Arm(
            name="cache_off",
            overrides={"runtime.compile_cache.enabled": False},
            meta={"cache": "off"},
            description="persistent compilation cache off",
        ),
        Arm(
            name="cache_on",
            overrides={"runtime.compile_cache.enabled": True},
            meta={"cache": "on"},
            repeats=2,
            description="persistent cache on: run 1 cold, run 2 warm in the same cache",
        ),
    ]


def arm_command(
    mode: str,
    *,
    simulate_devices: int | None = None,
    max_steps: int = 3,
    distributed: bool = False,
) -> list[str]:
    """The command template of one run of an arm (pd-probe fills the placeholders).

    compile: ``pd-train compile CONFIG --record RECORD``; steps: ``pd-train run CONFIG
    --run-dir OUT --max-steps K`` (its ``compile.json`` becomes the run's record), with
    ``--distributed slurm`` when every task of a SLURM job is one process of the run.
    """
    cmd = [sys.executable, "-m", "pd_train.cli"]
    if mode == "compile":
        cmd += ["compile", "{config}", "--record", "{record}"]
    else:
        cmd += ["run", "{config}", "--run-dir", "{out}", "--max-steps", str(max_steps)]
        if distributed:
            cmd += ["--distributed", "slurm"]
    if simulate_devices:
        cmd += ["--simulate-devices", str(simulate_devices)]
    return cmd


def _arm_paths_overrides(paths: Any) -> dict[str, Any]:
    return {"runtime.compile_cache.dir": str(paths.cache_dir), "output_dir": str(paths.root)}


def _collect_step_records(probe_dir: Path) -> None:
    """Steps mode: ``pd-train run`` records its compiles in ``RUN_DIR/compile.json``; that is
    the run's pd-probe record."""
    for run_dir in sorted((probe_dir / "arms").glob("*/run-*")):
        from pd_train.run import COMPILE_FILE

        source, record = run_dir / "out" / COMPILE_FILE, run_dir / "record.json"
        if source.is_file() and not record.exists():
            shutil.copyfile(source, record)


def _equivalence_lines(checks: Sequence[Any]) -> list[str]:
    return [
        f"- {c.group} ({', '.join(c.arms)}): {'identical' if c.identical else 'DIFFER'}: {c.detail}"
        for c in checks
    ]


def _rewrite_equivalence(report_md: Path, checks: Sequence[Any]) -> None:
    """Replace the report's equivalence section (pd-probe's ``write_report`` compares the key
    ``loss``; pd-train logs ``loss/total``) with the checks on :data:`LOSS_KEYS`."""
    from pd_probe import ProbeError

    text = report_md.read_text()
    head, marker, _ = text.partition("Equivalent arms")
    if not marker:
        return
    section = f"Equivalent arms ({', '.join(LOSS_KEYS)} at every step):\n"
    section += "\n".join(_equivalence_lines(checks)) + "\n"
    tmp = report_md.with_suffix(".md.tmp")
    try:
        tmp.write_text(head + section)
        os.replace(tmp, report_md)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ProbeError(f"could not rewrite {report_md}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# SLURM


class SlurmLauncher:
    """A pd-probe launcher that runs each run of an arm as one SLURM job through pd-launch.

    ``job`` is the template (nodes, GPUs, partition, time, account, …, e.g. from a pd-launch
    job file); each run gets a copy named ``{job.name}-{arm}``, with the run's command, its
    logs in the run dir (where pd-probe reads them), no requeue, and the arm's variables
    (those that differ from the submitting environment: XLA_FLAGS, the isolated cache dirs,
    PD_PROBE_*) exported in the script. The submitting environment is scrubbed of the caller's
    SLURM variables by pd-launch, so a probe started inside an allocation is safe.
    """

    def __init__(
        self,
        job: Any,
        *,
        poll_s: float = 10.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.job = job
        self.poll_s = poll_s
        self.env = env

    def _base_env(self) -> dict[str, str]:
        return dict(os.environ if self.env is None else self.env)

    def job_for(self, arm: Any, command: Sequence[str], env: dict[str, str], out_dir: Path) -> Any:
        """The job description of one run (what :meth:`launch` submits)."""
        import attrs

        base = self._base_env()
        extra = {k: v for k, v in env.items() if base.get(k) != v}
        return attrs.evolve(
            self.job,
            name=f"{self.job.name}-{arm.name}".replace("+", "-"),
            command=tuple(command),
            env={**self.job.env, **extra},
            output=str(out_dir / "stdout.log"),
            error=str(out_dir / "stderr.log"),
            requeue=False,
        )

    def launch(self, arm: Any, command: Sequence[str], env: Any, out_dir: Path) -> Any:
        import pd_launch

        out_dir.mkdir(parents=True, exist_ok=True)
        job = self.job_for(arm, command, dict(env), out_dir)
        submission = pd_launch.submit(job, env=self._base_env(), script_path=out_dir / "job.sh")
        return (submission.job_id, time.monotonic())

    def wait(self, handle: Any, *, timeout_s: float | None) -> int | None:
        import pd_launch

        job_id, started = handle
        left = math.inf if timeout_s is None else max(timeout_s - (time.monotonic() - started), 0)
        env = self._base_env()
        try:
            status = pd_launch.wait(job_id, timeout=left, check=False, poll=self.poll_s, env=env)
        except pd_launch.JobWaitTimeoutError:
            pd_launch.cancel(job_id, env=env)
            pd_launch.wait(job_id, timeout=300, check=False, poll=self.poll_s, env=env)
            return None
        if status.ok:
            return 0
        code = (status.exit_code or "").partition(":")[0]
        # A job that ended badly with exit code 0 (cancelled, node failure) still failed.
        return int(code) if code.isdigit() and int(code) != 0 else 1


# ---------------------------------------------------------------------------------------------
# The command


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``probe`` on the ``pd-train`` subparsers."""
    from pd_train.cli._common import positive_int

    p = subparsers.add_parser(
        "probe",
        help="compile probes of a config: arms with isolated caches, a report",
        description=(
            "Run variants (arms) of a config, each in a fresh process with its own compilation "
            "and autotune caches, and report per-jit compile seconds against the baseline."
        ),
    )
    p.add_argument(
        "config",
        nargs="?",
        default=DEFAULT_PROBE_CONFIG,
        help=f"base YAML config (default {DEFAULT_PROBE_CONFIG}; builtin:NAME for a shipped one)",
    )
    add_override_argument(p, what="a field of the base config")
    p.add_argument(
        "--arms",
        action="append",
        default=[],
        metavar="NAME[,NAME…]",
        help="run only these arms (comma-separated or repeated; the baseline always runs)",
    )
    p.add_argument(
        "--arm",
        dest="extra_arms",
        action="append",
        default=[],
        metavar="SPEC",
        help="an extra arm NAME:path=value;$VAR=value;@meta=value (repeatable; always run)",
    )
    p.add_argument("--mode", choices=("compile", "steps"), default="compile")
    p.add_argument("--out", type=Path, help="probe dir (new or empty; default under output_dir)")
    p.add_argument(
        "--simulate-devices",
        type=positive_int,
        metavar="N",
        help="each arm runs on N >= 1 simulated CPU devices",
    )
    p.add_argument("--timeout", type=float, metavar="SECONDS", help="per-run time limit")
    p.add_argument("--max-steps", type=int, default=3, help="steps per arm in steps mode")
    p.add_argument(
        "--layers",
        type=_int_list,
        default=LAYER_SLICES,
        metavar="N,N…",
        help="layer slices of the layers_N arms (default 2,8,32)",
    )
    p.add_argument(
        "--chunks",
        type=_int_list,
        default=CHUNK_COUNTS,
        metavar="K,K…",
        help="recon chunk counts of the chunks_K arms (default 1,2,4,8)",
    )
    p.add_argument(
        "--include-gpu-arms", action="store_true", help="also run GPU-only arms (autotune)"
    )
    p.add_argument(
        "--launcher",
        choices=("local", "slurm"),
        default="local",
        help="run arms as local processes, one after another, or as SLURM jobs (pd-launch)",
    )
    p.add_argument(
        "--slurm-job",
        type=Path,
        metavar="FILE",
        help="pd-launch job description (.toml/.json) every arm's job copies (its command is "
        "replaced); required with --launcher slurm",
    )
    p.add_argument(
        "--max-parallel",
        type=int,
        default=1,
        metavar="N",
        help="arms in flight at once (default 1: timings undisturbed; raise it with SLURM)",
    )
    p.add_argument("--list", action="store_true", help="list the validated arms and exit")
    return p


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        msg = f"{text!r}: expected positive integers separated by commas, e.g. 2,8,32"
        raise argparse.ArgumentTypeError(msg)
    return values


def _fail(message: str, code: int = 2) -> int:
    from pd_train.cli._common import fail

    return fail(message, code, command="pd-train probe")


def _launcher(args: argparse.Namespace) -> Any:
    from pd_probe import LocalLauncher

    if args.launcher == "local":
        if args.slurm_job is not None:
            raise ProbeInputError("--slurm-job is only used with --launcher slurm")
        return LocalLauncher()
    import pd_launch

    if args.slurm_job is None:
        msg = "--launcher slurm needs --slurm-job FILE (a pd-launch job description)"
        raise ProbeInputError(msg)
    try:
        return SlurmLauncher(pd_launch.load_job(args.slurm_job))
    except (OSError, pd_launch.JobSpecError) as exc:
        raise ProbeInputError(f"--slurm-job {args.slurm_job}: {exc}") from None


def _source(value: str) -> str | Path:
    from pd_train.configs import builtin_config

    if value.startswith("builtin:"):
        return builtin_config(value.removeprefix("builtin:"))
    if value == DEFAULT_PROBE_CONFIG and not Path(value).exists():
        return builtin_config(_DEFAULT_BUILTIN.removeprefix("builtin:"))
    return Path(value)


def _selection(args: argparse.Namespace, extra_names: Sequence[str]) -> list[str] | None:
    names = [n.strip() for item in args.arms for n in item.split(",") if n.strip()]
    if not names:
        return None
    return [*names, *extra_names]


def _listing(grid: Any) -> str:
    lines = []
    for arm in grid.arms:
        alias = f"  (= {grid.aliases[arm.name]})" if arm.name in grid.aliases else ""
        gpu = "  [GPU only]" if arm.gpu_only else ""
        lines.append(f"{arm.name}{alias}{gpu}")
        for o in arm.overrides:
            lines.append(f"    {o}")
        for key, value in arm.env.items():
            lines.append(f"    ${key}={value}")
    return "\n".join(lines)


def probe(args: argparse.Namespace) -> int:
    """Run ``pd-train probe``; 0 when every arm ran and the checks passed, 1 when an arm failed
    or a check did not hold, 2 on bad input (nothing is written then)."""
    from pd_probe import ProbeError, parse_arm, run_probe
    from pd_train.config.io import ConfigError

    problem = _argument_problem(args)
    if problem is not None:
        return _fail(problem)
    try:
        launcher = _launcher(args)
    except ProbeInputError as exc:
        return _fail(str(exc))
    steps = args.mode == "steps"
    try:
        extra = [parse_arm(spec) for spec in args.extra_arms]
        raw, prepared = load_base(_source(args.config), args.overrides, for_run=steps)
        grid = build_grid(
            raw,
            prepared,
            for_run=steps,
            extra_arms=extra,
            layer_slices=args.layers,
            chunk_counts=args.chunks,
        )
        grid = grid.select(
            _selection(args, [a.name for a in extra]), include_gpu_only=args.include_gpu_arms
        )
    except (ConfigError, ProbeError, ProbeInputError) as exc:
        return _fail(str(exc))
    if args.list:
        print(_listing(grid))
        return 0

    out = _out_dir(args, prepared.config)
    from pd_train._output_paths import directory_problem

    problem = directory_problem(out)
    if problem is not None:
        return _fail(f"--out: {problem}" if args.out is not None else f"output_dir: {problem}")
    tasks = 1
    if isinstance(launcher, SlurmLauncher):
        tasks = launcher.job.nodes * (launcher.job.tasks_per_node or 1)
    if tasks > 1 and not steps:
        msg = (
            f"--slurm-job {args.slurm_job} asks for {tasks} tasks, but `pd-train compile` is one "
            "process: use nodes = 1 and tasks_per_node = 1 for compile probes"
        )
        return _fail(msg)
    command = arm_command(
        args.mode,
        simulate_devices=args.simulate_devices,
        max_steps=args.max_steps,
        distributed=tasks > 1,
    )
    try:
        result = run_probe(
            grid,
            out,
            command=command,
            mode=args.mode,
            launcher=launcher,
            timeout_s=args.timeout,
            max_parallel=args.max_parallel,
            include_gpu_only=args.include_gpu_arms,
            path_overrides=_arm_paths_overrides,
            require_record=not steps,
            loss_keys=LOSS_KEYS,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except ProbeError as exc:
        return _fail(str(exc))
    return _report(result, steps=steps)


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``probe``'s numeric options, or None."""
    if args.max_steps < 1:
        return f"--max-steps {args.max_steps}: must be at least 1"
    if args.simulate_devices is not None and args.simulate_devices < 1:
        return f"--simulate-devices {args.simulate_devices}: must be at least 1"
    if args.timeout is not None and args.timeout <= 0:
        return f"--timeout {args.timeout}: must be positive"
    if args.max_parallel < 1:
        return f"--max-parallel {args.max_parallel}: must be at least 1"
    return None


def _out_dir(args: argparse.Namespace, config: Any) -> Path:
    """``--out``, or a new dir under ``output_dir/probes/`` named by run, mode and time."""
    if args.out is not None:
        return Path(args.out)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(config.output_dir) / "probes" / f"{config.run_name}-{args.mode}-{stamp}"


def _report(result: Any, *, steps: bool) -> int:
    """The probe's report written and printed with its checks; 0 when every arm ran and every
    check held, else 1."""
    from pd_probe import check_equivalence, check_isolation, write_report

    probe_dir = result.probe_dir
    if steps:
        _collect_step_records(probe_dir)
    report = write_report(probe_dir)
    checks = check_equivalence(probe_dir, loss_keys=LOSS_KEYS) if steps else []
    if steps:
        _rewrite_equivalence(report.markdown_path, checks)
    isolation = check_isolation(probe_dir)

    print(report.markdown)
    for name in result.failed:
        print(f"arm {name}: {result.arms[name].status}: {result.arms[name].error}")
    print(f"isolation: {'ok' if isolation.ok else 'BROKEN'}")
    for problem in isolation.problems:
        print(f"  {problem}")
    for line in _equivalence_lines(checks):
        print(line)
    print(f"report: {report.markdown_path} (also {report.csv_path.name}, {report.png_path.name})")
    ok = not result.failed and isolation.ok and all(c.identical for c in checks)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pd_train.cli.probe [CONFIG] [options]``: the same as ``pd-train probe``."""
    parser = argparse.ArgumentParser(prog="pd-train")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return probe(parser.parse_args(["probe", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
