"""`memory(model, …)`: build on meta in the storage's compute dtype, then add up weights, KV cache and workspace.

input → storage format (declared or --dtype) → meta build in the compute dtype → Report → which tensors are
quantised and kept in fp32 (from the module, as transformers decides) → weights → KV cache (config formula,
checked against the real cache on meta) → prefill workspace → peak → fits. With --tp/--pp each GPU's weights, KV
cache and workspace (parallel/serving.py), whose worst GPU's peak the fits answer; with --gpu/--budget also the
smallest layout that fits (tensor-parallel degree; a MoE model's tp × dp).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError, ParamscopeError
from ..dims import MAX_SEQ, config_int, context_source, dim, is_mla, max_context, text_config
from ..dtypes import itemsize, torch_name
from ..hardware import Accelerator
from .fits import fit_on, fit_table
from .kv import LAYOUT_CONVENTIONS, KVCache, attention_shape, kv_cache
from .prefill import family_workspace, prefill_workspace
from .declared import declared_format
from .quantization import group_size_problem, weight_format
from .result import DEFAULT_RESERVE, MemoryEstimate
from .serving_media import measured_prefill, measured_token_prefill, media_input, with_tower
from .weights import input_first_weights, quantized_names, weight_memory

KV_LAYOUTS = ("hf", "grouped", "latent", "expanded")
MAX_BATCH = 1 << 20


@dataclass(frozen=True)
class MemoryOptions:
    dtype: str | None = None  # --dtype: a storage format; None: the checkpoint's declared one
    kv_dtype: str | None = None  # None: the compute dtype
    batch: int = 1
    seq: int | None = None  # None: the model's maximum context (max_position_embeddings)
    kv_layout: str = "hf"  # "hf" (what transformers' cache holds, measured), "grouped" (per key/value head, as
    # servers with grouped-query kernels keep it), and for MLA "latent" or "expanded"
    group_size: int | None = None  # GPTQ/AWQ
    encoder_seq: int | None = None
    gpu: str | None = None
    budget: int | None = None
    reserve: int = DEFAULT_RESERVE
    trace: bool = False  # also measure generate()'s prefill and one decode step on fake tensors
    tp: int = 1  # serving across GPUs (parallel/serving.py): tensor-parallel degree
    pp: int = 1  # pipeline stages
    expert_parallel: bool = False  # vLLM's --enable-expert-parallel: routed experts split whole over tp × dp ranks
    dp: int = 1  # vLLM's --data-parallel-size: replicas, each serving --batch sequences of its own
    imatrix: bool = False  # a llama.cpp mixture quantised with an importance matrix (llama_cpp_mixture.py)
    # images beside the text (towers.MediaInput): the language model's KV cache and prefill over the text and image
    # tokens, and the vision tower's own forward peak before the prefill; None: a text input
    media: Any = None

    def check(self) -> None:
        from ..parallel.serving import check_degrees

        check_batch_and_seq(self.batch, self.seq)
        check_degrees(self.tp, self.pp, self.dp)
        if self.expert_parallel and self.tp * self.dp < 2 and self.gpu is None and self.budget is None:
            # (with --gpu or --budget a bare --ep asks the smallest layout's search to split the experts whole)
            raise OptionError("{0} splits the routed experts over the tensor-parallel ranks (vLLM: EP size = TP × "
                              "DP): give {1} or {2} 2 or more, or {3} for the smallest layout under it", "ep", "tp",
                              "dp", "gpu")
        if self.trace and self.tp * self.pp * self.dp > 1:
            raise OptionError("{0} measures one device; with {1}, {2} or {3} each GPU's figures are the analytic "
                              "engine's", "trace", "tp", "pp", "dp")
        check_batch_and_seq(1, self.encoder_seq, "encoder_seq")
        if self.media is not None:
            self.media.check()
            if self.trace or self.tp * self.pp * self.dp > 1:
                raise OptionError("an image or audio input's serving memory is counted on one device, without {0}, here",
                                  "trace" if self.trace else "tp" if self.tp > 1 else "pp" if self.pp > 1 else "dp")
        if self.imatrix and (self.dtype is None or weight_format(self.dtype).mixture is None):
            raise OptionError("{0} is for a llama.cpp mixture given with {1} (q4_k_m, iq4_xs, q4_0, ...)", "imatrix",
                              "dtype")
        if self.kv_layout not in KV_LAYOUTS:
            raise OptionError("{0} must be one of {choices}, got {value!r}", "kv_layout", choices=", ".join(KV_LAYOUTS),
                              value=self.kv_layout)
        if self.reserve < 0:
            raise OptionError("{0} must be 0 or more, got {reserve}", "reserve", reserve=self.reserve)
        if self.group_size is not None:  # as a config's quantization_config.group_size is checked (build.py)
            if group_size_problem(self.group_size):
                raise OptionError("{0} {problem}", "group_size", problem=group_size_problem(self.group_size))
            if self.dtype is None or weight_format(self.dtype).kind not in ("gptq", "awq"):
                raise OptionError("{0} is for a {1} of gptq-int2, gptq-int3, gptq-int4, gptq-int8 or awq-int4; "
                                  "a checkpoint's own group size is its quantization_config's", "group_size", "dtype")


def check_batch_and_seq(batch: int, seq: int | None, seq_option: str = "seq") -> None:
    """The bounds every command puts on the batch and the sequence length, checked before any build."""
    if not 1 <= batch <= MAX_BATCH:
        raise OptionError("{0} must be between 1 and {limit:,}, got {batch}", "batch", limit=MAX_BATCH, batch=batch)
    if seq is not None and not 1 <= seq <= MAX_SEQ:
        raise OptionError("{0} must be between 1 and {limit:,}, got {seq}", seq_option, limit=MAX_SEQ, seq=seq)


def storage_format(config: dict[str, Any], options: MemoryOptions):
    """(WeightFormat, where it came from, the config's modules_to_not_convert): --dtype, else the declared one."""
    if options.dtype is None:
        return declared_format(config)
    fmt = weight_format(options.dtype, compute_dtype=declared_compute_dtype(config), group_size=options.group_size)
    return fmt, "--dtype", ()


def serving_estimate(report: Any, view: Any, options: MemoryOptions, fmt: Any, origin: str,
                     not_convert: Any, accelerator: Accelerator | None = None, *,
                     checked: Any = None, correct: Any = None) -> MemoryEstimate:
    """The serving answer from the report and the model's view (model_view.ModelView), built in `fmt`'s compute
    dtype: the same arithmetic whether the view is the meta build or facts recorded from it.

    `checked` (engine_check.CheckFor): the analytic peak's check against a traced prefill for this config, made
    once; where it found them differing, `correct(view, dtype, batch, seq, encoder_seq)` (serving_correction's
    CorrectionFor: the difference at the asked point on two cuts, or where they disagree on the whole model, kept
    on disk, else traced on the view's module) corrects the analytic answer. None: the analytic arithmetic alone (a
    live module, a check's own cut)."""
    if getattr(fmt, "mixture", None):  # llama.cpp types each tensor of the file on its own: predict the file
        from .llama_cpp_mixture import with_prediction

        fmt = with_prediction(fmt, report.params, view.config, report.num_layers or 0, input_first_weights(
            view, [p.name for p in report.params if len(p.shape) == 2]), report.buffers, imatrix=options.imatrix)
    stored = _stored(report, view, fmt, not_convert)
    weights = stored.weights
    config = view.config
    text = text_config(config)
    seq = options.seq or max_context(text) or 2048
    media = measured = forward = None
    if options.media is not None and options.media.given:
        if view.module is None:
            return None  # the tower runs on fake tensors of the input: the build answers
        media, seq, options, measured, forward = media_input(view, options, seq, fmt.compute_dtype)
    notes: list[str] = list(weights.notes)
    if getattr(fmt, "prediction", None) is not None:
        notes.extend(fmt.prediction.summary())
    if fmt.quantized and not weights.quantized:
        notes.append(f"{fmt.key} quantises none of {view.class_name}'s tensors (it targets "
                     f"{'MoE experts' if fmt.kind == 'mxfp4' else 'none of these layers'}); every weight keeps its "
                     "dtype")
    kv_dtype = torch_name(options.kv_dtype) if options.kv_dtype else (
        "float16" if fmt.kind == "gguf" else fmt.compute_dtype)
    cache = None
    if view.can_generate:
        cache, note = _checked_cache(view, config, options, seq, kv_dtype, fmt.compute_dtype)
        notes.extend(note)
    elif options.kv_dtype is not None or options.kv_layout not in (None, "hf"):
        notes.append(f"{view.class_name} does not generate: no KV cache, so --kv-dtype and --kv-layout change "
                     "nothing")
    shape = _prefill_shape(report, view, text, fmt, cache)
    if not dim(text, "hidden"):
        notes.append("no config with a hidden size (a plain module): the prefill workspace is not estimated, only "
                     "the weights; --trace runs the module on token ids where its forward takes input_ids")
    fitted = family_workspace(text, view.class_name, batch=options.batch, seq=seq, dtype_size=shape["dtype_size"],
                              cache_bytes=0)
    if isinstance(fitted, str):
        notes.append(f"the prefill workspace takes the Llama-style formula: its family's moments were not fitted for "
                     f"{fitted}; --trace measures it")
    workspace = prefill_workspace(config, batch=options.batch, seq=seq, **shape,
                                  cache_bytes=cache.at(options.batch, seq) if cache is not None else 0,
                                  window_extra=cache.prefill_extra(options.batch, seq) if cache is not None else 0)
    analytic = _analytic_curve(config, weights, cache, shape)
    analytic_peak = analytic(options.batch, seq)
    # (a prefill measured on images is the answer itself: no check of the analytic one against a text trace)
    check = checked.of(view) if checked is not None and not options.trace and measured is None else None
    curve = _checked_curve(_Curve(analytic_peak, analytic, "prefill", "analytic"), check, view, options, fmt, seq,
                           weights, correct, notes)
    peak, peak_at, peak_phase, engine = curve.peak, curve.at, curve.phase, curve.engine
    if measured is not None:  # Llama-3.2-Vision on images: the prefill measured, the analytic curve moved onto it
        peak_at, workspace, note = measured_prefill(measured, peak_at, workspace, weights, cache, options, seq)
        notes.append(note)
        engine = "traced"
    elif forward is not None and forward.prefill_peak:  # images made tokens (LLaVA, Gemma-3, Qwen2.5-VL): the
        # prefill measured on the images through the forward's end, Gemma-3's dense masks' S² in the fits
        sdpa = getattr(getattr(view.module, "config", None), "_attn_implementation", None) == "sdpa"
        peak_at, workspace, note = measured_token_prefill(forward, peak_at, workspace, weights, cache, options, seq,
                                                           itemsize(fmt.compute_dtype) if sdpa else 0)
        notes.append(note)
        engine = "traced"
    media_settings = None
    if media is not None:  # the tower runs before the prefill: the peak is the larger of the two moments
        peak_at, media_settings, note = with_tower(media, peak_at, weights, text, options, seq, fmt.compute_dtype,
                                                    measured, forward)
        notes.append(note)
        peak = peak_at(options.batch, seq)
        peak_phase = media_settings["binds"]
    settings = {
        "dtype": fmt.key, "dtype_from": origin, "compute_dtype": fmt.compute_dtype, "kv_dtype": kv_dtype,
        "batch": options.batch, "seq": seq, "seq_from": "--seq" if options.seq else context_source(text),
        "kv_layout": cache.layout if cache else None, "reserve": options.reserve,
    }
    if fmt.group_size is not None:
        settings["group_size"] = fmt.group_size
    if media_settings is not None:
        settings["media"] = media_settings
    if getattr(fmt, "prediction", None) is not None:
        settings["gguf_file"] = fmt.prediction.to_dict()
    if accelerator is None and options.budget is not None:
        accelerator = Accelerator("budget", options.budget, "", "budget")
    parallel = None
    if options.tp * options.pp * options.dp > 1 or accelerator is not None:
        parallel, layout_at = _across_gpus(
            report, view, fmt, stored, cache, kv_dtype, shape, options, accelerator, seq,
            one_device=peak, missed_by=peak - analytic_peak if engine == "traced" else 0, whole=curve.whole)
        if parallel.layout is not None:  # the layout's worst GPU answers, in its own arithmetic
            peak, peak_at, engine = parallel.layout.peak, layout_at, "analytic"
            notes.extend(parallel.layout.notes)
            settings["layout"] = _layout_settings(parallel.layout)
    longest = max_context(text)
    settings["max_context"] = longest
    if longest is not None and seq > longest:
        notes.append(f"--seq {seq:,} is beyond the model's max_position_embeddings ({longest:,}); the largest "
                     "context is searched up to --seq")
        longest = seq
    budget = fit_on(accelerator, peak_at, options.reserve, batch=options.batch, seq=seq,
                    max_context=longest) if accelerator else None
    return MemoryEstimate(
        mode="inference", engine=engine, settings=settings, weights=weights, kv_cache=cache,
        activations=workspace, peak=peak, peak_phase=peak_phase, reserve=options.reserve,
        fits=fit_table(peak_at, options.reserve, batch=options.batch, seq=seq, max_context=longest),
        budget=budget, notes=tuple(notes), check=check, parallel=parallel)


@dataclass(frozen=True)
class _Stored:
    """The weights as stored (`weights`), and which tensors are quantised, kept in fp32, and read first by an input
    (the per-GPU answers read them again)."""

    weights: Any
    quantized: Any
    fp32: Any
    inputs_first: Any


def _stored(report: Any, view: Any, fmt: Any, not_convert: Any) -> _Stored:
    quantized = quantized_names(view, report.params, fmt, not_convert)
    fp32 = view.kept_in_fp32(fmt.compute_dtype, [p.name for p in report.params] + [b.name for b in report.buffers])
    inputs_first = input_first_weights(view, quantized)
    weights = weight_memory(report.params, report.buffers, fmt, quantized=quantized, fp32=fp32,
                            components=[c.name for c in report.components], inputs_first=inputs_first)
    return _Stored(weights, quantized, fp32, inputs_first)


def _prefill_shape(report: Any, view: Any, text: Any, fmt: Any, cache: Any) -> dict[str, Any]:
    """What the prefill workspace's formula reads beside the config (prefill.prefill_workspace's shape)."""
    scores_tokens = cache is not None or any(r in report.breakdown for r in ("head.lm", "head.decoder", "head.bias"))
    return dict(dtype_size=itemsize(fmt.compute_dtype), vocab=config_int(text, "vocab_size") if scores_tokens else None,
                layers=report.num_layers or 1,
                gated=any(role in report.breakdown for role in ("mlp.gate", "mlp.gate_up")),
                every_token_logits=cache is None, class_name=view.class_name)


def _analytic_curve(config: Any, weights: Any, cache: Any, shape: dict[str, Any]) -> Any:
    """(batch, length) → the analytic peak: weights, buffers, the KV cache and the prefill's workspace."""
    def peak_at(batch: int, length: int) -> int:
        kv = cache.at(batch, length) if cache is not None else 0
        extra = cache.prefill_extra(batch, length) if cache is not None else 0
        work = prefill_workspace(config, batch=batch, seq=length, **shape, cache_bytes=kv, window_extra=extra).bytes
        return weights.bytes + weights.buffer_bytes + kv + work

    return peak_at


def _moved(curve: Any, difference: int) -> Any:
    """The curve moved down by `difference` at every point (a correction exact at the asked point only)."""
    return lambda batch, length: curve(batch, length) - difference


@dataclass(frozen=True)
class _Curve:
    """The peak at the asked point, `at` the peak at any batch and length, the phase it binds in and the engine;
    `whole`: a trace of the whole model answers (the per-GPU answers carry its difference whole)."""

    peak: int
    at: Any
    phase: str
    engine: str
    whole: Any = False


def _checked_curve(curve: _Curve, check: Any, view: Any, options: MemoryOptions, fmt: Any, seq: int, weights: Any,
                   correct: Any, notes: list[str]) -> _Curve:
    """The analytic curve as the answer takes it: corrected where its kept check found it differing from a traced
    prefill (by the difference at the asked point, or the whole model traced where that grows with depth), moved
    onto a trace under --trace; the words added to `notes`."""
    trace = options.trace
    whole_traced = False  # the answer is the whole model's kept trace (the correction's cuts disagreed)
    if check is not None and check.status == "differs":
        from ..model_view import FactsGap

        found = correct(view, fmt.compute_dtype, options.batch, seq, options.encoder_seq)
        difference, words = found.difference, found.words()
        notes.append(check.words())
        if difference is None and view.module is None:
            raise FactsGap("the analytic serving peak's difference from a traced prefill grows with depth for this "
                           "config: the build traces the whole model")
        if difference is None:
            notes.append(f"{words}: it grows with depth, so the whole model is traced")
            trace = True
        else:
            change = f"less {difference:,} B" if difference >= 0 else f"plus {-difference:,} B"
            notes.append(f"{words}: the answer is the analytic one {change} (KV cache and weights as computed "
                         "above); the fits below move the analytic curve by the same (exact at the asked point only)")
            curve = dataclasses.replace(curve, peak=curve.peak - difference, at=_moved(curve.at, difference),
                                        engine="traced")
            if found.traced_whole:  # the whole model's trace, kept: its phase and its notes are the answer's
                curve, whole_traced = dataclasses.replace(curve, phase=found.phase), True
                notes.extend(note for note in found.notes if note not in notes)
    elif check is not None:
        notes.append(check.words())
    if trace:
        traced_peak, phase, traced_notes = traced_serving(view.module, options, seq, weights)
        notes.extend(note for note in traced_notes if note not in notes)
        difference = curve.peak - traced_peak
        notes.append(f"check: the analytic peak is {curve.peak:,} B, {100 * difference / traced_peak:+.2f}% from the "
                     f"traced one ({phase}); the fits below are the analytic curve moved by {-difference:+,} B")
        curve = _Curve(traced_peak, _moved(curve.at, difference), phase, "traced")
    return dataclasses.replace(curve, whole=trace or whole_traced)


def _across_gpus(report: Any, view: Any, fmt: Any, stored: _Stored, cache: Any, kv_dtype: str,
                 shape: dict[str, Any], options: MemoryOptions, accelerator: Accelerator | None, seq: int, *,
                 one_device: int, missed_by: int, whole: bool) -> tuple[Any, Any]:
    """(parallel/serving's ServingParallel: each GPU's answer under --tp/--pp/--dp and the smallest tp that fits the
    accelerator; (batch, length) → the layout's worst GPU's peak, or None without a layout). `missed_by`: what a
    trace moved the one-device answer by (each GPU's share of it added back, per_gpu_correction)."""
    from ..parallel.serving import ServingInputs, ServingParallel, per_gpu_correction, serving_layout, smallest_tp

    inputs = ServingInputs(report, view, fmt, stored.quantized, stored.fp32, stored.inputs_first, cache, kv_dtype,
                           options.encoder_seq, shape)
    layout = peak_at = None
    missed = per_gpu_correction(missed_by, options.batch, seq, whole=whole)
    if options.tp * options.pp * options.dp > 1:
        layout, peak_at = serving_layout(inputs, options.tp, options.pp, options.batch, seq, missed=missed,
                                         ep=options.tp * options.dp if options.expert_parallel else 1,
                                         dp=options.dp)
    smallest = smallest_tp(inputs, accelerator, options.reserve, pp=options.pp, batch=options.batch, seq=seq,
                           one_device_peak=one_device, missed=missed, dp=options.dp,
                           expert_parallel=options.expert_parallel) if accelerator is not None else None
    return ServingParallel(layout, smallest), peak_at


def _layout_settings(layout: Any) -> dict[str, Any]:
    """The JSON's settings.layout (docs/json-schema.md)."""
    return {"devices": layout.devices, "tp": layout.tp, "pp": layout.pp, "words": layout.words(),
            **({"ep": layout.ep} if layout.ep > 1 else {}), **({"dp": layout.dp} if layout.dp > 1 else {})}


def traced_serving(module: Any, options: MemoryOptions, seq: int,
                    weights: Any) -> tuple[int, str, tuple[str, ...]]:
    """generate()'s prefill of `seq` tokens and one decode step on fake tensors: (peak, phase, the trace's notes).

    The trace holds the weights as built, in the compute dtype; the stored format's weights (quantised or not)
    replace them, so the traced figure is the analytic weights plus what the trace measured beyond its own."""
    from ..traced.step import StepSettings, trace_inference

    traced = trace_inference(module, StepSettings(batch=options.batch, seq=seq, decode_steps=1,
                                                  encoder_seq=options.encoder_seq))
    top = traced.peak
    beyond = top.bytes - top.by_category["parameters"] - top.by_category["buffers"]
    return weights.bytes + weights.buffer_bytes + beyond, top.phase, traced.notes


def declared_compute_dtype(config: dict[str, Any] | None) -> str:
    """The compute dtype a --dtype format keeps its unquantised tensors in: the declared float dtype, or bf16."""
    try:
        return declared_format(config)[0].compute_dtype
    except ParamscopeError:
        return "bfloat16"


def step_length(report: Any, config: Any, seq: int | None, default: int = 2048) -> tuple[int, int | None, list[str]]:
    """(tokens per sequence, the model's maximum, notes) for a training step or a FLOP count: --seq, else
    `default` or the model's maximum when shorter. Beyond learned positions a model cannot run: refused; beyond
    a rotary model's maximum it runs (extrapolating): noted."""
    limit = max_context(config)
    length = seq or min(default, limit or default)
    notes = []
    if limit is not None and length > limit:
        if any(p.role == "embeddings.position" for p in report.params):
            raise OptionError("{0} {length:,} is beyond the model's {limit:,} learned positions "
                              "(max_position_embeddings)", "seq", length=length, limit=limit)
        notes.append(f"--seq {length:,} is beyond the model's max_position_embeddings ({limit:,})")
    return length, limit, notes


def _checked_cache(view: Any, config: Any, options: MemoryOptions, seq: int, kv_dtype: str,
                   build_dtype: str) -> tuple[KVCache, list[str]]:
    """The cache under the layout asked for. "hf": what transformers' cache holds, the config's formula checked
    against the real cache after a 2-token prefill on meta (`view.probe`), and where they disagree the layout that
    gives the real cache's bytes, or the formula under a convention that says it is not transformers'. A named
    layout ("grouped", "latent", "expanded"): the formula under that layout's own convention, compared with
    transformers' cache in a note."""
    notes: list[str] = []
    layout = options.kv_layout
    text = text_config(config)
    mla = is_mla(text)
    if not mla and layout in ("latent", "expanded"):
        notes.append(f"--kv-layout {layout} applies to multi-head latent attention (MLA); {view.class_name} caches "
                     "per-head K and V")
        layout = "hf"
    if mla and layout == "grouped":
        notes.append(f"--kv-layout grouped applies to grouped-query attention; {view.class_name} uses multi-head "
                     "latent attention (MLA), which MLA-aware servers keep as the latent (--kv-layout latent)")
        layout = "hf"
    common = dict(batch=options.batch, seq=seq, dtype=kv_dtype, encoder_seq=options.encoder_seq)
    held, held_notes = _transformers_cache(view, config, common, build_dtype)
    if layout == "hf":
        return held, notes + held_notes
    cache = kv_cache(config, layout=layout, convention=LAYOUT_CONVENTIONS[layout], **common)
    unchecked = "" if view.probe(build_dtype) is not None else ", by the formula: it could not be measured on meta"
    if cache.bytes_per_token == held.bytes_per_token and cache.bytes == held.bytes:
        notes.append(f"--kv-layout {layout}: the same bytes as transformers' {view.class_name} cache holds "
                     f"(--kv-layout hf{unchecked})")
    else:
        notes.append(f"--kv-layout {layout}: {cache.bytes_per_token:,} B per token, where transformers' "
                     f"{view.class_name} cache holds {held.bytes_per_token:,} B per token (--kv-layout hf{unchecked})")
    return cache, notes


def _transformers_cache(view: Any, config: Any, common: dict[str, Any], build_dtype: str) -> tuple[KVCache, list[str]]:
    """The cache as transformers' class holds it (--kv-layout hf), and what the check against the probe found."""
    notes = []
    name = view.class_name
    text = text_config(config)
    probed = view.probe(build_dtype)
    if is_mla(text):
        candidates: list[tuple[str, int | None]] = [("latent", None), ("expanded", None)]
    else:
        # the formula's heads (cached_heads), else the config's key/value heads or every query head, measured
        kv_heads = attention_shape(text)[0]
        query_heads = config_int(text, "num_attention_heads", "n_head", "num_heads", "decoder_attention_heads")
        candidates = [("kv", None), *(("kv", h) for h in dict.fromkeys((kv_heads, query_heads)) if h)]
    formula = _at(text, *candidates[0], build_dtype, 2)
    found = next((c for c in candidates if probed is not None and _at(text, *c, build_dtype, 2) == probed), None)
    layout, heads = found or candidates[0]
    convention = None
    if probed is None:
        notes.append(f"the real cache could not be measured on meta ({name}'s forward does not run there): the "
                     f"figures are the config's formula{', MLA counted as cached latents' if is_mla(text) else ''}, "
                     "unchecked")
    elif found is None:
        convention = (f"the config's formula ({'MLA latent' if is_mla(text) else 'K and V per key/value head'}), "
                      f"not transformers' DynamicCache: {name}'s real cache holds another amount, which no layout "
                      "paramscope knows gives (the check note says how much)")
        notes.append(f"check: the real cache holds {probed:,} B after 2 tokens in the build's dtype, the formula says "
                     f"{formula:,} B and no other layout gives it (one probe does not say how the real cache "
                     "grows): the formula is used, under its own convention; --trace measures generate() with the "
                     "real cache")
    elif heads is not None:  # the formula's heads did not give the real cache; another count did
        notes.append(f"check: the real cache holds {probed:,} B after 2 tokens in the build's dtype, the formula "
                     f"says {formula:,} B: transformers' {name} caches K and V for {heads} heads per layer (measured "
                     "on meta), and that is used")
    elif is_mla(text):
        notes.append(f"transformers' {name} caches MLA as "
                     f"{'the compressed latent' if layout == 'latent' else 'per-head K and V'} (measured on meta)")
    cache = kv_cache(config, layout=layout, heads=heads, convention=convention, **common)
    if not is_mla(text):
        grouped = kv_cache(config, layout="grouped", **common)
        if grouped.bytes_per_token != cache.bytes_per_token:
            notes.append(f"transformers' {name} caches more K and V heads than the config's key/value heads: "
                         f"{cache.bytes_per_token:,} B per token, where --kv-layout grouped (one K and V per key/value "
                         f"head, as servers with grouped-query kernels keep them) gives {grouped.bytes_per_token:,} B")
    return cache, notes


def _at(config: Any, layout: str, heads: int | None, dtype: str, seq: int) -> int:
    """The formula's bytes at batch 1 and `seq` tokens in the build's dtype (what the probe saw)."""
    return kv_cache(config, batch=1, seq=seq, dtype=dtype, layout=layout, heads=heads).bytes
