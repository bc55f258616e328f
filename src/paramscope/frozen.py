"""Read-only containers for the frozen results: a mapping that hashes, and the deep conversion into it.

A frozen dataclass only stops its fields from being rebound; a dict or list field can still be changed in place
(`report.breakdown["x"] = 0`), and makes the result unhashable. Every public result therefore holds tuples and
`FrozenDict`s, converted once where it is made (`freeze_fields` from the dataclass's `__post_init__`): changing
one raises TypeError, and `hash(result)` works.

`FrozenDict` is a `collections.abc.Mapping`, not a dict: it compares equal to a dict with the same items, but
`json.dumps` needs a plain one (`thaw`, or `json_default` as `json.dumps(..., default=json_default)`).

Imports nothing from paramscope, so every result module can import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Generic, Iterator, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenDict(Mapping, Generic[K, V]):
    """A read-only dict that hashes (when its values do): insertion order, `==` with any mapping of the same
    items, `repr` like a dict's. Nothing public changes one in place; `dict(d)` is a mutable copy."""

    __slots__ = ("_items", "_hash")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_items", dict(*args, **kwargs))
        object.__setattr__(self, "_hash", None)

    def __getitem__(self, key: Any) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Any) -> bool:
        return key in self._items

    # a dict's own (read-only) views and get: faster than Mapping's generic ones, same results
    def get(self, key: Any, default: Any = None) -> Any:
        return self._items.get(key, default)

    def keys(self):
        return self._items.keys()

    def values(self):
        return self._items.values()

    def items(self):
        return self._items.items()

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, FrozenDict):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._items == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:  # order-free, like ==; raises TypeError when a value does not hash
            object.__setattr__(self, "_hash", hash(frozenset(self._items.items())))
        return self._hash

    def __repr__(self) -> str:
        return repr(self._items)

    def __or__(self, other: Any) -> FrozenDict:
        if not isinstance(other, Mapping):
            return NotImplemented
        return FrozenDict({**self._items, **other})

    def __ror__(self, other: Any) -> dict:
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**other, **self._items}

    def __reduce__(self):  # pickle and copy: rebuilt from its items
        return (FrozenDict, (self._items,))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict) -> FrozenDict:
        return self  # immutable all the way down (freeze's values are)

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError("FrozenDict is read-only")

    def __delattr__(self, name: str) -> None:
        raise TypeError("FrozenDict is read-only")


def freeze(value: Any) -> Any:
    """`value` with every dict, list and set inside it, at any depth, made a FrozenDict, tuple and frozenset.

    Dataclasses and other objects are left as they are (a frozen dataclass freezes its own fields); so are
    FrozenDicts, strings and numbers. A tuple whose items need nothing is returned itself."""
    if isinstance(value, FrozenDict) or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return value
    if isinstance(value, Mapping):
        return FrozenDict((key, freeze(item)) for key, item in value.items())
    if isinstance(value, tuple) and not hasattr(value, "_fields"):  # named tuples keep their type
        items = tuple(freeze(item) for item in value)
        return value if all(a is b for a, b in zip(items, value)) else items
    if isinstance(value, list):
        return tuple(freeze(item) for item in value)
    if isinstance(value, (set, frozenset)):
        return frozenset(freeze(item) for item in value)
    return value


def freeze_fields(obj: Any, *names: str) -> None:
    """From a frozen dataclass's `__post_init__`: its fields `names` (all of them when none is named) frozen in
    place with `freeze`."""
    for name in names or tuple(f.name for f in dataclasses.fields(obj)):
        value = getattr(obj, name)
        frozen = freeze(value)
        if frozen is not value:
            object.__setattr__(obj, name, frozen)


def thaw(value: Any) -> Any:
    """A FrozenDict as a plain dict, at any depth inside dicts, lists and tuples (which stay what they are), for
    code that needs a real dict: `json.dumps`, a transformers config."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(thaw(item) for item in value)
    if isinstance(value, list):
        return [thaw(item) for item in value]
    return value


def json_default(value: Any) -> Any:
    """`json.dumps(..., default=json_default)`: a FrozenDict is written as the dict it holds (same bytes)."""
    if isinstance(value, FrozenDict):
        return value._items
    if isinstance(value, frozenset):
        raise TypeError("a frozenset has no JSON order; give a sorted list")
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
