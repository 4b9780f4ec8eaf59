"""A warm launch's fixed cost (docs/compile-cache.md, "The warm launch's floor"): what
`pd-train run` pays before step 0 when every program is cached — no toy module imported for a
shipped config, no ml_dtypes whose import alone took half of `import jax`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def _python(code: str) -> str:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return out.stdout.strip()


def test_a_shipped_config_resolves_without_importing_the_toys() -> None:
    """`builtin:default` used to import pd_train.targets.toys (its resid_mlp, tms, optax) only to
    check that `default` is not a toy's name."""
    code = (
        "import sys\n"
        "from pd_train.cli import config_source\n"
        "path = config_source('builtin:default')\n"
        "assert path.name == 'default.yaml', path\n"
        "print(sorted(m for m in ('pd_train.targets.toys', 'pd_train.targets.resid_mlp')"
        " if m in sys.modules))\n"
    )
    assert _python(code) == "[]"


def test_a_toy_or_an_unknown_name_is_still_refused_with_the_toys_listed() -> None:
    from pd_train.config.io import ConfigError
    from pd_train.configs import builtin_config

    with pytest.raises(ConfigError, match=r"builtin:tms_5_2 is a toy"):
        builtin_config("tms_5_2")
    with pytest.raises(ConfigError, match=r"no builtin config 'nope'; configs: .*toys: .*tms_5_2"):
        builtin_config("nope")


def test_ml_dtypes_is_a_version_whose_import_is_not_quadratic() -> None:
    """ml_dtypes 0.7.0 (beside numpy 2.4) spent ~0.57 CPU s registering its ufunc loops at import
    (0.6.0: 0.006 s): half of `import jax`, ~13 % of a warm launch to step 0. pd-train pins
    ``ml_dtypes<0.7`` (packages/pd-train/pyproject.toml) until a release imports quickly again."""
    from importlib.metadata import version

    major, minor = (int(part) for part in version("ml_dtypes").split(".")[:2])
    assert (major, minor) < (0, 7), version("ml_dtypes")


def test_logging_compiles_does_not_change_a_programs_executable_cache_key() -> None:
    """A launch with ``JAX_LOG_COMPILES=1`` (to see what compiles) missed every program in pd's
    executable cache: the option was part of the key. JAX's persistent cache then served them,
    and a served program is not stored, so it paid their trace and lowering each time."""
    import jax

    from pd_train.process_env import program_key

    before = jax.config.jax_log_compiles
    try:
        jax.config.update("jax_log_compiles", False)
        quiet = program_key("train_step", "structural", source="s")
        jax.config.update("jax_log_compiles", True)
        logged = program_key("train_step", "structural", source="s")
        precision = jax.config.jax_default_matmul_precision
        jax.config.update("jax_default_matmul_precision", "highest")
        try:  # an option that changes what programs compute still changes the key
            assert program_key("train_step", "structural", source="s") != logged
        finally:
            jax.config.update("jax_default_matmul_precision", precision)
    finally:
        jax.config.update("jax_log_compiles", before)
    assert quiet == logged
