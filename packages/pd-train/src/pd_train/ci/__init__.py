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
``_base``; adding a type is one new module plus its config class and a line in
:func:`make_ci_function`. All MLPs use the exact (erf) GELU.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from pd_train.ci._base import CIArray, CIFunction, CleanRun, ParamSpec, SiteCIFunction, SiteFn
from pd_train.ci.mlp import MLPCIFunction
from pd_train.ci.shared_mlp import SharedMLPCIFunction
from pd_train.ci.transformer import TransformerCIFunction
from pd_train.ci.vector_mlp import VectorMLPCIFunction
from pd_train.config import (
    MLPCI,
    ChunkwiseTransformerCI,
    CIConfig,
    GlobalTransformerCI,
    SharedMLPCI,
    VectorMLPCI,
)
from pd_train.decomposition import Decomposition

__all__ = [
    "CIArray",
    "CIFunction",
    "CleanRun",
    "MLPCIFunction",
    "ParamSpec",
    "SharedMLPCIFunction",
    "SiteCIFunction",
    "SiteFn",
    "TransformerCIFunction",
    "VectorMLPCIFunction",
    "ci_param_specs",
    "make_ci_function",
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
    """The CI function a config names. The transformers need the ``decomposition`` they serve
    (their chunks and taps depend on it) and ``constrain`` (keep activations batch-sharded)."""
    if isinstance(config, MLPCI):
        return MLPCIFunction(hidden_dims=tuple(config.hidden_dims), remat=remat)
    if isinstance(config, SharedMLPCI):
        return SharedMLPCIFunction(hidden_dims=tuple(config.hidden_dims), remat=remat)
    if isinstance(config, VectorMLPCI):
        return VectorMLPCIFunction(hidden_dims=tuple(config.hidden_dims), remat=remat)
    if isinstance(config, ChunkwiseTransformerCI | GlobalTransformerCI):
        if decomposition is None:
            msg = f"make_ci_function: pd.ci.type {config.type!r} needs the decomposition"
            raise ValueError(msg)
        bpc = config.blocks_per_chunk if isinstance(config, ChunkwiseTransformerCI) else None
        return TransformerCIFunction(
            decomposition=decomposition,
            d_model=config.d_model,
            n_blocks=config.n_blocks,
            n_heads=config.n_heads,
            n_kv_heads=config.n_kv_heads,
            mlp_hidden=config.mlp_hidden,
            blocks_per_chunk=bpc,
            rope_theta=config.rope_theta,
            remat=remat,
            constrain=constrain,
        )
    allowed = "'mlp', 'shared_mlp', 'vector_mlp', 'chunkwise_transformer', 'global_transformer'"
    msg = f"pd.ci.type: unknown CI function {config!r}; allowed: {allowed}"
    raise ValueError(msg)


def ci_param_specs(
    ci_fn: SiteCIFunction, decomposition: Decomposition
) -> dict[str, dict[str, ParamSpec]]:
    """``{kind: {param: ParamSpec}}`` of a site-local CI function for every decomposed kind."""
    return {layout.kind: ci_fn.param_specs(layout) for layout in decomposition.kinds}
