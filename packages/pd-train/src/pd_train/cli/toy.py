"""``pd-train run`` / ``pd-train pretrain`` for the built-in toy targets (``builtin:tms_5_2``).

A toy config is a small YAML mapping (the run dir's ``config.yaml`` is one, so it can be run
again)::

    toy: tms_5_2            # a built-in toy: its target, shipped weights and recipe
    seed: 0                 # the decomposition's run key
    target: {type: tms, n_features: 5, n_hidden: 2, n_hidden_layers: 0, tied_weights: true}
    pd: {steps: 40000, batch_size: 4096, ...}   # the decomposition recipe: a full PDConfig
    steps_per_call: 100     # K: steps per dispatched program (a lax.scan over K steps)
    log_every: 2000         # steps between loss records in metrics.jsonl (a multiple of K)
    eval_every: 0           # steps between ground-truth eval records (0: at the end only)
    save_every: 0           # steps between checkpoints (0: at the end, and at a stop, only)
    devices: 1              # the steps data-parallel over this many devices (CPU: with
                            # --simulate-devices N; docs/toys.md "Both cores")
    compile_cache: {enabled: true, dir: null}   # JAX's persistent compile cache (null:
                            # outputs/.compile_cache in the working directory): a second
                            # run of the same shapes loads its programs instead of compiling

``target`` describes the shipped weights and must agree with them (it is checked, not applied).
``pd`` is the toy's recipe (:class:`~pd_train.config.pd.PDConfig`, the same fields as a Llama run's
``pd`` section): what the file or ``--set`` gives replaces the built-in values (``--set
pd.decomposition_targets[0].C=40``, ``pd.loss_metrics[0].coeff=1e-3``, ``pd.components.lr``),
and bad fields are named by their path. ``pd-train run`` delegates here when its config
is ``builtin:<toy>`` or a YAML file with a top-level ``toy`` key; the decomposition runs through
:func:`pd_train.targets.toys.decompose` (the same Trainer and step as a Llama run) in
:func:`pd_train.run.run_loop` with a K-step step function and hooks. The run dir gets
``config.yaml``, ``metrics.jsonl`` (``warmup`` and ``train`` records, then ``eval`` records with
the ground-truth metrics), orbax checkpoints under ``checkpoints/`` (``pd-train run --resume
DIR`` continues one), ``summary.txt``/``summary.json`` and the PNG plots under ``plots/``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

__all__ = [
    "compile_toy",
    "is_toy_config",
    "load_toy_config",
    "pretrain_toy_cli",
    "run_toy_cli",
    "toy_pd_config",
]

_TOP_KEYS = (
    "toy",
    "seed",
    "target",
    "pd",
    "steps_per_call",
    "log_every",
    "eval_every",
    "save_every",
    "devices",
    "compile_cache",
)
#: ``compile_cache``'s fields: a Llama config's ``runtime.compile_cache`` names, same meanings.
_CACHE_KEYS = ("enabled", "dir")
#: Where a toy run's compile cache is when ``compile_cache.dir`` is null: beside the toy run
#: dirs made by default (``outputs/<toy>-<date>``), under the working directory.
DEFAULT_TOY_CACHE = Path("outputs") / ".compile_cache"
_TARGET_TYPES = ("tms", "resid_mlp")


def _toy_names() -> list[str]:
    from pd_train.targets.toys import TOYS

    return sorted(TOYS)


def is_toy_config(value: str) -> bool:
    """``builtin:<toy>`` or a YAML file whose top level has a ``toy`` key."""
    if value.startswith("builtin:"):
        return value.removeprefix("builtin:") in _toy_names()
    path = Path(value)
    if path.suffix not in (".yaml", ".yml") or not path.is_file():
        return False
    import yaml

    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(raw, dict) and "toy" in raw


def _defaults(name: str) -> dict[str, Any]:
    import attrs

    from pd_train.config.io import unstructure
    from pd_train.targets.toys import toy_config

    toy = toy_config(name)
    k = toy.steps_per_call
    return {
        "toy": name,
        "seed": 0,
        "target": {"type": toy.target_type, **attrs.asdict(toy.target)},
        "pd": unstructure(toy.pd),
        "steps_per_call": k,
        "log_every": max(k, toy.pd.steps // 20 // k * k),
        "eval_every": 0,
        "save_every": 0,
        "devices": 1,
        "compile_cache": {"enabled": True, "dir": None},
    }


def toy_pd_config(raw: dict[str, Any], *, source: str | None = None) -> Any:
    """The resolved config's ``pd`` section as a checked :class:`~pd_train.config.pd.PDConfig`
    (its patterns matched against the toy's sites); ConfigError with ``pd.``-paths."""
    from pd_train.config.io import ConfigError, structure
    from pd_train.config.pd import PDConfig, check_pd_config
    from pd_train.decomposition import build_decomposition
    from pd_train.losses import check_one_adversary
    from pd_train.targets.toys import make_target, toy_config

    try:
        pd = structure(raw["pd"], PDConfig)
        check_pd_config(pd, path="pd")
        decomposition = build_decomposition(
            make_target(toy_config(raw["toy"])), pd.decomposition_targets
        )
        check_one_adversary(pd, decomposition, seq_len=1)  # a toy batch is [B, 1, n_features]
    except ConfigError as exc:
        problems = [
            (p if p.startswith("pd.") or p == "pd" else f"pd.{p}" if p else "pd", m)
            for p, m in exc.problems
        ]
        raise ConfigError(problems, source=source) from None
    return pd


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def load_toy_config(value: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The resolved toy config (defaults of the toy, the file's values, then ``--set``
    overrides); ConfigError naming each bad field (``target.type``, ``pd.lr``, ...)."""
    import yaml

    from pd_train.config.io import ConfigError, apply_overrides, seed_problem

    source: str | None = None
    if value.startswith("builtin:"):
        given: dict[str, Any] = {"toy": value.removeprefix("builtin:")}
    else:
        source = value
        given = yaml.safe_load(Path(value).read_text())
    name = given.get("toy")
    if name not in _toy_names():
        have = ", ".join(_toy_names())
        raise ConfigError([("toy", f"no built-in toy {name!r}; have {have}")], source=source)
    raw = _defaults(name)
    for key, val in given.items():
        if isinstance(val, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **val}
        else:
            raw[key] = val
    raw = apply_overrides(raw, overrides)
    problems: list[tuple[str, str]] = []
    if raw["toy"] != name:
        problems.append(("toy", f"got {raw['toy']!r}; set the toy in the config, not by --set"))
    for key in raw:
        if key not in _TOP_KEYS:
            problems.append((key, f"unknown field; a toy config has {', '.join(_TOP_KEYS)}"))
    if (problem := seed_problem(raw["seed"])) is not None:
        problems.append(("seed", problem))
    for key in ("steps_per_call", "log_every", "devices"):
        if not _positive(raw[key]):
            problems.append((key, f"got {raw[key]!r}; must be an int >= 1"))
    for key in ("eval_every", "save_every"):
        every = raw[key]
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            problems.append((key, f"got {every!r}; must be an int >= 0"))
    if _positive(raw["steps_per_call"]):
        k = raw["steps_per_call"]
        for key in ("log_every", "eval_every", "save_every"):
            if _positive(raw[key]) and raw[key] % k:
                msg = f"got {raw[key]}; must be a multiple of steps_per_call ({k})"
                problems.append((key, msg))
    problems += _cache_problems(raw["compile_cache"])
    if not isinstance(raw["pd"], dict):
        problems.append(("pd", f"got {raw['pd']!r}; must be a mapping (a PDConfig)"))
    target, shipped = raw["target"], _defaults(name)["target"]
    if not isinstance(target, dict):
        problems.append(("target", f"got {target!r}; must be a mapping"))
    else:
        kind = target.get("type")
        if kind not in _TARGET_TYPES:
            allowed = ", ".join(_TARGET_TYPES)
            problems.append(("target.type", f"unknown target kind {kind!r}; have {allowed}"))
        elif kind != shipped["type"]:
            msg = f"got {kind!r}; {name} is a {shipped['type']} target"
            problems.append(("target.type", msg))
        for key, val in target.items():
            if key not in shipped:
                problems.append((f"target.{key}", f"unknown field; have {', '.join(shipped)}"))
            elif key != "type" and val != shipped[key]:
                problems.append(
                    (
                        f"target.{key}",
                        f"got {val!r}; the shipped {name} weights have {shipped[key]!r} "
                        "(the target describes the weights; it cannot be changed)",
                    )
                )
    if problems:
        raise ConfigError(problems, source=source)
    pd = toy_pd_config(raw, source=source)
    from pd_train.targets.toys import toy_mesh

    try:  # the process's devices and the batch (before a run dir is written)
        toy_mesh(raw["devices"], batch_size=pd.batch_size)
    except ConfigError as exc:
        raise ConfigError(exc.problems, source=source) from None
    return raw


def _cache_problems(cache: Any) -> list[tuple[str, str]]:
    if not isinstance(cache, dict):
        return [("compile_cache", f"got {cache!r}; must be a mapping ({', '.join(_CACHE_KEYS)})")]
    problems = [
        (f"compile_cache.{key}", f"unknown field; have {', '.join(_CACHE_KEYS)}")
        for key in cache
        if key not in _CACHE_KEYS
    ]
    if not isinstance(cache.get("enabled"), bool):
        problems.append(("compile_cache.enabled", f"got {cache.get('enabled')!r}; must be a bool"))
    where = cache.get("dir")
    if where is not None and (not isinstance(where, str) or not where.strip()):
        msg = f"got {where!r}; must be a directory (a non-empty string) or null (the default)"
        problems.append(("compile_cache.dir", msg))
    return problems


def toy_cache_directory(raw: dict[str, Any]) -> Path | None:
    """The resolved toy config's compile cache directory (absolute; relative paths from the
    working directory): ``compile_cache.dir``, else :data:`DEFAULT_TOY_CACHE`; None when
    ``compile_cache.enabled`` is false."""
    cache = raw["compile_cache"]
    if not cache["enabled"]:
        return None
    directory = Path(cache["dir"]).expanduser() if cache["dir"] else DEFAULT_TOY_CACHE
    return directory if directory.is_absolute() else Path.cwd() / directory


@contextlib.contextmanager
def _compile_cache(directory: Path | None) -> Iterator[None]:
    """JAX's persistent compile cache in ``directory`` (off with None) while the toy runs; the
    process's previous cache settings after (a sweep's or a test's later programs are not
    written into this run's cache)."""
    import jax

    from pd_train.process_env import configure_compile_cache

    names = (
        "jax_enable_compilation_cache",
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    previous = {name: jax.config.values[name] for name in names}
    configure_compile_cache(directory)
    try:
        yield
    finally:
        from jax._src import compilation_cache

        for name, value in previous.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"loss": {"a": x}}`` → ``{"loss/a": float(x)}`` (arrays as lists)."""
    import numpy as np

    out: dict[str, Any] = {}
    for key, val in tree.items():
        if isinstance(val, dict):
            out.update(_flat(val, f"{prefix}{key}/"))
        else:
            arr = np.asarray(val, dtype=np.float64)
            out[f"{prefix}{key}"] = float(arr) if arr.ndim == 0 else arr.tolist()
    return out


def _new_run_dir(name: str) -> Path:
    from pd_train._output_paths import dated_dir

    return dated_dir(Path.cwd() / "outputs", name)


class _ToyCompiles:
    """The toy run's ``on_compile`` (:class:`pd_probe.Recorder`): the jits a toy run waits on,
    named as a Llama run names them (``init_params``, ``opt_init``, ``train_step``: the K-step
    program), announced through ``announce`` (:class:`pd_train.outputs.CompileLines`); of the
    others (the eval's eager ops, each compiled once) only those taking 0.5 s or more, when
    done. With ``compile_cache.enabled: false`` every compile is shown as ``no cache``."""

    NAMES: ClassVar[dict[str, str]] = {
        "stacked": "init_params",
        "_opt_init": "opt_init",
        "run": "train_step",
    }
    SHOWN_FROM_S = 0.5

    def __init__(self, announce: Any) -> None:
        self.announce = announce
        self.cache_on = True

    def __call__(self, event: str, info: dict[str, Any]) -> None:
        name = self.NAMES.get(str(info.get("jit")))
        if event == "start":
            self.cache_on = bool(info.get("cache_enabled", True))
        if not self.cache_on and "cache" in info:
            info = {**info, "cache": "off"}
        if name is not None:
            self.announce(event, {**info, "name": name, "jit": name})
        elif event == "done" and info.get("seconds", 0.0) >= self.SHOWN_FROM_S:
            self.announce(event, info)


def _toy_progress(terminal: Any, n_steps: int, *, start: int) -> Any:
    """The toy run's progress, written through the run's one terminal writer
    (:class:`pd_train.outputs.Terminal`) as ``pd-train run`` writes a Llama run's: a plain
    ``step i/N (p%) | it/s | ETA | losses`` line at each loss record (``record``: the first
    step, every ``log_every`` steps, the last), and on a terminal with a size a status-line bar
    redrawn after every call (K steps). A run loop hook."""
    from pd_train.outputs import Progress
    from pd_train.run.hooks import Hook

    class ToyProgress(Hook):
        def __init__(self) -> None:
            # log_every=1: ``record`` is called at the loss records only, each is a line.
            self.progress = Progress(n_steps, start_step=start, log_every=1, terminal=terminal)

        def record(self, step: int, metrics: dict[str, Any]) -> None:
            self.progress.update(step, metrics)

        def __call__(self, info: Any) -> None:
            if terminal.bar:
                self.progress.update(info.step - 1)

        def close(self, info: Any) -> None:
            self.progress.close()

    return ToyProgress()


#: What a toy run dir may hold before its run starts: the run's own config (``pd-train sweep``
#: writes each point's, with the point's ``point.json``).
PREPARED_FILES = frozenset({"config.yaml", "point.json"})


def _start_problem(run_dir: Path, raw: dict[str, Any]) -> str | None:
    """Why a toy run cannot start in ``run_dir`` (None: absent, empty, or prepared for this
    run: nothing but ``PREPARED_FILES``, its ``config.yaml`` this run's resolved config)."""
    import yaml

    if not run_dir.exists():
        return None
    if not run_dir.is_dir():
        return f"{run_dir} exists and is not a directory"
    names = {p.name for p in run_dir.iterdir()}
    if not names:
        return None
    if not names <= PREPARED_FILES or "config.yaml" not in names:
        return f"{run_dir} exists and is not empty; resume it with --resume {run_dir}"
    try:
        prepared = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        prepared = None
    if prepared != raw:
        return (
            f"{run_dir} holds a config.yaml that is not this run's; run it with `pd-train run "
            f"{run_dir / 'config.yaml'} --run-dir {run_dir}`, or give a new --run-dir"
        )
    return None


def run_toy_cli(
    value: str,
    overrides: Sequence[str] = (),
    *,
    run_dir: Path | None = None,
    max_steps: int | None = None,
    resume: bool = False,
) -> tuple[Path, str]:
    """Decompose a toy into ``run_dir`` (refused if it already holds files other than this
    run's own config, as ``pd-train sweep`` prepares a point, unless ``resume``: then
    ``value`` is the run dir's ``config.yaml`` and the run continues from its latest
    checkpoint, bit-exact at the same K); returns the run dir and the summary text.

    The steps run in :func:`pd_train.run.run_loop` with the toy's K-step step function; its
    hooks log ``train`` records (and ``warmup`` ones) to ``metrics.jsonl``, show progress from
    the first line on through one :class:`~pd_train.outputs.Terminal` (as ``pd-train run``
    does: the compiles, progress lines or the status-line bar, the eval lines; fd 2 and pd's
    log captured into it), save orbax checkpoints under ``checkpoints/`` (every
    ``save_every`` steps and at the end) and stop cleanly on SIGTERM / Ctrl-C (checkpoint
    saved; ``--resume`` continues)."""
    import yaml

    from pd_train._output_paths import directory_problem
    from pd_train.config.io import ConfigError
    from pd_train.outputs import Terminal

    raw = load_toy_config(value, overrides)
    pd = toy_pd_config(raw)
    run_dir = run_dir or _new_run_dir(raw["toy"])
    if resume:
        if not (run_dir / "checkpoints").is_dir():
            raise ConfigError([("--resume", f"{run_dir} has no checkpoints to resume from")])
    elif (problem := _start_problem(run_dir, raw)) is not None:
        raise ConfigError([("--run-dir", problem)])
    cache_dir = toy_cache_directory(raw)
    if cache_dir is not None and (problem := directory_problem(cache_dir)) is not None:
        raise ConfigError([("compile_cache.dir", problem)])
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    terminal = Terminal()
    try:
        with (
            terminal.capture_stderr(),
            terminal.logging_to_terminal(),
            _compile_cache(cache_dir),
        ):
            return _run_toy(raw, pd, run_dir, max_steps, resume, terminal)
    finally:
        terminal.close()


def _run_toy(
    raw: dict[str, Any],
    pd: Any,
    run_dir: Path,
    max_steps: int | None,
    resume: bool,
    terminal: Any,
) -> tuple[Path, str]:
    """:func:`run_toy_cli` once the run dir is checked: every line through ``terminal``."""
    import numpy as np

    from pd_probe import Recorder
    from pd_train.outputs import MetricsLog
    from pd_train.run.checkpoints import Checkpoints
    from pd_train.run.distributed import Placement
    from pd_train.run.hooks import StopHook
    from pd_train.run.signals import StopSignals
    from pd_train.targets.toys import (
        keep_freed_memory,
        make_target,
        run_toy,
        toy_config,
        toy_identity_failures,
        toy_trainer,
        toy_weights,
        write_plots,
    )

    keep_freed_memory()  # no page faults of the programs' temporaries on every call
    name = raw["toy"]
    n_steps = pd.steps if max_steps is None else min(max_steps, pd.steps)
    checkpoints = Checkpoints(run_dir / "checkpoints", writer=True)
    start = checkpoints.latest_step() if resume else None
    log = MetricsLog(run_dir, is_primary=True)
    if start is not None:
        log.truncate_from(start)
    k = raw["steps_per_call"]
    where = f"from step {start}" if start else "from step 0"
    terminal.line(
        f"{name}: {n_steps} steps {where} at batch {pd.batch_size}, K = {k} steps per call "
        f"(the first call compiles the {k}-step program); run dir {run_dir}"
    )
    progress = _toy_progress(terminal, n_steps, start=start or 0)

    def on_warmup(i: int, value: float) -> None:
        log.log(i, "warmup", {"loss/faithfulness": value})
        if i == 0 or i + 1 == pd.faithfulness_warmup.steps:
            terminal.line(
                f"warmup {i + 1}/{pd.faithfulness_warmup.steps}: faithfulness {value:.3g}"
            )

    def on_step(i: int, metrics: dict[str, Any]) -> None:
        flat = _flat(metrics)
        log.log(i, "train", flat)
        progress.record(i, flat)

    def on_eval(n: int, gt: dict[str, float]) -> None:
        log.log(n - 1, "eval", gt)
        terminal.line(
            f"eval after step {n - 1}: IdentityCIError {gt.get('gt/identity_ci_error', 0):.0f}"
            + (f", MMCS {gt['gt/mmcs']:.3f}" if "gt/mmcs" in gt else "")
        )

    signals = StopSignals()
    signals.terminal = terminal
    stop = StopHook(signals, Placement())
    # The toy's compiles announced as a Llama run's are, each with its time (nothing recorded).
    recorder = Recorder(None, mode="run", on_compile=_ToyCompiles(terminal.compile_announcer()))
    toy = toy_config(name)
    trainer = toy_trainer(make_target(toy), pd)
    with signals, recorder, recorder.phase("toy"):
        result, ci, params = run_toy(
            name,
            seed=raw["seed"],
            pd=pd,
            on_step=on_step,
            max_steps=n_steps,
            steps_per_call=k,
            log_every=raw["log_every"],
            eval_every=raw["eval_every"],
            on_eval=on_eval,
            checkpoints=checkpoints,
            checkpoint_every=raw["save_every"],
            resume=resume,
            trainer=trainer,
            hooks=(stop, progress),
            on_warmup=on_warmup,
            devices=raw["devices"],
        )
    checkpoints.close()
    done = int(result["steps"])
    gt = {k: v for k, v in result.items() if k.startswith("gt/")}
    if not raw["eval_every"] or done % raw["eval_every"]:
        on_eval(done, gt)
    log.close()
    elapsed = result["time_s"]
    summary = {
        "toy": name,
        "steps": done,
        "stopped": stop.stopped,
        "time_s": elapsed,
        "steps_per_s": result["steps_per_s"],
        "samples_per_s": result["samples_per_s"],
        "reproduced": bool(result["reproduced"]),
        **gt,
        "identity_failures": toy_identity_failures(toy, trainer, toy_weights(name), ci, params),
        "one_hot_ci": {site: np.round(v, 4).tolist() for site, v in ci.items()},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    text = summary_text(name, summary, k=k, run_dir=run_dir)
    (run_dir / "summary.txt").write_text(text)
    # After the summary: what the run measured is on disk before anything is drawn.
    write_plots(toy, trainer, params, toy_weights(name), ci, run_dir / "plots")
    return run_dir, text


def summary_text(name: str, summary: dict[str, Any], *, k: int, run_dir: Path) -> str:
    """The toy run's summary: steps and rate, MMCS/ML2R, per site alive and the reference's
    errors (with what a nonzero IdentityCIError is made of), and the verdict."""
    from pd_train.analysis.ground_truth import describe_identity_failures

    lines = [
        f"{name}: {summary['steps']} steps in {summary['time_s']:.1f} s "
        f"({summary['steps_per_s']:.1f} steps/s, K = {k})"
        + (" (stopped by a signal; resume with --resume)" if summary.get("stopped") else "")
    ]
    if "gt/mmcs" in summary:
        lines.append(f"  linear1: MMCS {summary['gt/mmcs']:.3f}, ML2R {summary['gt/ml2r']:.3f}")
    for site in summary["one_hot_ci"]:
        line = (
            f"  {site}: alive {summary[f'gt/alive/{site}']:.0f}"
            f" (one-hot {summary[f'gt/alive_one_hot/{site}']:.0f})"
        )
        if f"gt/identity_ci_error/{site}" in summary:
            line += f", IdentityCIError {summary[f'gt/identity_ci_error/{site}']:.0f}"
        if f"gt/dense_ci_error/{site}" in summary:
            line += f", DenseCIError {summary[f'gt/dense_ci_error/{site}']:.0f}"
        lines.append(line)
        failures = summary.get("identity_failures", {}).get(site)
        if failures:
            lines.extend(f"    {d}" for d in describe_identity_failures(failures))
    verdict = "yes" if summary["reproduced"] else "no"
    lines.append(f"reproduced by the reference's criteria: {verdict}")
    lines.append(f"run dir: {run_dir}")
    return "\n".join(lines) + "\n"


#: ``pd-train pretrain --check``'s tolerance: the largest difference from the shipped weights,
#: relative to each array's largest value. Another CPU's float rounding, amplified over the
#: pretraining's Adam steps, moves resid_mlp1's weights by up to 3.0e-2 of that scale (an AMD
#: EPYC without AVX-512 against the machine they were made on; median difference 1e-3), the
#: TMS ones by ~1e-7; another pretraining seed moves resid_mlp1's by 1.5 (2026-12-02).
PRETRAIN_MATCH_RTOL = 0.1


def pretrain_toy_cli(
    value: str, *, out: Path | None = None, check: bool = False
) -> tuple[str, bool]:
    """Pretrain the toy ``builtin:<name>`` (deterministic from its pretrain seed); write its
    weights to ``out`` (default: the shipped file; ``check``: write nothing) and say whether
    they match the shipped ones: bit for bit on the CPU they were made on, within
    :data:`PRETRAIN_MATCH_RTOL` of each array's largest value on another (XLA:CPU's kernels
    round differently per instruction set, and training amplifies it: ~1e-7 apart after the TMS
    pretraining on an AVX-512 Xeon, 3e-2 after resid_mlp1's on an AMD EPYC). Returns the
    message and whether they match (True when nothing is shipped yet)."""
    import numpy as np

    from pd_train.config.io import ConfigError
    from pd_train.targets.toys import (
        flat_weights,
        load_weights,
        pretrain_toy,
        save_weights,
        toy_config,
        toy_weights_path,
    )

    if not value.startswith("builtin:"):
        raise ConfigError([("config", f"got {value!r}; pretrain takes builtin:<toy>")])
    name = value.removeprefix("builtin:")
    if name not in _toy_names():
        have = ", ".join(f"builtin:{n}" for n in _toy_names())
        raise ConfigError([("config", f"no built-in toy {name!r}; have {have}")])
    toy = toy_config(name)
    shipped_path = toy_weights_path(toy.weights)
    shipped = load_weights(shipped_path) if shipped_path.exists() else None
    if check and shipped is None:
        raise ConfigError([("--check", f"no shipped weights for {name} at {shipped_path}")])
    params, loss = pretrain_toy(toy)
    text = f"{name}: final loss {loss:.6g}"
    same = True
    if shipped is not None:
        new, old = flat_weights(params), flat_weights(shipped)
        if new.keys() != old.keys() or any(new[k].shape != old[k].shape for k in old):
            same, how = False, "other arrays or shapes"
        else:
            worst = max(
                float(np.max(np.abs(new[k] - old[k]), initial=0.0))
                / max(float(np.max(np.abs(old[k]), initial=0.0)), 1e-30)
                for k in old
            )
            same = worst <= PRETRAIN_MATCH_RTOL
            how = (
                "bit for bit"
                if worst == 0.0
                else f"largest difference {worst:.1e} of an array's scale, "
                f"{'within' if same else 'over'} {PRETRAIN_MATCH_RTOL:g}"
            )
        verdict = "matches" if same else "DIFFERS from"
        text += f"; {verdict} the shipped weights ({shipped_path.name}: {how})"
    if not check:
        target = out or shipped_path
        save_weights(params, target)
        text += f"; wrote {target}"
    return text, same


def compile_toy(value: str, overrides: Sequence[str] = ()) -> list[Any]:
    """``pd-train compile`` of a toy config: lower and compile the jits a toy run compiles
    (init, optimizer init, the faithfulness warmup if configured, the train step on a batch
    [pd.batch_size, 1, n_features] of fp32 features) on abstract inputs; one
    :class:`~pd_train.run.compile.CompileRow` each (no FLOP census: it is Llama-only)."""
    import jax
    import jax.numpy as jnp

    from pd_train.run.compile import CompileRow, compiled_memory
    from pd_train.targets.toys import make_target, toy_config, toy_trainer

    raw = load_toy_config(value, overrides)
    pd = toy_pd_config(raw)
    toy = toy_config(raw["toy"])
    trainer = toy_trainer(make_target(toy), pd)  # the run's compile options
    key = jax.eval_shape(lambda: jax.random.key(0))
    batch = jax.ShapeDtypeStruct((pd.batch_size, 1, toy.target.n_features), jnp.float32)
    jits = [
        *trainer.init_lowerings(key=key),
        ("opt_init", trainer.lower_opt_init),
    ]
    if pd.faithfulness_warmup.steps:
        jits.append(("faithfulness_warmup", lambda: trainer.lower_warmup(jnp.float32)))
    state, target = trainer.abstract_state(), trainer.abstract_target(jnp.float32)
    jits.append(("train_step", lambda: trainer._train_step.lower(state, target, batch, key)))
    rows = []
    for name, lower in jits:
        t0 = time.perf_counter()
        lowered = lower()
        t1 = time.perf_counter()
        compiled = lowered.compile()
        t2 = time.perf_counter()
        rows.append(CompileRow(name, t1 - t0, t2 - t1, compiled_memory(compiled)))
    return rows


def is_toy_run_dir(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a toy run (its ``config.yaml`` has a top-level ``toy``)."""
    return is_toy_config(str(Path(run_dir) / "config.yaml"))


def analyze_toy(run_dir: Path, *, checkpoint: int | None = None) -> tuple[Path, str]:
    """``pd-train analyze`` of a toy run dir: the reference's ground-truth metrics and the toy's
    plots of the decomposition at checkpoint ``checkpoint`` (default: the latest). Writes
    ``analysis/ground_truth-{step}.json`` (the metrics and the one-hot CI per site) and the
    PNGs under ``plots/``; returns the JSON's path and a one-line result. ConfigError naming
    ``--checkpoint`` when there is no such checkpoint."""
    import jax
    import numpy as np

    from pd_train.analysis.ground_truth import describe_identity_failures
    from pd_train.config.io import ConfigError
    from pd_train.run.checkpoints import Checkpoints, abstract_like
    from pd_train.targets.toys import (
        ground_truth_metrics,
        make_target,
        reproduced,
        toy_config,
        toy_identity_failures,
        toy_training_item,
        toy_weights,
        write_plots,
    )
    from pd_train.train import Trainer

    run_dir = Path(run_dir)
    raw = load_toy_config(str(run_dir / "config.yaml"))
    pd = toy_pd_config(raw)
    toy = toy_config(raw["toy"])
    steps = (
        Checkpoints(run_dir / "checkpoints").steps() if (run_dir / "checkpoints").is_dir() else []
    )
    if not steps:
        msg = f"{run_dir} has no checkpoint yet (a toy run saves one at its end)"
        raise ConfigError([("run_dir", msg)])
    step = steps[-1] if checkpoint is None else checkpoint
    if step not in steps:
        raise ConfigError([("--checkpoint", f"got {step}; {run_dir} has checkpoints {steps}")])
    trainer = Trainer(make_target(toy), pd)
    state = trainer.init_state(key=jax.random.key(0))  # a toy's: cheap; the restore's layout
    with Checkpoints(run_dir / "checkpoints") as checkpoints:
        params, _, _ = checkpoints.restore(
            decomposition=abstract_like(state.params),
            training=abstract_like(toy_training_item(state)),
            step=step,
        )
    params = jax.device_get(params)
    weights = toy_weights(raw["toy"])
    metrics, ci = ground_truth_metrics(toy, trainer, params, weights)
    write_plots(toy, trainer, params, weights, ci, run_dir / "plots")
    out = run_dir / "analysis" / f"ground_truth-{step}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "toy": raw["toy"],
        "checkpoint_step": step,
        "reproduced": reproduced(toy, metrics),
        **metrics,
        "identity_failures": toy_identity_failures(toy, trainer, weights, ci, params),
        "one_hot_ci": {site: np.round(v, 4).tolist() for site, v in ci.items()},
    }
    out.write_text(json.dumps(record, indent=1))
    verdict = "reproduced" if record["reproduced"] else "not reproduced"
    text = (
        f"{raw['toy']} at step {step}: IdentityCIError {metrics.get('gt/identity_ci_error', 0):.0f}, "
        f"DenseCIError {metrics.get('gt/dense_ci_error', 0):.0f}"
        + (f", MMCS {metrics['gt/mmcs']:.3f}" if "gt/mmcs" in metrics else "")
        + f" ({verdict} by the reference's criteria); wrote {out} and plots under {run_dir / 'plots'}"
    )
    for site, failures in record["identity_failures"].items():
        text += f"\n  {site}: IdentityCIError {metrics[f'gt/identity_ci_error/{site}']:.0f}"
        text += "".join(f"\n    {d}" for d in describe_identity_failures(failures))
    return out, text
