"""One kind of communication a device does a step, as bytes: what layout_comm.py counts, layout_time.py times and
search_result.py shows (its own module so that the timing and the result both read it without a circle)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommTerm:
    """One kind of communication one device does a step: bytes sent (as many received), a bound."""

    kind: str  # "dp" | "tp" | "pp" | "ep" | "cp"
    what: str  # the collective, in words
    bytes: int
    formula: str  # in symbols
    arithmetic: str  # with this layout's numbers
