"""Recon plans: the static chunks of sites a recon term makes live, and how positions are
routed among them. Built once per term (:meth:`pd_train.losses.LossTerm.plan`); the recon loss
(:mod:`pd_train.losses.recon`) and the FLOP census read them.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

import attrs
import numpy as np

from pd_train.decomposition import Decomposition

__all__ = ["ReconPlan", "all_sites_plan", "all_sites_subset_plan", "chunkwise_plan"]


@attrs.frozen(kw_only=True)
class ReconPlan:
    """Chunks of site indices (canonical order) and how positions are routed.

    ``routing="all"``: every position of a live site takes its component path (stochastic recon).
    ``routing="subset"``: per chunk, draw and position independently, k ~ U{1..n_live} and a
    uniformly random k-subset of the chunk's sites takes the component path (chunkwise subset
    recon, as spd's ``sample_uniform_k_subset_routing_masks``). ``routing="static_probability"``:
    per chunk, draw, live site and position independently, the site takes its component path
    with a fixed probability p (spd's ``StaticProbabilityRouter``; p is data, given to
    :func:`recon_loss`).
    """

    chunks: tuple[tuple[int, ...], ...]
    n_sites: int
    routing: Literal["all", "subset", "static_probability"]

    @property
    def n_chunks(self) -> int:
        return len(self.chunks)

    def site_masks(self) -> np.ndarray:
        """[n_chunks, n_sites] bool: which sites each chunk makes live."""
        out = np.zeros((self.n_chunks, self.n_sites), dtype=bool)
        for i, chunk in enumerate(self.chunks):
            out[i, list(chunk)] = True
        return out

    def n_live(self) -> np.ndarray:
        return np.array([len(c) for c in self.chunks], dtype=np.int32)

    def is_uniform(self, decomposition: Decomposition) -> bool:
        """Whether every chunk holds the same number of sites of each kind."""
        sites = decomposition.sites
        counts = [Counter(sites[i].kind for i in chunk) for chunk in self.chunks]
        return all(c == counts[0] for c in counts)


def chunkwise_plan(
    decomposition: Decomposition,
    sites_per_chunk: int,
    routing: Literal["subset", "static_probability"] = "subset",
) -> ReconPlan:
    """Sites in canonical order, cut into consecutive chunks of ``sites_per_chunk``."""
    n = len(decomposition.sites)
    chunks = tuple(
        tuple(range(i, min(i + sites_per_chunk, n))) for i in range(0, n, sites_per_chunk)
    )
    return ReconPlan(chunks=chunks, n_sites=n, routing=routing)


def all_sites_plan(decomposition: Decomposition) -> ReconPlan:
    """One chunk with every site live at every position."""
    n = len(decomposition.sites)
    return ReconPlan(chunks=(tuple(range(n)),), n_sites=n, routing="all")


def all_sites_subset_plan(decomposition: Decomposition) -> ReconPlan:
    """One chunk of every site with subset routing: per position, k ~ U{1..n_sites} and a
    random k-subset of all sites live (``subset_recon``)."""
    n = len(decomposition.sites)
    return ReconPlan(chunks=(tuple(range(n)),), n_sites=n, routing="subset")
