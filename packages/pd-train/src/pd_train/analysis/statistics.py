"""Per-component statistics of causal importance (traceable, one reduction per kind).

Everything here takes ``ci_lower`` as the Trainer's CI path returns it, ``{kind: [n_k, B, T, C]}``
(n_k: the kind's sites, stacked in layer order), and reduces over the batch and positions, so a
caller sums the results over batches and divides by the token count at the end:

* ``active[kind]`` [n_k, C] int32: tokens with ci_lower > threshold. Divided by the tokens seen
  this is the component's **activation density**.
* ``ci_sum[kind]`` [n_k, C] float32: Σ ci_lower. Divided by the tokens seen this is the
  component's **mean CI**.

CI-L0 (components with ci_lower > threshold per token) grouped per layer, per kind and in total
comes from the same counts: the L0 of a site is Σ_c active / tokens, and a group's L0 is the sum
over its sites (the mean number of active components per token in that group).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pd_train.config.io import ConfigError

__all__ = [
    "MAX_LOGGED_COMPONENTS",
    "EvalComponentStats",
    "ci_lower_of",
    "component_counts",
    "grouped_l0",
    "l0_groups",
    "resolve_l0_groups",
]


def ci_lower_of(trainer: Any, params: Any, target: Any, tokens: jax.Array) -> dict[str, jax.Array]:
    """``ci_lower`` {kind: [n_k, B, T, C]} of a batch, through the Trainer's CI path (traceable).

    The same calls the train step and the evaluation make: the clean runner over the frozen
    target, the Trainer's CI function on the params' components (in the compute dtype), and the
    lower squash. tokens [B, T] int32.
    """
    from pd_train._forward import CleanRunner
    from pd_train.squash import lower_leaky_hard

    comps = jax.tree.map(lambda a: a.astype(trainer.compute_dtype), params["components"])
    clean = CleanRunner(trainer.forward_spec, target, tokens)
    _, pre = trainer.ci_fn.causal_importance(params["ci_fn"], comps, clean)
    return {k: lower_leaky_hard(v) for k, v in pre.items()}


def component_counts(
    ci_lower: Mapping[str, jax.Array], threshold: float | jax.Array
) -> dict[str, dict[str, jax.Array]]:
    """``{"active": {kind: [n_k, C] int32}, "ci_sum": {kind: [n_k, C] float32}}`` of one batch.

    ci_lower[kind]: [n_k, B, T, C]; ``active`` counts tokens with ci_lower > threshold, ``ci_sum``
    sums ci_lower (fp32) over the batch and positions.
    """
    active = {k: jnp.sum(v > threshold, axis=(1, 2), dtype=jnp.int32) for k, v in ci_lower.items()}
    ci_sum = {k: jnp.sum(v.astype(jnp.float32), axis=(1, 2)) for k, v in ci_lower.items()}
    return {"active": active, "ci_sum": ci_sum}


def l0_groups(sites: Iterable[Any]) -> dict[str, list[str]]:
    """The CI-L0 groups of a decomposition's sites: ``layer.{i}`` (every site of layer i),
    ``kind.{kind}`` (every site of that kind) and ``total`` → the site names in each.

    ``sites``: objects with ``name``, ``layer`` and ``kind`` (:class:`pd_train.decomposition.Site`),
    in canonical order.
    """
    sites = list(sites)
    groups: dict[str, list[str]] = {}
    for site in sites:
        groups.setdefault(f"layer.{site.layer}", []).append(site.name)
    for site in sites:
        groups.setdefault(f"kind.{site.kind}", []).append(site.name)
    groups["total"] = [site.name for site in sites]
    return groups


_GROUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def resolve_l0_groups(
    patterns: Mapping[str, Sequence[str]] | None,
    sites: Iterable[Any],
    *,
    path: str = "pd.l0_groups",
) -> dict[str, list[str]]:
    """The CI-L0 groups ``{name: [site names]}`` of a config's ``pd.l0_groups``
    (``{name: [fnmatch patterns over site names]}``), members in canonical order; None gives the
    default :func:`l0_groups` (per layer, per kind, total).

    Raises ConfigError naming ``pd.l0_groups.<name>`` for a bad name or an empty list, and
    ``pd.l0_groups.<name>[i]`` for a pattern that matches no decomposed site (all at once).
    """
    sites = list(sites)
    if patterns is None:
        return l0_groups(sites)
    problems: list[tuple[str, str]] = []
    if not patterns:
        problems.append((path, "is empty; give {name: [site patterns]} or null for the defaults"))
    groups: dict[str, list[str]] = {}
    for name, group in patterns.items():
        where = f"{path}.{name}"
        if not _GROUP_NAME.match(name):
            msg = f"group name {name!r}: use letters, digits, '.', '_' and '-' (no '/')"
            problems.append((where, msg))
        if not group:
            problems.append((where, "is empty; list at least one site pattern"))
        matched: set[str] = set()
        for i, pattern in enumerate(group):
            hits = {s.name for s in sites if fnmatch.fnmatchcase(s.name, pattern)}
            if not hits:
                msg = (
                    f"{pattern!r} matches no decomposed site; decomposed sites are named like "
                    f"{sites[0].name!r} (fnmatch patterns: *, ?, [0-9])"
                )
                problems.append((f"{where}[{i}]", msg))
            matched |= hits
        groups[name] = [s.name for s in sites if s.name in matched]
    if problems:
        raise ConfigError(problems)
    return groups


def grouped_l0(
    site_l0: Mapping[str, float], groups: Mapping[str, Iterable[str]]
) -> dict[str, float]:
    """``{group: Σ_{site in group} L0(site)}``: the mean number of active components per token in
    each group (``site_l0``: ``{site name: L0}``, e.g. the ``l0/<site>`` of a metrics record)."""
    return {name: float(np.sum([site_l0[s] for s in members])) for name, members in groups.items()}


#: Per-component vectors of a site go into a metrics record only up to this many components
#: (``pd_train.outputs``' limit on logged arrays); larger sites log their summaries only.
MAX_LOGGED_COMPONENTS = 4096


class EvalComponentStats:
    """Sums :func:`component_counts` over eval batches on the host and turns them into the
    eval record's entries:

    * ``density/<site>``: [C] activation density per component (fraction of tokens with
      ci_lower > threshold) and ``ci_mean/<site>``: [C] mean ci_lower per component — for sites
      with at most :data:`MAX_LOGGED_COMPONENTS` components;
    * ``alive/<site>``: components with density > 0 on the eval batches (alive as
      goodfire-ai/spd defines it, with ``n_examples_until_dead`` = the eval's tokens: above the
      threshold on at least one of them);
    * ``density_tokens``: the number of tokens the densities are over (B·T summed over batches);
    * ``l0_group/<group>``: CI-L0 per group (``pd.l0_groups``, default :func:`l0_groups`:
      ``layer.{i}``, ``kind.{kind}``, ``total``): the mean number of active components per token
      in the group.
    """

    def __init__(
        self, decomposition: Any, groups: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        """groups: ``pd.l0_groups`` (site patterns per group; None: per layer, kind, total)."""
        self.sites = list(decomposition.sites)
        self.groups = resolve_l0_groups(groups, self.sites)
        self.active: dict[str, np.ndarray] = {}
        self.ci_sum: dict[str, np.ndarray] = {}
        self.tokens = 0

    def add(self, counts: Mapping[str, Mapping[str, Any]], n_tokens: int) -> None:
        """counts: one batch's :func:`component_counts` (on the host); n_tokens: the batch's
        global token count (B·T)."""
        for name in ("active", "ci_sum"):
            total = getattr(self, name)
            for kind, value in counts[name].items():
                value = np.asarray(value, np.float64)
                total[kind] = total[kind] + value if kind in total else value
        self.tokens += int(n_tokens)

    def record(self) -> dict[str, Any]:
        if not self.tokens:
            return {}
        out: dict[str, Any] = {"density_tokens": self.tokens}
        site_l0 = {}
        for site in self.sites:
            density = self.active[site.kind][site.index] / self.tokens
            site_l0[site.name] = float(density.sum())
            out[f"alive/{site.name}"] = int(np.count_nonzero(density))
            if density.size <= MAX_LOGGED_COMPONENTS:
                out[f"density/{site.name}"] = density.astype(np.float32)
                mean = self.ci_sum[site.kind][site.index] / self.tokens
                out[f"ci_mean/{site.name}"] = mean.astype(np.float32)
        for group, value in grouped_l0(site_l0, self.groups).items():
            out[f"l0_group/{group}"] = value
        return out
