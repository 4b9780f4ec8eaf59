"""Useful FLOPs of one train step, from the config alone (no tracing, no compile).

The census counts the work the method *needs* per step, entry by entry (term × part × site
kind), so that XLA's compiled FLOPs (``compiled.cost_analysis()``) can be compared to it: the
ratio compiled / useful is the step's redundancy (rematerialization, padding, work computed and
then discarded).

What is counted (2 FLOPs per multiply-add, the usual MFU convention):

- **matmuls** of the target (every site ``x @ W``, attention's ``q·kᵀ`` and ``p·v`` over all T
  keys, the LM head), of the components (``x @ V``, ``(x@V·m) @ U``, ``V @ U`` for
  faithfulness) and of the CI function (each type's linear layers and attention);
- **backward** per matmul: one forward's worth for the input gradient when the input carries
  a gradient, one for the weight gradient when the weight is trained (so 2× forward for a
  trained layer inside a differentiated path, 1× for a frozen layer behind a live one, 0 for
  layers the gradient never reaches);
- **the optimizer**: :data:`ADAM_FLOPS_PER_PARAM` per trained number (AdamW, clip) and
  :data:`ADAM_FLOPS_PER_PARAM` per persistent-PGD source number.

Elementwise work (norms, GELU/SiLU, softmax, the KL, squashing, masks, routing draws) is not
counted: at any realistic width it is < 1 % of the matmuls, and XLA counts it in its own
figure, so it shows up in the ratio.

What the method needs, per step (B·T = N positions):

- ``clean``: the frozen target once (every layer, the LM head), forward only — it feeds the CI
  function and the recon terms' clean logits. Not run when faithfulness is the only term.
- ``ci_fn``: the CI function's forward and backward (its inputs carry no gradient).
- each recon term, per chunk of its plan and per draw: a masked forward from the chunk's first
  live *site* (everything before it equals the clean forward, whose activations exist, and
  so do the ``x@W`` of that site's stage), in
  which a live site costs ``x@W`` (the δ·x@W path), ``x@V`` and ``(x@V·m)@U``, a frozen site
  ``x@W``; its backward reaches V/U of the live sites and the masks (→ CI function).
- ``pgd_recon``: ``n_steps`` extra masked forwards and backwards per (chunk, draw) for the
  ascent (gradient to the sources only); ``persistent_pgd_recon``: ``n_warmup_steps`` such
  ascents on the route-all forward (its final ascent reuses the main backward: free).
- ``faithfulness``: ``V @ U`` per site, forward and backward.

:func:`step_census` is the entry point; :class:`Census` sums by term, part and kind; what each
term and CI type counts into is :mod:`pd_train.census`.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

# What a term or CI type counts into lives below them (census.py); re-exported here.
from pd_train.census import (
    ADAM_FLOPS_PER_PARAM,
    Census,
    CensusContext,
    FlopAccumulator,
    FlopEntry,
)
from pd_train.config.pd import PDConfig
from pd_train.decomposition import Decomposition, build_decomposition
from pd_train.models.llama_config import LlamaConfig

__all__ = [
    "ADAM_FLOPS_PER_PARAM",
    "CPU_PEAK_FILE",
    "PEAK_TFLOPS",
    "Census",
    "CensusContext",
    "CompiledCost",
    "FlopAccumulator",
    "FlopEntry",
    "HloFlops",
    "MFUMeter",
    "ci_fn_flops",
    "compiled_cost",
    "cpu_peak_key",
    "efficiency_report",
    "hlo_matmul_flops",
    "measured_cpu_peak",
    "peak_flops_per_device",
    "step_census",
]

logger = logging.getLogger(__name__)


def _is_lm(model: Any) -> bool:
    """An LM architecture the census counts: a Llama-family ``LlamaConfig`` (Llama, Qwen2,
    Qwen3) or a ``GPT2Config`` (its kinds are Llama's names without ``gate_proj``)."""
    from pd_train.models.gpt2 import GPT2Config

    return isinstance(model, LlamaConfig | GPT2Config)


def ci_fn_flops(
    pd: PDConfig, decomposition: Decomposition, *, batch_size: int, seq_len: int
) -> list[FlopEntry]:
    """The CI function's forward and backward FLOPs, per kind (site-local types) or per part
    (transformers), for ``pd.ci``: its registered type's count (:mod:`pd_train.ci`)."""
    from pd_train.ci import ci_type, make_ci_function

    census = CensusContext(
        acc=FlopAccumulator(), decomposition=decomposition, batch_size=batch_size, seq_len=seq_len
    )
    fn = make_ci_function(pd.ci, decomposition=decomposition)
    ci_type(pd.ci).flops(pd.ci, fn, census)
    return census.acc.entries


def _ci_param_count(pd: PDConfig, decomposition: Decomposition) -> int:
    from pd_train.ci import ci_type, make_ci_function

    fn = make_ci_function(pd.ci, decomposition=decomposition)
    return ci_type(pd.ci).param_count(fn, decomposition)


def step_census(model: Any, pd: PDConfig, *, seq_len: int) -> Census:
    """The useful FLOPs of one train step of ``pd`` on ``model`` with batches [pd.batch_size,
    seq_len] (see the module docstring for what counts): the clean forward and CI function when
    a term needs CI, each term's own count (:meth:`pd_train.losses.LossTerm.flops`), the
    optimizers. ``model``: a Llama-family or GPT-2 architecture, or one whose registered kind
    has its own ``census``; TypeError for any other."""
    from pd_train.losses import loss_term

    if not _is_lm(model):  # another registered kind may count its own
        from pd_train.targets import kind_of

        kind = kind_of(model)
        if kind is None or kind.census is None:
            msg = (
                "step_census counts Llama-family and GPT-2 targets (or a kind with its own "
                f"census), not {type(model).__name__}"
            )
            raise TypeError(msg)
        return kind.census(model, pd, seq_len=seq_len)  # type: ignore[no-any-return]
    decomposition = build_decomposition(model, pd.decomposition_targets)
    b, t = pd.batch_size, seq_len
    census = CensusContext(
        acc=FlopAccumulator(), decomposition=decomposition, batch_size=b, seq_len=t, model=model
    )
    terms = [(config, loss_term(config)) for config in pd.loss_metrics]
    if any(term.needs_ci for _, term in terms):
        census.clean_forward()
        census.acc.entries.extend(ci_fn_flops(pd, decomposition, batch_size=b, seq_len=t))
    for config, term in terms:
        term.flops(config, census, plan=term.plan(config, decomposition))
    n_comp = sum(len(k.layers) * k.C * (k.d_in + k.d_out) for k in decomposition.kinds)
    census.optimizer(n_comp, term="optimizer", kind="components")
    census.optimizer(_ci_param_count(pd, decomposition), term="optimizer", kind="ci_fn")
    return Census(entries=tuple(census.acc.entries), tokens=b * t)


def census_summary(census: Census) -> Mapping[str, float]:
    """GFLOPs per term (a flat dict for compile.json / metrics)."""
    return {k: v / 1e9 for k, v in census.by("term").items()}


# ------------------------------------------------------------------ compiled programs

_COMP_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_DIMS = re.compile(r"\[([\d,]*)\]")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')


def _split_shape(rest: str) -> tuple[str, str]:
    """``f32[4,8]{1,0} dot(...)`` -> (shape, remainder); tuple shapes keep their parentheses."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[: i + 1], rest[i + 1 :].lstrip()
    shape, _, tail = rest.partition(" ")
    return shape, tail


def _numel(shape: str) -> int:
    m = _DIMS.search(shape)
    if m is None or not m.group(1):
        return 1
    return math.prod(int(d) for d in m.group(1).split(","))


def _dims(shape: str) -> list[int]:
    m = _DIMS.search(shape)
    return [int(d) for d in m.group(1).split(",")] if m and m.group(1) else []


def _attr_list(text: str, name: str) -> list[int]:
    m = re.search(name + r"=\{([\d,]*)\}", text)
    return [int(d) for d in m.group(1).split(",")] if m and m.group(1) else []


def _called(text: str, name: str) -> list[str]:
    m = re.search(name + r"=\{([^}]*)\}", text)
    if m:
        return [c.strip().lstrip("%") for c in m.group(1).split(",") if c.strip()]
    m = re.search(name + r"=%?([\w.\-]+)", text)
    return [m.group(1)] if m else []


@attrs.frozen(kw_only=True)
class HloFlops:
    """Matmul FLOPs (``dot`` and ``convolution``, 2 per MAC) of one compiled program per device,
    with every while loop's body counted ``known_trip_count`` times and each conditional at its
    most expensive branch (an upper bound where branches differ); ``flops_min`` counts each
    conditional at its cheapest branch (a lower bound). ``unknown_loops``: loops without a
    known trip count, counted once."""

    flops: float
    flops_min: float
    unknown_loops: int


def hlo_matmul_flops(hlo_text: str) -> HloFlops:
    """Count the matmul FLOPs of an HLO module's text (``compiled.as_text()``), per device.

    XLA's own ``cost_analysis()`` counts a while loop's body once, whatever its trip count, so
    for pd's scanned layers and chunks it reports a fraction of the work; this walks the call
    graph instead and multiplies."""
    comps: dict[str, list[str]] = {}
    entry = None
    current: list[str] | None = None
    for line in hlo_text.splitlines():
        if current is None:
            m = _COMP_HEADER.match(line)
            if m:
                current = comps.setdefault(m.group(1), [])
                if line.startswith("ENTRY"):
                    entry = m.group(1)
        elif line.strip() == "}":
            current = None
        else:
            current.append(line)
    unknown = 0
    memo: dict[str, tuple[float, float]] = {}

    def add(a: tuple[float, float], b: tuple[float, float], n: float = 1.0) -> tuple[float, float]:
        return (a[0] + n * b[0], a[1] + n * b[1])

    def comp_flops(name: str) -> tuple[float, float]:
        """(lower, upper) FLOPs of one computation."""
        nonlocal unknown
        if name in memo:
            return memo[name]
        memo[name] = (0.0, 0.0)  # guards recursion
        shapes: dict[str, str] = {}
        total = (0.0, 0.0)
        for line in comps.get(name, []):
            m = _INSTR.match(line)
            if not m:
                continue
            iname, rest = m.groups()
            shape, tail = _split_shape(rest)
            shapes[iname] = shape
            op = tail.split("(", 1)[0].strip()
            if op == "dot":
                operands = tail.split("(", 1)[1].split(")", 1)[0]
                lhs = operands.split(",")[0].strip().lstrip("%")
                lhs_dims = _dims(shapes.get(lhs, ""))
                contract = math.prod(lhs_dims[d] for d in _attr_list(tail, "lhs_contracting_dims"))
                total = add(total, (2.0 * _numel(shape) * contract,) * 2)
            elif op == "convolution":
                operands = tail.split("(", 1)[1].split(")", 1)[0]
                rhs = operands.split(",")[1].strip().lstrip("%")
                rhs_dims = _dims(shapes.get(rhs, ""))
                # 2 x output elements x kernel elements per output feature
                out_features = max(_dims(shape)[-1:] or [1])
                f = 2.0 * _numel(shape) * math.prod(rhs_dims) / max(out_features, 1)
                total = add(total, (f, f))
            elif op == "while":
                trip = _TRIP.search(tail)
                if trip is None:
                    unknown += 1
                n = int(trip.group(1)) if trip else 1
                for c in _called(tail, "body"):
                    total = add(total, comp_flops(c), n)
            elif op == "conditional":
                branches = _called(tail, "branch_computations") or (
                    _called(tail, "true_computation") + _called(tail, "false_computation")
                )
                costs = [comp_flops(c) for c in branches] or [(0.0, 0.0)]
                total = add(total, (min(c[0] for c in costs), max(c[1] for c in costs)))
            elif op in ("fusion", "call", "async-start", "custom-call"):
                called = _called(tail, "calls") + (
                    _called(tail, "to_apply") if op == "call" else []
                )
                for c in called:
                    total = add(total, comp_flops(c))
        memo[name] = total
        return total

    if entry is None:
        msg = "hlo_matmul_flops: no ENTRY computation in the HLO text"
        raise ValueError(msg)
    lo, hi = comp_flops(entry)
    return HloFlops(flops=hi, flops_min=lo, unknown_loops=unknown)


@attrs.frozen(kw_only=True)
class CompiledCost:
    """One compiled program, per device: ``matmul_flops`` / ``matmul_flops_min`` (upper and
    lower bound, :func:`hlo_matmul_flops`),
    ``xla_flops`` and ``bytes_accessed`` (XLA's ``cost_analysis()``: loop bodies counted once),
    and the memory from ``memory_analysis()`` (bytes; None where the backend has none)."""

    matmul_flops: float
    matmul_flops_min: float
    xla_flops: float | None
    bytes_accessed: float | None
    unknown_loops: int
    argument_bytes: int | None
    output_bytes: int | None
    temp_bytes: int | None
    peak_bytes: int | None


def compiled_cost(compiled: Any) -> CompiledCost:
    """FLOPs, bytes and memory per device of a ``jax.stages.Compiled``."""
    try:
        ca = compiled.cost_analysis()
    except Exception:  # not every backend implements it
        ca = None
    if isinstance(ca, list | tuple):
        ca = ca[0] if ca else None
    try:
        ma = compiled.memory_analysis()
    except Exception:
        ma = None

    def mem(field: str) -> int | None:
        value = getattr(ma, field, None) if ma is not None else None
        return None if value is None else int(value)

    hlo = hlo_matmul_flops(compiled.as_text())
    return CompiledCost(
        matmul_flops=hlo.flops,
        matmul_flops_min=hlo.flops_min,
        xla_flops=None if not ca or "flops" not in ca else float(ca["flops"]),
        bytes_accessed=None
        if not ca or "bytes accessed" not in ca
        else float(ca["bytes accessed"]),
        unknown_loops=hlo.unknown_loops,
        argument_bytes=mem("argument_size_in_bytes"),
        output_bytes=mem("output_size_in_bytes"),
        temp_bytes=mem("temp_size_in_bytes"),
        peak_bytes=mem("peak_memory_in_bytes"),
    )


def _fmt_ratio(lo: float, hi: float) -> str:
    return f"{hi:.2f}x" if abs(hi - lo) < 0.005 * hi else f"{lo:.2f}-{hi:.2f}x"


def efficiency_report(rows: Iterable[Any]) -> str:
    """Lines for ``pd-train compile``: per jit, compiled matmul GFLOPs per device (loops
    multiplied out; a range where conditionals differ), XLA's own GFLOPs and GB accessed (loop
    bodies once), peak memory; then the train step's compiled / useful ratio. ``rows``: objects
    with ``jit``, ``cost`` (:class:`CompiledCost` or None), ``useful`` (census matmul FLOPs of
    the whole step, train_step only) and ``devices``."""
    lines = [
        "FLOPs and memory per device (matmul GFLOP with loops multiplied out, a range where "
        "conditionals differ; XLA's cost_analysis counts loop bodies once):"
    ]
    summary = []
    for r in rows:
        c = getattr(r, "cost", None)
        if c is None:
            continue
        lo, hi = c.matmul_flops_min / 1e9, c.matmul_flops / 1e9
        flops = f"{hi:.3f}" if lo == hi else f"{lo:.3f}-{hi:.3f}"
        xla = "-" if c.xla_flops is None else f"{c.xla_flops / 1e9:.3f}"
        acc = "-" if c.bytes_accessed is None else f"{c.bytes_accessed / 1e9:.3f}"
        peak = "-" if c.peak_bytes is None else f"{c.peak_bytes / 2**30:.3f}"
        lines.append(
            f"  {r.jit:<20} matmul {flops} GFLOP, XLA {xla} GFLOP, {acc} GB accessed, "
            f"peak {peak} GiB"
        )
        useful = getattr(r, "useful", None)
        if useful:
            n = getattr(r, "devices", 1)
            ratio = _fmt_ratio(c.matmul_flops_min * n / useful, c.matmul_flops * n / useful)
            summary.append(
                f"{r.jit}: useful {useful / 1e9:.3f} GFLOP (census), compiled "
                f"{lo * n:.3f}{'' if lo == hi else f'-{hi * n:.3f}'} GFLOP on {n} device(s): "
                f"compiled/useful {ratio}"
                + (f" ({c.unknown_loops} loops of unknown trip count)" if c.unknown_loops else "")
            )
    return "\n".join([*lines, "", *summary])


def annotate(row: Any, compiled: Any, runtime: Any, prepared: Any) -> None:
    """Fill a ``pd_train.run.compile.CompileRow``'s ``cost`` (and, for the train step, ``useful``
    and ``devices``) from its compiled program and the run's config."""
    import jax

    row.cost = compiled_cost(compiled)
    if row.jit == "train_step":
        config = prepared.config
        try:
            census = step_census(prepared.model, config.pd, seq_len=config.data.seq_len)
        except TypeError:  # a target the census does not cover
            return
        row.useful = census.matmul
        mesh = runtime.trainer.mesh
        row.devices = mesh.devices.size if mesh is not None else jax.device_count()


# ------------------------------------------------------------------ MFU

#: Dense peak TFLOP/s per device from NVIDIA's datasheets (SXM parts; no sparsity):
#: "bfloat16" is the BF16 tensor-core peak, "float32" the TF32 tensor-core peak, which is what
#: XLA uses for fp32 matmuls at JAX's default precision on these GPUs. Sources: NVIDIA A100
#: datasheet (BF16 312, TF32 156), H100 datasheet (SXM: BF16 989, TF32 495; PCIe: 756, 378),
#: H200 datasheet (SXM: BF16 989, TF32 495). Matched on ``device.device_kind``, first hit wins.
PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H200", {"bfloat16": 989.0, "float16": 989.0, "float32": 495.0}),
    ("H100 PCIe", {"bfloat16": 756.0, "float16": 756.0, "float32": 378.0}),
    ("H100", {"bfloat16": 989.0, "float16": 989.0, "float32": 495.0}),
    ("A100", {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0}),
)


#: The file beside the persistent compile cache where :func:`measured_cpu_peak` keeps, per host
#: key, the best CPU peak measured so far.
CPU_PEAK_FILE = "cpu_peak.json"


@functools.cache
def _measure_cpu_peak(dtype: str, n: int) -> float:
    """FLOP/s of one timed ``[n, n] @ [n, n]`` in ``dtype`` on one device: best of 5 after a
    warm-up, once per process."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((n, n), dtype)
    f = jax.jit(lambda a: a @ a)
    f(x).block_until_ready()
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def cpu_peak_key(dtype: str, n: int) -> str:
    """What a stored CPU peak is valid for: the processor's model name, the cores this process
    may use, jax and jaxlib's versions, the matmul's dtype and size."""
    import os
    import platform

    import jax
    import jaxlib

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{model} | {cores} cores | jax {jax.__version__} jaxlib {jaxlib.__version__} | {dtype} {n}"
    )


def measured_cpu_peak(dtype: str = "float32", n: int = 1024, *, store: Path | None = None) -> float:
    """FLOP/s of the host's matmuls: best of 5 timed ``[n, n] @ [n, n]`` in ``dtype`` on one
    device after a warm-up (measured once per process, about a second on a laptop CPU).

    A measurement taken while another thread holds a core (a compile in the background) reads
    low, and the MFU computed against it high. With ``store`` (a folder; ``pd-train run`` passes
    its compile cache's) the best figure ever measured for this host (:func:`cpu_peak_key`) is
    kept in ``store / CPU_PEAK_FILE`` and returned when it beats this process's measurement, so
    one busy measurement does not move a host's MFU. A damaged file is replaced."""
    measured = _measure_cpu_peak(dtype, n)
    if store is None:
        return measured
    import json
    import os

    path = Path(store) / CPU_PEAK_FILE
    key = cpu_peak_key(dtype, n)
    try:
        stored = json.loads(path.read_text())
        if not isinstance(stored, dict):
            stored = {}
    except (OSError, ValueError):
        stored = {}
    best = stored.get(key)
    if isinstance(best, int | float) and math.isfinite(best) and best >= measured:
        return float(best)
    stored[key] = measured
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(stored, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: this process's figure still holds
    return measured


def peak_flops_per_device(
    device: Any, dtype: str, *, n_local_devices: int = 1, store: Path | None = None
) -> tuple[float, str]:
    """(peak FLOP/s of one device for ``dtype`` matmuls, where the figure comes from). Known
    GPUs from :data:`PEAK_TFLOPS`; anything else (CPU): :func:`measured_cpu_peak` (best kept
    in ``store``) divided by the process's devices (simulated CPU devices share the host's
    cores)."""
    kind = str(getattr(device, "device_kind", ""))
    for name, peaks in PEAK_TFLOPS:
        if name.lower() in kind.lower():
            return peaks.get(dtype, peaks["float32"]) * 1e12, f"datasheet {name} {dtype}"
    peak = measured_cpu_peak(dtype, store=store) / max(n_local_devices, 1)
    return peak, f"measured {kind or 'host'} {dtype} matmul / {n_local_devices} device(s)"


class MFUMeter:
    """Achieved useful TFLOP/s per device and MFU between two host syncs of the step loop.

    ``useful_flops``: the census's FLOPs of one step (whole batch); ``devices``: the devices the
    step runs on; ``peak``: FLOP/s of one device. :meth:`measure` at a logging step (after the
    metrics reached the host) returns ``{"perf/step_s", "perf/useful_tflops_per_device",
    "perf/mfu"}`` averaged since the previous call (``{}`` at the first: the baseline, so the
    first step's compile is never counted)."""

    def __init__(self, useful_flops: float | None, *, devices: int, peak: float) -> None:
        self.useful_flops = useful_flops
        self.devices = max(devices, 1)
        self.peak = peak
        self._last: tuple[int, float] | None = None

    @classmethod
    def for_trainer(cls, trainer: Any, *, seq_len: int) -> MFUMeter:
        """The meter of a :class:`pd_train.train.Trainer`'s run."""
        import jax

        try:
            useful: float | None = step_census(trainer.model, trainer.pd, seq_len=seq_len).total
        except TypeError:  # a target the census does not cover: no perf metrics
            useful = None
        devices = trainer.mesh.devices.size if trainer.mesh is not None else 1
        # A CPU's measured peak is kept beside the persistent compile cache, when it is on.
        cache = getattr(jax.config, "jax_compilation_cache_dir", None)
        enabled = getattr(jax.config, "jax_enable_compilation_cache", False)
        store = Path(cache) if cache and enabled else None
        peak, source = peak_flops_per_device(
            jax.local_devices()[0],
            trainer.runtime.compute_dtype,
            n_local_devices=jax.local_device_count(),
            store=store,
        )
        logger.info("MFU against %.3g TFLOP/s per device (%s)", peak / 1e12, source)
        return cls(useful, devices=devices, peak=peak)

    def measure(self, step: int, now: float | None = None) -> dict[str, float]:
        now = time.perf_counter() if now is None else now
        last, self._last = self._last, (step, now)
        if self.useful_flops is None or last is None or step <= last[0] or now <= last[1]:
            return {}
        step_s = (now - last[1]) / (step - last[0])
        per_device = self.useful_flops / step_s / self.devices
        return {
            "perf/step_s": step_s,
            "perf/useful_tflops_per_device": per_device / 1e12,
            "perf/mfu": per_device / self.peak,
        }
