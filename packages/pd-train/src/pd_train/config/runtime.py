"""The ``runtime:`` section of a run config: compute dtype, remat, init path, mesh, compile
cache, compiler options and the launch environment (:mod:`pd_train.process_env` applies the
process-level ones)."""

from __future__ import annotations

from typing import Literal

import attrs

from pd_train.config.io import non_negative, one_of, positive

__all__ = [
    "CompileCacheConfig",
    "LaunchEnvConfig",
    "MeshConfig",
    "ProfileConfig",
    "RematConfig",
    "RuntimeConfig",
]


@attrs.frozen(kw_only=True)
class RematConfig:
    """Rematerialize (recompute in the backward) each layer of the recon forwards, and the CI
    function. ``recon``: each recon chunk and each layer of its forwards. ``recon_layers``: only
    each layer of the masked forwards (its residual is the residual stream alone; no per-layer
    stacks of activations): on a CPU, where the step is bound by per-op overhead and copies
    rather than FLOPs, the recompute is cheaper than storing (docs/findings.md section 10)."""

    recon: bool = False
    ci_fn: bool = False
    recon_layers: bool = False
    #: With ``recon`` or ``recon_layers``: a rematerialized layer of a masked forward whose
    #: live sites are known at trace time (a one-draw all-sites term such as ``subset_recon``,
    #: an unrolled chunk loop) keeps its drawn sources for its backward, one [B, T, C + 1] fp32
    #: buffer per live site (for ``subset_recon`` every site's: 4.75 GiB per device in the
    #: production recipe at 64 devices). False: the backward draws them again from their keys
    #: (the same values; a few more ops). docs/memory.md.
    save_sources: bool = True


@attrs.frozen(kw_only=True)
class RuntimeConfig:
    """Runtime bits the step reads. Masters stay fp32; ``compute_dtype`` is what activations,
    the target weights and cast V/U use in the forwards (reductions always fp32).

    ``init`` chooses how V/U and the CI params are drawn. ``stacked`` (default): pd-init's
    stacked jit, one output per kind and array (compile time flat in the number of sites).
    ``per_array``: pd-init's per-array reference jit, one output per site and array (the
    original system's structure, compile time linear in the sites), then one jit that stacks
    them per kind (init briefly holds the params twice). Both give bit-identical values; the
    switch exists so a probe can measure what the per-array structure costs to compile."""

    compute_dtype: Literal["float32", "bfloat16", "float16"] = attrs.field(
        default="float32", validator=one_of("float32", "bfloat16", "float16")
    )
    remat: RematConfig = attrs.field(factory=RematConfig)
    init: Literal["stacked", "per_array"] = attrs.field(
        default="stacked", validator=one_of("stacked", "per_array")
    )
    mesh: MeshConfig = attrs.field(factory=lambda: MeshConfig())
    compile_cache: CompileCacheConfig = attrs.field(factory=lambda: CompileCacheConfig())
    compiler_options: dict[str, str | int | float | bool] = attrs.field(factory=dict)
    launch_env: LaunchEnvConfig = attrs.field(factory=lambda: LaunchEnvConfig())


@attrs.frozen(kw_only=True)
class MeshConfig:
    """Axis sizes of the device mesh ``replicate × data × tensor``; ``data: null`` takes every
    device that replicate and tensor leave."""

    replicate: int = attrs.field(default=1, validator=positive())
    data: int | None = attrs.field(default=None, validator=positive())
    tensor: int = attrs.field(default=1, validator=positive())


def _allowed_xla_caches(_instance: object, attribute: attrs.Attribute, value: str | None) -> None:  # type: ignore[type-arg]
    from pd_train.config.io import FieldValueError
    from pd_train.process_env import REFUSED_XLA_CACHES

    if value in REFUSED_XLA_CACHES:
        raise FieldValueError(attribute.name, f"got {value!r}: {REFUSED_XLA_CACHES[value]}")


@attrs.frozen(kw_only=True)
class CompileCacheConfig:
    """JAX's persistent compilation cache, on by default. ``dir: null`` shares
    ``<output_dir>/.compile_cache`` across runs; a low ``min_compile_time_s`` keeps the init
    and step compiles. ``xla_caches`` sets ``jax_persistent_cache_enable_xla_caches``
    (``all`` is refused: it crashed at run time on GPU)."""

    enabled: bool = True
    dir: str | None = None
    min_compile_time_s: float = attrs.field(default=0.0, validator=non_negative())
    xla_caches: str | None = attrs.field(default=None, validator=_allowed_xla_caches)


@attrs.frozen(kw_only=True)
class ProfileConfig:
    """``hlo_dump``: process 0 dumps the step's HLO into ``RUN_DIR/hlo`` (and that run skips
    the compile cache so the dump is written). ``trace_start_step``: record a jax.profiler trace
    of ``trace_num_steps`` steps into ``RUN_DIR/trace``."""

    hlo_dump: bool = False
    trace_start_step: int | None = attrs.field(default=None, validator=non_negative())
    trace_num_steps: int = attrs.field(default=3, validator=positive())


@attrs.frozen(kw_only=True)
class LaunchEnvConfig:
    """Environment set before JAX starts (``XLA_FLAGS`` is appended to, not replaced)."""

    env: dict[str, str] = attrs.field(factory=dict)
    profile: ProfileConfig = attrs.field(factory=ProfileConfig)
