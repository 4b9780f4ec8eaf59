"""The ``tracking:`` section: which experiment tracker ``pd-train run`` mirrors its
``metrics.jsonl`` into (Weights & Biases only), checked field by field.

::

    tracking:
      wandb: {project: pd, entity: my-team, mode: offline, tags: [tiny],
              figures: every_eval, checkpoint: final}

The section stays a plain mapping in :class:`pd_train.config.run.Config` (``tracking:``);
:func:`parse_tracking` turns it into a :class:`WandbConfig` (``load_config`` calls it, so a bad
section is refused at load time). The tracker itself is :mod:`pd_train.analysis.tracking`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pd_train.config.io import ConfigError

__all__ = ["CHECKPOINT", "FIGURES", "MODES", "WandbConfig", "parse_tracking"]

MODES = ("online", "offline", "disabled")
FIGURES = ("every_eval", "final", "none")
CHECKPOINT = ("final", "none")


@dataclass(frozen=True)
class WandbConfig:
    project: str
    entity: str | None = None
    mode: str = "online"
    tags: tuple[str, ...] = ()
    #: Eval figures as images: at every eval, the last eval's only, or none.
    figures: str = "every_eval"
    #: The decomposition (run dir and latest checkpoint) as an artifact at the end, or not.
    checkpoint: str = "final"


def parse_tracking(raw: Any, *, where: str = "tracking") -> WandbConfig:
    """A :class:`WandbConfig` from ``{"wandb": {project, entity, mode, tags}}``; every problem
    raises ConfigError together, each naming its field path (``tracking.wandb.mode``)."""
    problems: list[tuple[str, str]] = []
    if not isinstance(raw, Mapping):
        raise ConfigError([(where, f"got {raw!r}; must be a mapping with a 'wandb' section")])
    unknown = sorted(set(raw) - {"wandb"})
    problems += [
        (
            f"{where}.{k}",
            "unknown tracker; pd-train mirrors metrics.jsonl into Weights & Biases only "
            "(tracking: {wandb: {project: NAME}}); another tracker can read RUN_DIR/metrics.jsonl",
        )
        for k in unknown
    ]
    if unknown and "wandb" not in raw:
        raise ConfigError(problems)  # no W&B section was meant: nothing to say about one
    section = raw.get("wandb")
    path = f"{where}.wandb"
    if not isinstance(section, Mapping):
        problems.append(
            (path, f"got {section!r}; must be a mapping with project (and entity, mode, ...)")
        )
        raise ConfigError(problems)
    allowed = ("project", "entity", "mode", "tags", "figures", "checkpoint")
    problems += [
        (f"{path}.{k}", f"unknown key; allowed: {', '.join(allowed)}")
        for k in sorted(set(section) - set(allowed))
    ]
    project = section.get("project")
    if not isinstance(project, str) or not project.strip():
        problems.append((f"{path}.project", f"got {project!r}; must be a non-empty string"))
    entity = section.get("entity")
    if entity is not None and (not isinstance(entity, str) or not entity.strip()):
        problems.append((f"{path}.entity", f"got {entity!r}; must be a non-empty string or null"))
    mode = section.get("mode", "online")
    if mode not in MODES:
        problems.append((f"{path}.mode", f"got {mode!r}; must be one of {', '.join(MODES)}"))
    tags = section.get("tags", [])
    if not isinstance(tags, list | tuple) or not all(isinstance(t, str) and t for t in tags):
        problems.append((f"{path}.tags", f"got {tags!r}; must be a list of non-empty strings"))
    figures = section.get("figures", "every_eval")
    if figures not in FIGURES:
        problems.append(
            (f"{path}.figures", f"got {figures!r}; must be one of {', '.join(FIGURES)}")
        )
    checkpoint = section.get("checkpoint", "final")
    if checkpoint not in CHECKPOINT:
        problems.append(
            (f"{path}.checkpoint", f"got {checkpoint!r}; must be one of {', '.join(CHECKPOINT)}")
        )
    if problems:
        raise ConfigError(problems)
    return WandbConfig(
        project=str(project),
        entity=entity,
        mode=mode,
        tags=tuple(tags),
        figures=figures,
        checkpoint=checkpoint,
    )
