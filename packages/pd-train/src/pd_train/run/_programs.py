"""The train step (and the init, warm-up and eval programs) compiled ahead of time in a
background thread, loaded from the executable cache when it holds them."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from pd_train.process_env import ProgramPrefetch

log = logging.getLogger("pd_train")


class StepProgram:
    """The train step, compiled ahead of time in a background thread; call it like the step.

    :meth:`start` lowers and compiles the step on the run's abstract state, target, batch and
    key (:meth:`Trainer.lower_step`: the shardings the loop passes) while the main thread loads
    the target, initializes the state and runs the faithfulness warmup; JAX's persistent cache
    applies as before. With the compile cache on (in a single-process run) the compiled
    program is also kept in an :class:`pd_train.process_env.ExecutableCache` beside it, keyed
    by the structural fields of the step's configs, pd's source and the environment
    (:func:`trainer_program_key`), so that a later launch loads it without tracing or lowering,
    also one whose config differs in values only (they are the step's arguments). If building fails, or the program refuses the first step's
    arguments, the step falls back to the trainer's jit (compiled at its first call) with a
    warning.

    Started without a recorder (``recorder=None``: :func:`start_runtime`, before the run dir
    exists), the thread loads from the executable cache at once; a program that must be
    compiled waits for :meth:`attach` so that its trace, lower and compile are recorded in
    compile.json as before (:meth:`cancel` ends a thread whose run never started).

    The init and warm-up programs that a launch with this step loaded or stored are listed
    beside the step's entry (:meth:`remember_init_programs`,
    :meth:`pd_train.process_env.ExecutableCache.companions`); :meth:`start` loads those in a
    second thread at once, beside the step's load, so that :meth:`init_programs` finds them
    loaded (each still by its own key: a listed program whose key the launch does not ask for
    is never used).

    ``preload`` (``pd-train run``: :func:`pd_train._preload.begin`): the step and its init
    programs that the launch started loading from a hint before its set-up; taken instead of
    loading them again when the step's key (and cache) are the hint's, dropped otherwise; the
    hint is rewritten to name this step once the cache holds it.
    """

    def __init__(
        self,
        trainer: Any,
        *,
        target_dtype: Any,
        recorder: Any,
        cache_dir: Path | None,
        announce: bool = False,
        preload: Any = None,
    ) -> None:
        from pd_train.process_env import EXECUTABLES_DIR, ExecutableCache, source_digest

        self.trainer = trainer
        self.target_dtype = target_dtype
        self.recorder = recorder
        self.announce = announce
        self.cache_dir = cache_dir
        self._attached = threading.Event()
        if recorder is not None:
            self._attached.set()
        self._cancelled = False
        #: Seconds the executable-cache load took (a hit), else None.
        self.load_seconds: float | None = None
        self.cache = (
            ExecutableCache(cache_dir / EXECUTABLES_DIR)
            if cache_dir is not None and ExecutableCache.usable()
            else None
        )
        #: ``hit`` (loaded from the executable cache), ``hit (lowered)`` (lowered, then loaded
        #: by its lowered program's key: the source changed, the program did not), ``miss``
        #: (compiled and stored), ``miss, not stored`` (served by JAX's persistent cache, or the
        #: source changed meanwhile), ``off``.
        self.outcome = "off" if self.cache is None else "miss"
        self.compiled: Any = None
        self.error: BaseException | None = None
        self._thread: Any = None
        self._joined = False
        # The source as imported (read right after the imports): a file edited while this run
        # starts changes the digest read after the compile, and nothing is stored.
        self._source = source_digest() if self.cache is not None else ""
        #: ``{init or warm-up jit name: executable-cache outcome}`` (see :meth:`init_programs`).
        self.init_outcomes: dict[str, str] = {}
        self._lock = threading.Lock()
        self._inputs: list[Any] | None = None
        self._key: str | None = None
        #: ``(name, key)`` of each init and warm-up program asked for, in order.
        self._init_keys: list[tuple[str, str]] = []
        #: What the cache listed for this step (:meth:`remember_init_programs`).
        self._listed: list[tuple[str, str]] = []
        self._prefetch: ProgramPrefetch | None = None
        #: The init and warm-up jits whose programs the prefetch thread had loaded.
        self.init_prefetched: list[str] = []
        self._prefetch_started = threading.Event()
        self.preload = preload if self.cache is not None else None
        if preload is not None and self.preload is None:
            preload.claim("", None)  # no executable cache: nothing preloaded is used

    def _program_key(self, name: str) -> str:
        """:func:`trainer_program_key` of ``name``, the trainer's static inputs read once."""
        with self._lock:
            if self._inputs is None:
                self._inputs = program_inputs(self.trainer, self.target_dtype)
            inputs = self._inputs
        return trainer_program_key(
            name, self.trainer, self.target_dtype, self._source, inputs=inputs
        )

    def key(self) -> str:
        if self._key is None:
            self._key = self._program_key("train_step")
        return self._key

    def start(self) -> None:
        self._thread = threading.Thread(target=self._build, name="pd-train-step", daemon=True)
        self._thread.start()

    def _start_prefetch(self) -> None:
        """Load the init and warm-up programs listed beside the step's entry, in a thread."""
        assert self.cache is not None
        try:
            preloaded = self.preload.prefetch() if self.preload is not None else None
            if preloaded is not None:  # started with the launch, from its hint
                self._prefetch, self._listed = preloaded
                return
            self._listed = self.cache.companions(self.key())
            if self._listed:
                self._prefetch = ProgramPrefetch(self.cache, [key for _, key in self._listed])
        finally:
            self._prefetch_started.set()

    def wait_for_prefetch(self) -> None:
        """Wait until the listed init programs are loaded (tests: a run never waits)."""
        self._prefetch_started.wait()
        if self._prefetch is not None:
            self._prefetch.wait()

    def remember_init_programs(self) -> None:
        """List beside the step's entry the init and warm-up programs this launch asked for
        and the cache now holds (for the next launch's :meth:`start`); drop the prefetched
        programs nobody asked for."""
        if self._prefetch is not None:
            self._prefetch.finish()
        if self.cache is None or not self._init_keys:
            return
        held = [(name, key) for name, key in self._init_keys if self.cache.holds(key)]
        if held != self._listed:
            self.cache.set_companions(self.key(), held)

    def attach(self, recorder: Any) -> None:
        """Give a program started without a recorder the run's (entered) recorder: a compile
        waiting for it proceeds inside its ``train_step`` phase."""
        self.recorder = recorder
        self._attached.set()

    def cancel(self, *, wait: bool = False) -> None:
        """End a thread still waiting for :meth:`attach` (the run did not start); ``wait``: and
        join it (a load in progress finishes first: a process must not exit while XLA
        deserializes in a thread)."""
        if not self._attached.is_set():
            self._cancelled = True
            self._attached.set()
            if wait and self._thread is not None:
                self._thread.join()
        if wait and self._prefetch is not None:
            self._prefetch.finish()

    def _build(self) -> None:
        import sys

        try:
            key = self.key() if self.cache is not None else ""
            if self.cache is not None:
                preload = self.preload
                preloaded = preload is not None and preload.claim(key, self.cache_dir)
                # The init programs are needed first: their loads start beside the step's.
                self._start_prefetch()
                # A load needs no recorder: it starts at once, also before the run's.
                t0 = time.perf_counter()
                compiled = preload.step() if preload is not None and preloaded else None
                if compiled is None:
                    compiled = self.cache.load(key)
                self.compiled = self.trainer.bind_step_program(compiled)
                if self.compiled is not None:
                    self.outcome = "hit"
                    self.load_seconds = time.perf_counter() - t0
                    self._remember(key)
                    if self.announce:
                        print(
                            f"loading train_step (executable cache)… {self.load_seconds:.1f} s",
                            file=sys.stderr,
                            flush=True,
                        )
                    return
            self._attached.wait()
            if self._cancelled:
                return
            with self.recorder.phase("train_step"):
                self._compile(key)
            self._remember(key)
        except Exception as exc:  # reported at the first step, which falls back to the jit
            self.error = exc

    def _remember(self, key: str) -> None:
        """Name this step in the launch's hint (:meth:`pd_train._preload.Preload.remember`)."""
        if self.preload is not None and self.cache is not None:
            self.preload.remember(key, held=self.cache.holds(key))

    def _compile(self, key: str) -> None:
        import sys

        from pd_train.process_env import source_digest

        t0 = time.perf_counter()
        lowered = self.trainer.lower_step(
            batch_size=self.trainer.pd.batch_size,
            seq_len=self.trainer.seq_len,
            target_dtype=self.target_dtype,
        )
        if self.cache is None:
            self.compiled = lowered.compile()
        else:
            compiled, self.outcome = self.cache.obtain(
                key, lowered, unchanged=lambda: source_digest() == self._source
            )
            self.compiled = self.trainer.bind_step_program(compiled)
            if self.outcome == "hit (lowered)" and self.announce:
                print(
                    f"loading train_step (executable cache, by its lowered program: pd's source"
                    f" changed, the step did not)… {time.perf_counter() - t0:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )

    def init_programs(self) -> Any:
        """A :attr:`Trainer.programs` that announces each init and warm-up jit by the
        trainer's name for it (``init: init_params``, ``init: init_sources``: pd-init names
        both jits ``stacked``; :func:`pd_train.outputs.compile_label`) and, with this program's
        executable cache, serves them from it: each is loaded, or lowered and then loaded by its
        lowered key or compiled and stored (when compiled here, as the step), keyed by its name, the structural fields of the
        trainer's configs (:func:`trainer_program_key`), the source and its arguments' shapes,
        dtypes and shardings. Outcomes go to :attr:`init_outcomes`."""
        if self.cache is None:
            return lambda name, jit, args, kwargs: _Labelled(name, jit)
        from pd_train.process_env import ProgramOrJit, source_digest

        cache = self.cache

        def programs(name: str, jit: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            import jax

            from pd_train.outputs import compile_label

            signature = jax.tree.map(
                lambda a: (tuple(a.shape), str(a.dtype), repr(getattr(a, "sharding", None))),
                (args, kwargs),
            )
            key = self._program_key(f"{name} {jax.tree.structure((args, kwargs))} {signature}")
            self._init_keys.append((name, key))
            prefetch = self._prefetch
            compiled = prefetch.take(key) if prefetch is not None else None
            if compiled is not None:
                self.init_prefetched.append(name)
            else:
                compiled = cache.load(key)
            outcome = "hit"
            if compiled is None:
                with compile_label(name):
                    compiled, outcome = cache.obtain(
                        key,
                        jit.lower(*args, **kwargs),
                        unchanged=lambda: source_digest() == self._source,
                    )
            self.init_outcomes[name] = outcome
            return _Labelled(name, ProgramOrJit(name, compiled, jit))

        return programs

    def start_eval(self, evaluator: Any) -> None:
        """Start ``evaluator``'s ahead-of-time compile (:meth:`Evaluator.compile_ahead`), with
        this program's executable cache, source digest and recorder."""
        from pd_train.process_env import source_digest

        cache, key = self.cache, None
        if cache is not None:
            key = trainer_program_key("eval_metrics", self.trainer, self.target_dtype, self._source)
        evaluator.compile_ahead(
            target_dtype=self.target_dtype,
            cache=cache,
            key=key,
            unchanged=lambda: source_digest() == self._source,
            recorder=self.recorder,
        )

    def _join(self) -> None:
        self._thread.join()
        self._joined = True
        self.recorder.note(train_step_executable_cache=self.outcome)
        if self.preload is not None:
            self.recorder.note(train_step_preload=self.preload.outcome)
        if self.load_seconds is not None:
            # The hit's jit entry (no compiles); the load ran before the recorder was attached,
            # so its seconds are a note.
            with self.recorder.phase("train_step"):
                pass
            self.recorder.note(train_step_load_seconds=round(self.load_seconds, 3))
        if self.compiled is None:
            log.warning(
                "train step: the ahead-of-time compile failed (%s: %s); compiling at the first "
                "call instead",
                type(self.error).__name__,
                self.error,
            )

    def __call__(self, state: Any, target: Any, tokens: Any, key: Any) -> Any:
        if not self._joined:
            self._join()
            if self.compiled is not None:
                try:
                    return self.compiled(state, target, tokens, key)
                except (TypeError, ValueError) as exc:
                    # The loop's arguments drifted from the trainer's abstract layout (a bug);
                    # the jit still runs the step.
                    log.warning("train step: the compiled program refused the arguments: %s", exc)
                    self.compiled = None
        if self.compiled is None:
            return self.trainer.train_step(state, target, tokens, key)
        return self.compiled(state, target, tokens, key)


def trainer_program_key(
    name: str, trainer: Any, target_dtype: Any, source: str, *, inputs: list[Any] | None = None
) -> str:
    """The executable-cache key of the trainer's program ``name`` (``train_step``,
    ``eval_metrics``, an init jit with its arguments' signature): its static inputs and
    ``source``, a :func:`pd_train.process_env.source_digest`.

    The static inputs are :func:`program_inputs`: the *structural* fields of the trainer's
    configs (:func:`pd_train.config.hyperparameters.structural_leaves`), the target's architecture,
    T, compiler options, mesh and target dtype. Value fields (coefficients, lrs and their
    schedules, p, step counts, thresholds) are not part of it: every program takes them as an
    argument (:meth:`pd_train.train.Trainer.hyperparams`, :func:`pd_train.evaluate.eval_hyperparams`,
    the warm-up's lr and weight decay), so a program compiled under one value serves every
    other, called with this trainer's values (tests/pd_train/test_cache_key.py). ``inputs``:
    :func:`program_inputs` of the trainer, when the caller has read them already."""
    from pd_train.process_env import program_key

    if inputs is None:
        inputs = program_inputs(trainer, target_dtype)
    return program_key(name, *inputs, source=source)


def program_inputs(trainer: Any, target_dtype: Any) -> list[Any]:
    """What :func:`trainer_program_key` hashes of ``trainer`` besides the environment:
    ``[structural fields, hyperparameter signature, architecture, T, compiler options, mesh,
    target dtype]``. The hyperparameter signature (the trees of the step's and the eval's
    scalars, each leaf's type) follows from the structural fields; it is here so that a
    program never loads for arguments of another structure."""
    import json

    from pd_train.config import hyperparameters
    from pd_train.config.io import unstructure
    from pd_train.evaluate import eval_hyperparams

    t = trainer
    raw = {"pd": unstructure(t.pd), "runtime": unstructure(t.runtime)}
    structural = json.dumps(hyperparameters.structural_leaves(raw), sort_keys=True, default=repr)
    signature = [_types(t.hyperparams()), _types(eval_hyperparams(t))]
    mesh = None if t.mesh is None else (dict(t.mesh.shape), t.mesh.devices.tolist())
    return [
        structural, signature, t.model, t.seq_len, t.compiler_options, mesh, str(target_dtype)
    ]  # fmt: skip


def _types(tree: Any) -> str:
    """``tree`` with each leaf replaced by its type's name (``float``, ``int``)."""
    import jax

    return repr(jax.tree.map(lambda v: type(v).__name__, tree))


#: The loader of the listed init programs (moved to :mod:`pd_train.process_env`, where the
#: launch's preload uses it before this module is imported).
_Prefetch = ProgramPrefetch


class _Labelled:
    """``program`` called with its compiles announced as ``name``
    (:func:`pd_train.outputs.compile_label`)."""

    def __init__(self, name: str, program: Any) -> None:
        self.name, self.program = name, program

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pd_train.outputs import compile_label

        with compile_label(self.name):
            return self.program(*args, **kwargs)


def compile_announcer(terminal: Any = None) -> Any:
    """A pd-probe ``on_compile`` callback that writes one whole line per compile, its time
    beside its name, through ``terminal`` (a :class:`pd_train.outputs.Terminal`; default: one on
    stderr): ``compiled train_step in 12.3 s (cache miss)``; background compiles are announced
    when they start (:class:`pd_train.outputs.CompileLines`). Jits are named by their
    :func:`pd_train.outputs.compile_label` where one is set."""
    from pd_train.outputs import Terminal, labelled

    return labelled((terminal if terminal is not None else Terminal()).compile_announcer())
