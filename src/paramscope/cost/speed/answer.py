"""`paramscope serve MODEL --gpu NAME`: the roofline bounds (roofline.py) for a model, from the project's engines.

input → storage format (declared or --dtype) → template and cost facts, or the meta build → weights in the format
(memory/weights.py, as `memory` computes them) and the KV cache (memory/kv.py, checked against transformers' cache
on meta) → generate()'s decode step and prefill FLOPs (flops/generation.py, checked once per config against
FlopCounterMode) → bytes over bandwidth against FLOPs over peak.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...entry_options import check_model_options
from ...errors import UnsupportedError
from ..dims import text_config
from ..hardware import Accelerator, find_accelerator
from .roofline import ServeSpeed, check_serve, peak_dtype_of, refuse_non_generating, roofline, serve_speed, \
    weight_traffic
from .text_path import text_path

DEFAULT_PROMPT = 2048


@dataclass(frozen=True)
class ServeOptions:
    gpu: str
    dtype: str | None = None  # --dtype: a storage format; None: the checkpoint's declared one
    kv_dtype: str | None = None  # None: the compute dtype
    kv_layout: str = "hf"
    batch: int = 1
    seq: int | None = None  # the prompt; None: 2,048, or the model's maximum or `context` when shorter
    context: int | None = None  # the keys a decode step reads; None: the prompt's length
    peak_dtype: str | None = None  # None: the format's (fp8 for fp8 checkpoints, else the compute dtype)
    peak_tflops: float | None = None
    group_size: int | None = None
    tp: int = 1  # tensor parallel: one GPU's bytes and FLOPs (no communication modelled)

    def check(self) -> None:
        from ..parallel.serving import check_degrees

        check_serve(self.batch, self.context, self.seq)
        check_degrees(self.tp, 1)
        if self.peak_tflops is not None and not 0 < self.peak_tflops <= 1e6:  # also refuses nan
            from ...errors import OptionError

            raise OptionError("{0} must be a rate above 0 and at most 1e6 TFLOP/s, got {value:g}", "peak_tflops",
                              value=self.peak_tflops)


def estimate_serving(model: Any, options: ServeOptions, use_cache: bool = True, **model_options: Any) -> ServeSpeed:
    """The roofline bounds (`paramscope serve`), with the model's Report as their `report`.

    With `use_cache`, a config whose template and cost facts are recorded is answered without torch
    (facts/store.py); otherwise the class is built on meta in the storage's compute dtype."""
    check_model_options("estimate_serving", model_options, ServeOptions)
    report, speed, _ = serve_answer(model, options, use_cache, **model_options)
    return dataclasses.replace(speed, report=report)


def serve_answer(model: Any, options: ServeOptions, use_cache: bool = True, *, accelerator: Accelerator | None = None,
                 **model_options: Any):
    """(report, ServeSpeed, the ModelView read): from the template and cost facts where they answer, else the build.
    `accelerator`: options.gpu's, where the caller found it already (the CLI, before resolving the model)."""
    from ...api import as_source
    from ...build import validate_config_dict
    from ..dtypes import torch_name
    from ..engine_check import CheckFor
    from ..facts.store import answer_from_facts_or_build, facts_key
    from ..flops.check import check_generation
    from ..memory.serving import MemoryOptions, storage_format

    options.check()
    if accelerator is None:
        accelerator = find_accelerator(options.gpu, instead=None)
    if options.kv_dtype is not None:
        torch_name(options.kv_dtype)  # a bad name fails before the build
    source = as_source(model, model_options.pop("revision", None))
    validate_config_dict(source.config)
    memory_options = MemoryOptions(dtype=options.dtype, kv_dtype=options.kv_dtype, batch=options.batch,
                                   seq=options.context or options.seq, kv_layout=options.kv_layout,
                                   group_size=options.group_size, tp=options.tp)
    memory_options.check()
    fmt, origin, not_convert = storage_format(source.config, memory_options)
    if source.checkpoint is not None and options.dtype is None:  # a GGUF: its weights move in the file's own types
        from ...checkpoint.gguf_memory import gguf_file_format

        fmt = gguf_file_format(source.checkpoint, int(source.config["num_hidden_layers"]))
        origin, not_convert = f"the GGUF file {source.checkpoint.files[0]}'s header", ()
    roof = roofline(accelerator, options.peak_dtype or peak_dtype_of(fmt), options.peak_tflops)
    key = facts_key(source.config, model_class=model_options.get("model_class"), task=model_options.get("task"),
                    num_labels=model_options.get("num_labels"))
    checked = CheckFor("generation", key, use_cache, check_generation)

    def answer(report: Any, view: Any) -> ServeSpeed:
        return _speed(report, view, options, memory_options, fmt, origin, not_convert, roof, accelerator, checked)

    report, view, speed = answer_from_facts_or_build(source, answer, dtype=fmt.compute_dtype, use_cache=use_cache,
                                                     **model_options)
    return report, speed, view


def _speed(report: Any, view: Any, options: ServeOptions, memory_options: Any, fmt: Any, origin: str,
           not_convert: Any, roof: Any, accelerator: Accelerator, checked: Any) -> ServeSpeed:
    from ..flops.generation import analytic_generation
    from ..memory.serving import serving_estimate, step_length

    refuse_non_generating(view)
    text = text_config(view.config)
    # a decode step at --context C follows a prompt of at most C tokens: the default prompt is no longer
    default_prompt = DEFAULT_PROMPT if options.context is None else min(DEFAULT_PROMPT, options.context)
    prompt, limit, notes = step_length(report, text, options.seq, default_prompt)
    context = options.context or prompt
    if options.context is not None and limit is not None and context > limit:
        learned = any(p.role == "embeddings.position" for p in report.params)
        notes.append(f"--context {context:,} is beyond the model's max_position_embeddings ({limit:,}): a decode "
                     f"step there reads {context:,} keys at positions the model was not trained on ("
                     + ("its learned position table ends there: it cannot run so far" if learned else
                        "a rotary model extrapolates; its quality there is untested")
                     + "); the bound is computed anyway, for those keys")
    memory_options = dataclasses.replace(memory_options, seq=context)
    # without the GPU: its fits and its smallest tensor-parallel search are not what a step's bounds read
    memory = serving_estimate(report, view, memory_options, fmt, origin, not_convert)

    def smallest() -> tuple[Any, int]:
        """Memory's smallest tensor-parallel degree that fits the GPU at the asked batch × context: the same
        answer on the GPU, made only where serve_speed finds the asked batch or its prefill does not fit one."""
        on_gpu = serving_estimate(report, view, memory_options, fmt, origin, not_convert, accelerator)
        return on_gpu.parallel.smallest, memory_options.reserve

    weights, cache, params, whole = memory.weights, memory.kv_cache, report.params, memory.weights
    path = text_path(report, view, fmt, not_convert, memory.weights) if options.tp == 1 else None
    if path is not None:  # a multimodal model decoding text: its towers are not run, so not read
        weights, params, whole = path.weights, path.params, None
        notes.append(path.words())
    held = memory.weights.bytes  # what the GPU holds, a tower a text step does not read too
    if options.tp > 1:  # tensor-parallel rank 0 (the most vocabulary rows where V does not divide)
        gpu = memory.parallel.layout.stages[0]
        weights, cache = gpu.weights, gpu.kv_cache
        held = weights.bytes
        notes.extend(n for n in memory.parallel.layout.notes if n not in notes)
    _refuse_unformulated(view, text)
    check = checked.of(view)
    if check.status == "differs":
        from ..model_view import FactsGap

        if view.module is None:
            raise FactsGap("the analytic generate() count differs from FlopCounterMode's for this config")
        raise UnsupportedError("serving speed needs the analytic generate() count, and for {name} it differs from "
                               "FlopCounterMode's ({words}); `flops {0} N {1}` counts it traced",
                               "generate", "trace", name=view.class_name, words=check.words())

    def generation(batch: int, seq: int, new_tokens: int) -> Any:
        found = analytic_generation(view, report.params, batch=batch, seq=seq, new_tokens=new_tokens)
        if found is None:
            raise UnsupportedError("no analytic generate() count for {name}: `flops {0} N {1}` counts it traced",
                                   "generate", "trace", name=view.class_name)
        return found

    # memory's note on --seq beyond the maximum is about its fits' context search, which serve does not make
    notes.extend(n for n in memory.notes if n not in notes and "the largest context is searched" not in n)
    notes.append(check.words())
    notes.extend(_mla_words(report, text, options.batch, context))
    notes.extend(_recurrent_words(view, text, options.batch))
    if options.tp > 1:
        rank = _RankFlops(report, view, options.tp, generation)
        step_flops, prefill_flops = rank.step, rank.prefill
        notes.append(f"tp {options.tp}: one GPU's bytes (its weight shards in the storage format, its share of the KV "
                     "cache, as `memory --tp` places them) and FLOPs (the matmuls split by parallel/flops.py's "
                     f"rules, attention on heads / {options.tp}); no communication is modelled: the all-reduces of "
                     "each layer only add time")
    else:
        step_flops = lambda b, c: generation(b, c - 1, 2).first_step  # noqa: E731
        prefill_flops = lambda b, s: generation(b, s, 1).prefill  # noqa: E731
    return serve_speed(
        traffic=weight_traffic(weights, params, text, whole=whole), cache=cache, roof=roof,
        step_flops=step_flops, prefill_flops=prefill_flops, tp=options.tp,
        batch=options.batch, context=context, prompt=prompt, max_context=limit, dtype=fmt.key,
        kv_dtype=memory.settings["kv_dtype"], notes=tuple(notes), compute_dtype=fmt.compute_dtype, held_weights=held,
        smallest=smallest)


class _RankFlops:
    """One tensor-parallel rank's FLOPs: the matmuls as parallel/flops.py splits one token's forward weight by
    weight (column/row cuts 1/tp, the vocabulary-parallel head ⌈V/tp⌉ rows, routers and other whole-kept weights
    on every rank), and generate()'s attention (scores, MLA's kv_up decompression) on heads / tp."""

    def __init__(self, report: Any, view: Any, tp: int, generation: Any):
        self.report, self.view, self.tp, self.generation = report, view, tp, generation
        self.matmul: dict[int, tuple[int, int]] = {}

    def _device(self, batch: int, seq: int) -> Any:
        from ..flops.analytic import Parts, analytic_flops
        from ..parallel.flops import device_flops
        from ..parallel.layout import layout_for

        parts = Parts()
        whole = analytic_flops(self.view, self.report.params, batch=batch, seq=seq, training=False, parts=parts)
        if whole is None:
            raise UnsupportedError("no analytic FLOP count for {name}: FLOPs per GPU under {0} are split from it",
                                   "tp", name=self.view.class_name)
        device = device_flops(whole, parts, self.report, self.view, layout_for(devices=self.tp, tp=self.tp,
                                                                               batch=batch),
                              checkpointing=False, causal_model=True)
        return whole, device

    def step(self, batch: int, context: int) -> int:
        if batch not in self.matmul:
            whole, device = self._device(batch, 1)
            scores = sum(t.flops for t in device.terms if t.role == "attention.scores")
            self.matmul[batch] = (device.forward - scores, whole.forward - whole.attention)
        matmul_rank, matmul_whole = self.matmul[batch]
        # scores, MLA's kv_up, and Mamba mixers' conv and scan (their channels split over tp, as vLLM shards them)
        attention = self.generation(batch, context - 1, 2).first_step - matmul_whole
        share, left = divmod(attention, self.tp)
        if left:
            raise UnsupportedError("the attention FLOPs ({flops:,}) do not split evenly over {0} {tp}", "tp",
                                   flops=attention, tp=self.tp)
        return matmul_rank + share

    def prefill(self, batch: int, seq: int) -> int:
        """The rank's forward over the prompt with the head on the last token only (generate()'s prefill)."""
        _, device = self._device(batch, seq)
        head = sum(t.flops for t in device.terms if t.role == "head.lm")
        return device.forward - head + head // seq


def _refuse_unformulated(view: Any, text: Any) -> None:
    """A recurrent layer whose decode FLOPs have no formula (flops/recurrent_decode.py): one line, before any trace."""
    from ..flops.recurrent_decode import NoRecurrentFormula, recurrent_flops

    try:
        recurrent_flops(view, text)
    except NoRecurrentFormula as error:
        raise UnsupportedError("serving speed has no decode FLOP formula for the recurrent layers of {name} "
                               "({kind}; these have one: Mamba, Falcon-Mamba, Jamba, Mamba-2, Falcon-H1, Bamba, "
                               "Nemotron-H, Granite-4.0-H, LFM2, LFM2-MoE, Qwen3-Next, Qwen3.5); "
                               "`flops {0} N {1}` counts its generate() traced", "generate", "trace",
                               name=view.class_name,
                               kind=str(error)) from None


def _recurrent_words(view: Any, text: Any, batch: int) -> list[str]:
    """Recurrent layers: a decode step's FLOPs beyond their projections, the same at any context."""
    from ..flops.recurrent_decode import recurrent_flops

    recurrent = recurrent_flops(view, text)  # a layer with no formula refused before, with the generate() count
    if recurrent is None:
        return []
    words = [f"recurrent layers: a decode step reads and writes each layer's state whole and costs the same FLOPs at "
             f"any context: its projections (2·B·weights, with the others) + {recurrent.words()}; "
             f"{recurrent.step(batch):,} FLOPs at batch {batch} (flops/recurrent_decode.py, FlopCounterMode's "
             "convention: matmuls and convolutions; the scan's elementwise discretisation, gate and D skip are not "
             "counted)"]
    elementwise = recurrent.elementwise(batch)
    if elementwise:  # the compute side is then a bound from below on what a kernel spends, named with its size
        words.append(f"gated DeltaNet: the delta rule's step (the state read by k and by q, its rank-1 update) runs "
                     f"as elementwise products in transformers' torch path, so FlopCounterMode counts none of it; a "
                     f"fused kernel (fla's fused_recurrent) spends 3 × 2·B·Hv·dk·dv a layer, {elementwise:,} FLOPs a "
                     f"step at batch {batch}, not in the decode FLOPs here")
    return words


def _mla_words(report: Any, text: Any, batch: int, context: int) -> list[str]:
    """MLA: generate() decompresses every cached latent each step (flops/generation.py's kv_up term), which
    servers that absorb kv_up into the query and output projections do not."""
    from ..dims import is_mla

    kv_up = sum(p.numel for p in report.params if p.role == "attention.kv_up") if is_mla(text) else 0
    if not kv_up:
        return []
    term = 2 * batch * (context - 1) * kv_up
    return [f"MLA: generate() decompresses every cached latent each step, 2·B·(C − 1)·kv_up = 2 × {batch} × "
            f"{context - 1:,} × {kv_up:,} = {term:,} of the decode step's FLOPs at batch {batch}; servers that "
            "absorb kv_up into the query and output projections (vLLM's and SGLang's MLA) skip it, so their "
            "compute side is lower"]


__all__ = ["ServeOptions", "estimate_serving", "serve_answer", "DEFAULT_PROMPT"]
