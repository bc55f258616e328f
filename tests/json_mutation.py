"""Mutating a stored JSON document one value at a time: what the cache-fuzzing tests share."""

from __future__ import annotations

from hypothesis import strategies as st

ANY_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) |
                        st.text(max_size=8), lambda inner: st.lists(inner, max_size=3) |
                        st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)


def json_paths(node, prefix=()):
    """Every path (keys and indices) into a JSON document, the root's empty one first."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from json_paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from json_paths(value, (*prefix, i))


def mutate(document, data) -> None:
    """Replace one value of `document`, drawn with hypothesis' `data`, by any JSON value (in place)."""
    paths = [p for p in json_paths(document) if p]
    path = data.draw(st.sampled_from(paths))
    node = document
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = data.draw(ANY_JSON)
