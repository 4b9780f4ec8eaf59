"""The evaluation tests' tiny setup and their per-mask reference, written out by hand (shared by
test_evaluate.py and test_switches.py)."""

import functools
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import pd_sharding
from pd_train._forward import CleanRunner, site_id
from pd_train.config.pd import (
    MLPCI,
    DecompositionTarget,
    Faithfulness,
    OptimizerConfig,
    PDConfig,
)
from pd_train.evaluate import MASKS
from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig
from pd_train.run.data import Batches, TokenDataset
from pd_train.sources import sample_source
from pd_train.squash import lower_leaky_hard
from pd_train.train import Trainer

from ._tiny import FAST

TINY = LlamaConfig(
    vocab_size=32,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=2,
    num_key_value_heads=1,
)
B, T = 4, 8
THRESHOLD = 0.1
# Same HLO as the default, compiled with less LLVM optimization: faster to compile on CPU.


@functools.cache
def _setup() -> tuple[Trainer, Any, Any, Batches]:
    """A trainer whose decomposition leaves layer 0 frozen and covers different kinds in layers 1
    and 2 (so the masked forward has several segments), random params and real eval batches."""
    pd = PDConfig(
        steps=10,
        batch_size=B,
        decomposition_targets=(
            DecompositionTarget(module_pattern="layers.[12].mlp.*", C=8),
            DecompositionTarget(module_pattern="layers.2.self_attn.[qo]_proj", C=4),
        ),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=(Faithfulness(coeff=1.0),),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
        l0_threshold=THRESHOLD,
    )
    mesh = pd_sharding.make_mesh(data=1, devices=jax.devices()[:1])
    trainer = Trainer(TINY, pd, mesh=mesh, compiler_options=FAST)
    # Random params of the right shapes (pd-init's init is tested elsewhere and costs a
    # compile): wide enough that ci_lower spreads over [0, 1].
    rng = np.random.default_rng(0)
    params = jax.tree.map(
        lambda a: jnp.asarray(0.4 * rng.standard_normal(a.shape), a.dtype),
        trainer.abstract_params(),
    )
    target = llama.init_params(TINY, key=jax.random.key(0))
    tmp = Path(tempfile.mkdtemp(prefix="pd-eval-test-"))
    np.save(tmp / "tokens.npy", rng.integers(0, TINY.vocab_size, 4_000).astype(np.uint16))
    data = TokenDataset(tmp / "tokens.npy", seq_len=T, dtype="uint16", vocab_size=TINY.vocab_size)
    batches = Batches(data, batch_size=B, seed=5, process_index=0, process_count=1)
    return trainer, params, target, batches


@functools.partial(jax.jit, static_argnames=("trainer",), compiler_options=FAST)
def _reference_logits(
    trainer: Trainer, params: Any, target: Any, tokens: jax.Array, key: jax.Array
) -> dict[str, jax.Array]:
    """{mask: logits [B, T, V]} and the clean logits: the model layer by layer in Python, one
    forward per mask, the site output written as ((x@V)·m)@U + δ·(x@(W − V@U)) and the mask
    built per site from its definition."""
    model = trainer.model
    comps = params["components"]
    clean = CleanRunner(trainer.forward_spec, target, tokens)
    _, pre = trainer.ci_fn.causal_importance(params["ci_fn"], comps, clean)
    ci_lower = {k: lower_leaky_hard(v) for k, v in pre.items()}
    sites = {(s.layer, s.kind): s for s in trainer.decomposition.sites}
    cos, sin = llama.rope_cos_sin(model, T, jnp.float32)

    def site_mask(mask: str, ci: jax.Array, layer: int, kind: str) -> tuple[jax.Array, jax.Array]:
        """m [B, T, C] and δ [B, T] of one site."""
        no_delta = jnp.zeros(ci.shape[:-1])
        if mask == "ci":
            return ci, no_delta
        if mask == "ones":
            return jnp.ones_like(ci), no_delta
        if mask == "rounded":
            return (ci > THRESHOLD).astype(ci.dtype), no_delta
        r = sample_source(
            trainer.pd.sampling,
            (*ci.shape[:-1], ci.shape[-1] + 1),
            key=jax.random.fold_in(key, site_id(layer, kind)),
        )
        return ci + (1 - ci) * r[..., :-1], r[..., -1]

    out = {"clean": llama.forward(target, tokens, model)}
    for mask in MASKS:
        h = llama.embed(target, tokens)
        for layer in range(model.num_hidden_layers):

            def linear(
                kind: str, x: jax.Array, w: jax.Array, layer: int = layer, mask: str = mask
            ) -> jax.Array:
                site = sites.get((layer, kind))
                if site is None:
                    return x @ w
                v, u = comps[kind]["V"][site.index], comps[kind]["U"][site.index]
                m, delta = site_mask(mask, ci_lower[kind][site.index], layer, kind)
                return ((x @ v) * m) @ u + delta[..., None] * (x @ (w - v @ u))

            layer_params = jax.tree.map(lambda a, i=layer: a[i], target["layers"])
            h = llama.decoder_layer(h, layer_params, cos, sin, model, linear)
        out[mask] = llama.unembed(target, h, model)
    return out


def _ce(logits: np.ndarray, tokens: np.ndarray) -> float:
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp[:, :-1], tokens[:, 1:, None], -1).mean())


def _kl(clean: np.ndarray, masked: np.ndarray) -> float:
    lp = clean - np.log(np.exp(clean).sum(-1, keepdims=True))
    lq = masked - np.log(np.exp(masked).sum(-1, keepdims=True))
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())
