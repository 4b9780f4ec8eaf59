"""Reading compiled HLO text in memory tests."""

from __future__ import annotations

import re


def _entry_constant_shapes(hlo: str) -> set[str]:
    """Shapes (HLO text, e.g. ``f32[2,2,6,4]``) of the top-level computation's values computed
    from constants only (zero broadcasts and their copies): XLA may schedule them anywhere."""
    entry = hlo[hlo.index("\nENTRY ") :]
    entry = entry[: entry.index("\n}")]
    const: set[str] = set()
    shapes = set()
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%(\S+) = (\w+\[[\d,]*\])\S* (\w[\w-]*)\((.*?)\)", line)
        if not m:
            continue
        name, shape, op, operands = m.groups()
        names = re.findall(r"%([\w.-]+)", operands)
        if op == "constant" or (names and all(n in const for n in names)):
            const.add(name)
            shapes.add(shape)
    return shapes


def _entry_scalar_broadcast_shapes(hlo: str) -> set[str]:
    """Shapes of the top-level computation's non-scalar values computed from scalars only (a
    scalar broadcast to a whole array, e.g. a zero carry started from ``0 · value``): unlike
    values computed from constants they wait for their scalar, but XLA may still keep them
    alive across everything scheduled between it and their use."""
    entry = hlo[hlo.index("\nENTRY ") :]
    entry = entry[: entry.index("\n}")]
    shape_of: dict[str, str] = {}
    found = set()
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%(\S+) = (\w+\[[\d,]*\])\S* (\w[\w-]*)\((.*?)\)", line)
        if not m:
            continue
        name, shape, _, operands = m.groups()
        shape_of[name] = shape
        names = re.findall(r"%([\w.-]+)", operands)
        scalar = shape.endswith("[]")
        if not scalar and names and all(shape_of.get(n, "").endswith("[]") for n in names):
            found.add(shape)
    return found
