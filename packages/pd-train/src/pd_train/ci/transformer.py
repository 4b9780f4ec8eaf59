"""``pd.ci.type: chunkwise_transformer`` and ``global_transformer``.

The decomposed layers are cut into consecutive chunks of ``blocks_per_chunk`` layers (global:
one chunk over every decomposed layer). Per chunk, an independent transformer:

1. **Input taps.** Every *distinct* input of the chunk's decomposed sites, RMS-normalized
   without a learned scale (eps = fp32 machine eps), concatenated per position → [B, T, D_in].
   Sites that read the same activation share one tap: q/k/v read the attention input, gate/up
   the MLP input. Duplicated taps would be identical vectors after normalization, so they add
   no information — only in_proj rows (W_q·x + W_k·x = (W_q + W_k)·x) — and at Llama-3-8B's
   shape per-site taps would grow D_in from 26,624 to 38,912 (+1.6 B parameters over 32
   chunks) for nothing. Kinds of one such group that cover different layers each keep a tap.
   Within a chunk the taps are ordered by kind (canonical order), then layer.
2. ``in_proj`` Linear+bias D_in → d_model.
3. ``n_blocks`` pre-norm blocks: ``h += attn(rms(h))`` — bidirectional (no mask) multi-head
   attention with RoPE on q and k (frequencies are numpy constants: no gradient), no bias,
   ``n_kv_heads`` K/V heads shared by groups of query heads — then
   ``h += W2·gelu_exact(W1·rms(h) + b1) + b2``.
4. One Linear+bias head [d_model, C] per site of the chunk → that site's CI pre-activations.

Chunks are uniform (each has the same kinds on each of its layers), so every parameter is
stacked on a leading chunk axis and the chunks run as one ``lax.scan``: the step's compile does
not grow with the number of chunks. Blocks are stacked too (``[n_chunks * n_blocks, ...]``,
chunk-major) and scanned inside a chunk, each under ``jax.checkpoint`` with ``remat``.

Parameters (``params["ci_fn"]``), each a pd-init group of per-chunk members named from the
chunk's layers (``layers.3.ci_fn.in_w``; ``layers.0-1.ci_fn.blocks.2.wq`` with two layers per
chunk; ``global.ci_fn.in_w``), so adding a layer leaves the other chunks' values unchanged:

======================  ==============================  =====================================
path                    stack shape                     init
======================  ==============================  =====================================
``in_w`` / ``in_b``     [n_chunks, D_in, d] / [.., d]   N(0, 2/D_in) / 0
``blocks.wq``, ``wo``   [n_chunks·n_blocks, d, d]       U(±1/√d)
``blocks.wk``, ``wv``   [n_chunks·n_blocks, d, d_kv]    U(±1/√d)
``blocks.w1`` / ``b1``  [.., d, mlp_hidden] / [.., h]   N(0, 2/d) / 0
``blocks.w2`` / ``b2``  [.., mlp_hidden, d] / [.., d]   N(0, 1/mlp_hidden) / 0
``out_w.{kind}``        [n_k, d, C]  (per site)         N(0, 1/d)
``out_b.{kind}``        [n_k, C]     (per site)         0
======================  ==============================  =====================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

import pd_init
from pd_train.ci._base import CIArray, CleanRun, gelu, he, lecun, rms_normalize
from pd_train.ci._registry import CIType, register_ci_type
from pd_train.config.io import ConfigError
from pd_train.config.pd import ChunkwiseTransformerCI, GlobalTransformerCI
from pd_train.decomposition import GLOBAL_KINDS, Decomposition, site_name
from pd_train.losses.chunk_vjp import scan_map
from pd_train.models import llama

if TYPE_CHECKING:
    from pd_train.census import CensusContext

__all__ = ["ChunkwiseTransformerCIType", "GlobalTransformerCIType", "TransformerCIFunction"]

#: The RMS-norm eps of the taps and the blocks: fp32 machine epsilon (torch's rms_norm default).
RMS_EPS = float(np.finfo(np.float32).eps)

#: Kinds that read the same activation of a layer (one tap per group and layer).
_SHARED_INPUT = (
    ("q_proj", "k_proj", "v_proj"),
    ("o_proj",),
    ("gate_proj", "up_proj"),
    ("down_proj",),
)

_BLOCK_PARAMS = ("wq", "wk", "wv", "wo", "w1", "b1", "w2", "b2")


@attrs.frozen(kw_only=True)
class Chunk:
    """One chunk: its decomposed layers (ascending) and the label its arrays are named by."""

    label: str
    layers: tuple[int, ...]


def _identity(x: jax.Array) -> jax.Array:
    return x


@attrs.frozen(kw_only=True)
class TransformerCIFunction:
    """The chunkwise (``blocks_per_chunk`` set) or global (``blocks_per_chunk=None``) transformer
    CI function (see the module docstring). ``decomposition`` is the one it serves;
    ``constrain(x [B, ...])`` keeps activations batch-sharded."""

    decomposition: Decomposition
    d_model: int
    n_blocks: int
    n_heads: int
    mlp_hidden: int
    n_kv_heads: int | None = None
    blocks_per_chunk: int | None = None
    rope_theta: float = 10_000.0
    remat: bool = False
    constrain: Callable[[jax.Array], jax.Array] = attrs.field(default=_identity, eq=False)

    # ------------------------------------------------------------------ structure
    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def tap_kinds(self) -> tuple[str, ...]:
        """Kinds whose site inputs are taps, canonical order: per shared-input group, the first
        decomposed kind of each distinct set of covered layers."""
        taps = []
        for group in _SHARED_INPUT:
            seen: set[tuple[int, ...]] = set()
            for kind in group:
                if kind in self.decomposition.kind_names:
                    layers = self.decomposition.kind(kind).layers
                    if layers not in seen:
                        seen.add(layers)
                        taps.append(kind)
        order = llama.KINDS
        return tuple(sorted(taps, key=order.index))

    def chunks(self) -> tuple[Chunk, ...]:
        layers = sorted({layer for k in self.decomposition.kinds for layer in k.layers})
        if self.blocks_per_chunk is None:
            return (Chunk(label="global", layers=tuple(layers)),)
        n = self.blocks_per_chunk
        out = []
        for i in range(0, len(layers), n):
            members = tuple(layers[i : i + n])
            if len(members) == 1:
                label = f"layers.{members[0]}"
            elif members == tuple(range(members[0], members[-1] + 1)):
                label = f"layers.{members[0]}-{members[-1]}"
            else:
                label = "layers." + "+".join(map(str, members))
            out.append(Chunk(label=label, layers=members))
        return tuple(out)

    def input_dim(self) -> int:
        """D_in of every chunk: Σ over tap kinds of d_in × that kind's layers per chunk."""
        n_chunks = len(self.chunks())
        return sum(
            self.decomposition.kind(k).d_in * (len(self.decomposition.kind(k).layers) // n_chunks)
            for k in self.tap_kinds()
        )

    # ------------------------------------------------------------------ the interface
    def check(self, decomposition: Decomposition, *, path: str = "pd.ci") -> None:
        """Chunkwise: ``blocks_per_chunk`` divides the decomposed layers and every decomposed
        layer has the same decomposed kinds (chunks must be uniform to stack). Neither reads
        the sites outside the layer stack (``embed_tokens``, ``lm_head``)."""
        outside = [k for k in decomposition.kind_names if k in GLOBAL_KINDS]
        if outside:
            msg = (
                f"the transformer CI functions read residual taps of the decomposed layers and "
                f"cannot serve {outside} (sites outside the layer stack); use pd.ci.type mlp, "
                "shared_mlp or vector_mlp (mlp only for embed_tokens), or leave them out"
            )
            raise ConfigError([(f"{path}.type", msg)])
        if self.blocks_per_chunk is None:
            return
        problems = []
        by_layer: dict[int, tuple[str, ...]] = {}
        for layer in range(decomposition.n_layers):
            kinds = tuple(k.kind for k in decomposition.kinds if layer in k.layers)
            if kinds:
                by_layer[layer] = kinds
        n = len(by_layer)
        if n % self.blocks_per_chunk:
            ok = [d for d in range(1, n + 1) if n % d == 0]
            msg = (
                f"got {self.blocks_per_chunk}, which does not divide the {n} decomposed layers "
                f"{sorted(by_layer)}; values that would: {ok}"
            )
            problems.append((f"{path}.blocks_per_chunk", msg))
        patterns = sorted(set(by_layer.values()), key=lambda p: -len(p))
        if len(patterns) > 1:
            first = {p: min(layer for layer, q in by_layer.items() if q == p) for p in patterns}
            a, b = patterns[0], patterns[1]
            msg = (
                f"chunkwise_transformer stacks its chunks, so every decomposed layer must "
                f"decompose the same kinds; layer {first[a]} decomposes {list(a)} but layer "
                f"{first[b]} decomposes {list(b)}. Decompose the same kinds on every layer, or "
                "use pd.ci.type: global_transformer"
            )
            problems.append(("pd.decomposition_targets", msg))
        if problems:
            raise ConfigError(problems)

    def arrays(self, decomposition: Decomposition) -> list[CIArray]:
        if decomposition != self.decomposition:
            msg = "TransformerCIFunction.arrays: built for another decomposition"
            raise ValueError(msg)
        d, hid, kv = self.d_model, self.mlp_hidden, self.kv_heads * self.head_dim
        d_in = self.input_dim()
        attn = pd_init.Uniform(low=-(d**-0.5), high=d**-0.5)
        block_specs: dict[str, tuple[tuple[int, ...], pd_init.Initializer]] = {
            "wq": ((d, d), attn),
            "wk": ((d, kv), attn),
            "wv": ((d, kv), attn),
            "wo": ((d, d), attn),
            "w1": ((d, hid), he(d)),
            "b1": ((hid,), pd_init.Zeros()),
            "w2": ((hid, d), lecun(hid)),
            "b2": ((d,), pd_init.Zeros()),
        }
        out: list[CIArray] = []
        chunks = self.chunks()
        for chunk in chunks:
            pre = f"{chunk.label}.ci_fn"
            out.append(CIArray(name=f"{pre}.in_w", path=("in_w",), shape=(d_in, d), init=he(d_in)))
            out.append(
                CIArray(name=f"{pre}.in_b", path=("in_b",), shape=(d,), init=pd_init.Zeros())
            )
        for pname in _BLOCK_PARAMS:
            shape, init = block_specs[pname]
            for chunk in chunks:
                for b in range(self.n_blocks):
                    name = f"{chunk.label}.ci_fn.blocks.{b}.{pname}"
                    out.append(CIArray(name=name, path=("blocks", pname), shape=shape, init=init))
        for layout in decomposition.kinds:
            for layer in layout.layers:
                site = site_name(layer, layout.kind)
                out.append(
                    CIArray(
                        name=f"{site}.ci_fn.out_w",
                        path=("out_w", layout.kind),
                        shape=(d, layout.C),
                        init=lecun(d),
                    )
                )
                out.append(
                    CIArray(
                        name=f"{site}.ci_fn.out_b",
                        path=("out_b", layout.kind),
                        shape=(layout.C,),
                        init=pd_init.Zeros(),
                    )
                )
        return out

    def sharding_rules(self, decomposition: Decomposition) -> dict[str, PartitionSpec | str]:
        """None: every array (stacked on chunks) takes pd-sharding's default ZeRO-1 rule — its
        largest non-leading dim that the data axes divide; a divisibility error names it."""
        del decomposition
        return {}

    # ------------------------------------------------------------------ the computation
    def causal_importance(
        self,
        params: Mapping[str, Any],
        components: Mapping[str, Mapping[str, jax.Array]],
        clean: CleanRun,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        del components
        taps = self.tap_kinds()
        dec = self.decomposition

        def site_fn(kind: str, x: jax.Array, xs: Any) -> jax.Array:
            del kind, xs
            return x

        site_xs = {k: jnp.arange(len(dec.kind(k).layers)) for k in taps}
        logits, inputs = clean.run(site_fn, site_xs)
        pre = self.apply(params, inputs)
        return logits, pre

    def apply(self, params: Mapping[str, Any], inputs: Mapping[str, jax.Array]) -> dict[str, Any]:
        """The chunk stack on the collected site inputs: ``inputs[kind]`` [n_k, B, T, d_in] for
        every tap kind -> ``{kind: [n_k, B, T, C]}`` (fp32). One ``lax.scan`` over chunks."""
        xs = dict(self.chunk_inputs(params, inputs))
        x = xs.pop("x")
        # chunk_vjp.scan_map: the plain scan's values, residuals and FLOPs; its backward starts
        # the CI parameters' gradient stacks late and no bf16 stack gets an fp32 copy on
        # XLA:CPU. The taps carry no gradient (the clean forward is frozen).
        ys = scan_map(lambda p, x: self.chunk({**p, "x": x}), xs, x)
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in ys.items()}

    def chunk_inputs(
        self, params: Mapping[str, Any], inputs: Mapping[str, jax.Array]
    ) -> dict[str, Any]:
        """Per-chunk slices with a leading chunk axis: ``x`` [n_chunks, B, T, D_in] (each tap
        RMS-normalized, ordered by kind then layer) and the chunk's params (blocks [n_chunks, n_blocks, ...], heads
        [n_chunks, sites per chunk of the kind, ...])."""
        n = params["in_w"].shape[0]
        parts = []
        for kind in self.tap_kinds():
            tap = rms_normalize(inputs[kind], RMS_EPS)  # [n_k, B, T, d], per site and position
            m, b, t, d = tap.shape
            tap = tap.reshape(n, m // n, b, t, d).transpose(0, 2, 3, 1, 4)
            parts.append(tap.reshape(n, b, t, (m // n) * d))
        x = jnp.concatenate(parts, axis=-1)

        def per_chunk(a: jax.Array) -> jax.Array:
            return a.reshape(n, a.shape[0] // n, *a.shape[1:])

        return {
            "x": x,
            "in_w": params["in_w"],
            "in_b": params["in_b"],
            "blocks": {k: per_chunk(v) for k, v in params["blocks"].items()},
            "out_w": {k: per_chunk(v) for k, v in params["out_w"].items()},
            "out_b": {k: per_chunk(v) for k, v in params["out_b"].items()},
        }

    def chunk(self, p: Mapping[str, Any]) -> dict[str, jax.Array]:
        """One chunk: ``p["x"]`` [B, T, D_in] and its params -> ``{kind: [m_k, B, T, C]}``."""
        x = self.constrain(p["x"])
        dt = x.dtype
        cos, sin = self.rope(x.shape[1], dt)
        h = x @ p["in_w"].astype(dt) + p["in_b"].astype(dt)

        def block(h: jax.Array, bp: Mapping[str, jax.Array]) -> tuple[jax.Array, None]:
            return self.block(h, bp, cos, sin), None

        body = jax.checkpoint(block) if self.remat else block
        h, _ = jax.lax.scan(body, self.constrain(h), p["blocks"])
        return {
            k: jnp.einsum("btd,mdc->mbtc", h, w.astype(dt)).astype(jnp.float32)
            + p["out_b"][k][:, None, None, :]
            for k, w in p["out_w"].items()
        }

    def rope(self, seq_len: int, dtype: Any) -> tuple[jax.Array, jax.Array]:
        """cos, sin [T, head_dim]: numpy constants (no gradient flows into the frequencies)."""
        hd = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
        freqs = np.arange(seq_len, dtype=np.float64)[:, None] * inv_freq[None, :]
        emb = np.concatenate([freqs, freqs], axis=-1).astype(np.float32)
        return jnp.asarray(np.cos(emb), dtype), jnp.asarray(np.sin(emb), dtype)

    def block(
        self, h: jax.Array, bp: Mapping[str, jax.Array], cos: jax.Array, sin: jax.Array
    ) -> jax.Array:
        """One pre-norm block on h [B, T, d]."""
        dt = h.dtype
        w = {k: v.astype(dt) for k, v in bp.items()}
        b, t, _ = h.shape
        hd, kv = self.head_dim, self.kv_heads
        a = rms_normalize(h, RMS_EPS)
        q = llama.apply_rope((a @ w["wq"]).reshape(b, t, self.n_heads, hd), cos, sin)
        k = llama.apply_rope((a @ w["wk"]).reshape(b, t, kv, hd), cos, sin)
        v = (a @ w["wv"]).reshape(b, t, kv, hd)
        q = q.reshape(b, t, kv, self.n_heads // kv, hd)
        scores = jnp.einsum("bqgrd,bkgd->bgrqk", q, k).astype(jnp.float32) / math.sqrt(hd)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)  # no mask: bidirectional
        att = jnp.einsum("bgrqk,bkgd->bqgrd", probs, v).reshape(b, t, self.d_model)
        h = self.constrain(h + att @ w["wo"])
        m = rms_normalize(h, RMS_EPS)
        h = h + gelu(m @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]
        return self.constrain(h)


class _TransformerCIType(CIType):
    """The transformers: params per chunk; they need the decomposition they serve."""

    def build(
        self,
        config: Any,
        *,
        decomposition: Decomposition | None,
        remat: bool,
        constrain: Callable[[jax.Array], jax.Array],
    ) -> TransformerCIFunction:
        if decomposition is None:
            msg = f"make_ci_function: pd.ci.type {config.type!r} needs the decomposition"
            raise ValueError(msg)
        return TransformerCIFunction(
            decomposition=decomposition,
            d_model=config.d_model,
            n_blocks=config.n_blocks,
            n_heads=config.n_heads,
            n_kv_heads=config.n_kv_heads,
            mlp_hidden=config.mlp_hidden,
            blocks_per_chunk=getattr(config, "blocks_per_chunk", None),
            rope_theta=config.rope_theta,
            remat=remat,
            constrain=constrain,
        )

    def flops(self, config: Any, fn: Any, census: CensusContext) -> None:
        acc, n = census.acc, census.tokens
        common: dict[str, Any] = {"term": "ci_fn", "part": "ci_fn"}
        n_chunks = len(fn.chunks())
        d, hid = config.d_model, config.mlp_hidden
        kv = fn.kv_heads * fn.head_dim
        nb = config.n_blocks * n_chunks
        acc.mm(n, fn.input_dim(), d, dx=False, dw=True, times=n_chunks, **common)
        for k_, n_ in ((d, d), (d, kv), (d, kv), (d, d), (d, hid), (hid, d)):
            acc.mm(n, k_, n_, dx=True, dw=True, times=nb, **common)
        acc.attention(census.batch_size, census.seq_len, config.n_heads, fn.head_dim, grad=True,
                      times=nb, **common)  # fmt: skip
        for lay in census.decomposition.kinds:
            acc.mm(n, d, lay.C, dx=True, dw=True, kind=lay.kind, times=len(lay.layers), **common)


class ChunkwiseTransformerCIType(_TransformerCIType):
    """``chunkwise_transformer``: one transformer per chunk of ``blocks_per_chunk`` layers."""

    config_cls = ChunkwiseTransformerCI


class GlobalTransformerCIType(_TransformerCIType):
    """``global_transformer``: one transformer over every decomposed site."""

    config_cls = GlobalTransformerCI


register_ci_type(ChunkwiseTransformerCIType())
register_ci_type(GlobalTransformerCIType())
