"""The keyword checks every public estimate_* entry point shares: what it takes beside its options, and a layout.

Neutral ground: the engines (cost/) and the API (api.py) both import it, so neither imports the other for them."""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import OptionError

# what every estimate_* function takes beside its options, as `inspect` takes them
MODEL_OPTIONS = ("model_class", "task", "num_labels", "revision", "trust_remote_code")


def check_model_options(function: str, model_options: dict[str, Any], options_type: type) -> None:
    """Refuse, in one line, a keyword an estimate_* function does not take (before it reaches a signature deep in
    the engines as a TypeError): an option of `options_type` given beside it, or a name it does not know."""
    for name in model_options:
        if name in MODEL_OPTIONS:
            continue
        if name in {field.name for field in dataclasses.fields(options_type)}:
            raise OptionError(f"{function}() takes {name} in its options: options={options_type.__name__}({name}=...)")
        raise OptionError(f"{function}() has no argument {name!r}: it takes options={options_type.__name__}(...), "
                          f"use_cache and {', '.join(MODEL_OPTIONS)}")


def check_layout_option(layout: Any) -> None:
    """Refuse, in one line, a `layout=` that is not a ParallelLayout (a dict, the flags' names): build one with
    `paramscope.layout_for(...)`, which takes the CLI's layout flags as keywords. None is no layout."""
    if layout is None:
        return
    from .cost.parallel.layout import ParallelLayout

    if not isinstance(layout, ParallelLayout):
        raise OptionError("{0} must be a ParallelLayout, got a {kind} ({value}): build it with "
                          "paramscope.layout_for(devices=..., tp=..., pp=..., zero=...), the CLI's layout flags as "
                          "keywords", "layout", kind=type(layout).__name__, value=repr(layout)[:60])
    layout.check()
