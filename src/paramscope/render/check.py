"""An engine check (cost/engine_check.py) as JSON: the `check` object of `flops --json` and `memory --json`."""

from __future__ import annotations

from typing import Any


def check_to_dict(check: Any) -> dict[str, Any] | None:
    """docs/json-schema.md: what both engines counted on which cut, and whether they agreed."""
    if check is None:
        return None
    return {"status": check.status, "class": check.class_name, "cut_layers": check.layers,
            "model_layers": check.of_layers, "points": [{"batch": b, "seq": s} for b, s in check.points],
            "modes": list(check.modes), "differs": check.differs or None, "words": check.words()}
