"""``--target CONFIG`` for the compile benchmarks: a real model's shapes from a pd-train config.

``CONFIG`` is a YAML file or ``builtin:NAME`` (e.g. ``builtin:smollm2-all``: SmolLM2-135M's 30
layers x 7 kinds = 210 sites, read from its GGUF's metadata). The benchmarks take from it the
architecture (:class:`~pd_train.models.llama_config.LlamaConfig`), each kind's ``(d_in, d_out)``
and C, and the decomposition targets; nothing is loaded but the metadata.
"""

from __future__ import annotations

from typing import Any


def load_target(source: str) -> tuple[Any, dict[str, tuple[int, int]], dict[str, int], Any]:
    """``(arch, shapes, c, pd)`` of config ``source``: ``shapes`` and ``c`` are keyed by the
    benchmarks' kind names (``self_attn.q_proj``, ``mlp.down_proj``, ...); every kind must be
    decomposed, with one C for all its layers."""
    from pd_train.cli import config_source
    from pd_train.decomposition import build_decomposition
    from pd_train.run import prepare

    prepared = prepare(config_source(source), for_run=False)
    arch, pd = prepared.model, prepared.config.pd
    decomposition = build_decomposition(arch, pd.decomposition_targets)
    block = {
        k: "self_attn" if k in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        for k in arch.site_shapes()
    }
    shapes = {f"{block[k]}.{k}": dims for k, dims in arch.site_shapes().items()}
    c = {f"{block[k.kind]}.{k.kind}": k.C for k in decomposition.kinds}
    partial = [k.kind for k in decomposition.kinds if len(k.layers) != arch.num_hidden_layers]
    missing = sorted(set(shapes) - set(c))
    if missing or partial:
        msg = (
            f"--target {source}: the benchmarks need every site decomposed; kinds not "
            f"decomposed: {missing}, kinds decomposed in only some layers: {partial}"
        )
        raise SystemExit(msg)
    return arch, shapes, c, pd
