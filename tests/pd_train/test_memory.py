"""Memory per device: what the eval and the train step materialize stays bounded.

XLA's ``memory_analysis()`` of small compiled programs stands in for the production topology
(Llama-3-8B on 64 devices, docs/findings.md section 8), where the same structures cost tens of
GiB per device.
"""

import jax
import jax.numpy as jnp

from pd_train.evaluate import HIST_BINS, ci_histogram


def test_ci_histogram_never_materializes_a_compare_against_all_edges() -> None:
    """The histogram of 4 sites' CI [4, 1, 1024, 4096] (64 MiB fp32) needs less temporary
    memory than its input: the broadcast compare against all edges was materialized by XLA:CPU
    as int32 [4, B·T·C, HIST_BINS], 20× the input (1282 MiB here)."""
    ci = jax.ShapeDtypeStruct((4, 1, 1024, 4096), jnp.float32)
    compiled = jax.jit(ci_histogram).lower(ci).compile()
    memory = compiled.memory_analysis()
    assert compiled.out_info.shape == (4, HIST_BINS)
    assert memory.temp_size_in_bytes < memory.argument_size_in_bytes
