"""The production config (Llama-3-8B, 224 sites) lowers every jit a compile probe compiles, on
8 simulated devices, without allocating anything. Lowering is what broke first at this size: the
faithfulness divisor (~7e9 elements) overflowed the int32 a Python int is traced as."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from pd_train import run as runner
from pd_train.run.distributed import Placement

PRODUCTION = Path(__file__).resolve().parents[2] / "configs" / "llama8b-full32L.yaml"


@pytest.mark.slow
def test_production_config_lowers_every_jit_on_eight_devices() -> None:
    prepared = runner.prepare(PRODUCTION, for_run=False)
    rt = runner.start_runtime(prepared, Placement())
    trainer, config = rt.trainer, prepared.config
    assert trainer.layout is not None and trainer.layout.mesh.size == 8
    numel = sum(
        len(k.layers) * k.d_in * k.d_out for k in trainer.decomposition.kinds
    )  # the faithfulness divisor
    assert numel > 2**31

    key = jax.eval_shape(lambda: jax.random.key(0))
    key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=trainer.layout.replicated())
    # The production recipe has persistent PGD: its sources' init jits are listed too.
    inits = trainer.init_lowerings(key=key)
    assert [name for name, _ in inits] == ["init_params", "init_sources", "init_sources_opt"]
    assert all(lower() is not None for _, lower in inits)
    assert trainer.lower_opt_init() is not None
    assert config.pd.faithfulness_warmup.steps > 0
    warmup = trainer.lower_warmup(jnp.bfloat16)
    _, _, value = warmup.out_info  # (components, opt_state, faithfulness)
    assert (value.shape, value.dtype) == ((), jnp.float32)
    step = trainer.lower_step(
        batch_size=config.pd.batch_size, seq_len=config.data.seq_len, target_dtype=jnp.bfloat16
    )
    assert "stablehlo" in step.as_text()[:2000]
