"""A toy config schema standing in for pd-train's: attrs classes, one cattrs converter that
forbids unknown keys, and checks across fields. Seven sites per decomposed layer."""

from __future__ import annotations

import copy
from typing import Any

import attrs
import cattrs
import pytest

SITES_PER_LAYER = 7


@attrs.frozen(kw_only=True)
class Model:
    n_layers: int
    width: int


@attrs.frozen(kw_only=True)
class Decomposition:
    layers: list[int]


@attrs.frozen(kw_only=True)
class Recon:
    sites_per_chunk: int
    loop: str = attrs.field(validator=attrs.validators.in_(("scan", "unroll")))


@attrs.frozen(kw_only=True)
class Init:
    mode: str = attrs.field(validator=attrs.validators.in_(("stacked", "per_array")))


@attrs.frozen(kw_only=True)
class Runtime:
    compiler_options: dict[str, int]
    cache_dir: str | None
    steps: int


@attrs.frozen(kw_only=True)
class ToyConfig:
    model: Model
    decomposition: Decomposition
    recon: Recon
    init: Init
    runtime: Runtime


_converter = cattrs.Converter(forbid_extra_keys=True)


class ToyConfigError(ValueError):
    pass


def toy_validate(raw: dict[str, Any]) -> ToyConfig:
    try:
        config = _converter.structure(raw, ToyConfig)
    except Exception as e:
        msg = "; ".join(cattrs.transform_error(e))
        raise ToyConfigError(msg) from e
    bad = [layer for layer in config.decomposition.layers if not 0 <= layer < config.model.n_layers]
    if bad:
        msg = f"decomposition.layers: {bad} outside 0..{config.model.n_layers - 1}"
        raise ToyConfigError(msg)
    sites = SITES_PER_LAYER * len(config.decomposition.layers)
    if config.recon.sites_per_chunk <= 0 or sites % config.recon.sites_per_chunk:
        msg = (
            f"recon.sites_per_chunk = {config.recon.sites_per_chunk} does not divide the "
            f"{sites} decomposed sites"
        )
        raise ToyConfigError(msg)
    return config


TOY_BASE: dict[str, Any] = {
    "model": {"n_layers": 4, "width": 16},
    "decomposition": {"layers": [0, 1, 2, 3]},
    "recon": {"sites_per_chunk": 14, "loop": "scan"},  # 28 sites in 2 chunks
    "init": {"mode": "stacked"},
    "runtime": {"compiler_options": {}, "cache_dir": None, "steps": 3},
}


def layers_override(n: int) -> dict[str, Any]:
    """Decompose layers 0..n-1 and keep two chunks (what pd-train's builder would do)."""
    return {
        "decomposition.layers": list(range(n)),
        "recon.sites_per_chunk": SITES_PER_LAYER * n // 2,
    }


def chunks_override(k: int) -> list[str]:
    return [f"recon.sites_per_chunk={SITES_PER_LAYER * 4 // k}"]


@attrs.frozen
class Toy:
    base: dict[str, Any]
    validate: Any
    layers_override: Any
    chunks_override: Any


@pytest.fixture
def toy() -> Toy:
    """The toy schema's base config, validator and override builders (test files cannot
    import conftest under --import-mode=importlib)."""
    return Toy(copy.deepcopy(TOY_BASE), toy_validate, layers_override, chunks_override)
