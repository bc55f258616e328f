"""`estimate_llama_cpp` (`paramscope memory MODEL|FILE.gguf --engine llama.cpp`): memory per device as llama.cpp
places a model, from its name, config or GGUF file.

input → a GGUF file's header (each tensor's exact bytes), or a config with a llama.cpp mixture `dtype` (the file
llama-quantize writes, predicted by llama_cpp_mixture.py) → memory's serving answer in those types (serving_answer.py:
the report, the weights, the config llama.cpp's hparams are read from) → llama.cpp's placement, caches and buffers
(llama_cpp.py) on the GPU or budget asked. An RWKV-6/7 file, which transformers has no class for, is answered from
its header alone (llama_cpp_header.py), without the memory report.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...entry_options import check_model_options
from ...errors import OptionError
from ..hardware import Accelerator, find_accelerator
from .llama_cpp import LlamaCppOptions, LlamaCppPlan, Tensor, llama_cpp_plan, model_facts
from .result import MemoryEstimate


@dataclass(frozen=True)
class LlamaCppEstimate:
    """What `memory --engine llama.cpp` answers: llama.cpp's plan, and memory's own serving answer for the same
    weights (None for a file answered from its header alone); `accelerator` is the GPU (or the budget, an
    Accelerator named "budget") the plan was fitted to, None without one."""

    plan: LlamaCppPlan
    memory: MemoryEstimate | None
    accelerator: Accelerator | None
    reserve: int
    # the GGUF header a header-only answer was read from (its JSON document names the file); None otherwise
    header: Any = field(default=None, repr=False, compare=False)
    # the model's Report (None for a header-only answer). Not in == or hash, as MemoryEstimate's
    report: Any = field(default=None, repr=False, compare=False)

    def __repr__(self) -> str:
        """One line: `<LlamaCppEstimate of MODEL: GPU … B, CPU … B · -ngl N · ctx C · fits on …>`."""
        devices = ", ".join(f"{d.device} {d.total:,} B" for d in self.plan.devices)
        fit = ""
        if self.plan.fit is not None and self.accelerator is not None:
            fit = f" · {'fits' if self.plan.fit.fits else 'does not fit'} on {self.accelerator.name}"
        return (f"<LlamaCppEstimate of {self.plan.model}: {devices} · -ngl {self.plan.placement.n_gpu_layers} · "
                f"ctx {self.plan.n_ctx:,}{fit}>")


def estimate_llama_cpp(model: Any, options: LlamaCppOptions = LlamaCppOptions(), use_cache: bool = True,
                       **model_options: Any) -> LlamaCppEstimate:
    """llama.cpp's memory per device for `model` (a .gguf file, shard or folder; or a preset, config or hub id with
    a llama.cpp mixture `options.dtype` such as "q4_k_m"), as `paramscope memory MODEL --engine llama.cpp` answers.

    With `options.gpu` or `options.budget`, `n_gpu_layers=None` offloads the most layers that fit, and the plan's
    `fit` gives the llama-server flags that fit."""
    check_model_options("estimate_llama_cpp", model_options, LlamaCppOptions)
    return llama_cpp_answer(model, options, use_cache, **model_options)


def llama_cpp_device(options: LlamaCppOptions) -> Accelerator | None:
    """The GPU `options` name (or its budget, as an Accelerator named "budget"), None with neither."""
    if options.gpu:
        return find_accelerator(options.gpu)
    return None if options.budget is None else Accelerator("budget", options.budget, "", "budget")


def llama_cpp_answer(model: Any, options: LlamaCppOptions, use_cache: bool = True, *,
                     accelerator: Accelerator | None = None, **model_options: Any) -> LlamaCppEstimate:
    """`estimate_llama_cpp` without the keyword check. `accelerator`: llama_cpp_device(options), where the caller
    found it already (the CLI, to word its refusals with its flags' text); else it is found here."""
    from ...api import as_source
    from ...sources import gguf_source, local_gguf
    from .llama_cpp_header import HEADER_ONLY
    from .llama_cpp_mixture import mixture_name
    from .serving import MemoryOptions
    from .serving_answer import memory_answer

    options.check()
    if accelerator is None:
        accelerator = llama_cpp_device(options)
    reserve = options.reserve
    if accelerator is not None and accelerator.memory <= reserve:  # no GPU memory left to place anything in
        raise OptionError("{0}'s {memory:,} B is not above {1} {reserve:,} B: nothing is left on the GPU for "
                          "llama.cpp's buffers; give a larger budget or a smaller {1}",
                          "gpu" if options.gpu else "budget", "reserve", memory=accelerator.memory, reserve=reserve)
    budget = None if accelerator is None else accelerator.memory - reserve
    revision = model_options.pop("revision", None)
    at = local_gguf(str(model)) if isinstance(model, (str, os.PathLike)) else None
    if at is not None:  # the header read once: an RWKV-6/7 file has no config to build
        from ...checkpoint.gguf_read import read_gguf

        header = read_gguf(at)
        if header.architecture in HEADER_ONLY:
            if options.dtype is not None:
                raise OptionError("{0} with a .gguf file: llama.cpp serves the file's own types", "dtype")
            return _from_header(str(model), header, options, accelerator, budget)
        source = gguf_source(header, str(Path(str(model).strip()).expanduser()))
    else:
        source = as_source(model, revision)
    if source.checkpoint is None:
        if options.dtype is None or mixture_name(options.dtype) is None:
            got = "" if options.dtype is None else f", got {options.dtype}"
            raise OptionError("llama.cpp's memory needs a .gguf file, or a config with a llama.cpp mixture {0} "
                              "(q4_k_m, q8_0, iq4_xs, ...){got}", "dtype", got=got)
    elif options.dtype is not None:
        raise OptionError("{0} with a .gguf file: llama.cpp serves the file's own types", "dtype")
    memory = MemoryOptions(dtype=options.dtype, imatrix=options.imatrix)
    memory.check()
    # the transformers serving peak's check against a traced prefill is not llama.cpp's memory: not made here (a
    # hybrid's traced prefill runs transformers' CPU scan for minutes)
    report, estimate, view = memory_answer(source, memory, use_cache, check=False, **model_options)
    if source.checkpoint is not None:
        ck = source.checkpoint
        tensors = tuple(Tensor(t.name, t.nbytes) for t in ck.tensors)
        weights_from = f"the GGUF file {ck.files[0]}'s header: each tensor's exact bytes"
        model_arg = ck.files[0]  # llama-server -m takes the file (a split set's first shard), not its folder
    else:
        predicted = estimate.settings["gguf_file"]
        tensors = tuple(Tensor(t["name"], t["bytes"]) for t in predicted["tensor_list"])
        weights_from = (f"the predicted {predicted['mixture']} file ({predicted['source']}): each tensor's bytes as "
                        "llama-quantize writes it")
        model_arg = f"{report.model.label.rsplit('/', 1)[-1]}-{predicted['mixture']}.gguf"
    plan = llama_cpp_plan(tensors, model_facts(view.config), options, model=report.model.label,
                          weights_from=weights_from, budget=budget, model_arg=model_arg)
    return LlamaCppEstimate(plan, dataclasses.replace(estimate, report=report), accelerator, reserve, report=report)


def _from_header(model: str, ck: Any, options: LlamaCppOptions, accelerator: Accelerator | None,
                 budget: int | None) -> LlamaCppEstimate:
    """An RWKV-6/7 GGUF: transformers has no class to build, and llama.cpp's memory needs only the header (its
    tensors' bytes and hparams), so the answer is the llama.cpp plan alone, without the memory report."""
    from .llama_cpp_header import header_facts

    facts = header_facts(ck)
    tensors = tuple(Tensor(t.name, t.nbytes) for t in ck.tensors)
    plan = llama_cpp_plan(tensors, facts, options, model=model,
                          weights_from=f"the GGUF file {ck.files[0]}'s header: each tensor's exact bytes",
                          budget=budget, model_arg=ck.files[0],
                          notes=(f"{ck.architecture}: transformers has no class for it, so no memory report; "
                                 "llama.cpp's memory from the header alone",))
    return LlamaCppEstimate(plan, None, accelerator, options.reserve, header=ck)


__all__ = ["LlamaCppEstimate", "estimate_llama_cpp", "llama_cpp_answer", "llama_cpp_device"]
