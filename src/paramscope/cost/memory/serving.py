"""`memory(model, …)`: build on meta in the storage's compute dtype, then add up weights, KV cache and workspace.

input → storage format (declared or --dtype) → meta build in the compute dtype → Report → which tensors are
quantised and kept in fp32 (from the module, as transformers decides) → weights → KV cache (config formula,
checked against the real cache on meta) → prefill workspace → peak → fits. With --tp/--pp each GPU's weights, KV
cache and workspace (parallel/serving.py), whose worst GPU's peak the fits answer; with --gpu/--budget also the
smallest layout that fits (tensor-parallel degree; a MoE model's tp × dp).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError, ParamscopeError, UnsupportedError
from ..dims import MAX_SEQ, config_int, context_source, dim, is_mla, max_context, text_config
from ..dtypes import itemsize, torch_name
from ..hardware import Accelerator
from .fits import fit_on, fit_table
from .kv import LAYOUT_CONVENTIONS, KVCache, attention_shape, kv_cache
from .prefill import family_workspace, prefill_workspace
from .declared import declared_format
from .quantization import group_size_problem, weight_format
from .result import DEFAULT_RESERVE, MemoryEstimate
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
    quantized = quantized_names(view, report.params, fmt, not_convert)
    fp32 = view.kept_in_fp32(fmt.compute_dtype, [p.name for p in report.params] + [b.name for b in report.buffers])
    inputs_first = input_first_weights(view, quantized)
    weights = weight_memory(report.params, report.buffers, fmt, quantized=quantized, fp32=fp32,
                            components=[c.name for c in report.components], inputs_first=inputs_first)
    config = view.config
    text = text_config(config)
    seq = options.seq or max_context(text) or 2048
    media = measured = forward = None
    if options.media is not None and options.media.given:
        if view.module is None:
            return None  # the tower runs on fake tensors of the input: the build answers
        media, seq, options, measured, forward = _media_input(view, options, seq, fmt.compute_dtype)
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
    scores_tokens = cache is not None or any(r in report.breakdown for r in ("head.lm", "head.decoder", "head.bias"))
    vocab = config_int(text, "vocab_size") if scores_tokens else None
    shape = dict(dtype_size=itemsize(fmt.compute_dtype), vocab=vocab, layers=report.num_layers or 1,
                 gated=any(role in report.breakdown for role in ("mlp.gate", "mlp.gate_up")),
                 every_token_logits=cache is None, class_name=view.class_name)
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

    def peak_at(batch: int, length: int) -> int:
        kv = cache.at(batch, length) if cache is not None else 0
        extra = cache.prefill_extra(batch, length) if cache is not None else 0
        work = prefill_workspace(config, batch=batch, seq=length, **shape, cache_bytes=kv, window_extra=extra).bytes
        return weights.bytes + weights.buffer_bytes + kv + work

    peak = analytic_peak = peak_at(options.batch, seq)
    peak_phase, engine = "prefill", "analytic"
    # (a prefill measured on images is the answer itself: no check of the analytic one against a text trace)
    check = checked.of(view) if checked is not None and not options.trace and measured is None else None
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
            analytic_curve = peak_at

            def peak_at(batch: int, length: int) -> int:  # noqa: F811 - the corrected curve
                return analytic_curve(batch, length) - difference

            peak, engine = peak - difference, "traced"
            if found.traced_whole:  # the whole model's trace, kept: its phase and its notes are the answer's
                peak_phase, whole_traced = found.phase, True
                notes.extend(note for note in found.notes if note not in notes)
    elif check is not None:
        notes.append(check.words())
    if trace:
        traced_peak, peak_phase, traced_notes = traced_serving(view.module, options, seq, weights)
        notes.extend(note for note in traced_notes if note not in notes)
        difference = peak - traced_peak
        notes.append(f"check: the analytic peak is {peak:,} B, {100 * difference / traced_peak:+.2f}% from the traced "
                     f"one ({peak_phase}); the fits below are the analytic curve moved by {-difference:+,} B")
        analytic_at = peak_at

        def peak_at(batch: int, length: int) -> int:  # noqa: F811 - the traced answer's curve
            return analytic_at(batch, length) - difference

        peak, engine = traced_peak, "traced"
    if measured is not None:  # Llama-3.2-Vision on images: the prefill measured, the analytic curve moved onto it
        peak_at, workspace, note = _measured_prefill(measured, peak_at, workspace, weights, cache, options, seq)
        notes.append(note)
        engine = "traced"
    elif forward is not None and forward.prefill_peak:  # images made tokens (LLaVA, Gemma-3, Qwen2.5-VL): the
        # prefill measured on the images through the forward's end, Gemma-3's dense masks' S² in the fits
        sdpa = getattr(getattr(view.module, "config", None), "_attn_implementation", None) == "sdpa"
        peak_at, workspace, note = _measured_token_prefill(forward, peak_at, workspace, weights, cache, options, seq,
                                                           itemsize(fmt.compute_dtype) if sdpa else 0)
        notes.append(note)
        engine = "traced"
    media_settings = None
    if media is not None:  # the tower runs before the prefill: the peak is the larger of the two moments
        peak_at, media_settings, note = _with_tower(media, peak_at, weights, text, options, seq, fmt.compute_dtype,
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
        from ..parallel.serving import (ServingInputs, ServingParallel, per_gpu_correction, serving_layout,
                                        smallest_tp)

        inputs = ServingInputs(report, view, fmt, quantized, fp32, inputs_first, cache, kv_dtype,
                               options.encoder_seq, shape)
        one_device = peak
        layout = None
        missed = per_gpu_correction(one_device - analytic_peak if engine == "traced" else 0, options.batch, seq,
                                    whole=trace or whole_traced)
        if options.tp * options.pp * options.dp > 1:
            layout, peak_at = serving_layout(inputs, options.tp, options.pp, options.batch, seq, missed=missed,
                                             ep=options.tp * options.dp if options.expert_parallel else 1,
                                             dp=options.dp)
            peak, engine = layout.peak, "analytic"
            notes.extend(layout.notes)
            settings["layout"] = {"devices": layout.devices, "tp": layout.tp, "pp": layout.pp,
                                  "words": layout.words(), **({"ep": layout.ep} if layout.ep > 1 else {}),
                                  **({"dp": layout.dp} if layout.dp > 1 else {})}
        smallest = smallest_tp(inputs, accelerator, options.reserve, pp=options.pp, batch=options.batch, seq=seq,
                               one_device_peak=one_device, missed=missed, dp=options.dp,
                               expert_parallel=options.expert_parallel) if accelerator is not None else None
        parallel = ServingParallel(layout, smallest)
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


def _media_input(view: Any, options: MemoryOptions, seq: int,
                 dtype: str) -> tuple[Any, int, MemoryOptions, Any, Any]:
    """(the tower's trace, the context length, the options the cache and prefill take, the prefill measured on the
    images where no formula holds it, else None, the forward up to the language model's call measured where the
    images become tokens (towers.ImageForward), else None). Images: --seq S text tokens and the N image tokens the
    projector hands the language model make a context of S + N; without --seq the context is the model's maximum,
    N of it images. Images read by cross-attention (Llama-3.2-Vision): the context is the text's, the
    cross-attention layers cache each sequence's vision tokens (images × tiles × (patches + 1)), and the prefill is
    measured (image_prefill.py). Audio (Whisper): each 30 s window is a sequence of its own, its decoder
    cross-attending to the window's encoder states, so the batch is B × windows and the cross-attention cache holds
    max_source_positions states a sequence."""
    from ..towers.families import media_family, media_flops
    from ..towers.prefill import held_into_prefill

    config = getattr(view.module, "config", None)
    cross = media_family(config) == "mllama"
    if cross and options.encoder_seq is not None:  # before any trace
        raise OptionError("{0} is the images': each sequence's images × tiles × (patches + 1) vision tokens",
                          "encoder_seq")
    media = media_flops(view.module, options.media, batch=options.batch, seq=options.seq or seq, training=False,
                        serving_dtype=dtype)
    if cross:
        from .image_prefill import measure_prefill

        measured = measure_prefill(view.module, images=media.per_sequence, batch=options.batch, context=seq,
                                   dtype=dtype)
        return (dataclasses.replace(media, held_through_prefill=measured.held), seq,
                dataclasses.replace(options, encoder_seq=measured.vision_tokens), measured, None)
    if media.kind == "audio":
        if options.encoder_seq is not None:
            raise OptionError("{0} is the audio's: each window's {states:,} encoder states", "encoder_seq",
                              states=int(config.max_source_positions))
        return media, seq, dataclasses.replace(options, batch=options.batch * media.per_sequence,
                                               encoder_seq=int(config.max_source_positions)), None, None
    if options.seq is not None:
        seq = options.seq + media.tokens
    elif media.tokens >= seq:
        raise OptionError("{tokens:,} image tokens fill the model's {seq:,}-token context: give {0} for the text",
                          "seq", tokens=media.tokens, seq=seq)
    forward = held_into_prefill(view.module, options.media, batch=options.batch, context=seq, dtype=dtype)
    return dataclasses.replace(media, held_through_prefill=forward.held), seq, options, None, forward


def _measured_prefill(measured: Any, analytic_at: Any, analytic: Any, weights: Any, cache: Any,
                      options: MemoryOptions, seq: int) -> tuple[Any, Any, str]:
    """(the prefill's curve without what the images hold, which _with_tower adds; the workspace; the note) where the
    prefill on images is measured (image_prefill.ImagePrefill): at the asked point the prefill's moment is the
    weights and the measured peak, which holds the KV cache (self-attention over the text, cross-attention over the
    vision tokens), what the images hold and the working tensors; the workspace is the measured peak less the
    other two. Elsewhere (the fits) the analytic curve moved by the same bytes, exact at the asked point only."""
    from .result import Workspace

    kv = cache.at(options.batch, seq) if cache is not None else 0
    moment = weights.bytes + weights.buffer_bytes + measured.peak
    difference = analytic_at(options.batch, seq) + measured.held - moment
    rest = measured.peak - kv - measured.held
    workspace = Workspace(rest, (f"measured: the prefill's largest live bytes {measured.peak:,} less the KV cache "
                                 f"{kv:,} and the images held {measured.held:,} (the token ids, a layer's working "
                                 "tensors, the last token's logits)"), analytic.logits)

    def prefill_at(batch: int, length: int) -> int:
        return analytic_at(batch, length) - difference

    change = f"{difference:,} B over" if difference >= 0 else f"{-difference:,} B short of"
    note = (f"prefill on images: measured, the class's own forward on fake tensors (weights in the compute dtype, no "
            f"grad, a DynamicCache, the last token's logits as generate()'s prefill, the model's own attention as "
            f"torch runs it on CPU tensors), from the language model's call to the end: {measured.peak:,} B beyond the "
            f"weights; the analytic prefill (a Llama-style workspace over the text, without the cross-attention "
            f"layers' tensors) is {change} it; the fits below move the analytic curve by the same (exact at "
            f"the asked point only)")
    return prefill_at, workspace, note


def _measured_token_prefill(forward: Any, analytic_at: Any, analytic: Any, weights: Any, cache: Any,
                            options: MemoryOptions, seq: int, additive: int) -> tuple[Any, Any, str]:
    """(the prefill's curve without what the images hold, which _with_tower adds; the workspace; the note) where the
    images become tokens (towers.ImageForward, the class's own forward on fake tensors through to its end): at the
    asked point the prefill's moment is the weights and the measured peak from the language model's call to the
    forward's end. That peak holds the attention masks the forward built for the language model, which the analytic
    workspace has not: Gemma-3's token_type_ids make image tokens attend bidirectionally, so transformers builds a
    dense B×1×S×S mask for its full and its sliding layers (bool under sdpa), alive until the forward ends. In the
    fits the masks grow as batch × S² (their measured shapes scaled) and the rest is the analytic curve moved by
    the same bytes as at the asked point (exact there only). `additive`: under sdpa, the compute dtype's bytes: torch's
    scaled_dot_product_attention turns a bool mask into an additive one of that dtype (convert_boolean_attn_mask,
    on CPU and CUDA alike), one B×1×S×S copy alive within each layer's attention, which the fits grow as S² too."""
    from .result import Workspace

    masks = forward.masks

    def built_at(batch: int, length: int) -> int:
        return sum(size * math.prod(shape[1:-2]) * batch * length * length for shape, size in masks)

    bool_masks = [shape for shape, size in masks if size == 1]
    copy_heads = max((math.prod(shape[1:-2]) for shape in bool_masks), default=0) if additive else 0

    def masks_at(batch: int, length: int) -> int:  # the masks built, and sdpa's additive copy of one (a layer's)
        return built_at(batch, length) + additive * copy_heads * batch * length * length

    def kv_at(batch: int, length: int) -> int:
        return cache.at(batch, length) if cache is not None else 0

    kv = cache.at(options.batch, seq) if cache is not None else 0
    moment = weights.bytes + weights.buffer_bytes + forward.prefill_peak
    built = forward.mask_bytes
    if built != built_at(options.batch, seq):  # a mask not B×…×S×S: the fits cannot scale it
        raise UnsupportedError("the language model's attention masks are not batch × S × S ({shapes})",
                               shapes=", ".join("×".join(map(str, shape)) for shape, _ in masks))
    # the analytic prefill (a Llama-style workspace with its own sliding-window mask where the prompt fills the
    # window) with the masks and the images held, beside the measured: the note says by how much it differs
    difference = analytic_at(options.batch, seq) + masks_at(options.batch, seq) + forward.held - moment
    rest = forward.prefill_peak - kv - forward.held
    # the fits: the KV cache as computed, the masks as batch × S², and the rest of the measured peak (a layer's
    # working tensors, the sliding layers' prompt K and V, the logits) in batch × tokens
    linear = rest - masks_at(options.batch, seq)
    workspace = Workspace(rest, (f"measured: the prefill's largest live bytes {forward.prefill_peak:,} less the KV "
                                 f"cache {kv:,} and the images held {forward.held:,} (the inputs given, the merged "
                                 "embeddings, the attention masks built, a layer's working tensors, the last "
                                 "token's logits)"), analytic.logits)

    def prefill_at(batch: int, length: int) -> int:
        return (weights.bytes + weights.buffer_bytes + kv_at(batch, length) + masks_at(batch, length)
                + linear * batch * length // (options.batch * seq))

    change = f"{difference:,} B over" if difference >= 0 else f"{-difference:,} B short of"
    if masks:
        kinds = {size: "bool" if size == 1 else f"{size} B an element" for _, size in masks}
        each = " and ".join(kinds.values())
        mask_words = (f"attention masks over text + image tokens, B×S×S {each} each: {len(masks)} × "
                      f"{options.batch:,} × {seq:,} × {seq:,} = {built:,} B (transformers' masks for the full and "
                      "the sliding-window layers: token_type_ids make each image's tokens attend to each other "
                      "both ways, which no causal kernel does, so the masks are dense; built before the language "
                      "model's call and alive to the forward's end; in the fits they grow as batch × S²)"
                      + (f", and within each layer's attention sdpa's additive copy of one in the compute dtype "
                         f"({copy_heads * options.batch * seq * seq * additive:,} B here: torch turns a bool mask "
                         "into -inf/0 before its kernel, on GPU as on CPU; also B×S² in the fits)"
                         if copy_heads else ""))
    else:
        mask_words = "no dense attention mask (the model's attention runs causal without one)"
    note = (f"prefill on images: measured, the class's own forward on fake tensors (weights in the compute dtype, "
            f"no grad, the model's own cache, the last token's logits as generate()'s prefill, the model's own "
            f"attention as torch runs it on CPU tensors), from the language model's call to the end: "
            f"{forward.prefill_peak:,} B beyond the weights, which holds {mask_words}; the analytic prefill with "
            f"the masks and the images held is {change} it. The fits below: the KV cache as computed, the masks "
            f"as batch × S², the rest of the measured peak ({linear:,} B) in batch × tokens (exact at the asked "
            f"point; elsewhere approximate: ask --seq at the length that matters)")
    return prefill_at, workspace, note


def _with_tower(media: Any, prefill_at: Any, weights: Any, text: Any, options: MemoryOptions, seq: int,
                dtype: str, image_prefill: Any = None, forward: Any = None) -> tuple[Any, dict[str, Any], str]:
    """(the peak curve with the tower's moment in it, settings["media"], the note). The tower runs before the
    prefill, with the weights resident; its moment is the weights and the tower's and projector's measured forward
    peak, linear in the batch (each image or window runs the same layers), and for images the language model's input
    embeddings over the whole context (transformers' forward makes them before it runs the tower). The prefill's:
    weights, KV cache and workspace over text + image tokens, as for text, and what the forward keeps of the images
    through it (media.held_through_prefill, measured); for audio the encoder's output, which the decoder reads
    through generation (its cross-attention K and V are in the cache besides). Images read by cross-attention
    (`image_prefill`, Llama-3.2-Vision's measured prefill): the tower runs before the language model embeds the
    text, beside the inputs given for it, the token ids and the int64 cross-attention mask (8 B a token, and 8 B a
    token a tile). Images made tokens (`forward`, towers.ImageForward): the moment is measured over the forward
    from its start to the language model's call, which holds the integer inputs given (token ids, attention mask,
    each family's own) and the input embeddings beside the tower's run, and then merges the image features into a
    new copy of the embeddings and builds the language model's masks."""
    size = itemsize(dtype)
    audio = media.kind == "audio"
    # images read by cross-attention (Llama-3.2-Vision): the forward runs the tower before the language model
    # embeds the text, and the cross-attention layers cache the vision tokens (options.encoder_seq a sequence)
    cross = image_prefill is not None
    per_token = 0 if audio else (dim(text, "hidden") or 0) * size  # the input embeddings, a token
    if cross:  # the token ids and the cross-attention mask given (text tokens × images × tiles), int64
        per_token = 8 * (1 + image_prefill.images * image_prefill.tiles)
    given = forward.given_per_token if forward is not None else 0  # the integer inputs given, a token
    states = config_int(text, "max_source_positions") or 0
    # what the input holds through the prefill, a sequence: Whisper's encoder output; the images' pixel values, the
    # tower's returned output and the projected features (measured: towers.held_into_prefill)
    held_each = states * (config_int(text, "d_model") or 0) * size if audio else 0
    resident = weights.bytes + weights.buffer_bytes

    # the tower's moment is measured in the whole forward (image_prefill.tower; forward.before_prefill up to the
    # language model's call): any bytes beyond the inputs given, the embeddings and the tower's own peak (the merge's
    # copy of the embeddings and the masks, where they bind) move the curve, exact at the asked point
    shift = 0
    if cross:
        shift = image_prefill.tower - options.batch * seq * per_token - media.forward_peak
    elif forward is not None:
        shift = forward.before_prefill - options.batch * seq * (per_token + given) - media.forward_peak

    # Gemma-3 (dense masks built before the call): the rest is the masks' construction, their B×S×S temporaries,
    # which grow as batch × S² (approximate away from the asked point)
    square = forward is not None and bool(forward.masks)

    def tower_at(batch: int, length: int) -> int:  # the rest measured before the call is each sequence's
        rest = shift * batch // options.batch if forward is not None else shift
        if square:
            rest = shift * batch * length * length // (options.batch * seq * seq)
        return (resident + batch * length * (per_token + given) + media.forward_peak * batch // options.batch
                + rest)

    def held_at(batch: int, length: int) -> int:  # linear in the batch (the image-token mask, a byte a token, at
        # the asked S); cross-attention's: the images' own part linear in the batch, the masks' in batch × length
        if cross:
            return (image_prefill.held_fixed * batch // options.batch
                    + batch * length * image_prefill.held_per_token)
        return batch * held_each if audio else media.held_through_prefill * batch // options.batch

    def mask_at(batch: int, length: int) -> int:
        """Cross-attention's: building the mask over text × vision tokens, after the tower and before the prefill,
        beside the images' own part (linear in the batch) and the mask's temporaries (in batch × length)."""
        if not cross:
            return 0
        fixed = image_prefill.held_fixed
        grows = image_prefill.mask - fixed
        return resident + fixed * batch // options.batch + grows * batch * length // (options.batch * seq)

    def peak_at(batch: int, length: int) -> int:
        return max(prefill_at(batch, length) + held_at(batch, length), tower_at(batch, length),
                   mask_at(batch, length))

    tower, prefill = tower_at(options.batch, seq), prefill_at(options.batch, seq) + held_at(options.batch, seq)
    mask = mask_at(options.batch, seq)
    part = "audio encoder" if audio else "vision tower"
    # the first of equal moments binds: the prefill's
    binds = max([(prefill, "prefill"), (tower, part), (mask, "cross-attention mask")], key=lambda m: m[0])[1]
    embeddings, held = options.batch * seq * per_token, held_at(options.batch, seq)
    inputs = options.batch * seq * given  # the integer inputs given (images made tokens)
    settings = {"kind": media.kind, "input": media.input_words, "per_sequence": media.per_sequence,
                "image_tokens": media.tokens, "text_seq": seq - media.tokens, "tokens_from": media.tokens_words,
                "tower_forward_peak": media.forward_peak, "embeddings": 0 if cross else embeddings,
                "encoder_output": held if audio else 0, "image_features_held": 0 if audio else held,
                "tower_moment": tower, "prefill_moment": prefill, "binds": binds,
                "vision_tokens": options.encoder_seq if cross else 0,
                "text_inputs": embeddings if cross else inputs,
                "text_inputs_given": list(forward.given) if forward is not None else
                ["input_ids", "cross_attention_mask"] if cross else [],
                "tower_rest": shift if forward is not None else 0,
                "mask_moment": mask if cross else None,
                # the language model's dense attention masks, built before its call and alive through the prefill
                "attention_masks": forward.mask_bytes if forward is not None else 0,
                "parts": [[line.part, line.path, line.class_name] for line in media.lines]}
    parts = " and ".join(f"{line.part} {line.path} ({line.class_name})" for line in media.lines)
    measured = (f"the forward peak, {media.forward_peak:,} B (the largest bytes live at once in {dtype}, the "
                "input and every intermediate, weights not: measured on fake tensors)")
    if audio:
        note = (f"audio input: each sequence holds {media.input_words}; each window is a sequence of its own, "
                f"{options.batch:,} in all, its decoder over {seq:,} tokens cross-attending to the window's "
                f"{states:,} encoder states (the cross-attention KV cache). The {parts} runs first: "
                f"{measured}, with the weights, is its moment, {tower:,} B; the prefill's, {prefill:,} B, holds the "
                f"encoder's output ({held:,} B) beside the KV cache and workspace; the peak is the larger, the "
                f"{binds}'s (fits: both linear in the batch)")
    elif cross:
        note = (f"image input: each sequence holds {media.input_words}; {media.tokens_words}. Every image is "
                f"{image_prefill.tiles} tiles (max_num_tiles) whatever its size: transformers' MllamaImageProcessor "
                "pads each to max_image_tiles zero tiles (float32 pixel values), which the vision model runs and the "
                "cross-attention layers cache, masked. The self-attention "
                f"layers' KV cache and the prefill are over the "
                f"{seq:,} text tokens, the cross-attention layers' cache over the {options.encoder_seq:,} vision "
                f"tokens. The {parts} run first in the forward, before the language model embeds the text: "
                f"{measured}, with the weights and the token ids and cross-attention mask given ({embeddings:,} B, "
                f"8 B a token × (1 + {image_prefill.images * image_prefill.tiles} tiles)) is the tower's moment, "
                f"{tower:,} B. Then the forward builds the cross-attention mask over text × vision tokens (int64, "
                f"float32 and bool temporaries of {seq:,} × {options.encoder_seq:,} a sequence): the weights and the "
                f"largest bytes live then, measured, are its moment, {mask:,} B. The prefill's, {prefill:,} B, is "
                f"the weights and the measured prefill, which holds what the forward keeps of the images, {held:,} B "
                "(the pixel values, the tile and cross-attention masks given, the vision model's output, which "
                "transformers returns with the logits, the projected tiles and the float cross-attention mask it "
                "builds over text × vision tokens: measured at the language model's call against a text input), "
                f"the KV cache and the workspace; the peak is the largest, the {binds}'s (fits: the tower's peak "
                "linear in the batch; the mask's and what the images hold, their own part linear in the batch and "
                "the rest in batch × text tokens)")
    else:
        note = (f"image input: each sequence holds {media.input_words}, {media.tokens:,} image tokens "
                f"({media.tokens_words}): the KV cache and prefill workspace are over {seq - media.tokens:,} text + "
                f"{media.tokens:,} image tokens = {seq:,}. The {parts} run first: {measured}. The tower's moment, "
                f"{tower:,} B, is the weights and the largest bytes live from the forward's start to the language "
                f"model's call, measured on the class's own forward (fake tensors, pixel values in {dtype}): the "
                f"integer inputs given ({', '.join(forward.given)}: {inputs:,} B, {given} B a token), the language "
                f"model's input embeddings over the {seq:,} tokens ({embeddings:,} B, made before the tower runs), "
                f"the tower's run and "
                + (f"{shift:,} B more (the image features merged into a copy of the embeddings, and the language "
                   "model's masks, where they bind" + ("; in the fits batch × S², the masks' construction, "
                                                       "approximate" if square else "") + ")"
                   if shift else "nothing more (the merge into the embeddings and the masks built after it stay "
                   "below)")
                + f"; the prefill's, {prefill:,} B, holds what the "
                f"forward keeps of the images through it, {held:,} B (the pixel values, the tower's returned output "
                "and the projected features, measured at the language model's call on fake tensors against a text "
                "input of the same length) beside the KV cache and workspace; the peak is the "
                f"larger, the {binds}'s (fits: the tower's peak linear in the batch, the inputs and embeddings in "
                f"batch × tokens, the rest linear in the batch at {seq:,} tokens: exact at the asked point)")
    return peak_at, settings, note


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
