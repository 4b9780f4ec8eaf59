"""The CI-type registry: one :class:`CIType` per ``pd.ci.type``.

A CI type describes itself to everything that used to know the types by name: its config class
(registered in ``pd.ci``'s tagged union, so an unregistered ``type`` is refused at config time),
how to build its :class:`~pd_train.ci._base.CIFunction` (which owns the params — ``arrays``,
``sharding_rules``, ``check`` — and the forward, ``causal_importance``), its FLOPs for the
census (:func:`pd_train.flops.ci_fn_flops`) and its parameter count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import jax

from pd_train.ci._base import CIFunction
from pd_train.config.pd import CIConfig, register_ci_config
from pd_train.decomposition import Decomposition

if TYPE_CHECKING:
    from pd_train.census import CensusContext

__all__ = ["CI_TYPES", "CIType", "ci_type", "register_ci_type"]


class CIType:
    """One CI-function type. Subclass it, set :attr:`config_cls` (an attrs class subclassing
    :class:`pd_train.config.pd.CIConfig`, with a ``type`` tag), implement :meth:`build` and
    :meth:`flops`, and register an instance with :func:`register_ci_type`."""

    config_cls: ClassVar[type]

    def build(
        self,
        config: Any,
        *,
        decomposition: Decomposition | None,
        remat: bool,
        constrain: Callable[[jax.Array], jax.Array],
    ) -> CIFunction:
        """The CI function of ``config``. ``decomposition``: the sites it serves (types whose
        structure depends on it require it); ``remat``: ``runtime.remat.ci_fn``;
        ``constrain``: keeps an activation batch-sharded (identity without a mesh)."""
        raise NotImplementedError

    def flops(self, config: Any, fn: Any, census: CensusContext) -> None:
        """Add the function's forward and backward FLOPs on ``census.tokens`` positions
        (``term="ci_fn"``, ``part="ci_fn"``) to ``census.acc``."""
        raise NotImplementedError

    def param_count(self, fn: CIFunction, decomposition: Decomposition) -> int:
        """The number of trained CI parameters (default: the sum over ``fn.arrays``)."""
        total = 0
        for a in fn.arrays(decomposition):
            size = 1
            for s in a.shape:
                size *= s
            total += size
        return total


#: The registered CI types by ``type`` tag.
CI_TYPES: dict[str, CIType] = {}


def register_ci_type(ci: CIType) -> CIType:
    """Register ``ci`` under its config class's tag (and the class in ``pd.ci``'s union)."""
    import attrs

    register_ci_config(ci.config_cls)
    CI_TYPES[str(attrs.fields_dict(ci.config_cls)["type"].default)] = ci
    return ci


def ci_type(config: CIConfig) -> CIType:
    """The registered type of a ``pd.ci`` config."""
    found = CI_TYPES.get(config.type)
    if found is None:
        allowed = ", ".join(repr(t) for t in CI_TYPES)
        msg = f"pd.ci.type: CI type {config.type!r} is not registered; registered: {allowed}"
        raise ValueError(msg)
    return found
