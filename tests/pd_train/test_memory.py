"""Memory per device: what the eval and the train step materialize stays bounded.

XLA's ``memory_analysis()`` of small compiled programs stands in for the production topology
(Llama-3-8B on 64 devices, docs/findings.md section 8), where the same structures cost tens of
GiB per device.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np

import pd_sharding
from pd_train._forward import CleanRunner
from pd_train.config.pd import (
    MLPCI,
    DecompositionTarget,
    Faithfulness,
    ImportanceMinimality,
    OptimizerConfig,
    PDConfig,
    StochasticRecon,
)
from pd_train.evaluate import HIST_BINS, ci_histogram
from pd_train.losses import l0
from pd_train.models import llama
from pd_train.models.llama_config import LlamaConfig
from pd_train.squash import lower_leaky_hard
from pd_train.train import Trainer

from ._tiny import FAST

# Same HLO as the default, compiled with less LLVM optimization: faster to compile on CPU.


def test_ci_histogram_never_materializes_a_compare_against_all_edges() -> None:
    """The histogram of 4 sites' CI [4, 1, 1024, 4096] (64 MiB fp32) needs less temporary
    memory than its input: the broadcast compare against all edges was materialized by XLA:CPU
    as int32 [4, B·T·C, HIST_BINS], 20× the input (1282 MiB here)."""
    ci = jax.ShapeDtypeStruct((4, 1, 1024, 4096), jnp.float32)
    compiled = jax.jit(ci_histogram).lower(ci).compile()
    memory = compiled.memory_analysis()
    assert compiled.out_info.shape == (4, HIST_BINS)
    assert memory.temp_size_in_bytes < memory.argument_size_in_bytes


def test_the_lm_head_is_gathered_once_per_step() -> None:
    """Every forward of the train step (clean, masked, their backward) shares one gathered LM
    head: left FSDP-sharded, each unembed gathered its own (3 here; 6 live at once, 2 GiB each,
    at Llama-3-8B on 64 devices)."""
    tiny = LlamaConfig(
        vocab_size=256,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    pd = PDConfig(
        steps=20,
        batch_size=8,
        decomposition_targets=(DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=8),),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=(
            Faithfulness(coeff=100.0),
            ImportanceMinimality(coeff=1e-3),
            StochasticRecon(coeff=1.0),
        ),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
    )
    mesh = pd_sharding.make_mesh(data=8, devices=jax.devices()[:8])
    trainer = Trainer(tiny, pd, mesh=mesh, compiler_options=FAST)
    compiled = trainer.lower_step(batch_size=8, seq_len=8, target_dtype=jnp.float32).compile()
    gathers = re.findall(r"= f32\[16,256\]\{[^}]*\} all-gather", compiled.as_text())
    assert len(gathers) == 1


def test_the_step_s_per_site_l0_equals_the_all_sites_formula() -> None:
    """The train step computes L0 one site at a time (XLA:CPU materialized the compare over every
    site's CI at once as an fp32 buffer alive at the step's peak): the values equal
    :func:`pd_train.losses.l0` over all sites at once, exactly."""
    from ._tiny import TINY

    tiny = TINY
    pd = PDConfig(
        steps=20,
        batch_size=2,
        decomposition_targets=(
            DecompositionTarget(module_pattern="layers.*.mlp.down_proj", C=8),
            DecompositionTarget(module_pattern="layers.1.self_attn.q_proj", C=4),
        ),
        ci=MLPCI(hidden_dims=(4,)),
        loss_metrics=(ImportanceMinimality(coeff=1.0),),
        components=OptimizerConfig(lr=1e-3),
        ci_fn=OptimizerConfig(lr=1e-3),
        l0_threshold=0.2,
    )
    trainer = Trainer(tiny, pd, compiler_options=FAST)
    params = trainer.init_params(key=jax.random.key(0))
    target = llama.init_params(tiny, key=jax.random.key(1))
    tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, tiny.vocab_size)

    comps = jax.tree.map(lambda a: a.astype(trainer.compute_dtype), params["components"])
    clean = CleanRunner(trainer.forward_spec, target, tokens)
    _, pre = trainer.ci_fn.causal_importance(params["ci_fn"], comps, clean)
    want = l0({k: lower_leaky_hard(v) for k, v in pre.items()}, pd.l0_threshold)
    _, aux = trainer.loss(params, target, tokens, jnp.int32(3), jax.random.key(4))
    assert set(aux["l0"]) == set(want)
    for kind in want:
        assert aux["l0"][kind].shape == want[kind].shape
        np.testing.assert_array_equal(np.asarray(aux["l0"][kind]), np.asarray(want[kind]))
        assert float(want[kind].max()) > 0.0  # some components above the threshold
