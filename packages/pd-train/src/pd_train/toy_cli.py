"""``pd-train run`` / ``pd-train pretrain`` for the built-in toy targets (``builtin:tms_5_2``).

A toy config is a small YAML mapping (the run dir's ``config.yaml`` is one, so it can be run
again)::

    toy: tms_5_2            # a built-in toy: its target, shipped weights and recipe
    seed: 0                 # the decomposition's run key
    target: {type: tms, n_features: 5, n_hidden: 2, n_hidden_layers: 0, tied_weights: true}
    pd: {steps: 2000, batch_size: 256}
    log_every: 100          # steps between loss records in metrics.jsonl

``target`` describes the shipped weights and must agree with them (it is checked, not applied);
``pd.steps`` and ``pd.batch_size`` may change. ``pd-train run`` delegates here when its config
is ``builtin:<toy>`` or a YAML file with a top-level ``toy`` key; the decomposition runs through
:func:`pd_train.targets.toys.decompose` (the same Trainer and step as a Llama run), not through
:mod:`pd_train.run`'s token-data loop. The run dir gets ``config.yaml``, ``metrics.jsonl`` (loss
records, then one ``eval`` record with the ground-truth metrics), ``summary.txt``/
``summary.json`` and the PNG plots under ``plots/``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["is_toy_config", "load_toy_config", "pretrain_toy_cli", "run_toy_cli"]

_TOP_KEYS = ("toy", "seed", "target", "pd", "log_every")
_PD_KEYS = ("steps", "batch_size")
_TARGET_TYPES = ("tms",)


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

    from pd_train.targets.toys import toy_config

    toy = toy_config(name)
    return {
        "toy": name,
        "seed": 0,
        "target": {"type": "tms", **attrs.asdict(toy.target)},
        "pd": {"steps": toy.pd.steps, "batch_size": toy.pd.batch_size},
        "log_every": max(1, toy.pd.steps // 20),
    }


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def load_toy_config(value: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The resolved toy config (defaults of the toy, the file's values, then ``--set``
    overrides); ConfigError naming each bad field (``target.type``, ``pd.lr``, ...)."""
    import yaml

    from pd_train._config_io import ConfigError, apply_overrides

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
    for key in ("seed",):
        seed = raw[key]
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            problems.append((key, f"got {seed!r}; must be an int >= 0"))
    if not _positive(raw["log_every"]):
        problems.append(("log_every", f"got {raw['log_every']!r}; must be an int >= 1"))
    pd = raw["pd"]
    if not isinstance(pd, dict):
        problems.append(("pd", f"got {pd!r}; must be a mapping with {', '.join(_PD_KEYS)}"))
    else:
        for key, val in pd.items():
            if key not in _PD_KEYS:
                problems.append(
                    (f"pd.{key}", f"not settable for a toy; a toy's pd has {', '.join(_PD_KEYS)}")
                )
            elif not _positive(val):
                problems.append((f"pd.{key}", f"got {val!r}; must be an int >= 1"))
    target, shipped = raw["target"], _defaults(name)["target"]
    if not isinstance(target, dict):
        problems.append(("target", f"got {target!r}; must be a mapping"))
    else:
        kind = target.get("type")
        if kind not in _TARGET_TYPES:
            allowed = ", ".join(_TARGET_TYPES)
            problems.append(("target.type", f"unknown target kind {kind!r}; have {allowed}"))
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
    return raw


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
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path.cwd() / "outputs" / f"{name}-{stamp}"
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = Path.cwd() / "outputs" / f"{name}-{stamp}-{n}"
    return run_dir


def run_toy_cli(
    value: str,
    overrides: Sequence[str] = (),
    *,
    run_dir: Path | None = None,
    max_steps: int | None = None,
) -> tuple[Path, str]:
    """Decompose a toy into ``run_dir`` (refused if it already holds files); returns the run dir
    and the summary text."""
    import attrs
    import jax
    import numpy as np
    import yaml

    from pd_train._config_io import ConfigError
    from pd_train.targets.tms import TMSTarget
    from pd_train.targets.toys import (
        decompose,
        ground_truth_metrics,
        one_hot_ci,
        plot_permuted_ci,
        plot_tms_directions,
        toy_config,
        toy_weights,
    )

    raw = load_toy_config(value, overrides)
    name = raw["toy"]
    run_dir = run_dir or _new_run_dir(name)
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ConfigError(
            [("--run-dir", f"{run_dir} exists and is not empty; toy runs are not resumed")]
        )
    toy = toy_config(name)
    pd = attrs.evolve(toy.pd, **raw["pd"])
    target = TMSTarget(config=toy.target)
    weights = toy_weights(name)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    n_steps = pd.steps if max_steps is None else min(max_steps, pd.steps)
    every = raw["log_every"]
    start = time.perf_counter()
    with (run_dir / "metrics.jsonl").open("w") as log:

        def on_step(i: int, metrics: dict[str, Any]) -> None:
            if i % every == 0 or i == n_steps - 1:
                record = {"step": i, **_flat(jax.device_get(metrics))}
                log.write(json.dumps(record) + "\n")
                log.flush()

        trainer, state = decompose(
            target,
            weights,
            pd,
            seed=raw["seed"],
            feature_probability=toy.feature_probability,
            mode=toy.mode,
            on_step=on_step,
            max_steps=n_steps,
        )
        jax.block_until_ready(state.params)
        elapsed = time.perf_counter() - start
        ci = one_hot_ci(trainer, state.params, weights, toy.target.n_features)
        gt = ground_truth_metrics(ci)
        eval_record = {"step": n_steps - 1, "eval": True, **gt}
        log.write(json.dumps(eval_record) + "\n")
    plots = run_dir / "plots"
    plot_permuted_ci(ci, plots / f"{name}_permuted_ci.png")
    if toy.target.n_hidden == 2:
        comps = jax.device_get(state.params["components"])
        plot_tms_directions(weights, comps, ci, plots / f"{name}_directions.png")
    summary = {
        "toy": name,
        "steps": n_steps,
        "time_s": elapsed,
        "steps_per_s": n_steps / elapsed,
        **gt,
        "one_hot_ci": {site: np.round(v, 4).tolist() for site, v in ci.items()},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"{name}: {n_steps} steps in {elapsed:.1f} s ({n_steps / elapsed:.1f} steps/s)"]
    for site in ci:
        recovered = "yes" if gt[f"gt/recovered/{site}"] else "no"
        lines.append(
            f"  {site}: alive {gt[f'gt/alive/{site}']:.0f}, identity-CI error "
            f"{gt[f'gt/identity_ci_error/{site}']:.3f}, recovered {recovered}"
        )
    lines.append(f"run dir: {run_dir}")
    text = "\n".join(lines) + "\n"
    (run_dir / "summary.txt").write_text(text)
    return run_dir, text


def pretrain_toy_cli(
    value: str, *, out: Path | None = None, check: bool = False
) -> tuple[str, bool]:
    """Pretrain the toy ``builtin:<name>`` (deterministic from its pretrain seed); write its
    weights to ``out`` (default: the shipped file; ``check``: write nothing) and say whether
    they equal the shipped ones. Returns the message and whether they are identical (True when
    nothing is shipped yet)."""
    import numpy as np

    from pd_train._config_io import ConfigError
    from pd_train.targets.toys import (
        _weights_path,
        load_weights,
        pretrain_toy,
        save_weights,
        toy_config,
    )

    if not value.startswith("builtin:"):
        raise ConfigError([("config", f"got {value!r}; pretrain takes builtin:<toy>")])
    name = value.removeprefix("builtin:")
    if name not in _toy_names():
        have = ", ".join(f"builtin:{n}" for n in _toy_names())
        raise ConfigError([("config", f"no built-in toy {name!r}; have {have}")])
    toy = toy_config(name)
    shipped_path = _weights_path(name)
    shipped = load_weights(shipped_path) if shipped_path.exists() else None
    if check and shipped is None:
        raise ConfigError([("--check", f"no shipped weights for {name} at {shipped_path}")])
    params, loss = pretrain_toy(toy)
    text = f"{name}: final loss {loss:.6g}"
    same = True
    if shipped is not None:
        new = {"b_final": np.asarray(params["b_final"])}
        new.update({f"layers.{k}": np.asarray(v) for k, v in params["layers"].items()})
        old = {"b_final": shipped["b_final"]}
        old.update({f"layers.{k}": v for k, v in shipped["layers"].items()})
        same = new.keys() == old.keys() and all(np.array_equal(new[k], old[k]) for k in old)
        verdict = "identical to" if same else "DIFFERENT from"
        text += f"; {verdict} the shipped weights ({shipped_path.name})"
    if not check:
        target = out or shipped_path
        save_weights(params, target)
        text += f"; wrote {target}"
    return text, same
