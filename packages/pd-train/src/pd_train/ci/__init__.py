"""Causal-importance (CI) functions: one module per ``pd.ci.type`` behind one interface.

=========================  =====================================================  ==============
``pd.ci.type``             network                                                params stacked
=========================  =====================================================  ==============
``mlp``                    per site and component, 1 -> hidden -> 1 on (x@V)_c    per kind
``shared_mlp``             per site, d_in -> hidden -> C on x                     per kind
``vector_mlp``             per site and component, d_in -> hidden -> 1 on x       per kind
``chunkwise_transformer``  per chunk of layers, a transformer over its inputs     per chunk
``global_transformer``     one transformer over every decomposed site's input     one chunk
=========================  =====================================================  ==============

The interface (:class:`CIFunction`) and what the site-local functions share are in
``_base``; the registry (:class:`CIType`, :func:`register_ci_type`) in ``_registry``. Adding a
type is one new module: its config class (subclassing :class:`pd_train.config.pd.CIConfig`), its
CI function and a registered :class:`CIType` (build, FLOPs, parameter count). All MLPs use the
exact (erf) GELU.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from pd_train.ci._base import CIArray, CIFunction, CleanRun, ParamSpec, SiteCIFunction, SiteFn
from pd_train.ci._registry import CI_TYPES, CIType, ci_type, register_ci_type
from pd_train.ci.mlp import MLPCIFunction
from pd_train.ci.shared_mlp import SharedMLPCIFunction
from pd_train.ci.transformer import TransformerCIFunction
from pd_train.ci.vector_mlp import VectorMLPCIFunction
from pd_train.config.pd import CIConfig
from pd_train.decomposition import Decomposition

__all__ = [
    "CI_TYPES",
    "CIArray",
    "CIFunction",
    "CIType",
    "CleanRun",
    "MLPCIFunction",
    "ParamSpec",
    "SharedMLPCIFunction",
    "SiteCIFunction",
    "SiteFn",
    "TransformerCIFunction",
    "VectorMLPCIFunction",
    "ci_param_specs",
    "ci_type",
    "make_ci_function",
    "register_ci_type",
]


def _identity(x: jax.Array) -> jax.Array:
    return x


def make_ci_function(
    config: CIConfig,
    *,
    decomposition: Decomposition | None = None,
    remat: bool = False,
    constrain: Callable[[jax.Array], jax.Array] = _identity,
) -> CIFunction:
    """The CI function a config names (its registered :class:`CIType` builds it). The
    transformers need the ``decomposition`` they serve (their chunks and taps depend on it) and
    ``constrain`` (keep activations batch-sharded)."""
    return ci_type(config).build(
        config, decomposition=decomposition, remat=remat, constrain=constrain
    )


def ci_param_specs(
    ci_fn: SiteCIFunction, decomposition: Decomposition
) -> dict[str, dict[str, ParamSpec]]:
    """``{kind: {param: ParamSpec}}`` of a site-local CI function for every decomposed kind."""
    return {layout.kind: ci_fn.param_specs(layout) for layout in decomposition.kinds}
