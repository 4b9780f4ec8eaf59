"""The loss-term and CI-type registries: a term and a CI type defined in this module only,
registered, structured from plain config data, trained for a step and counted by the census;
an unregistered ``type`` refused at config time by field path."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pd_init
from pd_train.ci import (
    CI_TYPES,
    CIType,
    ParamSpec,
    SiteCIFunction,
    make_ci_function,
    register_ci_type,
)
from pd_train.config import io as _config_io
from pd_train.config.pd import CIConfig, ConfigError, LossMetric, PDConfig
from pd_train.decomposition import KindLayout
from pd_train.flops import CensusContext, step_census
from pd_train.losses import LOSS_TERMS, LossTerm, TermInputs, register_loss_term
from pd_train.models import llama
from pd_train.train import Trainer, step_key

from ._tiny import FAST, TINY

B, T = 4, 8


# ---------------------------------------------------------------- a dummy loss term
@attrs.frozen(kw_only=True)
class SquaredV(LossMetric):
    """Σ_sites ‖V‖² / Σ_sites numel(V): a term no built-in computes."""

    type: Literal["test_squared_v"] = "test_squared_v"
    coeff: float = attrs.field(validator=_config_io.non_negative())


class SquaredVTerm(LossTerm):
    config_cls = SquaredV
    needs_ci = False

    def value(
        self,
        config: Any,
        inputs: TermInputs,
        *,
        plan: Any,
        hp: Mapping[str, jax.Array],
        key: jax.Array,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        vs = [c["V"].astype(jnp.float32) for c in inputs.params["components"].values()]
        total = sum(jnp.sum(v * v) for v in vs)
        numel = sum(v.size for v in vs)
        return total / numel, {"test/v_numel": jnp.float32(numel)}

    def flops(self, config: Any, census: CensusContext, *, plan: Any) -> None:
        numel = sum(len(k.layers) * k.d_in * k.C for k in census.decomposition.kinds)
        census.acc.flat(2.0 * numel, term=config.type, part="squares")


# ---------------------------------------------------------------- a dummy CI type
@attrs.frozen(kw_only=True)
class BiasCI(CIConfig):
    """Per site, CI pre-activations ``scale · (x@V) + b`` with learned b [C] (and a fixed
    ``scale``)."""

    type: Literal["test_bias"] = "test_bias"
    scale: float = 0.5


@attrs.frozen(kw_only=True)
class BiasCIFunction(SiteCIFunction):
    scale: float
    remat: bool = False

    def param_specs(self, layout: KindLayout) -> dict[str, ParamSpec]:
        return {"b": ParamSpec(shape=(layout.C,), init=pd_init.Normal(std=1.0))}

    def site_fn(self, params: Mapping[str, jax.Array], x: jax.Array, V: jax.Array) -> jax.Array:
        return (self.scale * (x @ V) + params["b"].astype(x.dtype)).astype(jnp.float32)


class BiasCIType(CIType):
    config_cls = BiasCI

    def build(self, config: Any, *, decomposition: Any, remat: bool, constrain: Any) -> Any:
        return BiasCIFunction(scale=config.scale, remat=remat)

    def flops(self, config: Any, fn: Any, census: CensusContext) -> None:
        for lay in census.decomposition.kinds:
            census.acc.mm(census.tokens, lay.d_in, lay.C, term="ci_fn", part="ci_fn",
                          kind=lay.kind, dx=False, dw=False, times=len(lay.layers))  # fmt: skip


@pytest.fixture(autouse=True, scope="module")
def _registered() -> Iterator[None]:
    """The dummy members are registered for this module's tests only (registered at import,
    they would leak into every later walk of the schema: the config reference, the field
    classification), and removed again after them."""
    from pd_train.config.io import tagged_family

    register_loss_term(SquaredVTerm())
    register_ci_type(BiasCIType())
    try:
        yield
    finally:
        LOSS_TERMS.pop("test_squared_v", None)
        CI_TYPES.pop("test_bias", None)
        tagged_family(LossMetric).members.pop("test_squared_v", None)
        tagged_family(CIConfig).members.pop("test_bias", None)


# ---------------------------------------------------------------- config data
@attrs.frozen(kw_only=True)
class _Root:
    pd: PDConfig


def _raw(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "steps": 10,
        "batch_size": B,
        "decomposition_targets": [{"module_pattern": "layers.*.mlp.*", "C": 4}],
        "ci": {"type": "mlp", "hidden_dims": [4]},
        "loss_metrics": [
            {"type": "faithfulness", "coeff": 1.0},
            {"type": "importance_minimality", "coeff": 1e-3},
            {"type": "stochastic_recon", "coeff": 1.0},
        ],
        "components": {"lr": 1e-2},
        "ci_fn": {"lr": 1e-2},
    }
    raw.update(overrides)
    return raw


def _pd(**overrides: Any) -> PDConfig:
    return _config_io.structure({"pd": _raw(**overrides)}, _Root).pd


@functools.cache
def _target() -> Any:
    return llama.init_params(TINY, key=jax.random.key(0), dtype=jnp.float32)


def _tokens() -> jax.Array:
    return jnp.asarray(np.random.default_rng(0).integers(0, TINY.vocab_size, (B, T)), jnp.int32)


def test_registered_members_are_listed_and_structured() -> None:
    assert LOSS_TERMS["test_squared_v"].config_cls is SquaredV
    assert CI_TYPES["test_bias"].config_cls is BiasCI
    pd = _pd(
        ci={"type": "test_bias", "scale": 0.25},
        loss_metrics=[
            {"type": "faithfulness", "coeff": 1.0},
            {"type": "test_squared_v", "coeff": 2},
        ],
    )
    assert pd.ci == BiasCI(scale=0.25)
    assert pd.loss_metrics[1] == SquaredV(coeff=2.0)
    # Round trip through plain data (what a run dir's config.yaml holds).
    again = _config_io.structure(_config_io.unstructure(_Root(pd=pd)), _Root)
    assert again.pd == pd
    assert _config_io.unstructure(pd)["loss_metrics"][1] == {"type": "test_squared_v", "coeff": 2.0}


@pytest.mark.parametrize(
    ("override", "path", "value"),
    [
        (
            {
                "loss_metrics": [
                    {"type": "faithfulness", "coeff": 1.0},
                    {"type": "kl", "coeff": 1.0},
                    {"type": "test_nope", "coeff": 1.0},
                ]
            },
            "pd.loss_metrics[2].type",
            "'test_nope'",
        ),
        ({"ci": {"type": "test_unknown_ci"}}, "pd.ci.type", "'test_unknown_ci'"),
    ],
)
def test_an_unregistered_type_is_refused_by_field_path(
    override: dict[str, Any], path: str, value: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _pd(**override)
    problems = dict(info.value.problems)
    assert path in problems, info.value.problems
    message = problems[path]
    assert message.startswith(f"got {value}; must be one of"), message
    # The registered types are listed, the test module's own among them.
    registry = LOSS_TERMS if "loss_metrics" in path else CI_TYPES
    for tag in registry:
        assert repr(tag) in message, (tag, message)


def test_a_dummy_loss_term_trains_a_step() -> None:
    pd = _pd(
        loss_metrics=[
            {"type": "faithfulness", "coeff": 3.0},
            {"type": "test_squared_v", "coeff": 0.5},
        ]
    )
    trainer = Trainer(TINY, pd, compiler_options=FAST)
    state = trainer.init_state(key=jax.random.key(1))
    state_kinds = list(state.params["components"])
    vs = [np.asarray(c["V"], np.float64) for c in state.params["components"].values()]
    expected_v = sum(float(np.sum(v * v)) for v in vs) / sum(v.size for v in vs)
    target = _target()
    w = {
        k: np.asarray(target["layers"][k], np.float64)
        for k in ("gate_proj", "up_proj", "down_proj")
    }
    faith, numel = 0.0, 0
    for kind, comps in state.params["components"].items():
        prod = np.asarray(comps["V"], np.float64) @ np.asarray(comps["U"], np.float64)
        faith += float(np.sum((w[kind] - prod) ** 2))
        numel += w[kind].size
    faith /= numel
    new, metrics = trainer.train_step(state, target, _tokens(), step_key(jax.random.key(2), 0))
    host = trainer.metrics_to_host(metrics)
    np.testing.assert_allclose(host["loss/test_squared_v"], expected_v, rtol=1e-5)
    np.testing.assert_allclose(host["loss/faithfulness"], faith, rtol=1e-4)
    np.testing.assert_allclose(host["loss/total"], 3.0 * faith + 0.5 * expected_v, rtol=1e-4)
    assert host["test/v_numel"] == sum(v.size for v in vs)
    assert int(new.step) == 1
    # The step moved V (the dummy term's gradient reached it; the old state was donated).
    for kind, v in zip(state_kinds, vs, strict=True):
        assert not np.allclose(np.asarray(new.params["components"][kind]["V"]), v)
    # The census counts the term by its own description.
    census = step_census(TINY, pd, seq_len=T)
    by_term = census.by("term")
    n_v = sum(len(k.layers) * k.d_in * k.C for k in trainer.decomposition.kinds)
    assert by_term["test_squared_v"] == 2.0 * n_v


def test_a_dummy_ci_type_trains_a_step() -> None:
    pd = _pd(ci={"type": "test_bias", "scale": 0.5})
    fn = make_ci_function(pd.ci)
    assert isinstance(fn, BiasCIFunction) and fn.scale == 0.5
    trainer = Trainer(TINY, pd, compiler_options=FAST)
    state = trainer.init_state(key=jax.random.key(1))
    assert set(state.params["ci_fn"]) == {"gate_proj", "up_proj", "down_proj"}
    assert state.params["ci_fn"]["down_proj"]["b"].shape == (2, 4)
    b0 = np.asarray(state.params["ci_fn"]["down_proj"]["b"])
    new, metrics = trainer.train_step(state, _target(), _tokens(), step_key(jax.random.key(2), 0))
    host = trainer.metrics_to_host(metrics)
    assert all(np.isfinite(v) for v in host.values())
    assert host["grad_norm/ci_fn"] > 0
    assert not np.allclose(b0, np.asarray(new.params["ci_fn"]["down_proj"]["b"]))
    # Census: the CI type's own count (forward only: dx = dw = False) and its parameter count
    # (2·C per kind of 2 layers) in the optimizer's FLOPs.
    census = step_census(TINY, pd, seq_len=T)
    ci_entries = [e for e in census.entries if e.term == "ci_fn"]
    expected = sum(2.0 * B * T * k.d_in * k.C * len(k.layers) for k in trainer.decomposition.kinds)
    assert sum(e.forward for e in ci_entries) == expected
    assert sum(e.backward for e in ci_entries) == 0.0
    ci_opt = [e for e in census.entries if e.term == "optimizer" and e.kind == "ci_fn"]
    assert sum(e.forward for e in ci_opt) == 14 * 3 * 2 * 4
