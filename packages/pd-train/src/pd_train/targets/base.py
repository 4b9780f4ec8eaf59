"""What a decomposition needs from a target model (the interface the forwards rely on).

A target is a stack of ``n_layers`` repeated layers. Each layer applies some matrices, each of one
*kind* (``kinds``, in canonical order); the matrix of kind ``k`` at layer ``i`` is the *site*
:func:`pd_train.decomposition.site_name` ``(i, k)`` (``layers.{i}.{k}`` for a kind that is not
Llama's) with shape ``site_shapes()[k] = (d_in, d_out)``. The frozen weights of kind
``k`` live stacked over layers at ``params["layers"][k]`` [n_layers, d_in, d_out] (what
faithfulness compares the components with); other per-layer arrays may sit beside them in
``params["layers"]``, global ones elsewhere in ``params``.

The forward is split in three so the layer loop (scan, copy/frozen/live switch, chunks) stays
generic: ``start(params, inputs, dtype) -> (h, ctx)`` (the stream entering layer 0 and static
context every layer reads, e.g. rotary tables); ``layer(h, layer_params, ctx, linear) -> h`` (one
layer; every decomposed matmul goes through ``linear(kind, x, w)``, None: ``x @ w``);
``finish(params, h) -> output``.

A language-model target may also have sites outside the layer stack
(:data:`pd_train.decomposition.GLOBAL_KINDS`): it then defines ``global_site_shapes()``
(``{"embed_tokens": (vocab, d), "lm_head": (d, vocab)}``) and ``global_weights(params)`` (the
frozen matrices), and its ``start`` takes ``lookup(kind, tokens, table) -> rows`` (the
embedding's row lookup) and its ``finish`` a ``linear`` (the LM head's matmul), as ``layer``
takes ``linear``. ``output_loss`` names how the recon loss compares a masked
output with the clean one: ``"kl"`` (logits, KL(clean ‖ masked) over the last axis) or
``"mse"`` (activations, mean squared error).

A target may also offer ``reduced_stream(params, components, *, force) -> (target', params',
components') | None``: the same function and site values with a narrower stream (e.g. the
residual MLP's, whose stream lies in the span of a few hundred batch-independent rows). The
masked forward then runs ``target'`` on ``params'`` and ``components'`` (same kinds, sites, CI
and sources; only the stream and the matrices touching it differ). None: not reducible, or
(unless ``force``) not cheaper. See :func:`pd_train._forward.masked_forward`.

Inputs are [B, T, ...] (tokens [B, T] for a language model, features [B, 1, n_features] for a
toy model): every site sees x [B, T, d_in], so the CI functions and masks work per position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import jax

__all__ = ["Linear", "Lookup", "Target", "as_target"]

#: ``linear(kind, x [..., d_in], w [d_in, d_out]) -> [..., d_out]``.
Linear = Callable[[str, jax.Array, jax.Array], jax.Array]

#: ``lookup(kind, tokens [B, T] int, table [vocab, d]) -> rows [B, T, d]``.
Lookup = Callable[[str, jax.Array, jax.Array], jax.Array]


@runtime_checkable
class Target(Protocol):
    """A decomposable model architecture (hashable: it is part of the forwards' static spec)."""

    @property
    def kinds(self) -> tuple[str, ...]: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def output_loss(self) -> Literal["kl", "mse"]: ...

    def site_shapes(self) -> dict[str, tuple[int, int]]:
        """``(d_in, d_out)`` of each kind, in canonical order."""
        ...

    def init_params(self, *, key: jax.Array, dtype: Any = ...) -> Any:
        """Random params of the right shapes (tests, abstract shapes)."""
        ...

    def start(self, params: Any, inputs: jax.Array, dtype: Any) -> tuple[jax.Array, Any]:
        """The stream entering layer 0 [B, T, ...] and the context every layer reads."""
        ...

    def layer(
        self,
        h: jax.Array,
        layer_params: Mapping[str, jax.Array],
        ctx: Any,
        linear: Linear | None = None,
    ) -> jax.Array:
        """One layer on h; ``layer_params``: this layer's slice of ``params["layers"]``."""
        ...

    def finish(self, params: Any, h: jax.Array) -> jax.Array:
        """The output the recon loss compares: logits or activations [B, T, ...]."""
        ...


def as_target(model: Any) -> Target:
    """``model`` as a :class:`Target`: a Target as is; an architecture a registered kind owns
    (a ``LlamaConfig``, a ``GPT2Config``) as that kind's target."""
    from pd_train.targets.registry import kind_of

    if isinstance(model, Target):
        return model
    kind = kind_of(model)
    if kind is not None:
        return kind.target(model)  # type: ignore[no-any-return]
    msg = (
        f"{type(model).__name__} is not a pd target (an architecture of a registered target "
        "kind, e.g. a LlamaConfig, or a pd_train.targets.Target)"
    )
    raise TypeError(msg)
