"""The init plan: validated specs grouped into stacks, and the jitted functions that draw them."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from pd_init import _counter
from pd_init._errors import InitSpecError
from pd_init._initializers import Initializer, Zeros
from pd_init._keys import check_no_collisions
from pd_init._spec import ArraySpec, check_sharding


def require_partitionable_threefry() -> None:
    """Raise unless ``jax_threefry_partitionable`` is on: it changes every random value."""
    if not jax.config.jax_threefry_partitionable:  # type: ignore[attr-defined]
        msg = (
            "pd-init needs jax.config.jax_threefry_partitionable = True (the default in current "
            "JAX): with it off, random values depend on how arrays are sharded and stacked, so "
            "stacked, fanned-out and per-array inits would not agree. Turn it back on with "
            "jax.config.update('jax_threefry_partitionable', True)."
        )
        raise InitSpecError(msg)


@attrs.frozen(kw_only=True)
class Group:
    """A shape group: arrays drawn together, in one jit, into one stacked array.

    ``shape`` is the member shape; the stack is ``[len(members), *shape]`` with ``sharding``.
    ``member_shardings[i]`` is the sharding member ``i`` gets when fanned out.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    init: Initializer
    members: tuple[str, ...]
    hashes: tuple[int, ...]
    sharding: Sharding | None
    member_shardings: tuple[Sharding | None, ...]

    @property
    def stacked_shape(self) -> tuple[int, ...]:
        return (len(self.members), *self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the stacked array (equal to the bytes of all its members)."""
        return int(np.prod(self.stacked_shape, dtype=np.int64)) * self.dtype.itemsize


@attrs.frozen(kw_only=True)
class StackedArrays:
    """The result of a stacked init.

    ``stacks[group]`` is the ``[n_members, *shape]`` array of a group; ``index[name]`` is
    ``(group, i)``: the array called ``name`` is ``stacks[group][i]``.
    """

    stacks: Mapping[str, jax.Array]
    index: Mapping[str, tuple[str, int]]

    def member(self, name: str) -> jax.Array:
        """The array called ``name``: its slice of its group's stack (``[*shape]``)."""
        if name not in self.index:
            msg = f"no array named {name!r} in this init; known: {_preview(self.index)}"
            raise KeyError(msg)
        group, i = self.index[name]
        return self.stacks[group][i]


def _preview(names: Iterable[str], limit: int = 5) -> str:
    names = list(names)
    head = ", ".join(repr(n) for n in names[:limit])
    return head + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _stacked_sharding(member: Sharding) -> Sharding:
    """``P(None, *member_spec)``: the stack's leading (member) axis is not sharded."""
    if isinstance(member, NamedSharding):
        spec = PartitionSpec(None, *member.spec)
        return NamedSharding(member.mesh, spec, memory_kind=member.memory_kind)
    return member  # SingleDeviceSharding: a stack lives on the same device.


def _member_sharding(stacked: Sharding) -> Sharding:
    """The sharding of one slice of a stack: the stack's spec without its leading entry."""
    if isinstance(stacked, NamedSharding):
        spec = PartitionSpec(*tuple(stacked.spec)[1:])
        return NamedSharding(stacked.mesh, spec, memory_kind=stacked.memory_kind)
    return stacked


def _auto_group_name(shape: tuple[int, ...], dtype: np.dtype, init: Initializer) -> str:
    return f"{dtype.name}[{','.join(str(d) for d in shape)}]/{init.label()}"


def _take(stack: jax.Array, index: jax.Array) -> jax.Array:
    # The index is a runtime argument, so one executable per group serves every member.
    return jax.lax.dynamic_index_in_dim(stack, index, axis=0, keepdims=False)


class InitPlan:
    """Validated specs, grouped; builds the jitted stacked, fan-out and reference inits.

    Build a plan once and reuse it: its jitted functions are traced and compiled on first use.

    Args:
        specs: the arrays to initialize (non-empty, unique names).
        group_shardings: optional ``{group name: sharding of the stacked [n, *shape] array}``,
            taken unchanged; by default a group's stack is sharded ``P(None, *member_spec)``.
        draw: how a group's members are drawn inside the one jit. ``"map"`` (default): a
            ``lax.map`` over the members' keys, so every kernel has the member's shape and
            compile time does not grow with the number of members. ``"vmap"``: one vectorized
            draw of ``[n, *shape]``; same values, but XLA's CPU compile time grows with ``n``.
            ``"counter"``: every group whose initializer maps a U[0, 1) draw elementwise
            (Uniform, Normal, TruncatedNormal: ``from_unit``) with threefry keys is drawn with
            NO loop: its whole stack is one elementwise expression of (member key, the element's
            flat index in its member), the counters ``jax.random`` gives each element, hashed by
            an unrolled threefry that XLA fuses into the kernel writing the stack (see
            ``pd_init._counter``). Same values, bit for bit; no temporary; the compile is one
            small kernel per group, whatever the member count and size. ``Zeros`` groups are
            one broadcast zero (no key, no loop); other groups (and members of 2**32 elements
            or more) are drawn as by ``"map"``.
            :attr:`counter_drawn` lists the groups drawn from counters.
    """

    def __init__(
        self,
        specs: Sequence[ArraySpec],
        *,
        group_shardings: Mapping[str, Sharding] | None = None,
        draw: Literal["map", "vmap", "counter"] = "map",
    ) -> None:
        require_partitionable_threefry()
        if draw not in ("map", "vmap", "counter"):
            msg = f"draw must be 'map', 'vmap' or 'counter', got {draw!r}"
            raise InitSpecError(msg)
        self.draw = draw
        specs = list(specs)
        if not specs:
            msg = "specs is empty: give at least one ArraySpec"
            raise InitSpecError(msg)
        for i, spec in enumerate(specs):
            if not isinstance(spec, ArraySpec):
                msg = f"specs[{i}] must be an ArraySpec, got {type(spec).__name__}: {spec!r}"
                raise InitSpecError(msg)
        seen: dict[str, int] = {}
        for i, spec in enumerate(specs):
            if spec.name in seen:
                msg = (
                    f"duplicate array name {spec.name!r} at specs[{seen[spec.name]}] and specs[{i}]"
                )
                raise InitSpecError(msg)
            seen[spec.name] = i
        hashes = check_no_collisions(spec.name for spec in specs)
        self.specs: tuple[ArraySpec, ...] = tuple(specs)
        self.groups: tuple[Group, ...] = _build_groups(specs, hashes, dict(group_shardings or {}))
        self.index: dict[str, tuple[str, int]] = {
            name: (group.name, i) for group in self.groups for i, name in enumerate(group.members)
        }
        self._hashes = hashes
        self._groups_by_name = {group.name: group for group in self.groups}
        self.sharded = self.groups[0].sharding is not None
        #: Names of the groups drawn from counters (``draw="counter"``; threefry keys only).
        self.counter_drawn: tuple[str, ...] = tuple(
            g.name for g in self.groups if draw == "counter" and _counter_drawable(g)
        )

    # ------------------------------------------------------------------ stacked
    @functools.cached_property
    def stacked_fn(self) -> Any:
        """Jitted ``fn(*, key) -> {group name: [n, *shape]}``; lower it on an abstract key."""
        groups = self.groups
        draw_mode = self.draw
        # Every member's key by one fold_in over all the name hashes.
        all_hashes = np.array([h for group in groups for h in group.hashes], dtype=np.uint32)
        starts = np.cumsum([0] + [len(group.members) for group in groups])

        counter_drawn = set(self.counter_drawn)

        def stacked(*, key: jax.Array) -> dict[str, jax.Array]:
            require_partitionable_threefry()
            threefry = _counter.is_threefry(key)
            if threefry:  # every member's key, by threefry written out: one fused kernel
                # The barrier keeps the keys one small kernel of their own; without it XLA
                # fuses their hash into every group's kernel (twice the code, and per element).
                keys = jax.lax.optimization_barrier(_counter.fold_in(key, all_hashes))
                if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
                    keys = jax.random.wrap_key_data(keys, impl=jax.random.key_impl(key))
            else:
                keys = jax.vmap(lambda h: jax.random.fold_in(key, h))(jnp.asarray(all_hashes))
            out = {}
            for group, start, stop in zip(groups, starts[:-1], starts[1:], strict=True):
                members = keys[start:stop]
                if threefry and group.name in counter_drawn:
                    unit = _counter.unit_uniform_stack(
                        _counter.key_data(members), group.shape, group.dtype
                    )
                    value = group.init.from_unit(unit, group.dtype)  # type: ignore[union-attr]
                    value = _constrain(value, group.sharding)
                elif draw_mode == "counter" and isinstance(group.init, Zeros):
                    value = jnp.zeros(group.stacked_shape, group.dtype)  # no key, no loop
                    value = _constrain(value, group.sharding)
                else:
                    init = functools.partial(_draw, group.init, group.shape, group.dtype)
                    if draw_mode != "vmap":
                        value = jax.lax.map(init, members)
                    else:
                        value = jax.vmap(init)(members)
                _check_output(f"group {group.name!r}", value, group.stacked_shape, group.dtype)
                out[group.name] = value
            return out

        if not self.sharded:
            return jax.jit(stacked)
        return jax.jit(stacked, out_shardings={g.name: g.sharding for g in groups})

    def init_stacked(self, *, key: jax.Array) -> StackedArrays:
        """Draw every group's stack in one jit (one output per group)."""
        return StackedArrays(stacks=self.stacked_fn(key=key), index=dict(self.index))

    def abstract_stacks(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Shape, dtype and sharding of every stack, for lowering the fan-out without arrays."""
        return {
            g.name: jax.ShapeDtypeStruct(g.stacked_shape, g.dtype, sharding=g.sharding)
            for g in self.groups
        }

    # ------------------------------------------------------------------ fan-out
    def _take_plan(self, group: Group) -> list[tuple[Sharding | None, list[int]]]:
        """Members grouped by target sharding: one take executable per distinct sharding."""
        by_sharding: dict[Sharding | None, list[int]] = {}
        for i, sharding in enumerate(group.member_shardings):
            by_sharding.setdefault(sharding, []).append(i)
        return list(by_sharding.items())

    def lower_fan_out(self) -> list[Any]:
        """Lowered take functions: one per distinct (stack shape, dtype, sharding, member sharding)."""
        abstract = self.abstract_stacks()
        index = jax.ShapeDtypeStruct((), jnp.int32)
        # Stacks of one shape, dtype and sharding share an executable, as they do when called.
        lowered = {}
        for group in self.groups:
            for sharding, _ in self._take_plan(group):
                stack = abstract[group.name]
                signature = (stack.shape, stack.dtype, stack.sharding, sharding)
                if signature not in lowered:
                    lowered[signature] = _take_for(sharding).lower(stack, index)
        return list(lowered.values())

    def fan_out(self, stacked: StackedArrays, *, consume: bool = False) -> dict[str, jax.Array]:
        """Per-array outputs ``{name: [*shape]}`` with each spec's sharding, in spec order.

        Works group by group, with one small jit per group whose member index is a runtime
        argument (so compile time does not grow with the number of members). With
        ``consume=True`` each group's stack is deleted once its members exist, which bounds peak
        memory by all stacks plus the largest group's members; ``stacked`` is unusable after.
        Without it, the stacks stay alive and the peak is stacks plus every member.
        """
        # Check every stack before touching any, so a bad input consumes nothing.
        missing = [g.name for g in self.groups if g.name not in stacked.stacks]
        if missing:
            msg = f"stacked has no stack for groups {missing}; pass the result of this plan's init"
            raise InitSpecError(msg)
        for group in self.groups:
            stack = stacked.stacks[group.name]
            if stack.is_deleted():
                msg = f"stack of group {group.name!r} was deleted (already consumed by a fan-out)"
                raise InitSpecError(msg)
            if stack.shape != group.stacked_shape or stack.dtype != group.dtype:
                msg = (
                    f"stack of group {group.name!r} is {stack.dtype}{list(stack.shape)}, "
                    f"expected {group.dtype}{list(group.stacked_shape)}"
                )
                raise InitSpecError(msg)
        out: dict[str, jax.Array] = {}
        for group in self.groups:
            stack = stacked.stacks[group.name]
            made = []
            for sharding, members in self._take_plan(group):
                take = _take_for(sharding)
                for i in members:
                    out[group.members[i]] = take(stack, np.int32(i))
                    made.append(out[group.members[i]])
            if consume:
                # Wait for the slices before freeing the stack, so the next group's slices are
                # never allocated while this stack is still held.
                jax.block_until_ready(made)
                stack.delete()
        return {spec.name: out[spec.name] for spec in self.specs}

    def init_per_array(self, *, key: jax.Array) -> dict[str, jax.Array]:
        """Stacked init, then fan-out consuming the stacks: ``{name: [*shape]}``."""
        return self.fan_out(self.init_stacked(key=key), consume=True)

    # ---------------------------------------------------------------- reference
    @functools.cached_property
    def reference_fn(self) -> Any:
        """Jitted ``fn(*, key) -> {name: [*shape]}``: one output per array (the old way)."""
        specs = self.specs
        hashes = self._hashes

        def reference(*, key: jax.Array) -> dict[str, jax.Array]:
            require_partitionable_threefry()
            out = {}
            for spec in specs:
                array_key = jax.random.fold_in(key, np.uint32(hashes[spec.name]))
                value = _draw(spec.init, spec.shape, spec.dtype, array_key)
                _check_output(f"array {spec.name!r}", value, spec.shape, spec.dtype)
                out[spec.name] = value
            return out

        if not self.sharded:
            return jax.jit(reference)
        shardings = {
            name: self._groups_by_name[group].member_shardings[i]
            for name, (group, i) in self.index.items()
        }
        return jax.jit(reference, out_shardings=shardings)

    def init_reference(self, *, key: jax.Array) -> dict[str, jax.Array]:
        """One jit, one output per array: the test oracle and the benchmark baseline."""
        return dict(self.reference_fn(key=key))


def _counter_drawable(group: Group) -> bool:
    """Whether ``draw="counter"`` draws ``group`` from counters (given a threefry key)."""
    return hasattr(group.init, "from_unit") and _counter.supports(group.shape, group.dtype)


def _constrain(value: jax.Array, sharding: Sharding | None) -> jax.Array:
    """``value`` laid out as ``sharding`` (a stack written in one kernel), or as XLA likes."""
    return value if sharding is None else jax.lax.with_sharding_constraint(value, sharding)


def _draw(init: Initializer, shape: tuple[int, ...], dtype: np.dtype, key: jax.Array) -> jax.Array:
    return init(key, shape, dtype)


def _check_output(where: str, value: Any, shape: tuple[int, ...], dtype: np.dtype) -> None:
    if tuple(np.shape(value)) != shape or jnp.result_type(value) != dtype:
        msg = (
            f"{where}: the initializer returned {jnp.result_type(value)}{list(np.shape(value))}, "
            f"expected {dtype}{list(shape)}"
        )
        raise InitSpecError(msg)


_take_unsharded = jax.jit(_take)


def _take_for(sharding: Sharding | None) -> Any:
    """The jitted take whose output has ``sharding`` (compiled once per stack shape)."""
    if sharding is None:
        return _take_unsharded
    return _take_sharded(sharding)


@functools.cache
def _take_sharded(sharding: Sharding) -> Any:
    return jax.jit(_take, out_shardings=sharding)


def _build_groups(
    specs: list[ArraySpec],
    hashes: dict[str, int],
    group_shardings: dict[str, Sharding],
) -> tuple[Group, ...]:
    # Members of a group in the order given; groups in order of their first member.
    members: dict[str, list[ArraySpec]] = {}
    explicit: set[str] = set()
    for spec in specs:
        if spec.group is not None:
            name = spec.group
            explicit.add(name)
        else:
            name = _auto_group_name(spec.shape, spec.dtype, spec.init)
            if name in explicit:
                msg = (
                    f"array {spec.name!r}: its automatic group name {name!r} is also an explicit "
                    f"group name; rename that group"
                )
                raise InitSpecError(msg)
            # Distinct user functions can share a label; keep their groups apart.
            suffix = 1
            while name in members and _group_key(members[name][0]) != _group_key(spec):
                suffix += 1
                name = f"{_auto_group_name(spec.shape, spec.dtype, spec.init)}#{suffix}"
        if spec.group is not None and name in members and members[name][0].group is None:
            msg = (
                f"array {spec.name!r}: explicit group {name!r} has the name of an automatic group "
                f"(of {members[name][0].name!r}); rename the group"
            )
            raise InitSpecError(msg)
        first = members.setdefault(name, [spec])[0]
        if first is not spec:
            _check_same_group(name, first, spec)
            members[name].append(spec)

    unknown = sorted(set(group_shardings) - set(members))
    if unknown:
        msg = f"group_shardings names unknown groups {unknown}; groups: {_preview(members)}"
        raise InitSpecError(msg)

    groups = []
    for name, group_specs in members.items():
        first = group_specs[0]
        stacked_shape = (len(group_specs), *first.shape)
        if name in group_shardings:
            sharding: Sharding | None = group_shardings[name]
            check_sharding(f"group_shardings[{name!r}]", sharding, stacked_shape)  # type: ignore[arg-type]
        else:
            distinct = {spec.sharding for spec in group_specs}
            if len(distinct) > 1:
                other = next(s for s in group_specs if s.sharding != first.sharding)
                msg = (
                    f"group {name!r}: arrays {first.name!r} ({first.sharding}) and {other.name!r} "
                    f"({other.sharding}) have different shardings, so the stack's sharding is "
                    f"ambiguous; pass it in group_shardings[{name!r}]"
                )
                raise InitSpecError(msg)
            sharding = None if first.sharding is None else _stacked_sharding(first.sharding)
        member_shardings = tuple(
            spec.sharding
            if spec.sharding is not None or sharding is None
            else _member_sharding(sharding)
            for spec in group_specs
        )
        groups.append(
            Group(
                name=name,
                shape=first.shape,
                dtype=first.dtype,
                init=first.init,
                members=tuple(spec.name for spec in group_specs),
                hashes=tuple(hashes[spec.name] for spec in group_specs),
                sharding=sharding,
                member_shardings=member_shardings,
            )
        )

    sharded = [g for g in groups if g.sharding is not None]
    unsharded = [g for g in groups if g.sharding is None]
    if sharded and unsharded:
        msg = (
            f"group {unsharded[0].name!r} (array {unsharded[0].members[0]!r}) has no sharding "
            f"while group {sharded[0].name!r} has one; give every array a sharding (or "
            f"group_shardings), or none"
        )
        raise InitSpecError(msg)
    devices = {frozenset(g.sharding.device_set) for g in sharded}  # type: ignore[union-attr]
    if len(devices) > 1:
        msg = "the groups' shardings use different device sets; one init runs on one device set"
        raise InitSpecError(msg)
    return tuple(groups)


def _group_key(spec: ArraySpec) -> tuple[Any, ...]:
    return (spec.shape, spec.dtype, spec.init)


def _check_same_group(name: str, first: ArraySpec, spec: ArraySpec) -> None:
    for field in ("shape", "dtype", "init"):
        a, b = getattr(first, field), getattr(spec, field)
        if a != b:
            msg = (
                f"group {name!r}: arrays {first.name!r} and {spec.name!r} differ in {field} "
                f"({a} vs {b}); a group's arrays must share shape, dtype and initializer"
            )
            raise InitSpecError(msg)
