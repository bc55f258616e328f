"""`estimate_vllm` (`paramscope memory MODEL --engine vllm`): what vLLM computes at launch for a model, before
launching it.

input → the storage vLLM loads (vllm_dtype: the declared format, or `dtype`) → memory's serving answer at --tp
(serving_answer.py: the report, the weights, the KV cache's bytes per token) → vLLM's budget, KV blocks, concurrency
and the `vllm serve` line that fits (vllm.py) on the GPU or budget asked.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from ...entry_options import check_model_options
from ...errors import OptionError, UnsupportedError
from ..hardware import Accelerator, find_accelerator
from .result import MemoryEstimate
from .vllm import VllmOptions, VllmPreflight


@dataclass(frozen=True)
class VllmEstimate:
    """What `memory --engine vllm` answers: vLLM's launch figures, and memory's own serving answer at --tp that
    they are read from (its weights, its KV cache)."""

    preflight: VllmPreflight
    memory: MemoryEstimate
    # the model's Report. Not in == or hash, as MemoryEstimate's
    report: Any = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        """One line: `<VllmEstimate of MODEL on H100 80GB: N KV blocks, T tokens, max concurrency X at L tokens>`."""
        p = self.preflight
        model = "" if self.report is None else f" of {self.report.model.label}"
        gpus = f" × {p.tp * p.pp}" if p.tp * p.pp > 1 else ""
        return (f"<VllmEstimate{model} on {p.gpu}{gpus}: {p.blocks:,} KV blocks, {p.kv_tokens:,} tokens, max "
                f"concurrency {p.max_concurrency:,.2f} at {p.max_model_len:,} tokens · "
                f"{'fits' if p.fits else 'does not fit'}>")


def estimate_vllm(model: Any, options: VllmOptions = VllmOptions(), use_cache: bool = True,
                  **model_options: Any) -> VllmEstimate:
    """vLLM's launch figures for `model` on `options.gpu` (or `options.budget` bytes), as `paramscope memory MODEL
    --engine vllm` answers: its memory budget, KV blocks and tokens, the maximum concurrency at max_model_len, the
    largest max_model_len that fits, and the `vllm serve` flags that fit."""
    check_model_options("estimate_vllm", model_options, VllmOptions)
    return vllm_answer(model, options, use_cache, **model_options)


def vllm_answer(model: Any, options: VllmOptions, use_cache: bool = True, **model_options: Any) -> VllmEstimate:
    """`estimate_vllm` without the keyword check."""
    from ...api import as_source
    from .quantization import weight_format
    from .serving import MemoryOptions
    from .serving_answer import memory_answer
    from .vllm import cache_dtype_flag, refuse_unserved_encoder_decoder, vllm_dtype, vllm_preflight

    options.check()
    if options.pp_layer_partition is not None and options.pp == 1:
        raise OptionError("{0} is for {1}: each pipeline stage's layers", "pp_layer_partition", "pp")
    if not options.gpu and options.budget is None:
        raise OptionError("vLLM's pre-flight needs {0} or {1}: the memory vLLM's utilization multiplies", "gpu",
                          "budget")
    accelerator = find_accelerator(options.gpu) if options.gpu else Accelerator("budget", options.budget, "",
                                                                                "budget")
    source = as_source(model, model_options.pop("revision", None))
    if source.checkpoint is not None or (options.dtype is not None and weight_format(options.dtype).kind == "gguf"):
        # vLLM keeps a GGUF's weights in their ggml types through its own (experimental) GGUF kernels: not modelled,
        # and pricing them at the model's dtype would be several times high
        raise UnsupportedError("vLLM's pre-flight on a GGUF model (a .gguf file or a llama.cpp mixture {0}) is not "
                               "modelled; llama.cpp's memory serves it", "dtype")
    refuse_unserved_encoder_decoder(source.config)
    dtype, dtype_flag, dtype_note = vllm_dtype(source.config, options.dtype)
    memory = MemoryOptions(dtype=dtype, kv_dtype=options.kv_dtype, seq=options.max_model_len,
                           group_size=options.group_size, reserve=options.reserve, tp=options.tp)
    memory.check()
    report, estimate, view = memory_answer(source, memory, use_cache, **model_options)
    # the model as `vllm serve` takes it: a hub id, or the path (or name) given
    named = isinstance(model, (str, os.PathLike)) and report.model.source_kind not in ("preset", "hub", "hub-cache")
    preflight = vllm_preflight(report, view, estimate, options, accelerator, reserve=options.reserve, tp=options.tp,
                               pp=options.pp, model_id=str(model) if named else report.model.label,
                               kv_dtype_flag=cache_dtype_flag(estimate.settings["kv_dtype"],
                                                              estimate.settings.get("compute_dtype")),
                               dtype_flag=dtype_flag, extra_notes=(dtype_note,) if dtype_note else ())
    return VllmEstimate(preflight, dataclasses.replace(estimate, report=report), report)


__all__ = ["VllmEstimate", "estimate_vllm", "vllm_answer"]
