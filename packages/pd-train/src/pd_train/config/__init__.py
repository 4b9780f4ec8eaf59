"""The run config's schema, one module per YAML section, and the converter that reads it.

- :mod:`pd_train.config.run`: the whole config (``target``, ``data``, ``cadence``, ``tracking``,
  ``runtime``, ``launch``, ``pd``): loading, ``--set`` overrides, paths, ``to_yaml``;
- :mod:`pd_train.config.pd`: the ``pd:`` section (loss terms, CI functions, optimizers) and the
  ``runtime:`` section's classes;
- :mod:`pd_train.config.launch`: the ``launch:`` section (SLURM);
- :mod:`pd_train.config.io`: the one cattrs converter, YAML, overrides, :class:`ConfigError`;
- :mod:`pd_train.config.hyperparameters`: which fields are structural and which are values;
- :mod:`pd_train.config.reference`: docs/config-reference.md, generated from the schema.
"""
