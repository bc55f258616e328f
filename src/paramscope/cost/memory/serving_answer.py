"""`paramscope memory MODEL` (serving): the answer for a model — from its template and cost facts, or from the meta
build — by the analytic engine (serving.py), checked once per config and compute dtype against a traced prefill
(serving_check.py), and corrected at the asked point, or traced, where the check found them differing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...entry_options import check_model_options
from ...errors import OptionError
from ..dtypes import torch_name
from ..hardware import find_accelerator
from .result import MemoryEstimate
from .serving import MemoryOptions, serving_estimate, storage_format


def estimate_memory(model: Any, options: MemoryOptions = MemoryOptions(), use_cache: bool = True,
                    **model_options: Any) -> MemoryEstimate:
    """The MemoryEstimate for serving `model`, analytic engine, with the model's Report as its `report`.

    With `use_cache` (and without --trace), a config whose template and cost facts are recorded is answered
    without torch (facts/store.py); otherwise the class is built on meta in the storage's compute dtype."""
    check_model_options("estimate_memory", model_options, MemoryOptions)
    report, estimate, _ = memory_answer(model, options, use_cache, **model_options)
    return dataclasses.replace(estimate, report=report)


def memory_answer(model: Any, options: MemoryOptions = MemoryOptions(), use_cache: bool = True,
                  check: bool = True, **model_options: Any):
    """`estimate_memory`, and the ModelView it read (the CLI records cost facts from a built one). `check`: the
    analytic peak is held against a traced prefill once per config (False for a caller that reads the report, the
    view and the weights only: llama.cpp's memory is its own arithmetic)."""
    from ...api import as_source
    from ..facts.store import answer_from_facts_or_build

    from ...api import is_module, inspect_module
    from ..model_view import from_module

    options.check()
    accelerator = find_accelerator(options.gpu) if options.gpu else None
    if options.kv_dtype is not None:
        torch_name(options.kv_dtype)  # a bad name fails before the build
    if is_module(model):  # a user's module, counted as it is; a transformers one brings its config
        if any(v for k, v in model_options.items() if k != "trust_remote_code"):
            raise OptionError("{0}, {1} and {2} apply to configs, not to a live module", "model_class", "task",
                              "num_labels")
        config = getattr(model, "config", None)
        fmt, origin, not_convert = storage_format(config.to_dict() if hasattr(config, "to_dict") else {}, options)
        report, view = inspect_module(model), from_module(model)
        return report, serving_estimate(report, view, options, fmt, origin, not_convert, accelerator), view
    source = as_source(model, model_options.pop("revision", None))
    from ...build import validate_config_dict

    validate_config_dict(source.config)  # the fields the storage format reads too, before they are read
    fmt, origin, not_convert = storage_format(source.config, options)
    if source.checkpoint is not None and options.dtype is None:  # a GGUF: priced at the file's own types
        from ...checkpoint.gguf_memory import gguf_file_format

        fmt = gguf_file_format(source.checkpoint, int(source.config["num_hidden_layers"]))
        origin, not_convert = f"the GGUF file {source.checkpoint.files[0]}'s header", ()
    from ..engine_check import CheckFor
    from ..facts.store import facts_key
    from .serving_check import check_serving, extended_difference
    from .serving_correction import CorrectionFor

    key = facts_key(source.config, model_class=model_options.get("model_class"), task=model_options.get("task"),
                    num_labels=model_options.get("num_labels"))
    dtype = fmt.compute_dtype
    checked = CheckFor("serving", f"{key}-{dtype}", use_cache and not options.trace,
                       lambda module: check_serving(module, dtype)) if check else None
    correct = CorrectionFor(key, use_cache and not options.trace, extended_difference)
    report, view, estimate = answer_from_facts_or_build(
        source, lambda report, view: serving_estimate(report, view, options, fmt, origin, not_convert, accelerator,
                                                      checked=checked, correct=correct),
        dtype=fmt.compute_dtype, use_cache=use_cache and not options.trace, **model_options)
    return report, estimate, view


__all__ = ["estimate_memory", "memory_answer"]
