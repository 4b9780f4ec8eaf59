"""What the train step needs from a config: plain frozen attrs classes, no I/O.

YAML loading, ``--set`` overrides and whole-config validation live elsewhere (one cattrs
converter, ``pd_train.config.io``); unions here are discriminated by a ``type`` field so that
converter can structure them. The checks the step itself relies on (patterns, chunk sizes) are
functions in :mod:`pd_train.decomposition` and :func:`check_pd_config`, raising
:class:`~pd_train.config.io.ConfigError` with field paths like ``pd.loss_metrics[1].coeff``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import attrs

from pd_train.config.io import (
    ConfigError,
    FieldValueError,
    in_half_open,
    in_range,
    non_negative,
    one_of,
    positive,
    tagged_family,
)
from pd_train.config.runtime import (
    CompileCacheConfig,
    LaunchEnvConfig,
    MeshConfig,
    ProfileConfig,
    RematConfig,
    RuntimeConfig,
)

__all__ = [
    "MLPCI",
    "CIConfig",
    "CIMaskedRecon",
    "ChunkwiseSubsetRecon",
    "ChunkwiseTransformerCI",
    "CompileCacheConfig",
    "ConfigError",
    "DecompositionTarget",
    "Faithfulness",
    "FaithfulnessWarmup",
    "FrequencyPenalty",
    "GlobalTransformerCI",
    "ImportanceMinimality",
    "LaunchEnvConfig",
    "LossMetric",
    "MeshConfig",
    "OptimizerConfig",
    "PDConfig",
    "PGDEval",
    "PGDOptimizer",
    "PGDRecon",
    "PersistentPGDRecon",
    "ProfileConfig",
    "ReconConfig",
    "RematConfig",
    "RuntimeConfig",
    "SharedMLPCI",
    "SmoothL0ImportanceMinimality",
    "StaticProbabilitySubsetRecon",
    "StochasticHiddenActsRecon",
    "StochasticRecon",
    "SubsetRecon",
    "UnmaskedRecon",
    "VectorMLPCI",
    "check_pd_config",
    "ci_config_problems",
    "register_ci_config",
    "register_loss_config",
]


def _positive_ints(_instance: object, attribute: attrs.Attribute, value: tuple[int, ...]) -> None:  # type: ignore[type-arg]
    from pd_train.config.io import FieldValueError

    if not value or not all(isinstance(v, int) and v > 0 for v in value):
        msg = f"got {list(value)!r}; must be a non-empty list of positive ints (the hidden widths)"
        raise FieldValueError(attribute.name, msg)


def _term_name(_instance: object, attribute: attrs.Attribute, value: str | None) -> None:  # type: ignore[type-arg]
    from pd_train.config.io import FieldValueError

    if value is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
        msg = (
            f"got {value!r}; must be a non-empty metric name of letters, digits, '_', '.', '-'"
            " (the term reports loss/<name>)"
        )
        raise FieldValueError(attribute.name, msg)
    if value in RESERVED_TERM_NAMES:
        msg = f"got {value!r}; loss/{value} is the sum of the terms: give the term another name"
        raise FieldValueError(attribute.name, msg)


#: Names a loss term may not take: its ``loss/<name>`` metric would be overwritten.
RESERVED_TERM_NAMES = frozenset({"total"})


#: A threshold on ci_lower, which lies in [0, 1]: ``ci_lower > t`` holds for no value at t >= 1.
_below_one = in_half_open(
    0.0,
    1.0,
    " (it is compared as ci_lower > threshold and ci_lower lies in [0, 1]: 1 or more counts "
    "every component off)",
)


#: The optional ``name`` of a ``pd.loss_metrics`` entry: it reports ``loss/{name}`` instead of
#: ``loss/{type}``; two entries of one type need distinct names.
def _name_field() -> Any:
    return attrs.field(default=None, validator=_term_name)


class CIConfig:
    """Base of the ``pd.ci`` configs: an open tagged union (``type`` picks the member). A CI
    type's config class subclasses it (attrs, frozen, kw_only, a ``type`` tag) and is registered
    with :func:`register_ci_config` (``pd_train.ci.register_ci_type`` does it), so a ``type``
    nothing registered is refused at config time. ``problems(path)``, when a member defines it,
    lists ``(field path, message)`` for settings that contradict each other."""

    type: str

    @classmethod
    def registered_configs(cls) -> tuple[Any, ...]:
        """The registered members (the union the config reference and schema walks list)."""
        return tuple(tagged_family(cls).members.values())


class LossMetric:
    """Base of the ``pd.loss_metrics`` entries: an open tagged union like :class:`CIConfig`;
    members are registered with :func:`register_loss_config` (``pd_train.losses.register_loss_term``
    does it). Each has a ``type`` tag, a ``coeff`` and an optional ``name`` (its metric is
    ``loss/{name}``, default ``loss/{type}``; a type may repeat when each has its own name)."""

    type: str
    coeff: float
    name: str | None

    @classmethod
    def registered_configs(cls) -> tuple[Any, ...]:
        """The registered members (the union the config reference and schema walks list)."""
        return tuple(tagged_family(cls).members.values())


_CI_CONFIGS = tagged_family(CIConfig)
_LOSS_CONFIGS = tagged_family(LossMetric)
register_ci_config = _CI_CONFIGS.register
register_loss_config = _LOSS_CONFIGS.register


def _transformer_problems(ci: TransformerCIFields, path: str) -> list[tuple[str, str]]:
    problems = []
    if ci.d_model % ci.n_heads:
        divisors = [h for h in range(1, ci.d_model + 1) if ci.d_model % h == 0]
        near = sorted(divisors, key=lambda h: abs(h - ci.n_heads))[:2]
        msg = (
            f"got {ci.n_heads}, which does not divide d_model {ci.d_model}; "
            f"head counts that would: {' or '.join(map(str, sorted(near)))}"
        )
        problems.append((f"{path}.n_heads", msg))
    elif (ci.d_model // ci.n_heads) % 2:
        msg = (
            f"d_model {ci.d_model} / n_heads {ci.n_heads} gives head dim "
            f"{ci.d_model // ci.n_heads}, which is odd; RoPE rotates pairs of channels and "
            "needs an even head dim"
        )
        problems.append((f"{path}.n_heads", msg))
    if ci.n_kv_heads is not None and ci.n_heads % ci.n_kv_heads:
        msg = (
            f"got {ci.n_kv_heads}; must divide n_heads {ci.n_heads} (each K/V head serves a group)"
        )
        problems.append((f"{path}.n_kv_heads", msg))
    return problems


@attrs.frozen(kw_only=True)
class DecompositionTarget:
    """Sites whose names match ``module_pattern`` (fnmatch, with ``[]`` classes, e.g.
    ``layers.2[4-9].self_attn.*``) are decomposed into ``C`` rank-1 components each."""

    module_pattern: str
    C: int = attrs.field(validator=positive())


@register_ci_config
@attrs.frozen(kw_only=True)
class MLPCI(CIConfig):
    """Per site and component, a scalar MLP 1 -> hidden_dims -> 1 (GELU) on (x@V)_c."""

    type: Literal["mlp"] = "mlp"
    hidden_dims: tuple[int, ...] = attrs.field(default=(16,), validator=_positive_ints)
    #: None: each site's MLPs run on all batch×seq rows at once; an int: over blocks of that
    #: many rows, forward and backward, so a block's [rows, C, h] intermediates stay in cache
    #: (with one hidden layer the forward and VJP written out, Φ in torch's erf form): the same
    #: values up to float rounding, ~5x cheaper at C 200 (docs/toys.md); a last block of fewer
    #: rows runs on its own.
    batch_block: int | None = attrs.field(default=None, validator=positive())


@register_ci_config
@attrs.frozen(kw_only=True)
class SharedMLPCI(CIConfig):
    """Per site, one MLP d_in -> hidden_dims -> C (GELU) on the site's input x."""

    type: Literal["shared_mlp"] = "shared_mlp"
    hidden_dims: tuple[int, ...] = attrs.field(default=(256,), validator=_positive_ints)


@register_ci_config
@attrs.frozen(kw_only=True)
class VectorMLPCI(CIConfig):
    """Per site and component, an MLP d_in -> hidden_dims -> 1 (exact GELU) on the site's
    input x (spd's ``vector_mlp``)."""

    type: Literal["vector_mlp"] = "vector_mlp"
    hidden_dims: tuple[int, ...] = attrs.field(default=(16,), validator=_positive_ints)


def _own_fields_first(cls: type, fields: list[attrs.Attribute]) -> list[attrs.Attribute]:  # type: ignore[type-arg]
    """A subclass's own fields (its ``type`` tag first) before the ones it inherits, so a
    member's YAML, repr and schema read as if it declared them all itself."""
    own = set(vars(cls).get("__annotations__", {}))
    return [f for f in fields if f.name in own] + [f for f in fields if f.name not in own]


@attrs.frozen(kw_only=True)
class TransformerCIFields(CIConfig):
    """The fields the two transformer CI types share (not a ``pd.ci`` type itself): the
    width ``d_model``, ``n_blocks`` pre-norm blocks (bidirectional attention with RoPE of base
    ``rope_theta``, ``n_heads`` query heads and ``n_kv_heads`` K/V heads (default ``n_heads``),
    no attention bias; MLP Linear+bias -> exact GELU (``mlp_hidden`` wide) -> Linear+bias)."""

    d_model: int = attrs.field(validator=positive())
    n_blocks: int = attrs.field(validator=positive())
    n_heads: int = attrs.field(validator=positive())
    n_kv_heads: int | None = attrs.field(default=None, validator=positive())
    mlp_hidden: int = attrs.field(validator=positive())
    rope_theta: float = attrs.field(default=10_000.0, validator=positive())

    def problems(self, path: str) -> list[tuple[str, str]]:
        return _transformer_problems(self, path)


@register_ci_config
@attrs.frozen(kw_only=True, field_transformer=_own_fields_first)
class ChunkwiseTransformerCI(TransformerCIFields):
    """The decomposed layers cut into consecutive chunks of ``blocks_per_chunk``; per chunk an
    independent transformer: each distinct site input RMS-normalized (no learned scale) and
    concatenated -> Linear to ``d_model`` -> ``n_blocks`` pre-norm blocks (bidirectional
    attention with RoPE of base ``rope_theta``, ``n_kv_heads`` K/V heads (default
    ``n_heads``), no attention bias; MLP Linear+bias -> exact GELU -> Linear+bias) -> one
    Linear+bias head [d_model, C] per site of the chunk."""

    type: Literal["chunkwise_transformer"] = "chunkwise_transformer"
    blocks_per_chunk: int = attrs.field(default=1, validator=positive())


@register_ci_config
@attrs.frozen(kw_only=True, field_transformer=_own_fields_first)
class GlobalTransformerCI(TransformerCIFields):
    """The chunkwise transformer with one chunk over every decomposed site (spd's global
    shared transformer); same fields but no ``blocks_per_chunk``."""

    type: Literal["global_transformer"] = "global_transformer"


def ci_config_problems(ci: CIConfig, *, path: str = "pd.ci") -> list[tuple[str, str]]:
    """``(field path, message)`` for CI settings that contradict each other (the checks that
    need the decomposition live with the CI function: ``pd_train.ci``)."""
    problems = getattr(ci, "problems", None)
    return [] if problems is None else list(problems(path))


def _anneal_window_problems(term: Any, path: str) -> list[tuple[str, str]]:
    """An annealed term's window out of order (``anneal_end_frac`` below ``anneal_start_frac``)."""
    if term.anneal_end_frac < term.anneal_start_frac:
        msg = (
            f"got {term.anneal_end_frac}, below anneal_start_frac {term.anneal_start_frac};"
            " must be >= anneal_start_frac"
        )
        return [(f"{path}.anneal_end_frac", msg)]
    return []


@register_loss_config
@attrs.frozen(kw_only=True)
class Faithfulness(LossMetric):
    """Σ_sites ‖W − V@U‖² / Σ_sites numel(W)."""

    type: Literal["faithfulness"] = "faithfulness"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())


@attrs.frozen(kw_only=True)
class FrequencyPenalty:
    """The frequency term of importance minimality, weighted by its **own** coefficient beside
    the activity term (param-decomp's convention, its SPEC S8'): the loss gains
    ``coeff · Σ_sites Σ_c f_c·log2(1 + reference_token_count·f_c)``. param-decomp's production
    recipe: coeff 1e-6 beside importance 5e-6, reference count = the global batch's tokens."""

    coeff: float = attrs.field(validator=non_negative())
    reference_token_count: int = attrs.field(default=65_536, validator=positive())


def _retired_nested_frequency(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:  # type: ignore[type-arg]
    """Refuse the retired top-level frequency fields, saying how to convert them."""
    if value is None:
        return
    msg = (
        f"got {value!r}; retired: the frequency term used to be weighted inside `coeff` "
        "(loss = coeff·(Σ f + frequency_coeff·Σ f·log2(1 + reference_token_count·f))). It now "
        "has its own coefficient, as in param-decomp: write `frequency: {coeff: X, "
        "reference_token_count: A}` with X = coeff × the old frequency_coeff for the same "
        "loss (param-decomp's production recipe: X = 1e-6 beside coeff 5e-6), and drop "
        "frequency_coeff / reference_token_count"
    )
    raise FieldValueError(attribute.name, msg)


@attrs.frozen(kw_only=True)
class CoeffScheduleFields(LossMetric):
    """The coefficient schedule the importance penalties share (param-decomp's names and
    meaning; not a ``pd.loss_metrics`` type itself): the step weighs the term by ``coeff`` × a
    multiplier that goes linearly 0 → ``coeff_peak_multiplier`` over the first
    ``coeff_warmup_frac`` of ``pd.steps``, holds there, then goes linearly back to 1 between
    ``coeff_anneal_start_frac`` and ``coeff_anneal_end_frac`` (1 after). The defaults are no
    schedule (1 throughout). It weighs the training loss only: ``loss/{name}`` stays the
    term's value before its coefficient, and the multiplier is reported as
    ``coeff_multiplier``."""

    coeff_warmup_frac: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    coeff_peak_multiplier: float = attrs.field(default=1.0, validator=non_negative())
    coeff_anneal_start_frac: float = attrs.field(default=1.0, validator=in_range(0.0, 1.0))
    coeff_anneal_end_frac: float = attrs.field(default=1.0, validator=in_range(0.0, 1.0))


def _coeff_schedule_problems(term: CoeffScheduleFields, path: str) -> list[tuple[str, str]]:
    """The coefficient schedule's windows out of order."""
    out = []
    if term.coeff_warmup_frac > term.coeff_anneal_start_frac:
        msg = (
            f"got {term.coeff_warmup_frac}, above coeff_anneal_start_frac "
            f"{term.coeff_anneal_start_frac}; the warmup must end before the anneal starts"
        )
        out.append((f"{path}.coeff_warmup_frac", msg))
    if term.coeff_anneal_end_frac < term.coeff_anneal_start_frac:
        msg = (
            f"got {term.coeff_anneal_end_frac}, below coeff_anneal_start_frac "
            f"{term.coeff_anneal_start_frac}; must be >= coeff_anneal_start_frac"
        )
        out.append((f"{path}.coeff_anneal_end_frac", msg))
    return out


@register_loss_config
@attrs.frozen(kw_only=True, field_transformer=_own_fields_first)
class ImportanceMinimality(CoeffScheduleFields):
    """coeff · Σ_sites Σ_c f_c + frequency.coeff · Σ_sites Σ_c f_c·log2(1 +
    frequency.reference_token_count·f_c), with f_c = mean over the global batch of
    (ci_upper + eps)^p. p goes linearly from ``pnorm_start`` to ``pnorm_end`` between
    ``anneal_start_frac`` and ``anneal_end_frac`` of ``pd.steps``. ``frequency``: null (no
    frequency term) or its own coefficient (:class:`FrequencyPenalty`); the old top-level
    ``frequency_coeff`` / ``reference_token_count`` (nested inside ``coeff``) are refused.
    ``coeff_*``: param-decomp's schedule of the coefficient: the step weighs the term by coeff ×
    a multiplier that goes 0 → ``coeff_peak_multiplier`` over the first ``coeff_warmup_frac``
    of ``pd.steps``, holds, then goes back to 1 between ``coeff_anneal_start_frac`` and
    ``coeff_anneal_end_frac`` (the defaults: 1 throughout)."""

    type: Literal["importance_minimality"] = "importance_minimality"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())
    pnorm_start: float = attrs.field(default=2.0, validator=positive())
    pnorm_end: float = attrs.field(default=2.0, validator=positive())
    anneal_start_frac: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    anneal_end_frac: float = attrs.field(default=1.0, validator=in_range(0.0, 1.0))
    eps: float = attrs.field(default=1e-12, validator=non_negative())
    frequency: FrequencyPenalty | None = None
    frequency_coeff: float | None = attrs.field(default=None, validator=_retired_nested_frequency)
    reference_token_count: float | None = attrs.field(
        default=None, validator=_retired_nested_frequency
    )

    def problems(self, path: str) -> list[tuple[str, str]]:
        out = _anneal_window_problems(self, path) + _coeff_schedule_problems(self, path)
        if self.frequency is not None and self.frequency.coeff > 0 and self.coeff == 0:
            msg = (
                f"got coeff 0 with frequency.coeff {self.frequency.coeff}; the term's value is "
                "reported before `coeff`, so a frequency term needs coeff > 0 (or set "
                "frequency: null)"
            )
            out.append((f"{path}.coeff", msg))
        return out


@register_loss_config
@attrs.frozen(kw_only=True, field_transformer=_own_fields_first)
class SmoothL0ImportanceMinimality(CoeffScheduleFields):
    """``coeff · Σ f_c + frequency_coeff · Σ f_c · log2(1 + reference_token_count · f_c)`` with
    f_c = mean over the global batch of ci_upper² / (ci_upper² + γ²); γ linear from
    ``gamma_start`` to ``gamma_end`` between ``anneal_start_frac`` and ``anneal_end_frac`` of
    ``pd.steps − 1``. ``ema_halflife_steps``: the frequency part reads a debiased EMA of f_c
    with this half-life in steps (null: this batch's f_c).
    ``coeff_*``: param-decomp's schedule of the coefficient: the step weighs the term by coeff ×
    a multiplier that goes 0 → ``coeff_peak_multiplier`` over the first ``coeff_warmup_frac``
    of ``pd.steps``, holds, then goes back to 1 between ``coeff_anneal_start_frac`` and
    ``coeff_anneal_end_frac`` (the defaults: 1 throughout)."""

    type: Literal["smooth_l0_importance_minimality"] = "smooth_l0_importance_minimality"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=positive())
    gamma_start: float = attrs.field(default=1.0, validator=positive())
    gamma_end: float = attrs.field(default=0.01, validator=positive())
    anneal_start_frac: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    anneal_end_frac: float = attrs.field(default=1.0, validator=in_range(0.0, 1.0))
    frequency_coeff: float = attrs.field(default=0.0, validator=non_negative())
    reference_token_count: int = attrs.field(default=65_536, validator=positive())
    ema_halflife_steps: float | None = attrs.field(default=None, validator=positive())

    def problems(self, path: str) -> list[tuple[str, str]]:
        problems = _anneal_window_problems(self, path) + _coeff_schedule_problems(self, path)
        if self.ema_halflife_steps is not None and self.frequency_coeff == 0:
            msg = (
                f"got {self.ema_halflife_steps} with frequency_coeff 0; the EMA feeds only the"
                " frequency part: set frequency_coeff > 0 or leave ema_halflife_steps null"
            )
            problems.append((f"{path}.ema_halflife_steps", msg))
        return problems


@register_loss_config
@attrs.frozen(kw_only=True)
class StochasticRecon(LossMetric):
    """KL(clean ‖ masked) on final logits with every site live, mean over n_samples draws."""

    type: Literal["stochastic_recon"] = "stochastic_recon"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())
    n_samples: int = attrs.field(default=1, validator=positive())


@register_loss_config
@attrs.frozen(kw_only=True)
class ChunkwiseSubsetRecon(LossMetric):
    """Sites in canonical order grouped into chunks of ``sites_per_chunk``; per chunk and draw,
    k ~ U{1..n_live} and each position routes a random k-subset of the chunk's sites."""

    type: Literal["chunkwise_subset_recon"] = "chunkwise_subset_recon"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())
    sites_per_chunk: int = attrs.field(validator=positive())
    n_samples: int = attrs.field(default=1, validator=positive())


@register_loss_config
@attrs.frozen(kw_only=True)
class StaticProbabilitySubsetRecon(LossMetric):
    """KL(clean ‖ masked) where, per draw, each live site at each position independently takes
    its component path with probability ``p`` (else frozen; spd's ``static_probability``
    router), mean over chunks and n_samples draws. ``sites_per_chunk``: null routes over every
    site in one forward; a number cuts the sites (canonical order) into chunks as
    ``chunkwise_subset_recon`` does."""

    type: Literal["static_probability_subset_recon"] = "static_probability_subset_recon"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())
    p: float = attrs.field(validator=in_range(0.0, 1.0))
    sites_per_chunk: int | None = attrs.field(default=None, validator=positive())
    n_samples: int = attrs.field(default=1, validator=positive())


@register_loss_config
@attrs.frozen(kw_only=True)
class CIMaskedRecon(LossMetric):
    """KL(clean ‖ masked) with every site live at every position under m = ci_lower and no
    delta component (spd's ``CIMaskedReconLoss``; the eval's ``kl_ci``)."""

    type: Literal["ci_masked_recon"] = "ci_masked_recon"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())


@register_loss_config
@attrs.frozen(kw_only=True)
class UnmaskedRecon(LossMetric):
    """KL(clean ‖ masked) with every site live at every position under m = 1 and no delta
    component: the V@U model (spd's ``UnmaskedReconLoss``; the eval's ``kl_ones``)."""

    type: Literal["unmasked_recon"] = "unmasked_recon"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())


@register_loss_config
@attrs.frozen(kw_only=True)
class StochasticHiddenActsRecon(LossMetric):
    """MSE between every decomposed site's output in the masked model (every site live at every
    position, drawn sources as ``stochastic_recon``'s) and in the clean target, summed over
    draws, sites and elements and divided by their count (spd's and param-decomp's
    ``StochasticHiddenActsReconLoss``), mean over n_samples draws."""

    type: Literal["stochastic_hidden_acts_recon"] = "stochastic_hidden_acts_recon"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())
    n_samples: int = attrs.field(default=1, validator=positive())


@register_loss_config
@attrs.frozen(kw_only=True)
class SubsetRecon(LossMetric):
    """All sites in one masked forward per draw: at each position independently, k ~
    U{1..n_sites} and a random k-subset of all the decomposed sites routes to its components,
    the rest frozen (param-decomp's recon over all sites, SPEC S10′; spd's
    ``stochastic_recon_subset``). ``chunkwise_subset_recon`` is the chunked form."""

    type: Literal["subset_recon"] = "subset_recon"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())
    n_samples: int = attrs.field(default=1, validator=positive())


@attrs.frozen(kw_only=True)
class PGDEval:
    """Fresh PGD sources (see :mod:`pd_train.losses.pgd`): start ``random`` (U[0, 1)), ``ones``
    or ``zeros``; ``n_steps`` sign-gradient ascents of ``step_size`` on the recon KL, clamped to
    [0, 1]. ``mask_scope``: ``unique_per_datapoint`` sources [B, T, C + 1] or
    ``shared_across_batch`` [1, 1, C + 1] (one source for every position)."""

    init: Literal["random", "ones", "zeros"] = attrs.field(
        default="random", validator=one_of("random", "ones", "zeros")
    )
    n_steps: int = attrs.field(default=20, validator=non_negative())
    step_size: float = attrs.field(default=0.1, validator=positive())
    mask_scope: Literal["unique_per_datapoint", "shared_across_batch"] = attrs.field(
        default="unique_per_datapoint",
        validator=one_of("unique_per_datapoint", "shared_across_batch"),
    )


@register_loss_config
@attrs.frozen(kw_only=True)
class PGDRecon(LossMetric):
    """Recon under adversarial masks found afresh each step (:class:`PGDEval`'s settings),
    mean over n_samples draws. ``sites_per_chunk``: null routes every site at every position
    (one chunk); a number uses the chunkwise-subset plan with per-position uniform-k routing."""

    type: Literal["pgd_recon"] = "pgd_recon"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=non_negative())
    init: Literal["random", "ones", "zeros"] = attrs.field(
        default="random", validator=one_of("random", "ones", "zeros")
    )
    n_steps: int = attrs.field(default=1, validator=non_negative())
    step_size: float = attrs.field(default=0.1, validator=positive())
    mask_scope: Literal["unique_per_datapoint", "shared_across_batch"] = attrs.field(
        default="unique_per_datapoint",
        validator=one_of("unique_per_datapoint", "shared_across_batch"),
    )
    sites_per_chunk: int | None = attrs.field(default=None, validator=positive())
    n_samples: int = attrs.field(default=1, validator=positive())


@attrs.frozen(kw_only=True)
class PGDOptimizer:
    """The persistent sources' own optimizer. ``sign``: s += lr·sign(g). ``adam``: s += lr·m̂ /
    (sqrt(v̂) + eps) with bias-corrected moments (eps after the square root). Both clamp to
    [0, 1] after every ascent. lr: linear warmup over ``warmup_frac``·pd.steps, then cosine to
    ``final_val_frac``·lr (1.0: constant), as the components' schedule."""

    type: Literal["sign", "adam"] = attrs.field(default="adam", validator=one_of("sign", "adam"))
    lr: float = attrs.field(validator=positive())
    warmup_frac: float = attrs.field(default=0.0, validator=in_range(0.0, 1.0))
    final_val_frac: float = attrs.field(default=1.0, validator=non_negative())
    b1: float = attrs.field(default=0.9, validator=in_range(0.0, 1.0))
    b2: float = attrs.field(default=0.999, validator=in_range(0.0, 1.0))
    eps: float = attrs.field(default=1e-8, validator=non_negative())


@register_loss_config
@attrs.frozen(kw_only=True)
class PersistentPGDRecon(LossMetric):
    """Recon (every site routed at every position) under per-site sources [B | 1, T, C + 1]
    that persist across steps in the train state. ``scope``: ``bsc`` one source per batch row
    and position (batch-sharded), ``sc`` one per position shared by the batch (replicated).
    Each step: ``n_warmup_steps`` ascents with params and CI detached, then the term, then one
    final ascent along the main backward's source gradient divided by ``coeff`` (> 0)."""

    type: Literal["persistent_pgd_recon"] = "persistent_pgd_recon"
    name: str | None = _name_field()
    coeff: float = attrs.field(validator=positive())
    scope: Literal["sc", "bsc"] = attrs.field(default="bsc", validator=one_of("sc", "bsc"))
    n_warmup_steps: int = attrs.field(default=0, validator=non_negative())
    optimizer: PGDOptimizer


@attrs.frozen(kw_only=True)
class OptimizerConfig:
    """AdamW with a cosine schedule: linear warmup over ``warmup_steps`` to ``lr``, held at
    ``lr`` for ``hold_steps`` more (0: none; a warmup-stable-decay schedule when the decay is
    short), then cosine to ``final_val_frac·lr`` over ``decay_steps`` (default: the steps after
    warmup and hold), with the final value reached at decay step ``decay_steps − 1``. ``clip``
    is the max global grad norm (None: no clipping)."""

    lr: float = attrs.field(validator=positive())
    warmup_steps: int = attrs.field(default=0, validator=non_negative())
    hold_steps: int = attrs.field(default=0, validator=non_negative())
    final_val_frac: float = attrs.field(default=1.0, validator=non_negative())
    decay_steps: int | None = attrs.field(default=None, validator=positive())
    weight_decay: float = attrs.field(default=0.0, validator=non_negative())
    clip: float | None = attrs.field(default=None, validator=positive())
    b1: float = attrs.field(default=0.9, validator=in_range(0.0, 1.0))
    b2: float = attrs.field(default=0.999, validator=in_range(0.0, 1.0))
    eps: float = attrs.field(default=1e-8, validator=non_negative())


@attrs.frozen(kw_only=True)
class FaithfulnessWarmup:
    """Before step 0: ``steps`` AdamW steps on faithfulness alone at a constant ``lr`` with
    decoupled ``weight_decay`` (0: Adam; the reference's toy recipes use 0.1)."""

    steps: int = attrs.field(default=0, validator=non_negative())
    lr: float = attrs.field(default=1e-3, validator=positive())
    weight_decay: float = attrs.field(default=0.0, validator=non_negative())


@attrs.frozen(kw_only=True)
class ReconConfig:
    """How recon forwards are structured; every choice gives the same values.

    ``chunk_loop`` / ``layer_loop``: ``scan`` compiles one body, ``unroll`` a Python loop (A/B).
    ``pair_terms``: a one-draw stochastic recon term and the persistent-PGD term run as one
    masked forward of 2B rows (half the ops for the same FLOPs; 0.95x the default step's CPU
    seconds, docs/findings.md section 10). It holds twice one forward's activations, so it is
    used only without ``runtime.remat.recon``; false runs one forward each.
    ``random_draws``: how the masks' sources and the recon routing's uniforms are computed, the
    same bits either way (:mod:`pd_train.sources`): ``jax`` (``jax.random.uniform``), or
    ``blocked`` (the same Threefry-2x32 written out, in a scan over blocks so XLA:CPU computes
    each draw once; ~2.6x cheaper a draw on CPU; for single-device programs: a scan over the
    flat index is not batch-partitionable).
    """

    chunk_loop: Literal["scan", "unroll"] = attrs.field(
        default="scan", validator=one_of("scan", "unroll")
    )
    layer_loop: Literal["scan", "unroll"] = attrs.field(
        default="scan", validator=one_of("scan", "unroll")
    )
    pair_terms: bool = True
    random_draws: Literal["jax", "blocked"] = attrs.field(
        default="jax", validator=one_of("jax", "blocked")
    )


@attrs.frozen(kw_only=True)
class PDConfig:
    """The decomposition and its training, as the step sees it."""

    steps: int = attrs.field(validator=positive())
    batch_size: int = attrs.field(default=8, validator=positive())
    decomposition_targets: tuple[DecompositionTarget, ...]
    ci: CIConfig = attrs.field(factory=MLPCI)
    loss_metrics: tuple[LossMetric, ...]
    sampling: Literal["continuous", "binomial"] = attrs.field(
        default="continuous", validator=one_of("continuous", "binomial")
    )
    recon: ReconConfig = attrs.field(factory=ReconConfig)
    components: OptimizerConfig
    ci_fn: OptimizerConfig
    faithfulness_warmup: FaithfulnessWarmup = attrs.field(factory=FaithfulnessWarmup)
    l0_threshold: float = attrs.field(default=0.0, validator=_below_one)
    #: The eval's ``rounded`` masks: m = [ci_lower > rounding_threshold] (null: l0_threshold).
    rounding_threshold: float | None = attrs.field(default=None, validator=_below_one)
    #: False: no delta component; a live site outputs ((x@V)·m)@U, with no δ·(x@Δ) term and
    #: no delta channel in the drawn sources (adversarial sources keep theirs, unused).
    use_delta_component: bool = True
    #: CI-L0 groups of the eval records (``l0_group/<name>``): ``{name: [site patterns]}``, a
    #: group's L0 the sum over the decomposed sites its fnmatch patterns match (checked by
    #: :func:`pd_train.analysis.statistics.resolve_l0_groups`). Null: per layer, per kind, total.
    l0_groups: dict[str, tuple[str, ...]] | None = None
    #: Evaluation also reports ``eval/kl_pgd``: recon under fresh PGD masks (null: not run).
    eval_pgd: PGDEval | None = None


def check_pd_config(pd: PDConfig, *, path: str = "pd") -> None:
    """Checks the step relies on beyond single fields: a known loss list without duplicates,
    a coherent p-annealing window, decay settings (a hold that ends before the last step).
    Raises ConfigError naming the field path."""
    problems: list[tuple[str, str]] = []
    if not pd.decomposition_targets:
        problems.append((f"{path}.decomposition_targets", "is empty; list at least one target"))
    seen: dict[str, int] = {}
    for i, term in enumerate(pd.loss_metrics):
        where = f"{path}.loss_metrics[{i}]"
        name = getattr(term, "name", None) or term.type
        if name in seen:
            other = f"{path}.loss_metrics[{seen[name]}]"
            if getattr(term, "name", None) is None:
                msg = (
                    f"type {term.type!r} appears twice (also at {other}) without a name; give"
                    " each a distinct `name` (it reports loss/<name>)"
                )
                problems.append((f"{where}.type", msg))
            else:
                msg = f"got {name!r}, also the metric name of {other}; names must be distinct"
                problems.append((f"{where}.name", msg))
        seen.setdefault(name, i)
        term_problems = getattr(term, "problems", None)
        if term_problems is not None:
            problems.extend(term_problems(where))
    if not pd.loss_metrics:
        problems.append((f"{path}.loss_metrics", "is empty; list at least one loss term"))
    for group in ("components", "ci_fn"):
        opt = getattr(pd, group)
        if opt.hold_steps and opt.warmup_steps + opt.hold_steps >= pd.steps:
            msg = (
                f"got {opt.hold_steps}; with warmup_steps {opt.warmup_steps} the lr would never"
                f" decay within {path}.steps ({pd.steps}): must be < {pd.steps - opt.warmup_steps}"
                " (0: no hold)"
            )
            problems.append((f"{path}.{group}.hold_steps", msg))
    problems.extend(ci_config_problems(pd.ci, path=f"{path}.ci"))
    if problems:
        raise ConfigError(problems)
