"""Step 2 of a run: the launch environment, ``jax.distributed``, the mesh and the trainer, with
every layout rule checked on abstract shapes; the compile cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pd_train.config.io import ConfigError
from pd_train.config.run import Config
from pd_train.run._prepare import Prepared, target_dtype
from pd_train.run._programs import StepProgram
from pd_train.run.distributed import Placement


@dataclass
class Runtime:
    """The started runtime: placement, mesh and the trainer, with its layout checked."""

    prepared: Prepared
    placement: Placement
    mesh: Any
    trainer: Any
    hlo_dump_dir: Path | None = None
    #: The train step, started loading or compiling by :func:`start_runtime` (``start_step``);
    #: :func:`execute` takes it over.
    step_program: StepProgram | None = None
    #: The layout checks' :meth:`Trainer.abstract_state` and :meth:`Trainer.abstract_target`
    #: (of the target's dtype), reused by :func:`execute` instead of traced again.
    abstract_state: Any = None
    abstract_target: Any = None


def start_runtime(
    prepared: Prepared,
    placement: Placement,
    *,
    run_dir: Path | None = None,
    start_step: bool = False,
    preload: Any = None,
) -> Runtime:
    """Launch environment, ``jax.distributed``, mesh, trainer; layout errors raise ConfigError.

    ``start_step`` (``pd-train run``): the train step starts loading from the executable cache
    (or waits to compile, see :class:`StepProgram`) in a thread as soon as the trainer exists,
    before the layout checks and the run dir's setup; :func:`execute` takes it over
    (``Runtime.step_program``). ``preload``: the launch's :class:`pd_train._preload.Preload`
    (``pd-train run``), handed to the step (:class:`StepProgram`)."""
    from pd_train.process_env import apply_launch_env
    from pd_train.run import distributed

    config = prepared.config
    launch = config.runtime.launch_env
    dump_dir = None
    if launch.profile.hlo_dump and placement.is_primary and run_dir is not None:
        dump_dir = run_dir / "hlo"
    apply_launch_env(launch.env, hlo_dump_dir=dump_dir)
    distributed.initialize(placement)

    import jax

    import pd_sharding
    from pd_train.train import Trainer

    problems: list[tuple[str, str]] = []
    mesh_config = config.runtime.mesh
    try:
        mesh = pd_sharding.make_mesh(
            replicate=mesh_config.replicate, data=mesh_config.data, tensor=mesh_config.tensor
        )
    except pd_sharding.MeshError as exc:
        raise ConfigError([("runtime.mesh", str(exc))]) from None
    batch = config.pd.batch_size
    data_size = mesh.shape["replicate"] * mesh.shape["data"]
    if batch % data_size:
        msg = (
            f"got {batch}; must be a multiple of the data axes' size {data_size} "
            f"(runtime.mesh replicate × data), e.g. {max(data_size, batch // data_size * data_size)}"
        )
        problems.append(("pd.batch_size", msg))
    if batch % jax.process_count():
        msg = f"got {batch}; must be a multiple of the process count {jax.process_count()}"
        problems.append(("pd.batch_size", msg))
    if problems:
        raise ConfigError(problems)
    try:
        trainer = Trainer(
            prepared.model,
            config.pd,
            config.runtime,
            mesh=mesh,
            compiler_options=config.runtime.compiler_options,
            seq_len=config.data.seq_len,
        )
    except pd_sharding.ShardingError as exc:
        raise ConfigError([("runtime.mesh", str(exc))]) from None
    step_program = None
    if start_step:
        # A warm launch's critical path is this load (~2 s for the default step): it starts
        # here, overlapping the layout checks, the run dir, the target, init and warm-up.
        step_program = StepProgram(
            trainer,
            target_dtype=target_dtype(config),
            recorder=None,
            cache_dir=configure_cache(config, disable=dump_dir is not None),
            announce=placement.is_primary,
            preload=preload,
        )
        step_program.start()
    try:
        # Every sharding rule runs on abstract shapes now, before anything is allocated.
        abstract_state = trainer.abstract_state()
        abstract_target = trainer.abstract_target(target_dtype(config))
    except pd_sharding.ShardingError as exc:
        if step_program is not None:
            step_program.cancel(wait=True)
        raise ConfigError([("runtime.mesh", str(exc))]) from None
    return Runtime(
        prepared=prepared,
        placement=placement,
        mesh=mesh,
        trainer=trainer,
        hlo_dump_dir=dump_dir,
        step_program=step_program,
        abstract_state=abstract_state,
        abstract_target=abstract_target,
    )


def compile_cache_directory(config: Config) -> Path | None:
    """The compile cache's directory for ``config`` (``runtime.compile_cache.dir``, else
    ``<output_dir>/.compile_cache``; relative to the working directory), None when it is off.
    :func:`pd_train._preload.cache_directory` reads the same from the unvalidated config."""
    cache = config.runtime.compile_cache
    if not cache.enabled:
        return None
    directory = (
        Path(cache.dir).expanduser()
        if cache.dir
        else Path(config.output_dir).expanduser() / ".compile_cache"
    )
    if not directory.is_absolute():
        directory = Path.cwd() / directory
    return directory


def configure_cache(config: Config, *, disable: bool = False) -> Path | None:
    from pd_train.process_env import configure_compile_cache

    cache = config.runtime.compile_cache
    directory = None if disable else compile_cache_directory(config)
    if directory is None:
        configure_compile_cache(None)
        return None
    configure_compile_cache(
        directory, min_compile_time_s=cache.min_compile_time_s, xla_caches=cache.xla_caches
    )
    return directory


# ---------------------------------------------------------------------------------------------
