"""Which config fields change the compiled programs (*structural*) and which are *values*.

Every field of the run config (:class:`pd_train.config.run.Config`) is in exactly one of three
lists (a test walks the schema and fails on a field in none or in two, so a new field must be
classified here):

* **structural** — the field changes a program: an array's shape, the sites, C, which loss terms
  run, the CI architecture, the mesh, dtypes, remat, chunking, loop trip counts (``n_steps`` of
  fresh PGD, draws per term). Changing it recompiles, by design.
* **value** — a scalar hyperparameter that changes no shape and no structure: coefficients,
  learning rates and their schedules, p and its anneal, PGD step sizes and lrs, step counts,
  warmup lengths, thresholds, the seed. DESIGN decision 9: these enter the programs as data, so
  changing one loads every program from the compile cache (:data:`CONSTANT_VALUE_FIELDS`,
  the ones still trace-time constants of some program, is empty).
  Some values are structural at one point (``switch``): ``null`` turns clipping off, ``0``
  drops a warmup; crossing that point recompiles.
* **outside** — never reaches a compiled program: names, paths, cadences, the compile cache's
  own settings, SLURM, tracking.

Fields are named by their *schema path*: ``[*]`` for every item of a list
(``pd.decomposition_targets[*].C``), ``[type=NAME]`` for the member of a tagged union
(``pd.loss_metrics[type=importance_minimality].pnorm_end``). :func:`schema_path` turns the path
of a field in a concrete config (``pd.loss_metrics[1].pnorm_end``) into it. The table in
docs/hyperparameters.md is :func:`markdown_table` (a test checks they agree).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import attrs

__all__ = [
    "CONSTANT_VALUE_FIELDS",
    "DATA_VALUE_FIELDS",
    "FIELDS",
    "FieldClass",
    "classify",
    "config_leaves",
    "leaf_class",
    "markdown_table",
    "schema_path",
    "schema_paths",
    "split_leaves",
    "structural_fields",
    "structural_leaves",
    "value_fields",
]

Kind = Literal["structural", "value", "outside"]


@dataclass(frozen=True)
class FieldClass:
    """One schema path's class. ``switch``: for a value, the setting that is structural
    (``"null"``: null versus any number, ``"zero"``: zero versus non-zero)."""

    path: str
    kind: Kind
    why: str
    switch: Literal["null", "zero"] | None = None


def _group(kind: Kind, why: str, *paths: str, switch: Any = None) -> list[FieldClass]:
    return [FieldClass(p, kind, why, switch) for p in paths]


_LOSS = "pd.loss_metrics[type={}]"
_IMP = _LOSS.format("importance_minimality")
_SL0 = _LOSS.format("smooth_l0_importance_minimality")
_PGD = _LOSS.format("pgd_recon")
_PPGD = _LOSS.format("persistent_pgd_recon")
_CT = "pd.ci[type=chunkwise_transformer]"
_GT = "pd.ci[type=global_transformer]"
_OPT_VALUES = ("lr", "warmup_steps", "hold_steps", "final_val_frac", "decay_steps", "weight_decay")
_ADAM = ("b1", "b2", "eps")

#: The classification, in the order of the docs' table.
FIELDS: tuple[FieldClass, ...] = tuple(
    [
        # ---- structural: shapes and sites
        *_group("structural", "the batch's and the activations' shapes", "pd.batch_size"),
        *_group("structural", "the sequence length: every activation's shape", "data.seq_len"),
        *_group(
            "structural",
            "which sites are decomposed and their C: the shapes of V, U, CI and sources",
            "pd.decomposition_targets[*].module_pattern",
            "pd.decomposition_targets[*].C",
        ),
        *_group(
            "structural",
            "the target's architecture (the checkpoint's config.json when null): every shape",
            "target.architecture",
        ),
        *_group("structural", "the target weights' dtype", "target.dtype"),
        *_group("structural", "the target's family (its forward and loader)", "target.type"),
        # ---- structural: the CI function
        *_group(
            "structural",
            "the CI function's architecture",
            "pd.ci[type=mlp].hidden_dims",
            "pd.ci[type=shared_mlp].hidden_dims",
            "pd.ci[type=vector_mlp].hidden_dims",
            *(
                f"{ci}.{name}"
                for ci in (_CT, _GT)
                for name in ("d_model", "n_blocks", "n_heads", "n_kv_heads", "mlp_hidden")
            ),
            f"{_CT}.blocks_per_chunk",
        ),
        *_group(
            "structural",
            "how the CI MLPs' program is blocked over the rows (the same values up to rounding)",
            "pd.ci[type=mlp].batch_block",
        ),
        *_group(
            "structural",
            "part of the CI transformer's architecture (RoPE frequencies are computed from it "
            "at trace time)",
            f"{_CT}.rope_theta",
            f"{_GT}.rope_theta",
        ),
        # ---- structural: the loss terms' structure
        *_group(
            "structural",
            "draws per term: how many masked forwards the step runs",
            _LOSS.format("stochastic_recon") + ".n_samples",
            _LOSS.format("chunkwise_subset_recon") + ".n_samples",
            _LOSS.format("static_probability_subset_recon") + ".n_samples",
            _LOSS.format("subset_recon") + ".n_samples",
            _LOSS.format("stochastic_hidden_acts_recon") + ".n_samples",
            f"{_PGD}.n_samples",
        ),
        *_group(
            "structural",
            "the recon plan: which sites are live in each masked forward",
            _LOSS.format("chunkwise_subset_recon") + ".sites_per_chunk",
            _LOSS.format("static_probability_subset_recon") + ".sites_per_chunk",
            f"{_PGD}.sites_per_chunk",
        ),
        *_group(
            "structural",
            "PGD's start and the sources' shape ([B, T, C+1] or [1, 1, C+1])",
            f"{_PGD}.init",
            f"{_PGD}.mask_scope",
            "pd.eval_pgd.init",
            "pd.eval_pgd.mask_scope",
        ),
        *_group(
            "structural",
            "the number of PGD ascents: a loop's trip count",
            f"{_PGD}.n_steps",
            "pd.eval_pgd.n_steps",
            f"{_PPGD}.n_warmup_steps",
        ),
        *_group(
            "structural",
            "the persistent sources' shape ([B, T, C+1] or [1, T, C+1]) and their optimizer",
            f"{_PPGD}.scope",
            f"{_PPGD}.optimizer.type",
        ),
        *_group("structural", "whether the eval runs fresh PGD (null: not)", "pd.eval_pgd"),
        *_group(
            "structural",
            "which CI-L0 groups the eval reports (its outputs)",
            "pd.l0_groups",
        ),
        *_group("structural", "how sources are drawn", "pd.sampling"),
        *_group(
            "structural",
            "a loss term's metric name (a key of the step's metrics)",
            *(
                _LOSS.format(t) + ".name"
                for t in (
                    "faithfulness",
                    "importance_minimality",
                    "smooth_l0_importance_minimality",
                    "static_probability_subset_recon",
                    "ci_masked_recon",
                    "unmasked_recon",
                    "stochastic_hidden_acts_recon",
                    "stochastic_recon",
                    "subset_recon",
                    "chunkwise_subset_recon",
                    "pgd_recon",
                    "persistent_pgd_recon",
                )
            ),
        ),
        *_group(
            "structural",
            "whether live sites carry the delta component (its term and channel)",
            "pd.use_delta_component",
        ),
        *_group(
            "structural",
            "how the recon forwards are structured (scan or unrolled loops, paired terms)",
            "pd.recon.chunk_loop",
            "pd.recon.layer_loop",
            "pd.recon.pair_terms",
        ),
        *_group(
            "structural",
            "how the masks' uniform draws are computed (the same bits either way)",
            "pd.recon.random_draws",
        ),
        # ---- structural: runtime
        *_group("structural", "the activations' dtype", "runtime.compute_dtype"),
        *_group(
            "structural",
            "what the backward recomputes",
            "runtime.remat.recon",
            "runtime.remat.ci_fn",
            "runtime.remat.recon_layers",
            "runtime.remat.save_sources",
        ),
        *_group("structural", "which init programs run", "runtime.init"),
        *_group(
            "structural",
            "the mesh: every array's sharding",
            "runtime.mesh.replicate",
            "runtime.mesh.data",
            "runtime.mesh.tensor",
        ),
        *_group("structural", "XLA's compile options", "runtime.compiler_options"),
        *_group(
            "structural",
            "the launch environment (XLA_FLAGS enter every program's cache key)",
            "runtime.launch_env.env",
        ),
        # ---- values: loss terms
        *_group(
            "value",
            "a loss term's weight",
            *(
                _LOSS.format(t) + ".coeff"
                for t in (
                    "faithfulness",
                    "importance_minimality",
                    "stochastic_recon",
                    "chunkwise_subset_recon",
                    "subset_recon",
                    "pgd_recon",
                    "persistent_pgd_recon",
                    "static_probability_subset_recon",
                    "ci_masked_recon",
                    "unmasked_recon",
                    "stochastic_hidden_acts_recon",
                )
            ),
        ),
        *_group(
            "value",
            "the static-probability router's p",
            _LOSS.format("static_probability_subset_recon") + ".p",
        ),
        *_group(
            "value",
            "importance minimality's p, its anneal window and eps",
            f"{_IMP}.pnorm_start",
            f"{_IMP}.pnorm_end",
            f"{_IMP}.anneal_start_frac",
            f"{_IMP}.anneal_end_frac",
            f"{_IMP}.eps",
        ),
        *_group(
            "value",
            "the importance penalties' coefficient schedule (warmup, peak, anneal back to 1)",
            *(
                f"{term}.{field}"
                for term in (_IMP, _SL0)
                for field in (
                    "coeff_warmup_frac",
                    "coeff_peak_multiplier",
                    "coeff_anneal_start_frac",
                    "coeff_anneal_end_frac",
                )
            ),
        ),
        *_group(
            "value",
            "the frequency term's own weight and its a (reference token count)",
            f"{_IMP}.frequency.coeff",
            f"{_IMP}.frequency.reference_token_count",
        ),
        *_group(
            "structural",
            "whether importance minimality has a frequency term (null: not)",
            f"{_IMP}.frequency",
        ),
        *_group(
            "outside",
            "retired (refused with how to convert: the old frequency term nested in coeff)",
            f"{_IMP}.frequency_coeff",
            f"{_IMP}.reference_token_count",
        ),
        *_group(
            "value",
            "smooth-L0's weights, its gamma schedule, the frequency term's a and the EMA's"
            " half-life",
            f"{_SL0}.coeff",
            f"{_SL0}.gamma_start",
            f"{_SL0}.gamma_end",
            f"{_SL0}.anneal_start_frac",
            f"{_SL0}.anneal_end_frac",
            f"{_SL0}.reference_token_count",
        ),
        *_group(
            "value",
            "smooth-L0's frequency weight (0 leaves the frequency part out)",
            f"{_SL0}.frequency_coeff",
            switch="zero",
        ),
        *_group(
            "value",
            "the frequency EMA's half-life in steps (null: no EMA, no EMA state)",
            f"{_SL0}.ema_halflife_steps",
            switch="null",
        ),
        *_group("value", "a PGD ascent's step size", f"{_PGD}.step_size", "pd.eval_pgd.step_size"),
        *_group(
            "value",
            "the persistent sources' optimizer: lr, its schedule, Adam's betas and eps",
            *(
                f"{_PPGD}.optimizer.{n}"
                for n in ("lr", "warmup_frac", "final_val_frac", "b1", "b2", "eps")
            ),
        ),
        # ---- values: training
        *_group("value", "the schedules' length (and the p anneal's)", "pd.steps"),
        *_group(
            "value",
            "an optimizer's lr, schedule and weight decay",
            *(f"pd.{group}.{n}" for group in ("components", "ci_fn") for n in _OPT_VALUES),
        ),
        *_group(
            "value",
            "Adam's betas and eps",
            *(f"pd.{g}.{n}" for g in ("components", "ci_fn") for n in _ADAM),
        ),
        *_group(
            "value",
            "the max global gradient norm (null: no clipping)",
            "pd.components.clip",
            "pd.ci_fn.clip",
            switch="null",
        ),
        *_group(
            "value",
            "the faithfulness warmup's length (a loop on the host; 0: no warmup program)",
            "pd.faithfulness_warmup.steps",
            switch="zero",
        ),
        *_group("value", "the faithfulness warmup's lr", "pd.faithfulness_warmup.lr"),
        *_group(
            "value", "the faithfulness warmup's weight decay", "pd.faithfulness_warmup.weight_decay"
        ),
        *_group("value", "the eval's CI-L0 threshold", "pd.l0_threshold"),
        *_group(
            "value",
            "the eval's rounded-mask threshold (null: the CI-L0 threshold)",
            "pd.rounding_threshold",
            switch="null",
        ),
        *_group("value", "the run key and the data order (the key is an argument)", "seed"),
        # ---- outside the programs
        *_group("outside", "names and places", "run_name", "output_dir"),
        *_group(
            "outside",
            "where the weights come from (their architecture is target.architecture)",
            "target.checkpoint",
            "target.strict",
        ),
        *_group(
            "outside",
            "where the tokens come from (batches are int32 whatever the file's dtype)",
            "data.path",
            "data.dtype",
            "data.eval_path",
        ),
        *_group("outside", "how many eval batches (a loop on the host)", "data.eval_batches"),
        *_group(
            "outside",
            "how often to log, evaluate and save",
            "cadence.train_log_every",
            "cadence.eval_every",
            "cadence.slow_eval_every",
            "cadence.save_every",
            "cadence.keep_last_n_checkpoints",
        ),
        *_group(
            "outside",
            "the compile cache's own settings",
            "runtime.compile_cache.enabled",
            "runtime.compile_cache.dir",
            "runtime.compile_cache.min_compile_time_s",
            "runtime.compile_cache.xla_caches",
        ),
        *_group(
            "outside",
            "profiling (an HLO dump bypasses the cache)",
            "runtime.launch_env.profile.hlo_dump",
            "runtime.launch_env.profile.trace_start_step",
            "runtime.launch_env.profile.trace_num_steps",
        ),
        *_group(
            "outside",
            "SLURM (pd-train submit; the mesh and devices are structural)",
            *(
                f"launch.{name}"
                for name in (
                    "job_name",
                    "nodes",
                    "tasks_per_node",
                    "process_per",
                    "cpus_per_task",
                    "gpus_per_node",
                    "mem",
                    "mem_per_cpu",
                    "time",
                    "partition",
                    "account",
                    "signal",
                    "requeue",
                    "env",
                    "python",
                    "setup",
                    "log_dir",
                    "extra_directives",
                )
            ),
        ),
        *_group("outside", "experiment tracking", "tracking"),
    ]
)

#: Value fields that are still trace-time constants of some program: none (the eval programs
#: take their L0 and rounding thresholds and fresh-PGD step size as data,
#: pd_train.evaluate.eval_hyperparams).
CONSTANT_VALUE_FIELDS: frozenset[str] = frozenset()

_BY_PATH = {f.path: f for f in FIELDS}
#: Classified paths that are optional sections with classified fields of their own
#: (``pd.eval_pgd``, importance minimality's ``frequency``): present or null is the section's
#: class, its fields have theirs.
_SECTIONS = frozenset(p for p in _BY_PATH if any(q.startswith(p + ".") for q in _BY_PATH))

#: Value fields that enter every program as data (or never reach a program), so a change of
#: one alone loads every program from the cache: all but :data:`CONSTANT_VALUE_FIELDS` (the
#: miss explanation and the config-change benchmark read it).
DATA_VALUE_FIELDS = frozenset(
    f.path for f in FIELDS if f.kind == "value" and f.path not in CONSTANT_VALUE_FIELDS
)


def classify(path: str) -> FieldClass:
    """The class of a schema path or a concrete config path (``pd.loss_metrics[1].coeff``
    needs the config to name its type: pass it through :func:`schema_path` first)."""
    try:
        return _BY_PATH[path]
    except KeyError:
        msg = f"{path!r} is not a classified config field (pd_train.config.hyperparameters.FIELDS)"
        raise KeyError(msg) from None


def leaf_class(path: str, raw: Mapping[str, Any]) -> FieldClass:
    """The class of the concrete leaf ``path`` of the unstructured config ``raw`` (as
    :func:`config_leaves` names them). A tagged member's ``type`` (``pd.loss_metrics[2].type``,
    ``pd.ci.type``: which term, which CI function) is structural."""
    schema = schema_path(path, raw)
    if schema in _BY_PATH:
        return _BY_PATH[schema]
    if path.endswith(".type"):
        return FieldClass(schema, "structural", "which loss term or CI function this is")
    return classify(schema)


def split_leaves(raw: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(structural, values)``: ``{concrete path: value}`` of the structural and the value
    leaves of the unstructured config ``raw`` (:func:`config_leaves`; outside leaves are in
    neither). A value with a structural switch also adds its switch to the structural leaves
    (``pd.components.clip is null``: True or False; ``pd.faithfulness_warmup.steps == 0``). A
    leaf that no list classifies counts as structural: a key that misses is safe, one that
    hits wrongly is not. ``raw`` may be part of a run config (``{"pd": ..., "runtime": ...}``):
    paths are read from its root."""
    structural: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for path, value in config_leaves(raw).items():
        try:
            field = leaf_class(path, raw)
        except KeyError:
            structural[path] = value
            continue
        if field.kind == "structural":
            structural[path] = value
        elif field.kind == "value":
            values[path] = value
            if field.switch == "null":
                structural[f"{path} is null"] = value is None
            elif field.switch == "zero":
                structural[f"{path} == 0"] = value == 0
    return structural, values


def structural_leaves(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The structural half of :func:`split_leaves`: what a program's cache key must hold of
    a config (every value enters the programs as an argument, DESIGN decision 9)."""
    return split_leaves(raw)[0]


def structural_fields() -> list[str]:
    return [f.path for f in FIELDS if f.kind == "structural"]


def value_fields() -> list[str]:
    return [f.path for f in FIELDS if f.kind == "value"]


# ---------------------------------------------------------------------------------------------
# The schema's leaves


def _members(tp: Any) -> list[Any]:
    return [m for m in typing.get_args(tp) if m is not type(None)]


def _tag(cls: type) -> str:
    return str(attrs.fields_dict(cls)["type"].default)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _registered_union(tp: Any) -> Any:
    """A registry-built union's base (it defines ``registered_configs``: pd.ci, the loss
    terms) as the ``Union`` of its registered members; any other type as it is."""
    if isinstance(tp, type) and "registered_configs" in vars(tp) and tp.__name__ != "TargetConfig":
        return typing.Union[tuple(typing.cast(Any, tp).registered_configs())]  # noqa: UP007
    return tp


def _walk(cls: type, prefix: str) -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    for a in attrs.fields(cls):
        tp, path = _registered_union(hints[a.name]), f"{prefix}.{a.name}" if prefix else a.name
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else None
        item = _registered_union(item)
        if isinstance(tp, type) and "registered_configs" in vars(tp):
            # The target kinds: the members' fields by name, each once (every kind reads
            # checkpoint, architecture, dtype, strict alike); ``type`` is a field of its own.
            seen: set[str] = set()
            for member in typing.cast(Any, tp).registered_configs():
                for leaf in _walk(member, path):
                    if leaf not in seen:
                        seen.add(leaf)
                        yield leaf
        elif item is not None and attrs.has(item):
            yield from _walk(item, f"{path}[*]")
        elif item is not None and _is_union(item) and all(attrs.has(m) for m in _members(item)):
            for m in _members(item):
                yield from _walk(m, f"{path}[type={_tag(m)}]")
        elif attrs.has(tp):
            yield from _walk(tp, path)
        elif _is_union(tp) and _members(tp) and all(attrs.has(m) for m in _members(tp)):
            members = _members(tp)
            if len(members) == 1:  # an optional section: its presence, then its fields
                yield path
                yield from _walk(members[0], path)
            else:
                for m in members:
                    yield from _walk(m, f"{path}[type={_tag(m)}]")
        elif a.name == "type" and prefix.endswith("]"):
            continue  # a tagged union's discriminator: the member's path names it
        else:
            yield path


def schema_paths() -> list[str]:
    """Every leaf of the run config's schema, as a schema path."""
    from pd_train.config.run import Config

    return list(_walk(Config, ""))


_INDEX = re.compile(r"\[(\d+)\]")


def schema_path(path: str, raw: Any) -> str:
    """``pd.loss_metrics[1].coeff`` → ``pd.loss_metrics[type=importance_minimality].coeff``
    for the unstructured config ``raw``; ``pd.ci.hidden_dims`` → ``pd.ci[type=mlp].hidden_dims``."""
    parts = re.split(r"(?=[.\[])", path)
    out, node = "", raw
    for part in parts:
        index = _INDEX.fullmatch(part)
        if index is not None and isinstance(node, list):
            node = node[int(index.group(1))]
            if isinstance(node, Mapping) and "type" in node:
                out += f"[type={node['type']}]"
            else:
                out += "[*]"
            continue
        name = part.lstrip(".")
        out += part
        node = node.get(name) if isinstance(node, Mapping) else None
        if isinstance(node, Mapping) and isinstance(node.get("type"), str) and name == "ci":
            out += f"[type={node['type']}]"
    return out


def config_leaves(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``{concrete path: value}`` of every classified leaf of the unstructured config ``raw``
    (a mapping-valued field such as ``target.architecture`` is one leaf)."""
    leaves: dict[str, Any] = {}
    known = set(_BY_PATH)

    def visit(node: Any, path: str) -> None:
        schema = schema_path(path, raw) if path else ""
        if schema in known:
            if not (isinstance(node, Mapping) and schema in _SECTIONS):
                leaves[path] = node
                return
            leaves[path] = "set"  # an optional section that is present: its fields follow
        if isinstance(node, Mapping):
            for key, value in node.items():
                if key == "type" and path:
                    leaves[f"{path}.type"] = value  # a tagged member: which one
                    continue
                visit(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                visit(value, f"{path}[{i}]")
        else:
            leaves[path] = node

    visit(raw, "")
    return leaves


def markdown_table() -> str:
    """The docs' table: one row per group of fields with the same class and reason."""
    lines = ["| fields | class | why |", "|---|---|---|"]
    rows: list[tuple[list[str], FieldClass]] = []
    for f in FIELDS:
        if rows and rows[-1][1].kind == f.kind and rows[-1][1].why == f.why:
            rows[-1][0].append(f.path)
        else:
            rows.append(([f.path], f))
    for paths, f in rows:
        kind: str = f.kind
        if f.kind == "value":
            today = all(p in DATA_VALUE_FIELDS for p in paths)
            kind = "value (data)" if today else "value"
        if f.switch is not None:
            kind += f"; structural at {'null' if f.switch == 'null' else '0'}"
        names = ", ".join(f"`{p}`" for p in _braced(paths))
        lines.append(f"| {names} | {kind} | {f.why} |")
    return "\n".join(lines) + "\n"


def _braced(paths: list[str]) -> list[str]:
    """Consecutive paths under one parent written once: ``pd.ci_fn.{b1, b2}``."""
    out: list[tuple[str, list[str]]] = []
    for path in paths:
        parent, _, name = path.rpartition(".")
        if out and parent and out[-1][0] == parent:
            out[-1][1].append(name)
        else:
            out.append((parent, [name]))
    prefix = [f"{parent}." if parent else "" for parent, _ in out]
    return [
        f"{p}{names[0]}" if len(names) == 1 else f"{p}{{{', '.join(names)}}}"
        for p, (_, names) in zip(prefix, out, strict=True)
    ]
