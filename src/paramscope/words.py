"""A count and its noun, agreeing: "1 rank", "2 ranks", "1 microbatch", "8 microbatches".

Imports nothing from paramscope, so the engines' notes and the renderers can both use it."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` with thousands separators, then `noun`, or its plural (default: noun + "s") unless the count is 1."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
