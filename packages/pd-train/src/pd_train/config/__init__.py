"""The run config's schema, one module per YAML section, and the converter that reads it.

- :mod:`pd_train.config.run`: the whole config (``target``, ``data``, ``cadence``, ``tracking``,
  ``runtime``, ``launch``, ``pd``): loading, ``--set`` overrides, paths, ``to_yaml``;
- :mod:`pd_train.config.pd`: the ``pd:`` section (loss terms, CI functions, optimizers);
- :mod:`pd_train.config.runtime`: the ``runtime:`` section (dtype, remat, mesh, compile cache);
- :mod:`pd_train.config.launch`: the ``launch:`` section (SLURM);
- :mod:`pd_train.config.tracking`: the ``tracking:`` section (Weights & Biases);
- :mod:`pd_train.config.io`: the one cattrs converter, YAML, overrides, :class:`ConfigError`;
- :mod:`pd_train.config.hyperparameters`: which fields are structural and which are values;
- :mod:`pd_train.config.reference`: docs/config-reference.md, generated from the schema.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``pd_train.config.X`` for a name of the old ``config.py`` (now :mod:`pd_train.config.pd`):
    forwarded, with one :class:`DeprecationWarning` per name."""
    import importlib
    import warnings

    pd = importlib.import_module("pd_train.config.pd")
    if name.startswith("__") or not hasattr(pd, name):
        msg = f"module 'pd_train.config' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(pd, name)
    msg = f"pd_train.config.{name} moved to pd_train.config.pd.{name}; import it from there"
    warnings.warn(msg, DeprecationWarning, stacklevel=2)
    globals()[name] = value
    return value
