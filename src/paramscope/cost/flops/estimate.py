"""`paramscope flops MODEL`: build on meta, count FLOPs (analytic, checked by or replaced with the traced count),
then training compute, MFU and time.

input → meta build → Report → analytic FLOPs (flops/analytic.py) or, for a class it does not cover and with --trace, the
traced count (traced/flops.py) → per token → × tokens (training compute, beside 6ND) → ÷ time and peak (MFU) or
÷ MFU and peak (time).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ...entry_options import check_layout_option, check_model_options
from ...errors import OptionError
from ...selection import match_all
from ..dims import max_context, text_config
from ..hardware import Accelerator, find_accelerator, peak_flops
from ..memory.serving import step_length
from ..parallel.layout import ParallelLayout, layout_at_batch
from ..traced.flops import by_role, count_flops, module_roles
from ..traced.step import StepSettings
from .analytic import analytic_flops, skipped_input_gradients
from .result import FlopEstimate, FlopTerm

DEFAULT_SEQ = 2048
PEAK_DTYPES = ("bf16", "fp16", "fp8", "tf32")


@dataclass(frozen=True)
class FlopOptions:
    batch: int = 1
    seq: int | None = None  # None: 2,048, or the model's maximum when shorter
    training: bool = False
    grad_checkpointing: str = "none"
    causal: str = "full"  # "full" (FlopCounterMode's, PaLM's) | "half" (Megatron's)
    freeze: tuple[str, ...] = ()
    tokens: int | None = None  # D: training tokens, for the total compute
    gpu: str | None = None
    peak_dtype: str = "bf16"
    peak_tflops: float | None = None  # overrides the table
    tokens_per_second: float | None = None  # measured throughput (all devices), for MFU
    mfu: float | None = None  # assumed MFU, for the time
    devices: int | None = None  # None: the layout's devices, or 1 without a layout
    trace: bool = False
    context_curve: bool = False  # also count the forward at powers of two up to the model's context (HTML plot)
    generate: int | None = None  # new tokens: generate()'s FLOPs (the prefill, its last token's logits, and decode)
    # a multi-GPU layout (parallel/layout.py's ParallelLayout): one device's FLOPs (parallel/flops.py); `batch` is
    # then each data-parallel replica's, and `devices` the layout's
    layout: Any = None
    step_seconds: float | None = None  # a measured step's time: the MFU (per device under a layout)
    # images or audio beside the text (towers.MediaInput): the tower and projector traced on that input, the
    # language model over the text and the tokens the projector adds; None: a text input
    media: Any = None

    def __post_init__(self) -> None:
        # the options' batch is the one batch: a layout built without one takes it (check refuses another)
        layout = layout_at_batch(self.layout, self.batch)
        object.__setattr__(self, "layout", layout)
        if self.devices is None:
            object.__setattr__(self, "devices", layout.devices if isinstance(layout, ParallelLayout) else 1)

    def check(self) -> None:
        from ..memory.serving import check_batch_and_seq

        check_batch_and_seq(self.batch, self.seq)
        if self.causal not in ("full", "half"):
            raise OptionError("{0} must be full or half, got {causal!r}", "causal", causal=self.causal)
        if self.grad_checkpointing not in ("none", "full"):
            raise OptionError("{0} must be none or full, got {value!r}", "grad_checkpointing",
                              value=self.grad_checkpointing)
        if self.peak_dtype not in PEAK_DTYPES:
            raise OptionError("{0} must be one of {choices}, got {value!r}", "peak_dtype", choices=", ".join(PEAK_DTYPES),
                              value=self.peak_dtype)
        if self.tokens is not None and not 1 <= self.tokens <= 10**17:
            raise OptionError("{0} must be between 1 and 1e17, got {tokens}", "tokens", tokens=self.tokens)
        for option, value in (("tokens_per_second", self.tokens_per_second), ("peak_tflops", self.peak_tflops)):
            if value is not None and not 0 < value < 1e15:
                raise OptionError("{0} must be a positive number, got {value}", option, value=value)
        if self.mfu is not None and not 0 < self.mfu <= 1:
            raise OptionError("{0} must be a fraction in (0, 1], got {mfu}", "mfu", mfu=self.mfu)
        if not 1 <= self.devices <= 1 << 20:
            raise OptionError("{0} must be between 1 and {limit:,}, got {devices}", "devices", limit=1 << 20,
                              devices=self.devices)
        if self.generate is not None:
            from .generation import MAX_NEW_TOKENS

            if not 1 <= self.generate <= MAX_NEW_TOKENS:
                raise OptionError("{0} must be between 1 and {limit:,} new tokens, got {value}", "generate",
                                  limit=MAX_NEW_TOKENS, value=self.generate)
            if self.training:
                raise OptionError("{0} counts generation, which does not train: drop {1}", "generate", "training")
            if self.causal == "half":
                raise OptionError("{0} half halves a forward's masked scores; generate()'s decode steps mask none, "
                                  "so {1} counts in full", "causal", "generate")
        if self.step_seconds is not None and not 0 < self.step_seconds < 1e9:
            raise OptionError("{0} must be a positive number of seconds, got {value}", "step_seconds",
                              value=self.step_seconds)
        if self.step_seconds is not None and self.tokens_per_second is not None:
            raise OptionError("give {0} or {1} (the MFU from either), not both", "step_seconds", "tokens_per_second")
        if self.step_seconds is not None and self.layout is None and self.devices > 1:
            raise OptionError("{0} is one step's time: give the layout it ran on ({1}, {2}, …), or use {3}",
                              "step_seconds", "dp", "tp", "tokens_per_second")
        if self.layout is not None:
            check_layout_option(self.layout)
            self.layout.check_batch(self.batch)
            if self.generate is not None:
                raise OptionError("{0} counts one device's step under a layout; {1} is not split per device",
                                  "tp", "generate")
            if self.freeze:
                raise OptionError("{0} under a layout is not split per device (frozen weights skip gradients "
                                  "unevenly)", "freeze")
            if self.trace:
                raise OptionError("{0} traces the whole model; under a layout the per-device count is the analytic "
                                  "one (its check against a traced tensor-parallel rank is in the tests)", "trace")
            if self.devices != self.layout.devices:
                raise OptionError("{0} {devices} is not the layout's {total} devices", "devices",
                                  devices=self.devices, total=self.layout.devices)
            layout = self.layout
            if not self.training and layout.pp > 1 and (layout.micro_batches > 1 and not layout.micro_batches_default
                                                        or layout.virtual_stages > 1
                                                        or layout.schedule == "interleaved"):
                # a pipeline schedule orders forwards and backwards: a forward's FLOPs a stage take none
                raise OptionError("{0} and the pipeline schedule are for {1}: a forward's pipeline runs no backward, "
                                  "so its stages' FLOPs take no schedule", "micro_batches", "training")
        if self.tokens_per_second is not None and self.mfu is not None:
            raise OptionError("give {0} (to get the MFU) or {1} (to get the time), not both", "tokens_per_second", "mfu")
        if self.media is not None:
            self.media.check()
            media_flag = next(name for name in ("image_tokens", "images", "audio_seconds")
                              if getattr(self.media, name) is not None)
            for option, given in (("layout", self.layout is not None), ("generate", self.generate is not None),
                                  ("grad_checkpointing", self.grad_checkpointing != "none"),
                                  ("causal", self.causal != "full")):
                if given:
                    raise OptionError("{0} with {1} is not counted here yet: the tower is traced for a forward or a "
                                      "plain training step", media_flag, "tp" if option == "layout" else option)


@dataclass(frozen=True)
class Compute:
    """What the per-step FLOPs come to: per token, over D tokens, and against an accelerator's peak."""

    per_token_forward: int
    per_token_training: int | None  # forward + backward, model FLOPs
    tokens: int | None
    total: int | None  # model FLOPs for D tokens (training, or forward-only)
    six_nd: int | None
    parameters: int
    accelerator: str | None
    peak: float | None  # FLOP/s per device
    peak_from: str | None
    mfu: float | None
    hfu: float | None
    seconds: float | None  # for D tokens at --mfu on --devices
    notes: tuple[str, ...] = field(default=())
    # a step's time (--step-time, or a layout's tokens a step ÷ --tokens-per-second) and, under a layout, one
    # device's MFU and HFU at it: the busiest device's model FLOPs (hardware FLOPs for HFU) ÷ (time × peak)
    step_seconds: float | None = None
    step_from: str | None = None
    device_mfu: float | None = None
    device_hfu: float | None = None


def estimate_flops(model: Any, options: FlopOptions = FlopOptions(), use_cache: bool = True,
                   **model_options: Any) -> FlopEstimate:
    """The FlopEstimate, with the model's Report as its `report` and the Compute (per token, over D tokens, MFU,
    time) as its `compute`.

    With `use_cache` (and without --trace), a config whose template and cost facts are recorded is counted
    without torch (facts/store.py); otherwise, or where only the traced engine answers, the class is built on
    meta."""
    check_model_options("estimate_flops", model_options, FlopOptions)
    report, estimate, compute, _ = flop_answer(model, options, use_cache, **model_options)
    return dataclasses.replace(estimate, report=report, compute=compute)


def flop_answer(model: Any, options: FlopOptions = FlopOptions(), use_cache: bool = True, **model_options: Any):
    """`estimate_flops`, and the ModelView it read (the CLI records cost facts from a built one)."""
    from ...api import as_source
    from ..facts.store import answer_from_facts_or_build

    options.check()
    accelerator = find_accelerator(options.gpu, instead="peak_tflops") if options.gpu else None
    from ..facts.store import facts_key

    source = as_source(model, model_options.pop("revision", None))
    key = facts_key(source.config, model_class=model_options.get("model_class"), task=model_options.get("task"),
                    num_labels=model_options.get("num_labels"))
    from ..engine_check import CheckFor
    from .check import check_flops, check_generation

    checked = CheckFor("flops", key, use_cache and not options.trace, check_flops)
    generation_checked = CheckFor("generation", key, use_cache and not options.trace, check_generation)

    media_of = _media_once(options, key, use_cache and not options.trace)

    def answer(report: Any, view: Any) -> FlopEstimate | None:
        media = media_of(report, view)
        if media is not None and media.decoder_by_module:  # cross-attention: the language model is read off the trace
            return _decoder_estimate(report, media, options, _length(report, text_config(view.config), options)[0])
        estimate = _estimate(report, view, options, checked, media)
        if estimate is not None and options.generate:
            estimate = dataclasses.replace(estimate, generation=_generation(report, view, options, estimate.seq,
                                                                            generation_checked))
        return estimate

    report, view, estimate = answer_from_facts_or_build(
        source, answer,
        why_none=lambda report, view: _no_analytic(report, view, options, checked) + ": the traced engine needs the "
        "build", use_cache=use_cache and not options.trace, **model_options)
    if estimate is None or options.trace and estimate.engine != "traced":  # Whisper on audio: traced already
        estimate = _with_trace(estimate, report, view, options, checked, media_of(report, view))
        if options.generate:
            estimate = dataclasses.replace(estimate, generation=_generation(report, view, options, estimate.seq,
                                                                            generation_checked, traced=True))
    return report, estimate, _compute(estimate, report, options, accelerator,
                                      _active_parameters(report, text_config(view.config))), view


def _media_once(options: FlopOptions, key: str, use_cache: bool) -> Any:
    """(report, view) → the towers' MediaFlops for --image-tokens/--images/--audio-seconds: kept from an earlier
    trace of this config and input (`use_cache`), else traced once on the built module and kept (FactsGap from facts:
    the build answers); None for a text input."""
    made: dict[str, Any] = {}

    def media_of(report: Any, view: Any) -> Any:
        from ..towers.cache import find_media, keep_media, media_key
        from ..towers.families import media_flops
        from ..towers.media import MediaInput

        asked, assumed = options.media if options.media is not None and options.media.given else None, ()
        if asked is None and getattr(view.config, "model_type", None) == "whisper":
            # no text-only forward exists: Whisper's encoder always reads a 30 s window of mel frames
            asked = MediaInput(audio_seconds=30.0)
            assumed = ("Whisper runs on audio and its transcript: 30 s of audio a sequence assumed (the window its "
                       "feature extractor pads every clip to; --audio-seconds T)",)
        if asked is None:
            return None
        seq, _ = _length(report, text_config(view.config), options)
        frozen = frozenset(match_all(report.params, options.freeze))
        trace_key = media_key(key, asked, batch=options.batch, seq=seq, training=options.training, frozen=frozen)
        if trace_key in made:
            return made[trace_key]
        kept = find_media(view.class_name, trace_key) if use_cache else None
        if kept is not None:
            made[trace_key] = dataclasses.replace(kept, notes=assumed + kept.notes + (
                "the tower's count is kept from an earlier FlopCounterMode trace of this config and input",))
            return made[trace_key]
        if view.module is None:
            from ..model_view import FactsGap

            raise FactsGap("an image or audio input traces the tower once on the built module")
        made[trace_key] = media_flops(view.module, asked, batch=options.batch, seq=seq,
                                      training=options.training, frozen=frozen)
        if use_cache:
            keep_media(made[trace_key], view.class_name, trace_key)
        if assumed:
            made[trace_key] = dataclasses.replace(made[trace_key], notes=assumed + made[trace_key].notes)
        return made[trace_key]

    return media_of


def _with_media(estimate: FlopEstimate, media: Any) -> FlopEstimate:
    """The language model's count with the towers' lines added: each part a term of its own, FlopCounterMode's."""
    if media is None:
        return estimate
    kind = "audio" if media.kind == "audio" else "vision"
    whole = bool(media.decoder_by_module)  # one trace of the whole forward, the tower's modules read off it
    how = "FlopCounterMode on {path} ({name}) in the traced forward" if whole else \
        "FlopCounterMode on {path} ({name}) alone"
    sequences = estimate.batch // (media.per_sequence if media.kind == "audio" else 1)
    terms = tuple(FlopTerm(f"{kind}.{'projector' if line.part == 'projector' else 'tower'}", line.forward,
                           how.format(path=line.path, name=line.class_name) + f", batch {sequences:,} × "
                           f"{media.input_words}") for line in media.lines)
    backward = estimate.backward
    if backward is not None:
        backward += media.backward or 0
    notes = [f"{media.kind} input: each sequence holds {media.input_words}; the tower and projector are counted by "
             f"FlopCounterMode {'in the whole forward' if whole else 'on them alone'}, on fake tensors of that size "
             "(traced engine), in lines of their own"]
    if media.tokens:
        notes.append(f"the language model runs over {estimate.seq - media.tokens:,} text tokens + {media.tokens:,} "
                     f"image tokens = {estimate.seq:,} a sequence ({media.tokens_words})")
    if backward is not None:
        notes.append("training: the tower and projector train, but for what --freeze names (their backward as "
                     "FlopCounterMode counts it, eager attention)")
    # the analytic engine's word on a text input (the towers do not run) is not this input's
    kept = tuple(n for n in estimate.notes if not n.startswith("a text input runs the language model only"))
    return dataclasses.replace(estimate, terms=estimate.terms + terms, forward=estimate.forward + media.forward,
                               backward=backward, notes=kept + tuple(notes) + media.notes, media=media)


def _decoder_estimate(report: Any, media: Any, options: FlopOptions, seq: int) -> FlopEstimate:
    """A language model reading its tower by cross-attention (Whisper's decoder, Llama-3.2-Vision's text model): the
    tower's lines and the language model over `seq` text tokens, both from one FlopCounterMode trace of the real
    class."""
    roles = by_role(dict(media.decoder_by_module), module_roles(report.params))
    batch = options.batch * media.per_sequence
    terms = tuple(FlopTerm(role, value, "FlopCounterMode") for role, value in
                  sorted(roles.items(), key=lambda kv: -kv[1]) if value)
    training = media.decoder_backward is not None  # the same trace's backward, less the tower's lines
    decoder = FlopEstimate("traced", batch, seq, options.causal, sum(t.flops for t in terms),
                           roles.get("attention.scores", 0), terms, media.decoder_backward, 0 if training else None,
                           (f"the language model over {seq:,} text tokens a sequence, cross-attending to the tower's "
                            "states, from the same FlopCounterMode trace as the tower (traced engine)",)
                           + (("training: the language model's backward is that trace's whole backward less the "
                               "tower's and projector's, counted by FlopCounterMode on them alone",) if training
                              else ()))
    return _with_media(decoder, media)


def _estimate(report: Any, view: Any, options: FlopOptions, checked: Any, media: Any = None) -> FlopEstimate | None:
    """The analytic count (with its context curve when asked), once checked against FlopCounterMode for this config;
    None where only the traced engine answers (no closed form, or the check found one term differing). With `media`,
    the language model runs over the text and the image tokens, and the towers' lines are added."""
    text = text_config(view.config)
    seq, length_notes = _length(report, text, options)
    if media is not None and media.tokens:
        seq += media.tokens
        limit = max_context(text)
        if limit is not None and seq > limit:
            length_notes = length_notes + [f"the text and image tokens ({seq:,}) reach beyond the model's {limit:,} "
                                           "positions"]
    if options.causal == "half" and not view.class_name.endswith(("ForCausalLM", "LMHeadModel")):
        raise OptionError("{0} half halves a causal decoder's attention; {name}'s attention is bidirectional (or, for "
                          "an encoder-decoder, partly so)", "causal", name=view.class_name)
    frozen = frozenset(match_all(report.params, options.freeze))
    if frozen and not options.training:
        raise OptionError("{0} is for {1}", "freeze", "training")
    checkpointing = options.grad_checkpointing == "full"
    if checkpointing and options.training:
        view.check_checkpointing()
    from .analytic import Parts

    parts = Parts()
    estimate = analytic_flops(view, report.params, batch=options.batch, seq=seq, training=options.training,
                              checkpointing=checkpointing, causal=options.causal, frozen=frozen, parts=parts)
    if estimate is None:
        return None
    check = None
    if not options.trace:
        check = checked.of(view)
        if check.status == "differs":
            return None
    estimate = dataclasses.replace(estimate, notes=tuple(length_notes) + estimate.notes +
                                   ((check.words(),) if check else ()), check=check)
    estimate = _with_media(estimate, media)
    if options.context_curve and not options.trace and media is None:
        estimate = dataclasses.replace(estimate, by_context=_by_context(
            view, report, options, estimate, max_context(text), checkpointing, frozen))
    if options.layout is not None:
        from ..parallel.flops import device_flops

        estimate = dataclasses.replace(estimate, device=device_flops(
            estimate, parts, report, view, options.layout, checkpointing=checkpointing and options.training,
            causal_model=view.class_name.endswith(("ForCausalLM", "LMHeadModel"))))
    return estimate


def _length(report: Any, text: Any, options: FlopOptions) -> tuple[int, list[str]]:
    """(tokens per sequence, notes): step_length's; with --generate N and no --seq, a prompt short enough that it
    and the new tokens fit the model's context; a --seq that does not, beyond learned positions, refused."""
    seq, limit, notes = step_length(report, text, options.seq, DEFAULT_SEQ)
    new = options.generate
    if new is None or limit is None or seq + new - 1 <= limit:
        return seq, notes
    if options.seq is None and limit >= new:
        seq = limit - new + 1
        return seq, notes + [f"the prompt is {seq:,} tokens, so that it and the {new:,} new tokens fit the model's "
                             f"{limit:,} positions"]
    if any(p.role == "embeddings.position" for p in report.params):
        raise OptionError("{0} {new:,} after a {seq:,}-token prompt reaches position {end:,}, beyond the model's "
                          "{limit:,} learned positions", "generate", new=new, seq=seq, end=seq + new - 1, limit=limit)
    return seq, notes + [f"the prompt and the new tokens reach position {seq + new - 1:,}, beyond "
                         f"max_position_embeddings ({limit:,})"]


def _generation(report: Any, view: Any, options: FlopOptions, seq: int, checked: Any,
                traced: bool = False) -> Any:
    """generate()'s FLOPs (flops/generation.py) and the check that chose the engine: analytic once checked equal
    for this config, else FlopCounterMode's on the build (FactsGap from facts)."""
    from ...errors import UnsupportedError
    from ..model_view import FactsGap
    from .generation import analytic_generation, traced_generation

    config = text_config(view.config)
    if not view.can_generate:
        raise UnsupportedError("{name} does not generate: {0} is for causal language models", "generate",
                               name=view.class_name)
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedError("{0} counts decoder-only models here; {name} is an encoder-decoder", "generate",
                               name=view.class_name)
    check = None if traced else checked.of(view)
    if check is not None and check.status != "differs":
        found = analytic_generation(view, report.params, batch=options.batch, seq=seq, new_tokens=options.generate)
        if found is not None:
            return dataclasses.replace(found, check=check)
    if view.module is None:
        raise FactsGap("the analytic generate() count differs from FlopCounterMode's for this config: the build "
                       "traces it")
    return dataclasses.replace(traced_generation(view.module, batch=options.batch, seq=seq,
                                                 new_tokens=options.generate), check=check)


def _no_analytic(report: Any, view: Any, options: FlopOptions, checked: Any) -> str:
    """Why the analytic engine gave no count, in words."""
    check = checked.kept(view)
    if check is not None and check.status == "differs":
        return check.words()
    frozen = frozenset(match_all(report.params, options.freeze))
    why = skipped_input_gradients(report.params, frozen, text_config(view.config)) if options.training and frozen \
        else None
    return f"no analytic FLOP count here ({why})" if why else f"no analytic FLOP formula for {view.class_name}"


def _with_trace(estimate: FlopEstimate | None, report: Any, view: Any, options: FlopOptions,
                checked: Any, media: Any = None) -> FlopEstimate:
    """The traced count, beside the analytic one (--trace) or in its place (a class it does not cover)."""
    if options.layout is not None:
        from ...errors import UnsupportedError

        raise UnsupportedError("one device's FLOPs under a layout are split from the analytic count, and there is "
                               "none here: {why}", why=_no_analytic(report, view, options, checked))
    text = text_config(view.config)
    seq, length_notes = _length(report, text, options)
    seq += media.tokens if media is not None else 0
    frozen = frozenset(match_all(report.params, options.freeze))
    traced = _traced(view.module, report, options, seq, frozen, options.grad_checkpointing == "full")
    check = None
    counted = _with_media(traced, media)
    if estimate is None:
        check = checked.kept(view)
        check = check if check is not None and check.status == "differs" else None
        notes = length_notes + [_no_analytic(report, view, options, checked) + ": counted by FlopCounterMode on "
                                "fake tensors"] + list(counted.notes)
    else:  # the analytic answer's notes (the towers' among them) and the agreement, the towers in both
        notes = list(estimate.notes) + [_agreement(estimate, counted)] + list(traced.notes)
    return dataclasses.replace(counted, notes=tuple(notes), check=check)


CURVE_POINTS = 16


def _by_context(view: Any, report: Any, options: FlopOptions, answer: FlopEstimate, limit: int | None,
                checkpointing: bool, frozen: frozenset[str]) -> tuple[tuple[int, int, int], ...]:
    """(seq, forward, attention) at 128, 256, … (CURVE_POINTS lengths at most) up to the model's context (or 4 × seq
    when it has none), and at the answer's own length: the same analytic count at each length, so the attention
    term's S² shows against the linear rest. The answer's point is the answer's (a forward is a forward, training
    or not)."""
    top = limit or 4 * answer.seq
    lengths = [128 << k for k in range(CURVE_POINTS) if 128 << k <= top] or [top]
    points = {answer.seq: (answer.forward, answer.attention)}
    for length in lengths:
        if length not in points:
            counted = analytic_flops(view, report.params, batch=options.batch, seq=length, training=False,
                                     checkpointing=checkpointing, causal=options.causal, frozen=frozen)
            points[length] = (counted.forward, counted.attention)
    return tuple((length, *points[length]) for length in sorted(points))


def _active_parameters(report: Any, config: Any) -> int:
    """Parameters a token meets: all of them, less the routed experts it does not pass (MoE: k of E)."""
    from .analytic import routing

    top_k, experts = routing(config)
    routed = sum(p.numel for p in report.params if p.role.startswith("moe.experts"))
    if not experts or not routed:
        return report.total
    return report.total - routed + routed * top_k // experts


def _traced(module: Any, report: Any, options: FlopOptions, seq: int, frozen: frozenset[str],
            checkpointing: bool) -> FlopEstimate:
    settings = StepSettings(batch=options.batch, seq=seq, precision="fp32", grad_checkpointing=checkpointing,
                            frozen=frozen)
    counted = count_flops(module, settings, training=options.training)
    roles = by_role(counted.forward_by_module, module_roles(report.params))
    attention = roles.get("attention.scores", 0)
    notes = []
    if options.causal == "half" and attention:
        roles["attention.scores"] = attention // 2
        notes.append("causal half: the traced attention term is halved")
    terms = tuple(FlopTerm(role, value, "FlopCounterMode") for role, value in
                  sorted(roles.items(), key=lambda kv: -kv[1]) if value)
    forward = sum(t.flops for t in terms)
    backward = counted.model_backward
    recompute = counted.recompute
    if backward is not None and options.causal == "half":
        backward -= attention  # 2 × the halved part
    return FlopEstimate("traced", options.batch, seq, options.causal, forward, roles.get("attention.scores", 0),
                        terms, backward, recompute, tuple(notes))


def _agreement(analytic: FlopEstimate, traced: FlopEstimate) -> str:
    pairs = [("forward", analytic.forward, traced.forward), ("backward", analytic.backward, traced.backward),
             ("recompute", analytic.recompute, traced.recompute)]
    differing = [f"{name} {a:,} analytic vs {t:,} traced" for name, a, t in pairs if a is not None and a != t]
    if not differing:
        return "check: the analytic count equals FlopCounterMode's on fake tensors, term for term"
    return "check: " + "; ".join(differing)


def _compute(estimate: FlopEstimate, report: Any, options: FlopOptions, accelerator: Accelerator | None,
             active: int) -> Compute:
    tokens = estimate.tokens
    per_forward = estimate.forward // tokens
    per_training = None if estimate.step is None else estimate.step // tokens
    per_hardware = None if estimate.step is None else (estimate.step + (estimate.recompute or 0)) / tokens
    notes = []
    total = six_nd = None
    parameters = active  # 6ND's N: for an MoE, the parameters a token meets (Kaplan's and DeepSeek's usage)
    if active != report.total:
        notes.append(f"MoE: N in 6ND and the per-parameter ratio is the {active:,} parameters a token meets (top-k "
                     f"of the routed experts), not all {report.total:,}")
    if options.tokens is not None:
        per = estimate.step if estimate.step is not None else estimate.forward
        total = per * options.tokens // tokens
        if options.training:
            six_nd = 6 * parameters * options.tokens
    peak = peak_from = None
    mfu = hfu = seconds = None
    if options.peak_tflops is not None:
        peak, peak_from = options.peak_tflops * 1e12, "--peak-tflops"
        if accelerator is not None:
            notes.append(f"--peak-tflops {options.peak_tflops:g} is used instead of the {accelerator.name}'s table peak")
    elif accelerator is not None:
        peak = peak_flops(accelerator, options.peak_dtype)
        peak_from = f"{accelerator.name} dense {options.peak_dtype} (vendor datasheet)" if peak else None
        if peak is None:
            notes.append(f"no {options.peak_dtype} peak for {accelerator.name} in the table; give --peak-tflops")
    per_model = per_training if per_training is not None else per_forward
    step_seconds = step_from = device_mfu = device_hfu = None
    device = estimate.device
    if options.step_seconds is not None or (device is not None and options.tokens_per_second is not None):
        if peak is None:
            raise OptionError("{0} needs {1} NAME (with a peak in the table) or {2}",
                              "step_seconds" if options.step_seconds is not None else "tokens_per_second", "gpu",
                              "peak_tflops")
        replicas = device.layout.dp if device is not None else 1
        step_tokens = replicas * tokens
        if options.step_seconds is not None:
            step_seconds, step_from = options.step_seconds, "--step-seconds"
        else:
            step_seconds = step_tokens / options.tokens_per_second
            step_from = (f"{step_tokens:,} tokens a step (dp {replicas} × batch {estimate.batch:,} × "
                         f"{estimate.seq:,}) ÷ {options.tokens_per_second:,.10g} tokens/s")
        if device is not None:
            device_mfu = device.step / (step_seconds * peak)
            if device.backward is not None:
                device_hfu = device.hardware / (step_seconds * peak)
        if options.step_seconds is not None:  # the whole step's MFU, as --tokens-per-second gives it
            model = estimate.step if estimate.step is not None else estimate.forward
            mfu = replicas * model / (step_seconds * peak * options.devices)
            if estimate.step is not None:
                hfu = replicas * (estimate.step + (estimate.recompute or 0)) / (step_seconds * peak * options.devices)
    if options.tokens_per_second is not None:
        if peak is None:
            raise OptionError("{0} needs {1} NAME (with a peak in the table) or {2}", "tokens_per_second", "gpu",
                              "peak_tflops")
        mfu = per_model * options.tokens_per_second / (peak * options.devices)
        if per_hardware is not None:
            hfu = per_hardware * options.tokens_per_second / (peak * options.devices)
    if options.mfu is not None:
        if peak is None or options.tokens is None:
            raise OptionError("{0} needs {1} D and {2} NAME (or {3}) to give a time", "mfu", "tokens", "gpu", "peak_tflops")
        seconds = total / (options.mfu * peak * options.devices)
    return Compute(per_forward, per_training, options.tokens, total, six_nd, parameters,
                   accelerator.name if accelerator else None, peak, peak_from, mfu, hfu, seconds, tuple(notes),
                   step_seconds, step_from, device_mfu, device_hfu)
