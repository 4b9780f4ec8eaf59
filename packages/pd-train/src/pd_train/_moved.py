"""The module paths pd-train had before its relayout (issue 26) still import, and warn once.

``import pd_train.run_config`` (or ``from pd_train.run_config import Config``) gives the module
``pd_train.config.run`` itself, the same object under both names (so patching one patches the
other), with one :class:`DeprecationWarning` per old name, at its first import. The names
``pd_train.config.X`` of the old ``config.py`` (now :mod:`pd_train.config.pd`) are forwarded by
``pd_train.config.__getattr__`` the same way. Installed by ``pd_train/__init__.py``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

__all__ = ["MOVED", "install"]

#: old module → the module that holds its code now
MOVED: dict[str, str] = {
    "pd_train._config_io": "pd_train.config.io",
    "pd_train.run_config": "pd_train.config.run",
    "pd_train.launch_config": "pd_train.config.launch",
    "pd_train.hyperparameters": "pd_train.config.hyperparameters",
    "pd_train.configs.reference": "pd_train.config.reference",
    "pd_train.analyze_cli": "pd_train.cli.analyze",
    "pd_train.launch_cli": "pd_train.cli.submit",
    "pd_train.probe_cli": "pd_train.cli.probe",
    "pd_train.tokenize_cli": "pd_train.cli.tokenize",
    "pd_train.toy_cli": "pd_train.cli.toy",
    "pd_train.compile": "pd_train.run.compile",
    "pd_train.sweep": "pd_train.cli.sweep",
    "pd_train.checkpoints": "pd_train.run.checkpoints",
    "pd_train.data": "pd_train.run.data",
    "pd_train.distributed": "pd_train.run.distributed",
    "pd_train.runtime_env": "pd_train.process_env",
    "pd_train.tokenizer": "pd_train.models.tokenizer",
    "pd_train.run._hooks": "pd_train.run.hooks",
    "pd_train.run._loop": "pd_train.run.loop",
    "pd_train.run._signals": "pd_train.run.signals",
    "pd_train.outputs._records": "pd_train.outputs.records",
    "pd_train.outputs._plots": "pd_train.outputs.plots",
    "pd_train.outputs._summary": "pd_train.outputs.summary",
    "pd_train.models._preflight": "pd_train.models.preflight",
    "pd_train.step": "pd_train.train",
    "pd_train.recon": "pd_train.losses.recon",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the new module's object (nothing is executed twice)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # stacklevel 2: the warnings module skips importlib's own frames, so this names the
        # line that imported the old name.
        msg = f"{spec.name} moved to {self.new}; import it from there"
        warnings.warn(msg, DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set it to the alias's spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put the finder of the old names on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
