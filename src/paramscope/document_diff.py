"""Where two JSON documents differ: the check every "answered two ways" comparison uses (templates against
builds, cost facts against builds, tests)."""

from __future__ import annotations

from typing import Any


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """A report document without what names its engine (the only field two engines may differ in)."""
    document = dict(document)
    document["model"] = {k: v for k, v in document["model"].items() if k != "engine"}
    return document


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first JSON path where `a` and `b` differ (type, key, key order, length or value), in words; None when
    they are the same document."""
    if type(a) is not type(b):
        return f"{path or '/'}: {str(a)[:80]} vs {str(b)[:80]}"
    if isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{path}/{key}: only in {'the build' if key in a else 'the template'}"
            found = first_difference(a[key], b[key], f"{path}/{key}")
            if found:
                return found
        if list(a) != list(b):
            return f"{path or '/'}: keys in another order"
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path or '/'}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}/{i}")
            if found:
                return found
        return None
    return None if a == b else f"{path or '/'}: {str(a)[:80]} vs {str(b)[:80]}"
