"""Errors raised by pd-sharding."""

from __future__ import annotations


class MeshError(ValueError):
    """A mesh cannot be built from the requested axis sizes on the available devices."""


class ShardingError(ValueError):
    """An array cannot be laid out as a rule asks (rank, divisibility, unmatched state leaf)."""
