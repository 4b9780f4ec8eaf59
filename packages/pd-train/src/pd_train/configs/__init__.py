"""The configs that ship with pd-train: the repository's ``configs/`` directory.

The wheel carries them under ``pd_train/configs/`` (hatch force-include); in a source checkout
they are read from the repository's ``configs/``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["builtin_config", "builtin_configs", "builtin_toys"]


def _directories() -> list[Path]:
    here = Path(str(resources.files(__name__)))
    return [here, Path(__file__).resolve().parents[5] / "configs"]


def builtin_configs() -> dict[str, Path]:
    """Name (file stem) → path of every shipped config."""
    for directory in _directories():
        found = {p.stem: p for p in sorted(directory.glob("*.yaml"))}
        if found:
            return found
    return {}


def builtin_toys() -> list[str]:
    """The built-in toy targets' names (``tms_5_2``, ...): ``builtin:<toy>`` runs one."""
    from pd_train.targets.toys import TOYS

    return sorted(TOYS)


def builtin_config(name: str) -> Path:
    from pd_train.config.io import ConfigError

    configs = builtin_configs()
    if name in configs:  # answered without importing the toys (no toy shares its name)
        return configs[name]
    if name in builtin_toys():
        msg = (
            f"builtin:{name} is a toy; this command takes decomposition configs (toys run with "
            f"pd-train run, compile, config and pretrain builtin:{name})"
        )
        raise ConfigError([("config", msg)])
    allowed = ", ".join(f"builtin:{n}" for n in configs) or "none found"
    toys = ", ".join(f"builtin:{n}" for n in builtin_toys())
    msg = f"no builtin config {name!r}; configs: {allowed}; toys: {toys}"
    raise ConfigError([("config", msg)])
