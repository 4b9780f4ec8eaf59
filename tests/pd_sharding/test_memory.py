"""Memory estimate against hand arithmetic, for toy meshes and the Llama-8B production shape."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import pd_sharding as ps

# Llama-3-8B production decomposition (DESIGN.md): (d_in, d_out, C) per kind, 32 layers
LAYERS = 32
KINDS = {
    "q_proj": (4096, 4096, 2048),
    "k_proj": (4096, 1024, 2048),
    "v_proj": (4096, 1024, 4096),
    "o_proj": (4096, 4096, 4096),
    "gate_proj": (4096, 14336, 8192),
    "up_proj": (4096, 14336, 8192),
    "down_proj": (14336, 4096, 10240),
}
VU_PARAMS = 18_320_719_872  # Σ_kinds 32 · C · (d_in + d_out), by hand


def _components(layout):
    groups = []
    for kind, (d_in, d_out, c) in KINDS.items():
        v = jax.ShapeDtypeStruct((LAYERS, d_in, c), jnp.float32)
        u = jax.ShapeDtypeStruct((LAYERS, c, d_out), jnp.float32)
        groups.append(
            ps.ArrayGroup(
                name=kind,
                arrays={"V": v, "U": u},
                shardings={
                    "V": layout.v(v.shape, name=f"{kind}.V"),
                    "U": layout.u(u.shape, name=f"{kind}.U"),
                },
            )
        )
    return groups


def test_production_constants() -> None:
    assert LAYERS * sum(c for _, _, c in KINDS.values()) == 1_245_184
    assert LAYERS * sum(c * (i + o) for i, o, c in KINDS.values()) == VU_PARAMS


@pytest.mark.parametrize(("replicate", "data"), [(1, 8), (4, 8), (16, 8), (1, 32), (2, 64)])
def test_production_estimate_matches_hand_arithmetic(replicate: int, data: int) -> None:
    n = replicate * data
    layout = ps.Zero1Layout(ps.abstract_mesh(replicate=replicate, data=data))
    rows = ps.memory_estimate(_components(layout), layout.mesh)
    total = rows[-1]
    assert total.group == "total" and total.params == VU_PARAMS
    # fp32 master + 2 Adam moments = 12 bytes per parameter, ÷ devices; grads 4 bytes ÷ devices
    assert total.state_bytes == 12 * VU_PARAMS // n
    assert total.param_bytes == 4 * VU_PARAMS // n
    assert total.opt_bytes == 8 * VU_PARAMS // n
    assert total.grad_bytes == 4 * VU_PARAMS // n
    assert total.total_bytes == 16 * VU_PARAMS // n
    down = next(r for r in rows if r.group == "down_proj")
    assert down.params == 32 * 10240 * (14336 + 4096)
    assert down.state_bytes == 12 * down.params // n
    # what these mean: 219.8 GB of state overall; 27.5 GB per device on 8, 1.72 GB on 128
    assert round(12 * VU_PARAMS / 1e9, 1) == 219.8
    if n == 8:
        assert round(total.state_bytes / 1e9, 2) == 27.48


def test_tensor_axis_and_frozen_and_replicated_groups() -> None:
    mesh = {"replicate": 2, "data": 2, "tensor": 2}
    layout = ps.Zero1Layout(ps.abstract_mesh(replicate=2, data=2, tensor=2))
    v = jax.ShapeDtypeStruct((4, 64, 16), jnp.float32)
    w = jax.ShapeDtypeStruct((4, 64, 32), jnp.bfloat16)
    norm = jax.ShapeDtypeStruct((4, 64), jnp.float32)
    rows = ps.memory_estimate(
        [
            ps.ArrayGroup(name="V", arrays=v, shardings=layout.v(v.shape, name="V").spec),
            ps.ArrayGroup(
                name="target",
                arrays={"w": w, "norm": norm},
                shardings={
                    "w": layout.target_weight(w.shape, name="w", hidden_size=64),
                    "norm": layout.norm(norm.shape, name="n"),
                },
                trainable=False,
            ),
        ],
        mesh,
    )
    v_row, target, total = rows
    assert v_row.param_bytes == 4 * 4096 // 8  # d_in over 4 data shards, C over 2 tensor
    assert v_row.opt_bytes == 2 * v_row.param_bytes and v_row.grad_bytes == v_row.param_bytes
    # bf16 target FSDP over 4 data shards (replicated over tensor); fp32 norm whole everywhere
    assert target.param_bytes == 2 * 4 * 64 * 32 // 4 + 4 * 4 * 64
    assert target.grad_bytes == target.opt_bytes == 0
    assert total.total_bytes == v_row.total_bytes + target.param_bytes


def test_table_renders_rows() -> None:
    layout = ps.Zero1Layout(ps.abstract_mesh(data=8))
    table = ps.memory_table(ps.memory_estimate(_components(layout), layout.mesh), title="8 devices")
    lines = table.splitlines()
    assert lines[0] == "**8 devices**"
    assert lines[2].startswith("| group | params |")
    assert len(lines) == 4 + len(KINDS) + 1
    total = lines[-1].split("|")
    assert total[1].strip() == "total" and total[2].strip() == f"{VU_PARAMS:,}"
    assert total[5].strip() == f"{12 * VU_PARAMS / 8 / 2**30:.2f}"


def test_estimate_rejects_mismatched_groups() -> None:
    layout = ps.Zero1Layout(ps.abstract_mesh(data=8))
    v = jax.ShapeDtypeStruct((4, 12, 16), jnp.float32)
    with pytest.raises(ps.ShardingError, match=r"dim 1 \(size 12\)"):
        ps.memory_estimate(
            [
                ps.ArrayGroup(
                    name="V",
                    arrays=v,
                    shardings=jax.sharding.PartitionSpec(None, ("replicate", "data")),
                )
            ],
            layout.mesh,
        )
    with pytest.raises(ValueError, match="2 arrays but 1 shardings"):
        ps.memory_estimate(
            [
                ps.ArrayGroup(
                    name="V", arrays=[v, v], shardings=[layout.v((4, 16, 16), name="V").spec]
                )
            ],
            layout.mesh,
        )
