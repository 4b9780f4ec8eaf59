"""Grids: arms derived from one base config, each config validated when the grid is built."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from pd_probe._arm import Arm
from pd_probe._errors import GridError, OverrideError
from pd_probe._overrides import OverridesLike, apply_overrides, to_overrides

Validate = Callable[[dict[str, Any]], object]
"""The caller's schema: takes a raw config, raises (naming the field path) if it is invalid."""


@attrs.frozen(kw_only=True)
class Grid:
    """Arms and their validated raw configs.

    Attributes:
      base: the base raw config every arm derives from.
      arms: the arms, baseline first.
      configs: arm name → its raw config (base with the arm's overrides), already validated.
      aliases: arm name → an earlier arm with the same config, environment and repeats; the
        runner runs only the earlier one and the report shows its numbers for both.
      baseline: the name of the arm ratios are taken against.
      free_form: paths of free-form mapping fields (see :func:`apply_overrides`).
      validate: the schema check used to build the grid (reused for per-run overrides).
    """

    base: dict[str, Any]
    arms: tuple[Arm, ...]
    configs: dict[str, dict[str, Any]]
    aliases: dict[str, str] = attrs.field(factory=dict)
    baseline: str
    free_form: tuple[str, ...] = ()
    validate: Validate | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arms)

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        msg = f"no arm named {name!r}; the grid has: {', '.join(self.names)}"
        raise GridError(msg)

    def select(self, names: Iterable[str] | None = None, *, include_gpu_only: bool = True) -> Grid:
        """A grid with only ``names`` (all if None), always keeping the baseline and the targets
        of kept aliases; ``include_gpu_only=False`` drops GPU-only arms (a CPU run)."""
        wanted = set(self.names if names is None else names)
        unknown = sorted(wanted - set(self.names))
        if unknown:
            msg = f"unknown arm(s) {', '.join(unknown)}; the grid has: {', '.join(self.names)}"
            raise GridError(msg)
        if not include_gpu_only:
            wanted = {n for n in wanted if not self.arm(n).gpu_only}
        wanted.add(self.baseline)
        wanted |= {self.aliases[n] for n in wanted if n in self.aliases}
        arms = tuple(a for a in self.arms if a.name in wanted)
        return attrs.evolve(
            self,
            arms=arms,
            configs={a.name: self.configs[a.name] for a in arms},
            aliases={k: v for k, v in self.aliases.items() if k in wanted},
        )

    def config_with(self, name: str, overrides: OverridesLike) -> dict[str, Any]:
        """The config of arm ``name`` with extra ``overrides`` (e.g. its cache dir), validated."""
        self.arm(name)
        return _build(name, self.configs[name], overrides, self.validate, self.free_form)

    def to_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "arms": [a.to_dict() for a in self.arms],
            "aliases": dict(self.aliases),
            "free_form": list(self.free_form),
        }


def _build(
    name: str,
    base: Mapping[str, Any],
    overrides: OverridesLike,
    validate: Validate | None,
    free_form: Sequence[str],
) -> dict[str, Any]:
    try:
        config = apply_overrides(base, overrides, free_form=free_form)
    except OverrideError as e:
        msg = f"arm {name!r}: {e}"
        raise GridError(msg) from e
    if validate is not None:
        try:
            validate(config)
        except Exception as e:
            msg = f"arm {name!r}: config does not validate: {type(e).__name__}: {e}"
            raise GridError(msg) from e
    return config


def _identity(arm: Arm, config: Mapping[str, Any]) -> str:
    """What makes two arms the same run: config, environment, repeats, GPU-only flag."""
    payload = [config, arm.env, arm.repeats, arm.gpu_only]
    return json.dumps(payload, sort_keys=True, default=repr)


def make_grid(
    base: Mapping[str, Any],
    arms: Iterable[Arm],
    *,
    validate: Validate | None,
    baseline: str = "baseline",
    free_form: Iterable[str] = (),
    dedupe: bool = True,
) -> Grid:
    """Build a :class:`Grid` from explicit arms: apply each arm's overrides to ``base`` and pass
    the result to ``validate``; any failure raises :class:`GridError` naming the arm.

    With ``dedupe``, an arm identical to an earlier one (same config, env, repeats) becomes an
    alias of it: it is not run twice, but it keeps its row (and metadata) in the report.
    """
    arms = tuple(arms)
    free_form = tuple(free_form)
    seen_names: set[str] = set()
    for a in arms:
        if a.name in seen_names:
            msg = f"arm name {a.name!r} appears twice; arm names must be unique"
            raise GridError(msg)
        seen_names.add(a.name)
    if baseline not in seen_names:
        msg = f"baseline arm {baseline!r} is not among the arms: {', '.join(seen_names)}"
        raise GridError(msg)
    # The baseline goes first so that aliases point at it rather than at a later duplicate.
    arms = tuple(sorted(arms, key=lambda a: a.name != baseline))
    configs: dict[str, dict[str, Any]] = {}
    aliases: dict[str, str] = {}
    first_by_identity: dict[str, str] = {}
    for a in arms:
        configs[a.name] = _build(a.name, base, a.overrides, validate, free_form)
        identity = _identity(a, configs[a.name])
        if dedupe and identity in first_by_identity:
            aliases[a.name] = first_by_identity[identity]
        else:
            first_by_identity.setdefault(identity, a.name)
    return Grid(
        base=dict(base),
        arms=arms,
        configs=configs,
        aliases=aliases,
        baseline=baseline,
        free_form=free_form,
        validate=validate,
    )


def autotune_arms(levels: Iterable[int] = (0, 2, 4)) -> tuple[Arm, ...]:
    """GPU-only arms setting ``--xla_gpu_autotune_level`` through XLA_FLAGS.

    A caller whose schema has a compiler-options field may pass its own arms instead.
    """
    return tuple(
        Arm(
            name=f"autotune_{level}",
            env={"XLA_FLAGS": f"--xla_gpu_autotune_level={level}"},
            meta={"autotune_level": level},
            gpu_only=True,
            description=f"XLA GPU autotune level {level}",
        )
        for level in levels
    )


def cache_arms() -> tuple[Arm, ...]:
    """Persistent compilation cache off, and on with a second (warm) run in the same cache.

    Set through JAX_ENABLE_COMPILATION_CACHE; a caller whose program sets the cache from its
    config must pass arms overriding that config field instead.
    """
    return (
        Arm(
            name="cache_off",
            env={"JAX_ENABLE_COMPILATION_CACHE": "false"},
            meta={"cache": "off"},
            description="persistent compilation cache disabled",
        ),
        Arm(
            name="cache_on",
            env={"JAX_ENABLE_COMPILATION_CACHE": "true"},
            meta={"cache": "on"},
            repeats=2,
            description="persistent cache on: run 1 cold, run 2 warm",
        ),
    )


def _builder_arm(
    name: str, builder: Callable[[int], OverridesLike], n: int, meta: dict[str, Any]
) -> Arm:
    try:
        overrides = to_overrides(builder(n))
    except Exception as e:
        msg = f"arm {name!r}: its override builder failed for {n}: {type(e).__name__}: {e}"
        raise GridError(msg) from e
    return Arm(name=name, overrides=overrides, meta=meta)


def standard_grid(
    base: Mapping[str, Any],
    *,
    validate: Validate | None,
    layers_override: Callable[[int], OverridesLike] | None = None,
    chunks_override: Callable[[int], OverridesLike] | None = None,
    layer_slices: Sequence[int] = (2, 8, 32),
    chunk_counts: Sequence[int] = (1, 2, 4, 8),
    chunk_loop_arms: Sequence[Arm] = (),
    init_arms: Sequence[Arm] = (),
    autotune: Sequence[Arm] | None = None,
    cache: Sequence[Arm] | None = None,
    extra_arms: Sequence[Arm] = (),
    baseline_meta: Mapping[str, Any] | None = None,
    free_form: Iterable[str] = (),
    dedupe: bool = True,
) -> Grid:
    """The standard probe grid over ``base``.

    pd-probe knows no config fields: the caller says how to express each knob in its schema.

    Args:
      base: the base raw config (fully populated, defaults filled in).
      validate: the caller's schema check; every arm's config passes through it here.
      layers_override: ``n → overrides`` decomposing layers 0..n-1; arms ``layers_{n}`` for n in
        ``layer_slices`` (meta ``layers=n``). None: no layer arms.
      chunks_override: ``k → overrides`` splitting the recon term into k chunks; arms
        ``chunks_{k}`` for k in ``chunk_counts`` (meta ``chunks=k``). None: no chunk arms.
      chunk_loop_arms: e.g. scan vs unroll arms (give them one ``equivalence`` label).
      init_arms: e.g. stacked vs per-array init arms.
      autotune: GPU-only autotune arms; None: :func:`autotune_arms` (XLA_FLAGS levels 0/2/4).
      cache: persistent cache arms; None: :func:`cache_arms` (off; on with a warm re-run).
      extra_arms: more arms, e.g. from the command line (:func:`parse_arm`).
      baseline_meta: metadata of the baseline, e.g. ``{"layers": 32, "chunks": 4}``, so that it
        sits on the layer and chunk plots.
      free_form: free-form mapping fields (see :func:`apply_overrides`).
      dedupe: alias arms identical to an earlier one instead of running them again.
    """
    arms = [Arm(name="baseline", meta=dict(baseline_meta or {}), description="the base config")]
    if layers_override is not None:
        arms += [
            _builder_arm(f"layers_{n}", layers_override, n, {"layers": n}) for n in layer_slices
        ]
    if chunks_override is not None:
        arms += [
            _builder_arm(f"chunks_{k}", chunks_override, k, {"chunks": k}) for k in chunk_counts
        ]
    arms += [*chunk_loop_arms, *init_arms]
    arms += autotune_arms() if autotune is None else autotune
    arms += cache_arms() if cache is None else cache
    arms += extra_arms
    return make_grid(
        base, arms, validate=validate, baseline="baseline", free_form=free_form, dedupe=dedupe
    )
