"""What a captured plan is bound to, and the exact check a run passes before its plan replays.

A plan (an IOBinding, or a CUDA graph) holds raw pointers: replaying it after any binding moved,
or changed shape or dtype, would read or write the wrong memory. `signature` names every binding's
name, direction, dtype, shape and address; `ReplayCheck` decides the same as comparing signatures,
cheaply, by holding the very objects the plan was captured with.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter, is_, itemgetter
from typing import Any, NamedTuple

import numpy as np

from mtplab.runtime.arena import Block, address, put


class Binding(NamedTuple):
    """One bound value: graph name, the array bound by address, direction, and its pool block if any."""

    name: str
    array: Any
    output: bool
    block: Block | None = None


class AddressCache:
    """Raw addresses by array object. Holds a reference to each, so an id is never reused while cached.

    Looking up a pointer (`ndarray.ctypes.data`) costs about a microsecond; a signature check
    before every replay looks up every binding, and the arrays are mostly the same objects.
    """

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self.cache: dict[int, tuple[Any, int]] = {}

    def __call__(self, a: Any) -> int:
        hit = self.cache.get(id(a))
        if hit is not None and hit[0] is a:
            return hit[1]
        if len(self.cache) >= self.limit:
            self.cache.clear()
        addr = address(a)
        self.cache[id(a)] = (a, addr)
        return addr


def signature(binds: list[Binding], addr=address) -> tuple:
    """Name, direction, dtype, shape and address of every bound value: what a plan bakes in."""
    return tuple((b.name, "out" if b.output else "in", b.array.dtype, b.array.shape, addr(b.array)) for b in binds)


def describe_mismatch(old: tuple, new: tuple) -> str:
    """Human-readable first difference between two signatures."""
    old_d, new_d = {k[:2]: k for k in old}, {k[:2]: k for k in new}
    for key in list(new_d) + [k for k in old_d if k not in new_d]:  # binding order: inputs first
        a, b = old_d.get(key), new_d.get(key)
        if a == b:
            continue
        if a is None or b is None:
            return f"{key[0]}: {'added' if a is None else 'removed'}"
        if a[3] != b[3]:
            return f"{key[0]}: shape {list(a[3])} -> {list(b[3])}"
        if a[4] != b[4]:
            return f"{key[0]}: address moved {a[4]:#x} -> {b[4]:#x}"
        return f"{key[0]}: dtype {a[2]} -> {b[2]}"
    return "no difference"


class OutputSpec(Mapping):
    """A forward's output spec, {name: (shape, dtype)}, that cannot change once made: the replay check may take
    the very same object as the same spec (target_io and mtp_io cache one per forward size)."""

    __slots__ = ("_spec",)

    def __init__(self, spec: dict):
        self._spec = dict(spec)

    def __getitem__(self, name):
        return self._spec[name]

    def __iter__(self):
        return iter(self._spec)

    def __len__(self) -> int:
        return len(self._spec)

    def __repr__(self) -> str:
        return f"OutputSpec({self._spec!r})"


_META = attrgetter("dtype", "shape")
_ARRAY = itemgetter(1)


class ReplayCheck:
    """The objects a slot's plan was captured (or last validated) with, for a cheap exact check per replay.

    signature() of a run names every binding's name, direction, dtype, shape and address, the
    address looked up by array object (AddressCache). A run whose bindings are the very objects
    this holds, in the same order and under the same names, with the same dtype and shape read
    now, has that same signature, so it may replay without building it:
    - feeds: same names in the same order, each value of the same shape and dtype, so staging picks
      the same slot buffer (SlotMemory keeps one view per name, shape and dtype; host inputs are
      checked against SlotMemory.host, which a new shape replaces);
    - outputs: the same spec (names in order, shapes, dtypes; or the very same OutputSpec) from the
      same SlotMemory and, for step-scoped outputs, the same pool block still held, so the same addresses;
    - bound: the same (name, direction) and the same array object, read for dtype and shape;
    - every slot buffer (staged feeds, outputs) read for dtype and shape too.
    Anything else, and the run takes the full signature path, unchanged.
    """

    __slots__ = (
        "memory",
        "feeds",
        "feed_names",
        "feed_meta",
        "host_views",
        "staging",
        "out_names",
        "out_spec",
        "out_obj",
        "block",
        "bound",
        "bound_obj",
        "bound_arrays",
        "arrays",
        "meta",
        "result",
    )

    def __init__(self, memory: Any, feeds: dict, outputs: dict, staged: dict, outs: dict, bound: list):
        self.memory = memory
        self.feeds = feeds  # the objects themselves: a timing floor stages their values again (Executor.replay_bare)
        self.feed_names = tuple(feeds)
        self.feed_meta = list(map(_META, feeds.values()))
        self.host_views = [((n, v.shape, v.dtype), staged[n]) for n, v in feeds.items() if n in memory.host_inputs]
        # (buffer, whether a plain numpy assignment stages into it) per feed, in feed order
        self.staging = [(staged[n], isinstance(staged[n], np.ndarray)) for n in feeds]
        self.out_names = tuple(outputs)
        self.out_spec = dict(outputs)
        # An OutputSpec cannot change: the very same object needs no comparing.
        self.out_obj = outputs if type(outputs) is OutputSpec else None
        self.block = memory.block
        self.bound = tuple(bound)
        # A tuple of (name, array, is_output) tuples cannot change: the very same object needs no re-reading.
        self.bound_obj = bound if type(bound) is tuple else None
        self.bound_arrays = list(map(_ARRAY, bound))
        arrays = self.bound_arrays + list(staged.values()) + [a for a, _ in outs.values()]
        self.arrays = list({id(a): a for a in arrays}.values())  # each object once (KV is bound twice)
        self.meta = list(map(_META, self.arrays))
        self.result = {n: a for n, (a, _) in outs.items()}

    def holds(self, memory: Any, feeds: dict, outputs: dict, bound: list) -> bool:
        """Whether a run on these objects is the held one but for the arrays' dtypes and shapes (and the feeds'
        values), which stage() reads at every run: the same memory and pool block, feed names, output spec, bound
        (name, direction, array object) and host feed buffers."""
        if memory is not self.memory or memory.block is not self.block or tuple(feeds) != self.feed_names:
            return False
        if outputs is not self.out_obj and (tuple(outputs) != self.out_names or outputs != self.out_spec):
            return False
        if bound is not self.bound_obj:
            arrays = list(map(_ARRAY, bound))
            if len(arrays) != len(self.bound_arrays) or not all(map(is_, arrays, self.bound_arrays)):
                return False
            # Every bound array is the held object, so comparing the triples compares names and directions only.
            if tuple(bound) != self.bound:
                return False
        for key, view in self.host_views:
            if memory.host.get(key) is not view:
                return False
        return True

    def stage(self, memory: Any, feeds: dict, outputs: dict, bound: list) -> bool:
        """Stage the feeds and return True if this run's signature is the held one; False: take the full path.
        dtype and shape are read from the held objects at every run: an in-place reshape is caught here."""
        if not self.holds(memory, feeds, outputs, bound):
            return False
        values = list(feeds.values())
        if list(map(_META, values)) != self.feed_meta or list(map(_META, self.arrays)) != self.meta:
            return False
        for (view, plain), value in zip(self.staging, values):
            if plain:
                view[...] = value
            else:
                put(view, value)
        return True
