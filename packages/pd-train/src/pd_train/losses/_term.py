"""The loss-term interface and its registry.

A loss-term type is a :class:`LossTerm` subclass registered with :func:`register_loss_term`
under its config class's ``type`` tag. It describes itself to the three places that used to
know every term by name:

- the config union: registering adds ``config_cls`` to ``pd.loss_metrics``' tagged union
  (:class:`pd_train.config.pd.LossMetric`), so an unregistered ``type`` is refused at config time;
- the step (:class:`pd_train.train.Trainer`): :meth:`LossTerm.plan` (its recon plan, built once),
  :attr:`LossTerm.needs_ci`, :meth:`LossTerm.hyperparams` (its scalar hyperparameters, passed
  to the jitted step as data) and :meth:`LossTerm.value`;
- the FLOP census (:func:`pd_train.flops.step_census`): :meth:`LossTerm.flops`.

Two optional hooks serve the adversarial terms: :meth:`LossTerm.adversary` (persistent state in
``TrainState.adversary``) and :meth:`LossTerm.pairs_with_sources` (a term that can share one
masked forward with the persistent-PGD term). A term with state across steps (an EMA) describes
it with :meth:`LossTerm.state` and is evaluated by :meth:`LossTerm.stateful_value`; the state
lives in ``TrainState.term_state``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import jax

from pd_train.config.pd import LossMetric, PDConfig, register_loss_config

if TYPE_CHECKING:
    from pd_train._forward import ForwardSpec
    from pd_train.census import CensusContext
    from pd_train.decomposition import Decomposition
    from pd_train.losses.plan import ReconPlan

__all__ = ["LOSS_TERMS", "LossTerm", "TermInputs", "loss_term", "register_loss_term"]

#: A term's scalar hyperparameters: ``{name: f32 [] or i32 []}`` inside the step.
Hyperparams = Mapping[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class TermInputs:
    """What every term's value may read, built once per loss evaluation.

    ``components``: V/U in the compute dtype ({kind: {"V": [n_k, d_in, C], "U": [n_k, C,
    d_out]}}); ``params``: the fp32 masters ({"components", "ci_fn"}); ``ci_lower`` /
    ``ci_upper``: {kind: [n_k, B, T, C]} (None when no term needs CI); ``clean_logits`` [B, T,
    vocab]; ``clean_stream`` [L + 1, B, T, hidden] or None; ``step`` int32 []; ``sources``: the
    persistent-PGD sources of this step ({kind: [n_k, B | 1, T, C + 1]}) or None;
    ``chunk_unroll`` / ``remat``: ``pd.recon.chunk_loop == "unroll"`` and
    ``runtime.remat.recon``.
    """

    spec: ForwardSpec
    target: Any
    tokens: jax.Array
    params: Mapping[str, Any]
    components: Mapping[str, Any]
    step: jax.Array
    ci_lower: Mapping[str, jax.Array] | None = None
    ci_upper: Mapping[str, jax.Array] | None = None
    clean_logits: jax.Array | None = None
    clean_stream: jax.Array | None = None
    sources: Mapping[str, jax.Array] | None = None
    chunk_unroll: bool = False
    remat: bool = False


class LossTerm:
    """One loss-term type. Subclass it, set :attr:`config_cls` (an attrs class with a ``type``
    tag and a ``coeff``), override what applies, and register an instance with
    :func:`register_loss_term`. The step adds ``hp["coeff"] · value`` to the total and reports
    ``loss/{name}`` (the entry's ``name``, default its ``type``)."""

    #: The term's config class (its ``type`` default is the registry key).
    config_cls: ClassVar[type]
    #: Whether the value reads the CI (``ci_lower``/``ci_upper``, the clean forward).
    needs_ci: ClassVar[bool] = True

    def plan(self, config: Any, decomposition: Decomposition) -> ReconPlan | None:
        """The term's recon plan (static chunks of live sites), or None for no masked forward."""
        del config, decomposition
        return None

    def hyperparams(self, config: Any, pd: PDConfig) -> dict[str, float | int]:
        """The term's scalar hyperparameters by name; they reach :meth:`value` as f32 [] (a
        Python float) or i32 [] (an int) arguments of the jitted step, never as constants of
        its trace. Fields that change shapes or structure (sample counts, ascent counts,
        chunking) are read from ``config`` directly instead."""
        del pd
        return {"coeff": float(config.coeff)}

    def value(
        self,
        config: Any,
        inputs: TermInputs,
        *,
        plan: ReconPlan | None,
        hp: Hyperparams,
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """(The term's fp32 [] value before its coefficient, extra metrics by name). ``key``:
        the term key, ``fold_in(step key, index in pd.loss_metrics)``."""
        raise NotImplementedError

    def coeff_multiplier(self, config: Any, hp: Hyperparams, step: jax.Array) -> jax.Array | None:
        """What the step multiplies ``hp["coeff"]`` by at ``step`` (a schedule of the
        coefficient, from the term's hyperparameters), or None: the coefficient as it is."""
        del config, hp, step
        return None

    def flops(self, config: Any, census: CensusContext, *, plan: ReconPlan | None) -> None:
        """Add the term's useful FLOPs to ``census`` (default: its plan's masked forwards, one
        per chunk and ``n_samples`` draw, forward and backward)."""
        if plan is not None:
            census.recon_forwards(config.type, plan, samples=getattr(config, "n_samples", 1))

    # ------------------------------------------------------------ adversarial terms (optional)
    def adversary(
        self,
        config: Any,
        decomposition: Decomposition,
        *,
        batch_size: int,
        seq_len: int | None,
        total_steps: int,
        layout: Any,
        where: str,
    ) -> Any:
        """Persistent state the term keeps in ``TrainState.adversary`` (a
        :class:`pd_train.losses.PersistentPGD`), or None (the default). At most one term of a
        config may have one. ``where``: the term's field path, for errors."""
        del config, decomposition, batch_size, seq_len, total_steps, layout, where
        return None

    # ------------------------------------------------------------- terms with state (optional)
    def state(self, config: Any, decomposition: Decomposition) -> Any:
        """The shapes (a pytree of ShapeDtypeStructs) of state the term carries across steps in
        ``TrainState.term_state[str(index)]`` (zeros at step 0, replicated, checkpointed), or
        None (the default). A term with state is evaluated by :meth:`stateful_value`."""
        del config, decomposition
        return None

    def stateful_value(
        self,
        config: Any,
        inputs: TermInputs,
        state: Any,
        *,
        plan: ReconPlan | None,
        hp: Hyperparams,
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array], Any]:
        """:meth:`value` with the term's state: (value, extra metrics, the new state)."""
        value, extras = self.value(config, inputs, plan=plan, hp=hp, key=key)
        return value, extras, state

    def pairs_with_sources(self, config: Any) -> bool:
        """Whether this term is a one-draw route-all recon with drawn sources that may run as one
        masked forward beside the persistent-PGD term (:func:`paired_all_sites_loss`)."""
        del config
        return False


#: The registered loss-term types by ``type`` tag.
LOSS_TERMS: dict[str, LossTerm] = {}


def register_loss_term(term: LossTerm) -> LossTerm:
    """Register ``term`` under its config class's tag (and the class in the config union)."""
    cls = term.config_cls
    register_loss_config(cls)
    tag = attrs_default_type(cls)
    LOSS_TERMS[tag] = term
    return term


def attrs_default_type(cls: type) -> str:
    import attrs

    return str(attrs.fields_dict(cls)["type"].default)


def check_one_adversary(pd: Any, decomposition: Any, *, seq_len: int) -> None:
    """The Trainer's rule at config time: at most one ``pd.loss_metrics`` entry keeps persistent
    state in ``TrainState.adversary`` (:meth:`LossTerm.adversary`, asked without a layout).
    ConfigError at ``pd.loss_metrics`` naming the entries."""
    from pd_train.config.io import ConfigError

    found = []
    for i, config in enumerate(pd.loss_metrics):
        where = f"pd.loss_metrics[{i}]"
        kept = loss_term(config).adversary(
            config,
            decomposition,
            batch_size=pd.batch_size,
            seq_len=seq_len,
            total_steps=pd.steps,
            layout=None,
            where=where,
        )
        if kept is not None:
            found.append(where)
    if len(found) > 1:
        msg = f"terms {', '.join(found)} each keep persistent sources; at most one may"
        raise ConfigError([("pd.loss_metrics", msg)])


def loss_term(config: LossMetric) -> LossTerm:
    """The registered term of a ``pd.loss_metrics`` entry."""
    term = LOSS_TERMS.get(config.type)
    if term is None:
        allowed = ", ".join(repr(t) for t in LOSS_TERMS)
        msg = f"loss term type {config.type!r} is not registered; registered: {allowed}"
        raise ValueError(msg)
    return term
