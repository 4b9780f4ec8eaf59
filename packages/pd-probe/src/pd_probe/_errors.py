"""Errors raised by pd-probe; every message names the field, the bad value and what is allowed."""

from __future__ import annotations


class ProbeError(Exception):
    """Base class of every error pd-probe raises on bad input or a failed check."""


class OverrideError(ProbeError, ValueError):
    """An override is malformed or names a config path that does not exist."""


class GridError(ProbeError, ValueError):
    """An arm of a grid cannot be built or its config does not validate."""


class IsolationError(ProbeError):
    """Two arms shared a cache, or an arm's first compile of a jit was a cache hit."""
