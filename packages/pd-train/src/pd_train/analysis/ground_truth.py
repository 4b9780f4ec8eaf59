"""Ground-truth metrics of toy decompositions, defined as the SPD paper and its reference
(goodfire-ai/spd) define them.

CI matrices here are one-hot CIs: ``ci [n_features, C]``, row i the lower-leaky CI of every
component of one site on the input 0.75·e_i (the reference's ``input_magnitude``).

- :func:`identity_ci_error` (the reference's ``IdentityCIError`` for one site): permute the
  columns so each feature's best component sits on the diagonal (Hungarian, or greedy when the
  matrix's smaller side is ≥ 500), then count the entries off by more than ``tolerance``: off
  the diagonal above ``tolerance``, on the diagonal below ``1 − tolerance``. 0 = one component
  per feature, fully on, every other off.
- :func:`identity_failures` (pd's, not the reference's): the entries IdentityCIError counts,
  by feature and component: the features without a fully-on component of their own, the other
  entries above ``tolerance`` and the components on for several features. It tells what a
  nonzero IdentityCIError is made of; :func:`identity_failures_by_site` gathers it per site.
- :func:`sign_even_part` (pd's): the part of a site's output on one-feature inputs that is
  even in the feature's value, which one rank-1 component per feature cannot carry at both
  signs (what a residual MLP's later layers get from the earlier layers' ReLUs).
- :func:`dense_ci_error` (``DenseCIError``, the reference's ``DenseCIPattern``): sort the
  columns by their CI mass; each of the first ``k`` columns missing a strong (≥ 1 − tolerance)
  entry counts 1, every entry above ``tolerance`` in the other columns counts 1.
- :func:`mmcs_ml2r` (paper Table 1): over the feature rows ``W_j`` of a TMS ``linear1``
  ([n_features, n_hidden] in pd's ``x @ W`` layout), the max over components of the cosine
  between ``V[j, c]·U[c]`` and ``W_j`` (MMCS, mean over j), and the norm ratio
  ``‖V[j, mcs(j)]·U[mcs(j)]‖ / ‖W_j‖`` at the best component (ML2R, mean over j).
- :func:`alive_components`: components whose CI exceeds the reference's ``ci_alive_threshold``
  (0.1) on at least one row of a CI matrix. On a window of examples drawn from the training
  distribution this is the reference's *alive* count (goodfire-ai/spd's
  ``AliveComponentsTracker``: fired above the threshold within the last
  ``n_examples_until_dead`` training examples; pd counts it over one window at the current
  params, as pd's Llama runs count it over one eval): ``gt/alive/{site}``. On the one-hot CI
  it is pd's ``gt/alive_one_hot/{site}``: the components some single feature at 0.75 turns on,
  which the paper's one-hot CI figures show; a component that fires only on inputs with two or
  more active features counts in ``alive`` and not in ``alive_one_hot``.
- :func:`neuron_contributions`, :func:`component_neuron_contributions`: the residual MLP's
  per-neuron contributions (paper, "Toy Model of Compressed Computation"), and their
  scatter plot :func:`plot_neuron_contributions`.
- :func:`plot_permuted_ci` and :func:`plot_uv`: the permuted one-hot CI matrices and the V, U
  matrices per site in the same column order, as the reference draws them.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ALIVE_THRESHOLD",
    "TOLERANCE",
    "alive_components",
    "component_neuron_contributions",
    "dense_ci_error",
    "describe_identity_failures",
    "ground_truth_table",
    "identity_ci_error",
    "identity_failures",
    "identity_failures_by_site",
    "mmcs_ml2r",
    "neuron_contributions",
    "permute_to_dense",
    "permute_to_identity",
    "plot_neuron_contributions",
    "plot_permuted_ci",
    "plot_uv",
    "sign_even_part",
]

#: The reference's tolerance of IdentityCIError / DenseCIError.
TOLERANCE = 0.1
#: The reference's ``ci_alive_threshold``.
ALIVE_THRESHOLD = 0.1
#: At or above this smaller side the identity permutation is greedy (the reference's ``auto``).
_HUNGARIAN_BELOW = 500


def _check_2d(ci: np.ndarray, what: str) -> np.ndarray:
    ci = np.asarray(ci, dtype=np.float64)
    if ci.ndim != 2:
        msg = f"{what}: a CI matrix [n_features, C] is 2-d, got shape {ci.shape}"
        raise ValueError(msg)
    return ci


def permute_to_identity(ci: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ci[:, perm], perm)``: perm's first min(F, C) entries put feature i's assigned
    component in column i (Hungarian assignment maximizing the summed CI of the first
    min(F, C) rows; greedy, feature by feature, when min(F, C) ≥ 500), then the unassigned
    components in increasing order. ci [F, C] -> [F, C], perm [C]."""
    from scipy.optimize import linear_sum_assignment

    ci = _check_2d(ci, "permute_to_identity")
    n, c = ci.shape
    rows = min(n, c)
    if rows < _HUNGARIAN_BELOW:
        _, cols = linear_sum_assignment(-ci[:rows])
        chosen = [int(x) for x in cols]
    else:
        chosen, used = [], set()
        for i in range(rows):
            order = np.argsort(-ci[i], kind="stable")
            pick = next((int(j) for j in order if int(j) not in used), int(order[0]))
            chosen.append(pick)
            used.add(pick)
    rest = sorted(set(range(c)) - set(chosen))
    perm = np.asarray(chosen + rest, dtype=np.int64)
    return ci[:, perm], perm


def permute_to_dense(ci: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ci[:, perm], perm)`` with the columns in decreasing order of their CI sum."""
    ci = _check_2d(ci, "permute_to_dense")
    perm = np.argsort(-ci.sum(axis=0), kind="stable")
    return ci[:, perm], perm


def _identity_assignment(ci: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """``(ci, own)``: ci [F, C] checked (2-d, C ≥ F) and each feature's assigned component
    (:func:`permute_to_identity`'s first F columns)."""
    ci = _check_2d(ci, what)
    n, c = ci.shape
    if c < n:
        msg = f"{what}: {c} components cannot give each of {n} features its own"
        raise ValueError(msg)
    _, perm = permute_to_identity(ci)
    return ci, perm[:n]


def identity_ci_error(ci: np.ndarray, tolerance: float = TOLERANCE) -> int:
    """The reference's IdentityCIError of one site: entries of the identity-permuted ci [F, C]
    (C ≥ F) off by more than ``tolerance`` from [I | 0]."""
    ci, own = _identity_assignment(ci, "identity_ci_error")
    rows = np.arange(ci.shape[0])
    off = ci > tolerance
    off[rows, own] = False
    return int(np.sum(off) + np.sum(ci[rows, own] < 1.0 - tolerance))


def identity_failures(ci: np.ndarray, tolerance: float = TOLERANCE) -> dict[str, list[Any]]:
    """What :func:`identity_ci_error` counts in ci [F, C], by feature, under its assignment of a
    component to each feature (component indices are ci's columns):

    - ``without_own``: the features whose assigned component's CI is below ``1 − tolerance``;
    - ``extra``: ``[feature, component, ci]`` for every other entry above ``tolerance``;
    - ``shared``: ``[component, [features]]`` for every component above ``tolerance`` on two
      or more features (each of its entries but the assigned one is also in ``extra``).

    ``len(without_own) + len(extra) == identity_ci_error(ci)``."""
    ci, own = _identity_assignment(ci, "identity_failures")
    n, c = ci.shape
    without_own = [int(i) for i in range(n) if ci[i, own[i]] < 1.0 - tolerance]
    on = ci > tolerance
    on[np.arange(n), own] = False
    extra = [[int(i), int(j), round(float(ci[i, j]), 4)] for i, j in np.argwhere(on)]
    shared = [
        [int(j), [int(i) for i in np.nonzero(ci[:, j] > tolerance)[0]]]
        for j in range(c)
        if int(np.sum(ci[:, j] > tolerance)) >= 2
    ]
    return {"without_own": without_own, "extra": extra, "shared": shared}


def identity_failures_by_site(
    ci_by_site: Mapping[str, np.ndarray],
    identity: tuple[str, ...],
    tolerance: float = TOLERANCE,
    *,
    strength: Mapping[str, np.ndarray] | None = None,
) -> dict[str, dict[str, Any]]:
    """:func:`identity_failures` of every site an ``identity`` fnmatch pattern matches whose
    IdentityCIError is not 0. With ``strength`` (per site a value per feature: how much of
    the feature the target computes there), also ``without_own_rank``: each ``without_own``
    feature's rank among the features by it, 0 the weakest."""
    out: dict[str, dict[str, Any]] = {}
    for site, ci in ci_by_site.items():
        if any(fnmatch.fnmatch(site, p) for p in identity):
            failures: dict[str, Any] = identity_failures(ci, tolerance)
            if failures["without_own"] or failures["extra"]:
                if strength is not None:
                    rank = np.argsort(np.argsort(np.asarray(strength[site]), kind="stable"))
                    failures["without_own_rank"] = [int(rank[i]) for i in failures["without_own"]]
                out[site] = failures
    return out


def sign_even_part(out_pos: np.ndarray, out_neg: np.ndarray) -> dict[str, Any]:
    """pd's: the part of a site's output on one-feature inputs that is even in the feature's
    value. out_pos, out_neg [F, d]: the site's output in the target on the inputs +m·e_i and
    −m·e_i.

    Behind bias-free ReLUs a site's output is positively homogeneous in a feature's value a, not
    linear: out(a) = a·odd_i + |a|·even_i, with odd = (out_pos − out_neg) / 2 and even =
    (out_pos + out_neg) / 2 (per unit of m). A rank-1 component's output is linear in its
    input, so one component per feature carries odd_i but not even_i at both signs: where the
    even part is large an exact decomposition needs a second component per feature (one per
    sign) or one component carrying the even part for many features at once. The residual
    MLPs' layers after the first get such a part from the earlier layers' ReLU outputs; a
    linear site (TMS's, a residual MLP's first ``mlp_in``) has none.

    Returns ``even_to_odd``: the median over features of ‖even_i‖ / ‖odd_i‖ (features whose
    odd part is 0 left out; 0.0 when all are); ``top_share``: the share of Σ_i ‖even_i‖² along
    the even parts' first right singular vector (0.0 when they are all 0); ``direction``: that
    vector [d], unit norm, its sign arbitrary."""
    pos = np.asarray(out_pos, dtype=np.float64)
    neg = np.asarray(out_neg, dtype=np.float64)
    if pos.ndim != 2 or pos.shape != neg.shape:
        msg = (
            "sign_even_part: out_pos and out_neg are [n_features, d] of one shape, "
            f"got {pos.shape} and {neg.shape}"
        )
        raise ValueError(msg)
    odd, even = (pos - neg) / 2.0, (pos + neg) / 2.0
    odd_norm, even_norm = np.linalg.norm(odd, axis=1), np.linalg.norm(even, axis=1)
    keep = odd_norm > 0
    ratio = float(np.median(even_norm[keep] / odd_norm[keep])) if keep.any() else 0.0
    _, s, vt = np.linalg.svd(even, full_matrices=False)
    total = float(np.sum(s**2))
    return {
        "even_to_odd": ratio,
        "top_share": float(s[0] ** 2 / total) if total > 0 else 0.0,
        "direction": vt[0],
    }


def describe_identity_failures(
    failures: Mapping[str, Any], *, limit: int = 12, tolerance: float = TOLERANCE
) -> list[str]:
    """One line each for a site's :func:`identity_failures` (found at ``tolerance``): the
    features without their own component (and their strength ranks, when known), the
    components on for several features, and the features also on a second component of their
    own (at most ``limit`` of each listed); with an ``even_part`` entry (a
    :func:`sign_even_part` of the site, and ``shared_alignment``: ``[component, |cos|]`` of each
    shared component's U with its direction; ``two_sided``: ``[k, m]``, the features whose own
    component is on at both ±0.75), what the target's even part is, how the shared components
    lie along it and whether the features' own components are on for one sign only."""

    def listed(items: list[str]) -> str:
        more = len(items) - limit
        return ", ".join(items[:limit]) + (f", … ({more} more)" if more > 0 else "")

    lines = []
    if failures["without_own"]:
        feats = [str(i) for i in failures["without_own"]]
        lines.append(
            f"{len(feats)} feature(s) without a component ≥ {1 - tolerance:g} of their own: "
            + listed(feats)
        )
        if "without_own_rank" in failures:
            ranks = [str(r) for r in failures["without_own_rank"]]
            lines.append(
                "  their ranks by the target's output at this site (0 = the weakest): "
                + listed(ranks)
            )
    if failures["shared"]:
        comps = [f"{j} ({', '.join(map(str, fs))})" for j, fs in failures["shared"]]
        lines.append(
            f"{len(comps)} component(s) on for several features: component (features) "
            + listed(comps)
        )
    shared = {j for j, _ in failures["shared"]}
    second = [f"{i} ({j})" for i, j, _ in failures["extra"] if j not in shared]
    if second:
        lines.append(
            f"{len(second)} feature(s) also on a second component that no other feature "
            "uses: feature (component) " + listed(second)
        )
    even = failures.get("even_part")
    if even:
        lines.append(
            f"the target's output here has a part even in a feature's value, which one rank-1 "
            f"component per feature cannot carry at both signs: ‖even‖ / ‖odd‖ "
            f"{even['even_to_odd']:.2f} (median over the features), {even['top_share']:.0%} "
            "of it along one direction"
        )
        aligned = [f"{j} ({cos:.2f})" for j, cos in even.get("shared_alignment", [])]
        if aligned:
            lines.append(
                "  |cos| of the shared components' U with that direction: component (|cos|) "
                + listed(aligned)
            )
        if "two_sided" in even:
            k, m = even["two_sided"]
            lines.append(
                f"  {k} of the {m} features with a component ≥ {1 - tolerance:g} of their own at "
                f"+0.75 have it also on (> {tolerance:g}) at -0.75 (on at both signs a rank-1 "
                "component is linear in the feature's value and cannot carry the even part; on "
                "for one sign only it can)"
            )
    return lines


def dense_ci_error(
    ci: np.ndarray, k: int, tolerance: float = TOLERANCE, min_entries: int = 1
) -> int:
    """The reference's DenseCIError of one site (``DenseCIPattern(k)``): with the columns of
    ci [F, C] sorted by CI mass, the strong (≥ 1 − tolerance) entries the first ``k`` columns
    lack (each needs ``min_entries``) plus the entries above ``tolerance`` in the others."""
    ci = _check_2d(ci, "dense_ci_error")
    if ci.shape[1] < k:
        msg = f"dense_ci_error: k={k} dense components asked of {ci.shape[1]}"
        raise ValueError(msg)
    permuted, _ = permute_to_dense(ci)
    strong = (permuted >= 1.0 - tolerance).sum(axis=0)
    missing = np.clip(min_entries - strong[:k], 0, None).sum()
    extra = (permuted[:, k:] > tolerance).sum()
    return int(missing + extra)


def alive_components(ci: np.ndarray, threshold: float = ALIVE_THRESHOLD) -> int:
    """Components whose CI exceeds ``threshold`` on at least one row; ci [N, C] (N examples of
    a window: the reference's alive count; or the F one-hot rows: pd's ``alive_one_hot``)."""
    return int(np.sum(_check_2d(ci, "alive_components").max(axis=0) > threshold))


def mmcs_ml2r(w: np.ndarray, v: np.ndarray, u: np.ndarray, eps: float = 1e-12) -> dict[str, float]:
    """MMCS and ML2R of a TMS ``linear1``: w [F, h] (row j: feature j's direction), the
    components' V [F, C] and U [C, h] (component c's row j is V[j, c]·U[c]). Returns
    ``mmcs``, ``ml2r`` and their standard deviations over the features (``*_std``,
    population)."""
    w, v, u = (np.asarray(a, dtype=np.float64) for a in (w, v, u))
    sub = v.T[:, :, None] * u[:, None, :]  # [C, F, h]
    sub_n = sub / (np.linalg.norm(sub, axis=-1, keepdims=True) + eps)
    w_n = w / (np.linalg.norm(w, axis=-1, keepdims=True) + eps)
    cos = np.einsum("cfh,fh->cf", sub_n, w_n)  # [C, F]
    best = cos.argmax(axis=0)
    max_cos = cos.max(axis=0)
    ratio = np.linalg.norm(sub[best, np.arange(w.shape[0])], axis=-1) / np.linalg.norm(w, axis=-1)
    return {
        "mmcs": float(max_cos.mean()),
        "mmcs_std": float(max_cos.std()),
        "ml2r": float(ratio.mean()),
        "ml2r_std": float(ratio.std()),
    }


def neuron_contributions(embed: np.ndarray, w_in: np.ndarray, w_out: np.ndarray) -> np.ndarray:
    """The target's neuron contributions [L, F, d_mlp]: per layer, (E w_in)[i] ⊙ (w_out Eᵀ)[:, i]
    for embed E [F, d_embed], w_in [L, d_embed, d_mlp], w_out [L, d_mlp, d_embed] (unembedding
    Eᵀ)."""
    into = np.einsum("fd,ldm->lfm", embed, w_in)
    out = np.einsum("lmd,fd->lfm", w_out, embed)
    return np.asarray(into * out)


def component_neuron_contributions(
    embed: np.ndarray, v_in: np.ndarray, u_in: np.ndarray, w_out: np.ndarray
) -> np.ndarray:
    """The contributions [L, F, d_mlp] of the best ``mlp_in`` component per feature: for each
    component c, (E V[:, c] U[c])[i] ⊙ (w_out Eᵀ)[:, i] [L, F, C, d_mlp]; per (layer, feature)
    the component whose largest entry over the neurons is largest (the reference's choice).
    v_in [L, d_embed, C], u_in [L, C, d_mlp]; w_out [L, d_mlp, d_embed]: the sum of the
    ``mlp_out`` components (V·U)."""
    into = np.einsum("fd,ldc,lcm->lfcm", embed, v_in, u_in)
    out = np.einsum("lmd,fd->lfm", w_out, embed)
    per = into * out[:, :, None, :]
    best = per.max(axis=-1).argmax(axis=-1)  # [L, F]
    n_layers, n_features = best.shape
    ll, ff = np.meshgrid(np.arange(n_layers), np.arange(n_features), indexing="ij")
    return np.asarray(per[ll, ff, best])


def _site_pattern(site: str, patterns: Mapping[str, Any]) -> Any:
    for pattern, value in patterns.items():
        if fnmatch.fnmatch(site, pattern):
            return value
    return None


def ground_truth_table(
    ci_by_site: Mapping[str, np.ndarray],
    *,
    identity: tuple[str, ...] = (),
    dense: Mapping[str, int] | None = None,
    window_ci: Mapping[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """From the one-hot CI per site: ``gt/alive_one_hot/{site}`` for every site,
    ``gt/identity_ci_error/{site}`` for the sites an ``identity`` fnmatch pattern matches,
    ``gt/dense_ci_error/{site}`` for those a ``dense`` pattern matches (``{pattern: k}``);
    ``gt/identity_ci_error`` / ``gt/dense_ci_error``: the totals (the reference's ``total``).
    With ``window_ci`` (per site the CI [N, C] of N examples of the training distribution):
    ``gt/alive/{site}``, the reference's alive count (:func:`alive_components`)."""
    out: dict[str, float] = {}
    totals = {"identity_ci_error": 0, "dense_ci_error": 0}
    dense = dict(dense or {})
    for site, ci in ci_by_site.items():
        if window_ci is not None:
            out[f"gt/alive/{site}"] = float(alive_components(window_ci[site]))
        out[f"gt/alive_one_hot/{site}"] = float(alive_components(ci))
        if any(fnmatch.fnmatch(site, p) for p in identity):
            err = identity_ci_error(ci)
            out[f"gt/identity_ci_error/{site}"] = float(err)
            totals["identity_ci_error"] += err
        k = _site_pattern(site, dense)
        if k is not None:
            err = dense_ci_error(ci, int(k))
            out[f"gt/dense_ci_error/{site}"] = float(err)
            totals["dense_ci_error"] += err
    if identity:
        out["gt/identity_ci_error"] = float(totals["identity_ci_error"])
    if dense:
        out["gt/dense_ci_error"] = float(totals["dense_ci_error"])
    return out


# ---------------------------------------------------------------- plots


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _permutation(site: str, ci: np.ndarray, dense: Mapping[str, int]) -> np.ndarray:
    if _site_pattern(site, dense) is not None:
        return permute_to_dense(ci)[1]
    return permute_to_identity(ci)[1]


def plot_permuted_ci(
    ci_by_site: Mapping[str, np.ndarray], path: Path, *, dense: Mapping[str, int] | None = None
) -> dict[str, np.ndarray]:
    """One PNG: per site the one-hot CI [F, C], its columns identity-permuted (dense-sorted for
    the sites a ``dense`` pattern matches), as the reference's PermutedCIPlots. Returns the
    permutation per site (what :func:`plot_uv` orders V and U by)."""
    dense = dict(dense or {})
    fig = _figure(4.5 * len(ci_by_site), 3.8)
    axes = fig.subplots(1, len(ci_by_site), squeeze=False)[0]
    perms = {}
    for ax, (site, ci) in zip(axes, ci_by_site.items(), strict=True):
        perm = _permutation(site, ci, dense)
        perms[site] = perm
        image = ax.matshow(ci[:, perm], vmin=0.0, vmax=1.0, cmap="Blues", aspect="auto")
        ax.set_title(site, fontsize=9)
        ax.set_xlabel("component (permuted)")
        ax.set_ylabel("one-hot feature (0.75)")
        fig.colorbar(image, ax=ax, shrink=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return perms


def plot_uv(
    uv_by_site: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: Path,
    perms: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """One PNG, a row per site: V [d_in, C] and U [C, d_out], the components in ``perms``'
    order (the permuted-CI plot's), one colour scale for all (the reference's UV plots)."""
    fig = _figure(10, 4.5 * len(uv_by_site))
    axes = fig.subplots(len(uv_by_site), 2, squeeze=False)
    values = [a for vu in uv_by_site.values() for a in vu]
    lo, hi = min(float(a.min()) for a in values), max(float(a.max()) for a in values)
    image = None
    for row, (site, (v, u)) in zip(axes, sorted(uv_by_site.items()), strict=True):
        perm = np.arange(v.shape[1]) if perms is None or site not in perms else perms[site]
        image = row[0].matshow(v[:, perm], aspect="auto", cmap="coolwarm", vmin=lo, vmax=hi)
        row[0].set(title=f"{site} (V)", xlabel="component", ylabel="d_in")
        row[1].matshow(u[perm], aspect="auto", cmap="coolwarm", vmin=lo, vmax=hi)
        row[1].set(title=f"{site} (U)", xlabel="d_out", ylabel="component")
    fig.colorbar(image, ax=axes.ravel().tolist())
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def plot_neuron_contributions(target: np.ndarray, component: np.ndarray, path: Path) -> Path:
    """The scatter of the paper's neuron-contribution figures: one point per (layer, feature,
    neuron), the target's contribution [L, F, d_mlp] against the best component's."""
    fig = _figure(6, 6)
    ax = fig.subplots()
    for layer in range(target.shape[0]):
        ax.scatter(
            target[layer].ravel(),
            component[layer].ravel(),
            s=6,
            alpha=0.3,
            color=("C0", "C3", "C2", "C1")[layer % 4],
            label=f"MLP {layer + 1}",
            edgecolors="none",
        )
    lim = float(max(np.abs(target).max(), np.abs(component).max(), 1e-12)) * 1.05
    ax.plot([-lim, lim], [-lim, lim], color="grey", linewidth=0.8, linestyle="--")
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal")
    ax.set_xlabel("neuron contribution (target)")
    ax.set_ylabel("neuron contribution (best mlp_in component)")
    ax.legend(loc="upper left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path


def ground_truth_section(run_dir: str | Path) -> list[str] | None:
    """The report's ground-truth section of a toy run dir (HTML fragments), or None when
    ``run_dir`` holds no toy run: the reference's metrics per site (alive, pd's alive on the
    one-hot inputs, IdentityCIError, DenseCIError), what a nonzero IdentityCIError is made of
    (:func:`identity_failures`) and MMCS / ML2R, from the latest ``analysis/ground_truth-{step}.json``
    (``pd-train analyze``) or else the run's ``summary.json``, and the toy's PNGs under
    ``plots/`` (permuted CI, UV, directions, neuron contributions)."""
    import base64
    import html
    import json

    import yaml

    run_dir = Path(run_dir)
    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(config, dict) or "toy" not in config:
        return None
    name = str(config["toy"])
    found = sorted(
        (run_dir / "analysis").glob("ground_truth-*.json"),
        key=lambda p: int(p.stem.rsplit("-", 1)[1]) if p.stem.rsplit("-", 1)[1].isdigit() else -1,
    )
    source = found[-1] if found else run_dir / "summary.json"
    parts = ["<h2>Ground truth (the reference's metrics)</h2>"]
    if not source.is_file():
        parts.append(
            f"<p>No ground-truth metrics yet: run <code>pd-train analyze {html.escape(str(run_dir))}"
            "</code> on a checkpoint, or let the run finish.</p>"
        )
        return parts
    record = json.loads(source.read_text())
    step = record.get("checkpoint_step", record.get("steps"))
    verdict = "yes" if record.get("reproduced") else "no"
    parts.append(
        f'<p class="sub">{html.escape(str(source))}: {html.escape(name)} at step {step}; '
        f"reproduced by the reference's criteria (IdentityCIError 0, DenseCIError 0, MMCS ≥ 0.99 "
        f"for TMS): <b>{verdict}</b></p>"
    )
    if "gt/mmcs" in record:
        parts.append(
            f"<p>linear1: MMCS {record['gt/mmcs']:.4f} ± {record.get('gt/mmcs_std', 0):.4f}, "
            f"ML2R {record['gt/ml2r']:.4f} ± {record.get('gt/ml2r_std', 0):.4f}</p>"
        )
    rows = []
    for site in record.get("one_hot_ci", {}):
        cells = [html.escape(site)]
        for key in ("alive", "alive_one_hot", "identity_ci_error", "dense_ci_error"):
            value = record.get(f"gt/{key}/{site}")
            cells.append("–" if value is None else f"{value:.0f}")
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    parts.append(
        '<table id="ground-truth"><thead><tr><th>site</th><th class="num">alive</th>'
        '<th class="num">alive (one-hot)</th>'
        '<th class="num">IdentityCIError</th><th class="num">DenseCIError</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    failures = record.get("identity_failures") or {}
    if failures:
        items = "".join(
            f"<li>{html.escape(site)}: "
            + "; ".join(html.escape(d) for d in describe_identity_failures(f))
            + "</li>"
            for site, f in failures.items()
        )
        parts.append(
            f'<p>What the IdentityCIError counts:</p><ul id="identity-failures">{items}</ul>'
        )
    for png in sorted((run_dir / "plots").glob(f"{name}_*.png")):
        uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
        title = png.stem.removeprefix(f"{name}_").replace("_", " ")
        parts.append(
            f'<figure><img alt="{html.escape(title)}" src="{uri}">'
            f"<figcaption>{html.escape(title)}</figcaption></figure>"
        )
    return parts
