"""Print the layout table and the memory tables that pd-sharding's README shows.

    python packages/pd-sharding/scripts/readme_tables.py

Shapes are Llama-3-8B's and its production decomposition (C per kind: q/k 2048, v/o 4096,
gate/up 8192, down 10240; 32 layers). Nothing is allocated: the meshes are AbstractMeshes.
tests/pd_sharding/test_readme.py checks that the README shows exactly this output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import pd_sharding as ps

LAYERS, HIDDEN, VOCAB, BATCH, SEQ = 32, 4096, 128256, 128, 512
KINDS = {  # kind: (d_in, d_out, C)
    "q_proj": (4096, 4096, 2048),
    "k_proj": (4096, 1024, 2048),
    "v_proj": (4096, 1024, 4096),
    "o_proj": (4096, 4096, 4096),
    "gate_proj": (4096, 14336, 8192),
    "up_proj": (4096, 14336, 8192),
    "down_proj": (14336, 4096, 10240),
}
MESHES = {8: (1, 8), 32: (4, 8), 128: (16, 8)}  # devices: (replicate = nodes, data = GPUs/node)


def _shape(s: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in s) + "]"


def _spec(spec: jax.sharding.PartitionSpec) -> str:
    return "P(" + ", ".join(repr(e) if e is not None else "None" for e in spec) + ")"


def layout_table(replicate: int = 2, data: int = 4) -> str:
    layout = ps.Zero1Layout(ps.abstract_mesh(replicate=replicate, data=data))
    ci_leaf = (LAYERS, 2048, 16)  # an illustrative stacked CI-function weight
    rows = [
        ("V (master, Adam mu/nu)", "v", (LAYERS, 4096, 2048), layout.v),
        ("U (master, Adam mu/nu)", "u", (LAYERS, 2048, 1024), layout.u),
        ("V down_proj", "v", (LAYERS, 14336, 10240), layout.v),
        ("U down_proj", "u", (LAYERS, 10240, 4096), layout.u),
        ("CI-function leaf", "ci_params", ci_leaf, None),
        ("target q_proj", "target_weight", (LAYERS, 4096, 4096), None),
        ("target k_proj", "target_weight", (LAYERS, 4096, 1024), None),
        ("target down_proj", "target_weight", (LAYERS, 14336, 4096), None),
        ("embed_tokens", "embedding", (VOCAB, HIDDEN), layout.embedding),
        ("lm_head", "lm_head", (HIDDEN, VOCAB), layout.lm_head),
        ("RMSNorm scales", "norm", (LAYERS, HIDDEN), layout.norm),
        ("batch (token ids)", "batch", (BATCH, SEQ), layout.batch),
        ("Adam count, hyperparams", "replicated", (), None),
    ]
    lines = [
        f"| role | method | shape | PartitionSpec ({replicate}×{data} mesh) | block per device |",
        "|---|---|---|---|---|",
    ]
    for role, method, shape, fn in rows:
        if method == "ci_params":
            sharding = layout.ci_params({"w": jax.ShapeDtypeStruct(shape, jnp.float32)})["w"]
        elif method == "target_weight":
            sharding = layout.target_weight(shape, name=role, hidden_size=HIDDEN)
        elif method == "replicated":
            sharding = layout.replicated()
        else:
            assert fn is not None
            sharding = fn(shape, name=role)
        block = sharding.shard_shape(shape)
        lines.append(
            f"| {role} | `{method}` | {_shape(shape)} | `{_spec(sharding.spec)}` | {_shape(block)} |"
        )
    return "\n".join(lines)


def production_groups(layout: ps.Zero1Layout) -> list[ps.ArrayGroup]:
    """V/U per kind (fp32, trainable) and the frozen bf16 target."""
    groups = []
    for kind, (d_in, d_out, c) in KINDS.items():
        v = jax.ShapeDtypeStruct((LAYERS, d_in, c), jnp.float32)
        u = jax.ShapeDtypeStruct((LAYERS, c, d_out), jnp.float32)
        groups.append(
            ps.ArrayGroup(
                name=f"V/U {kind}",
                arrays={"V": v, "U": u},
                shardings={"V": layout.v(v.shape, name="V"), "U": layout.u(u.shape, name="U")},
            )
        )
    bf16 = jnp.bfloat16
    target = {kind: jax.ShapeDtypeStruct((LAYERS, i, o), bf16) for kind, (i, o, _) in KINDS.items()}
    target_sh = {
        k: layout.target_weight(a.shape, name=k, hidden_size=HIDDEN) for k, a in target.items()
    }
    target["embed_tokens"] = jax.ShapeDtypeStruct((VOCAB, HIDDEN), bf16)
    target_sh["embed_tokens"] = layout.embedding((VOCAB, HIDDEN), name="embed_tokens")
    target["lm_head"] = jax.ShapeDtypeStruct((HIDDEN, VOCAB), bf16)
    target_sh["lm_head"] = layout.lm_head((HIDDEN, VOCAB), name="lm_head")
    for norm, shape in [("norms", (2 * LAYERS, HIDDEN)), ("final_norm", (HIDDEN,))]:
        target[norm] = jax.ShapeDtypeStruct(shape, bf16)
        target_sh[norm] = layout.norm(shape, name=norm)
    groups.append(
        ps.ArrayGroup(
            name="target (frozen, bf16)", arrays=target, shardings=target_sh, trainable=False
        )
    )
    return groups


def memory_tables() -> str:
    out = []
    for n, (replicate, data) in MESHES.items():
        layout = ps.Zero1Layout(ps.abstract_mesh(replicate=replicate, data=data))
        rows = ps.memory_estimate(production_groups(layout), layout.mesh)
        title = f"{n} devices (replicate={replicate} × data={data})"
        out.append(ps.memory_table(rows, title=title))
    return "\n\n".join(out)


if __name__ == "__main__":
    print("<!-- layout table -->")
    print(layout_table())
    print()
    print("<!-- memory tables -->")
    print(memory_tables())
