"""The Python API's `memory MODEL --training --find-layout`: `find_layout(model, SearchOptions(...))`.

The same search the CLI runs (search.find_layouts) and the same LayoutSearch it renders, with the model's Report
kept as its `.report`, as `estimate_training` keeps it."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...entry_options import check_model_options
from .search_options import SearchOptions
from .search_result import LayoutSearch


def find_layout(model: Any, options: SearchOptions, use_cache: bool = True, **model_options: Any) -> LayoutSearch:
    """Every dp × tp × pp × cp (× ep) layout of `options.devices` devices: those that fit `options.gpu` sorted by a
    bound on the step time at the GPU's peak (`.fitting`, `.best`), those that do not (`.not_fitting`), and the
    fewest devices that fit (`.minimum`). `model` is what `estimate_training` takes, but a live module."""
    from ...errors import OptionError
    from .search import find_layouts

    check_model_options("find_layout", model_options, SearchOptions)
    if not isinstance(options, SearchOptions):
        raise OptionError("{0} must be a SearchOptions(devices=..., gpu=...), got {value}", "options",
                          value=type(options).__name__)
    report, search, _ = find_layouts(model, options, use_cache, **model_options)
    return dataclasses.replace(search, report=report)
