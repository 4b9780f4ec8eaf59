"""The fixed evaluation sources make the masks the evaluation claims."""

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.sources import masks, sample_source


def test_zeros_source_gives_ci_masks_and_no_delta() -> None:
    ci = jnp.asarray([[0.0, 0.3, 1.0]])
    m, delta = masks(ci, sample_source("zeros", (1, 4), key=jax.random.key(0)))
    np.testing.assert_array_equal(m, ci)
    np.testing.assert_array_equal(delta, [0.0])


def test_components_ones_source_gives_all_components_and_no_delta() -> None:
    ci = jnp.asarray([[0.0, 0.3, 1.0]])
    m, delta = masks(ci, sample_source("components_ones", (1, 4), key=jax.random.key(0)))
    np.testing.assert_array_equal(m, [[1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(delta, [0.0])
