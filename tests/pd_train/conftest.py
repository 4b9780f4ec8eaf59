"""Fixtures the pd_train tests share: the tiny trainer and the tiny run config.

Builders a test needs with arguments live in support modules (``_tiny.py``: the tiny Llama,
its `PDConfig` and trainer; ``_cli.py``: the tiny YAML run config and `pd-train` in a
subprocess; ``_recon.py``, ``_pgd.py``, ``_hf.py``, ...); no test module imports another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pd_train.train import Trainer

from ._cli import tiny_config
from ._tiny import _trainer


@pytest.fixture
def tiny_trainer() -> Trainer:
    """`_tiny._trainer()`: the tiny Llama under `_tiny._pd()`, built (and compiled) once."""
    return _trainer()


@pytest.fixture
def tiny_run_config(tmp_path: Path) -> dict[str, Any]:
    """`_cli.tiny_config` in this test's `tmp_path`, its compile cache in `tmp_path / "cache"`."""
    return tiny_config(tmp_path, tmp_path / "cache")
