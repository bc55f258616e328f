"""`memory MODEL --training`: build on meta in the training dtype, then model states, activations and the peak.

input → meta build in the weights' dtype (fp32, or bf16 when pure) → Report → what trains (--freeze) → model
states (memory/states.py, exact) → activations: the analytic recipe (memory/activations/) or the traced step (traced/step.py) →
the peak over the step's moments → per device (ZeRO) → fits.

The analytic engine answers where a recipe covers the layout; elsewhere, or with --trace, one step is traced on
fake tensors. With --trace the analytic answer, where there is one, is shown beside it with the difference.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ...entry_options import check_layout_option, check_model_options
from ...errors import OptionError
from ...frozen import FrozenDict, freeze_fields
from ...selection import match_all
from ..parallel.layout import ParallelLayout, layout_at_batch
from ..parallel.trace_reach import untraced_by_layout
from .activations import (
    TrainingActivations, recipe_attention, recipe_declines, recipe_for, recipe_peak_inside_layers,
    training_activations,
)
from ..dims import attention_dropout, config_int, dim, text_config
from ..hardware import Accelerator, find_accelerator
from ..model_view import towers_not_run
from ..traced.media_step import FAMILIES as CROSS_ATTENTION_FAMILIES
from ..traced.step import ATTENTION, StepSettings, TORCH_OPTIMIZERS, TracedStep, trace_training
from .expert_offsets import expert_offsets
from .fits import fit_on, fit_table
from .phases import PhaseFigure, cast_weights, moment_phases
from .precision_default import default_fsdp_mixed_precision, default_precision, default_precision_words
from .quantization import weight_format
from .result import DEFAULT_RESERVE, MemoryEstimate, Workspace
from .serving import step_length
from .states import (
    MASTER_PRECISION, ModelStates, as_trained, check_main_grad_layout, check_master_layout,
    check_master_optimizer, check_optimizer, check_precision, grad_buffer, master_gradient_copy, model_states,
    per_device, step_precision, weight_dtype, zero_stage,
)
from .weights import weight_memory

DEFAULT_TRAINING_SEQ = 2048
MAX_DEVICES = 1 << 16


@dataclass(frozen=True)
class TrainingOptions:
    batch: int = 1
    seq: int | None = None  # None: 2,048, or the model's maximum when shorter
    optimizer: str = "adamw"
    # None: what the frameworks run by default for the layout asked (precision_default.py): bf16-mixed, or
    # bf16-master under DeepSpeed's ZeRO 1-3; resolved here, `precision_defaulted` saying so for the notes
    precision: str | None = None
    grad_checkpointing: str = "none"  # "none" | "full"
    attention: str | None = None  # None: the model's own choice (sdpa where supported)
    freeze: tuple[str, ...] = ()  # roles ("embedding", "attention") or parameter-name globs
    # parameters (by name) a live module stores in their own dtype under any precision: a plan's bf16 adapters
    own_dtype: frozenset[str] = frozenset()
    devices: int = 1
    zero: str = "0"
    # a multi-GPU layout (parallel/layout.py: dp with ZeRO or FSDP2, tp, ep); None: --devices/--zero as DeepSpeed's
    # flat ZeRO shares over data-parallel devices
    layout: Any = None
    # the traced engine: False; "extended" (a few layers of each type traced at the asked point and extended to the
    # model's depth exactly, checked by a longer cut; --trace); "full" or True (every layer traced; --trace full)
    trace: bool | str = False
    # under a layout: derive one device's step from traces of the real class with the layout applied where the
    # closed form does not hold it (FSDP2's in-backward buffers; a class without a per-rank recipe); False: the
    # closed form answers, with its gap said (the layout search, which must answer in seconds)
    derive_layout: bool = True
    fits: bool = True  # the fits table (every accelerator's largest batch and context); False: left out
    gpu: str | None = None
    budget: int | None = None
    reserve: int = DEFAULT_RESERVE
    # images beside the text (towers.MediaInput): the towers train, and what their forward saves is held with the
    # language model's activations over the text and image tokens; None: a text input
    media: Any = None
    # gradient accumulation: the batch (each replica's) runs as this many micro-steps of batch / grad_accum sequences,
    # the optimizer stepping after the last (torchtitan's global / local batch, HF Trainer's
    # gradient_accumulation_steps); 1: the whole batch at once
    grad_accum: int = 1
    precision_defaulted: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.precision is None:
            shard = self.layout.shard if isinstance(self.layout, ParallelLayout) else self.zero
            object.__setattr__(self, "precision", default_precision(shard, self.optimizer))
            object.__setattr__(self, "precision_defaulted", True)
        # the options' batch is the one batch: a layout built without one takes it (check refuses another)
        layout = layout_at_batch(self.layout, self.batch)
        if isinstance(layout, ParallelLayout) and layout.fsdp_mixed_precision_defaulted:
            # FSDP2's MixedPrecisionPolicy where a mixed precision runs under it; autocast (nothing) elsewhere
            layout = dataclasses.replace(layout, fsdp_mixed_precision=default_fsdp_mixed_precision(
                layout.shard, str(self.precision)))
        object.__setattr__(self, "layout", layout)

    def check(self) -> None:
        from .serving import check_batch_and_seq

        check_batch_and_seq(self.batch, self.seq)
        check_master_optimizer(check_precision(self.precision), check_optimizer(self.optimizer))
        _check_flat_zero(self.zero)
        try:
            check_master_layout(check_precision(self.precision), self.layout)
        except OptionError as err:
            if not self.precision_defaulted:
                raise
            # a layout DeepSpeed refuses under its bf16, where the user asked no precision: say whose default it is
            raise OptionError(err.template + "; bf16-master is the default precision under DeepSpeed's ZeRO 1-3: "
                              "give {%d} bf16-mixed for torch.autocast over fp32 weights" % len(err.options),
                              *err.options, "precision", **err.values) from err
        check_main_grad_layout(check_precision(self.precision), self.layout, zero=zero_stage(self.zero),
                               devices=self.devices)
        if self.grad_checkpointing not in ("none", "full"):
            raise OptionError("{0} must be none or full, got {value!r}", "grad_checkpointing",
                              value=self.grad_checkpointing)
        if self.attention is not None and self.attention not in ATTENTION:
            raise OptionError("{0} must be one of {choices}, got {value!r}", "attention", choices=", ".join(ATTENTION),
                              value=self.attention)
        if not 1 <= self.devices <= MAX_DEVICES:
            raise OptionError("{0} must be between 1 and {limit:,}, got {devices}", "devices", limit=MAX_DEVICES,
                              devices=self.devices)
        if self.reserve < 0:
            raise OptionError("{0} must be 0 or more, got {reserve}", "reserve", reserve=self.reserve)
        trace_depth(self.trace)
        _check_grad_accum(self.grad_accum, self.batch, self.layout)
        if self.grad_accum > 1 and (self.devices != 1 or self.media is not None):
            raise OptionError("{0} is counted on one device or under a layout (layout_for), without an image or "
                              "audio input, here", "grad_accum")
        if self.media is not None:
            self.media.check()
            refused = "trace" if self.trace else "grad_checkpointing" if self.grad_checkpointing != "none" else \
                "devices" if self.layout is not None or self.devices != 1 else None
            if refused:
                raise OptionError("an image or audio input's training memory is counted on one device, without {0}, here",
                                  refused)
        if self.layout is not None:
            check_layout_option(self.layout)
            self.layout.check_batch(self.batch)
            if self.devices != 1 or str(self.zero) != "0":
                raise OptionError("give the layout or {0} and {1}, not both", "devices", "zero")
            why = untraced_by_layout(self.layout, self.precision) if self.trace else None
            if why:  # refused before the build that would end in "no rank traced"
                raise OptionError("{0} traces no rank under this layout: {why}", "trace", why=why)


def _check_grad_accum(steps: Any, batch: int, layout: Any) -> None:
    """Micro-steps a whole number dividing the batch; a pipeline's --micro-batches are already its accumulation."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise OptionError("{0} must be a whole number of micro-steps, 1 or more, got {value!r}", "grad_accum",
                          value=str(steps)[:40])
    if batch % steps:
        raise OptionError("{0} {steps} must divide the batch, {batch} sequence{s} a replica", "grad_accum",
                          steps=steps, batch=batch, s="" if batch == 1 else "s")
    if steps > 1 and layout is not None and getattr(layout, "pp", 1) > 1:
        raise OptionError("{0} beside a pipeline: its microbatches ({1}) already are the accumulation",
                          "grad_accum", "micro_batches")


def _check_flat_zero(zero: str | int) -> None:
    """`zero` is DeepSpeed's flat ZeRO share over `devices` (0-3, FSDP1's names for them); FSDP2's per-parameter
    sharding, which the CLI's --zero fsdp or hybrid_shard gives, is a layout's shard: one OptionError naming the
    way."""
    from ..parallel.layout import SHARD_ALIASES
    from .states import ZERO_ALIASES

    key = str(zero).strip().lower().replace("-", "_")
    # hybrid_shard: shards within a group of ranks, which a flat share over every device is not
    if SHARD_ALIASES.get(key) in ("fsdp", "hsdp") and (key not in ZERO_ALIASES or key == "hybrid_shard"):
        raise OptionError("{0} {value!r} is FSDP2's per-parameter sharding, a layout's: give "
                          "layout=paramscope.layout_for(devices=N, zero={value!r}) (devices and zero are DeepSpeed's "
                          "flat ZeRO 0-3)", "zero", value=str(zero)[:40])
    zero_stage(zero)


TRACE_DEPTHS = ("extended", "full")


def trace_depth(trace: bool | str) -> str | None:
    """None (no trace), "extended" or "full", from TrainingOptions.trace (True is "full", the older spelling)."""
    if trace is False or trace is None:
        return None
    if trace is True:
        return "full"
    if trace not in TRACE_DEPTHS:
        raise OptionError("{0} is extended or full, got {value!r}", "trace", value=str(trace)[:40])
    return trace


@dataclass(frozen=True)
class TrainingDetail:
    """What a training estimate adds to MemoryEstimate: model states, the phases, the check between engines."""

    states: ModelStates
    frozen: tuple[str, ...]  # parameter names that do not train
    activation_source: str  # "analytic: Llama-style decoder" | "traced"
    phases: tuple[PhaseFigure, ...]
    per_device: FrozenDict[str, int] | None
    traced: TracedStep | None = None
    analytic_peak: int | None = None  # beside a traced answer, where a recipe exists
    by_category: FrozenDict[str, int] = field(default_factory=FrozenDict)  # the traced peak's MemTracker breakdown
    analytic_activations: int | None = None  # beside a traced answer: the recipe's saved activations
    trace_depth: str | None = None  # the traced engine's: "extended" (cuts extended to the depth) | "full"
    device: Any = None  # parallel.estimate.DeviceMemory: one device's figures under a layout
    # a cross-attention family's step on audio or images: (part, module path, the activation bytes its forward
    # leaves allocated as it returns, MemTracker's) for the tower and its projector, part of the activations
    towers: tuple[tuple[str, str, int], ...] = ()

    def __post_init__(self) -> None:
        freeze_fields(self, "per_device", "by_category")


def estimate_training(model: Any, options: TrainingOptions = TrainingOptions(), use_cache: bool = True,
                      structure: str | None = None, **model_options: Any) -> MemoryEstimate:
    """The MemoryEstimate of one steady training step of `model`, with the model's Report as its `report`.

    With `use_cache` (and without --trace), a config whose template and cost facts are recorded, and whose layout
    an analytic activation recipe covers, is answered without torch (facts/store.py); otherwise the class is built
    on meta in the weights' dtype (and, without a recipe, one step is traced). `structure`: for a live module, the
    key its derived recipes are kept under (a plan's; default: a digest of the module's structure)."""
    check_model_options("estimate_training", model_options, TrainingOptions)
    report, estimate, _ = training_answer(model, options, use_cache, structure=structure, **model_options)
    return dataclasses.replace(estimate, report=report)


def training_answer(model: Any, options: TrainingOptions = TrainingOptions(), use_cache: bool = True,
                    structure: str | None = None, **model_options: Any):
    """`estimate_training`, and the ModelView it read (the CLI records cost facts from a built one)."""
    from ...api import is_module, as_source, inspect_module
    from ..facts.store import answer_from_facts_or_build
    from ..model_view import from_module

    options.check()
    dtype = weight_dtype(check_precision(options.precision))
    if is_module(model):  # a user's module: counted as it is, traced in a fake copy with the precision's dtype
        if any(v for k, v in model_options.items() if k != "trust_remote_code"):
            raise OptionError("{0}, {1} and {2} apply to configs, not to a live module", "model_class", "task",
                              "num_labels")
        report, view = inspect_module(model), from_module(model)
        return report, step_estimate(report, view, options, live=True, structure=structure), view
    source = as_source(model, model_options.pop("revision", None))
    report, view, estimate = answer_from_facts_or_build(
        source, lambda report, view: step_estimate(report, view, options, live=False),
        why_none=lambda report, view: _why_built(view, options),
        dtype=dtype, use_cache=use_cache and not options.trace, **model_options)
    return report, estimate, view


def step_estimate(report: Any, view: Any, options: TrainingOptions, *, live: bool,
                  structure: str | None = None) -> MemoryEstimate | None:
    """The training answer from the report and view; None when it needs a traced step and the view has no module
    (the caller builds). `live`: the report is of a module as it is (a plan's, a user's), whose requires_grad flags
    say what trains; `structure`: the key its derived recipes are kept under (plan.py's plan key). Under gradient
    accumulation: the micro-batch's step, its later micro-steps' moments added (grad_accum.py)."""
    if options.grad_accum > 1:
        from .grad_accum import accumulated, micro_options

        micro = step_estimate_at(report, view, micro_options(options), live=live, structure=structure,
                                 accumulating=True)
        return None if micro is None else accumulated(micro, report, options)
    return step_estimate_at(report, view, options, live=live, structure=structure)


def step_estimate_at(report: Any, view: Any, options: TrainingOptions, *, live: bool,
                     structure: str | None = None, accumulating: bool = False) -> MemoryEstimate | None:
    """step_estimate's one step of options.batch; `accumulating`: a traced step runs two micro-steps (the second
    over the gradients the first left) before its optimizer's."""
    optimizer = check_optimizer(options.optimizer)
    precision = check_precision(options.precision)
    run = step_precision(precision)  # the forward and backward's precision (bf16-master runs bf16-pure's)
    zero = zero_stage(options.zero)
    accelerator = find_accelerator(options.gpu) if options.gpu else None
    dtype = weight_dtype(precision)
    module = view.module
    if options.grad_checkpointing == "full" and not live:
        view.check_checkpointing()
    frozen = match_all(report.params, options.freeze)
    if live:  # a user's module (a PEFT model, a half-frozen one) trains what its requires_grad flags say
        frozen = sorted(set(frozen) | {p.name for p in report.params if not p.trainable})
    media = None
    cross = None  # a cross-attention family's audio or images (traced/media_step.StepMedia), fed to a traced step
    media_notes: list[str] = []
    asked = options.media if options.media is not None and options.media.given else None
    if asked is None and getattr(view.config, "model_type", None) == "whisper":
        from ..towers.media import MediaInput

        asked = MediaInput(audio_seconds=30.0)  # Whisper's forward needs its mel frames: it pads any audio to 30 s
        dataclasses.replace(options, media=asked).check()  # what an audio input's step is counted without
        media_notes.append("Whisper trains on audio and its transcript: 30 s of audio a sequence assumed (the window "
                           "its feature extractor pads every clip to; --audio-seconds T)")
    if asked is not None:  # the towers run on the image or audio input, and train
        from ..towers.families import media_family, media_flops

        if module is None:
            return None
        if media_family(view.config) in CROSS_ATTENTION_FAMILIES:
            from ..traced.media_step import step_media

            asked.check()
            cross = step_media(module, asked, options.batch)
            fixed = [p for p in report.params if not p.trainable and p.name not in set(frozen)]
            if fixed:  # the step runs the class as built: what it sets requires_grad False on takes no gradient
                frozen = sorted(set(frozen) | {p.name for p in fixed})
                media_notes.append(f"{', '.join(p.name for p in fixed[:4])}{' …' if len(fixed) > 4 else ''} "
                                   f"({sum(p.numel for p in fixed):,} parameters) do not train: {view.class_name} sets "
                                   "requires_grad False on them (Whisper's sinusoidal encoder positions), so no "
                                   "gradient or optimizer state is kept for them")
        else:
            media = media_flops(module, asked, batch=options.batch, seq=options.seq or DEFAULT_TRAINING_SEQ,
                                training=True, precision=run, attention=options.attention,
                                frozen=frozenset(frozen))
    idle = () if media is not None or cross is not None else towers_not_run(view)
    unused = [p.name for p in report.params if any(p.name.startswith(tower + ".") for tower in idle)]
    if unused:  # a text input runs no vision or audio tower: their parameters' .grad stays None
        frozen = sorted(set(frozen) | set(unused))
    trainable = frozenset(p.name for p in report.params) - frozenset(frozen)
    own = options.own_dtype if live else frozenset()
    states = model_states(report.params, precision=precision, optimizer=optimizer, trainable=trainable, own=own)
    fmt = weight_format({"float32": "fp32", "bfloat16": "bf16"}[dtype])
    # each parameter in the dtype the step holds it in (a live module is cast to the precision's, as traced)
    weights = weight_memory(as_trained(report.params, precision, own), report.buffers, fmt,
                            components=[c.name for c in report.components])
    text = text_config(view.config)
    seq, limit, notes = step_length(report, text, options.seq, DEFAULT_TRAINING_SEQ)
    notes.extend(media_notes)
    if cross is not None:
        notes.append(f"{'audio' if cross.family == 'whisper' else 'image'} input: each sequence holds {cross.words}; "
                     f"the text is {seq:,} tokens; " + "; ".join(cross.notes))
        notes.append(f"{view.class_name} reads its {'encoder' if cross.family == 'whisper' else 'vision tower'} by "
                     "cross-attention: the step is traced on the real input, every layer of the tower and the "
                     "language model, forward, backward and optimizer step (MemTracker on fake tensors); the "
                     "analytic and derived engines take no such input, so the answer is the trace's")
    tower_saved = 0
    if media is not None:
        seq += media.tokens
        tower_saved = media.saved_bytes or 0
        notes.append(f"image input: each sequence holds {media.input_words}; the language model's activations are "
                     f"over {seq - media.tokens:,} text + {media.tokens:,} image tokens = {seq:,}; the towers train (but "
                     "for what --freeze names), and "
                     f"what their forward saves for backward, {tower_saved:,} B (what the tower's and projector's forward "
                     "saves and still holds at its end, each storage once, weights not: measured on fake tensors), is "
                     "held from the forward through the language model's backward, added to those moments (linear in "
                     "the batch)")
    if unused:
        held = sum(p.numel for p in report.params if p.name in set(unused))
        notes.append(f"a text input runs the language model only: {', '.join(idle)} ({held:,} parameters) get no "
                     "gradient, so no gradient, optimizer state or master copy is kept for them (PyTorch's optimizers "
                     "skip a parameter whose .grad is None); their weights stay resident")
    checkpointing = options.grad_checkpointing == "full"
    resident = weights.bytes + weights.buffer_bytes + states.optimizer.bytes + states.master_weights.bytes
    gradients = states.gradients.bytes
    if grad_buffer(states):  # bf16-main-grad: the fp32 gradient buffer is resident, no .grad is held past its hook
        resident, gradients = resident + gradients, 0
        notes.append(MAIN_GRAD_CONVENTION)
    cast, cast_head, cast_biases = cast_weights(view) if precision.endswith("-mixed") else (0, 0, 0)
    shape = dict(precision=run, checkpointing=checkpointing, cast_weights=cast, cast_head=cast_head,
                 cast_biases=cast_biases)
    attention = options.attention or str(getattr(view.config, "_attn_implementation", "") or "") or "sdpa"
    class_name = view.class_name
    # adapters add their own activations: never an analytic recipe's (a plan counted without a build is a PEFT
    # model's stand-ins, named as PEFT's classes are)
    adapters = (module is not None and type(module).__module__.startswith("peft")) or \
        (module is None and live and class_name.startswith("PeftModel"))
    fused = attention in ("sdpa", "flash")  # flash is sdpa's flash kernel here, as traced
    recipe = recipe_for(text, class_name)
    fitted = recipe_attention(recipe) if recipe else None
    at_fitted = fitted == ("sdpa" if fused else attention)
    analytic = training_activations(text, class_name, batch=options.batch, seq=seq, **shape) \
        if at_fitted and not adapters and cross is None else None
    if recipe is not None and cross is None and not at_fitted:  # (a cross-attention step: the trace's, said above)
        notes.append(f"the analytic recipe is for {fitted} attention; attention {attention} is traced")
    elif recipe is not None and cross is None and analytic is None and not adapters:
        why = recipe_declines(text, class_name, batch=options.batch, seq=seq, precision=run,
                              checkpointing=checkpointing)
        notes.append(f"the analytic {recipe} recipe was not fitted for {why}: one step traced")
    beside = None  # a recipe's figures shown as a check, not given as the answer
    inside = recipe_peak_inside_layers(analytic.recipe) if analytic is not None else ""
    if inside:
        beside, analytic = analytic, None
        notes.append(f"the analytic {beside.recipe} recipe counts what the forward saves, but {inside}, which the "
                     "recipe's moments do not hold: the step is derived from traces (the recipe's figure is given "
                     "beside, as a check)")

    tied = _tied_embedding_bytes(report, trainable)
    step_bytes, step_text = _step_temporaries(optimizer, gradients)
    master_copy = master_gradient_copy(states)  # bf16-master: the step's fp32 gradients, beside the bf16 ones
    optimizer_text = step_text
    if master_copy:
        step_bytes += master_copy
        step_text = _with_master_copy(master_copy, optimizer_text)
        notes.append(MASTER_CONVENTION)
    if grad_buffer(states):  # Megatron's step reads the buffer itself as the masters' gradients
        step_text = ("the fp32 main-gradient buffer (resident, among the states) is the masters' .grad: nothing cast; "
                     f"{step_text}")

    def analytic_phases(act: TrainingActivations, batch: int, length: int) -> tuple[PhaseFigure, ...]:
        return moment_phases(act, resident=resident, gradients=gradients, tied=tied, text=text, batch=batch,
                             length=length, precision=run, step=(step_bytes, step_text),
                             # the recomputed layers' moments read each layer's gradient off the total: every
                             # parameter trains (a frozen one would make the per-layer share wrong)
                             recompute=None if frozen else (1, 0))

    traced = None
    derived = None
    # under a layout --trace traces one rank's step on torch's fake process group, beside the analytic answer
    layout_active = options.layout is not None and not options.layout.trivial
    depth = None if layout_active else trace_depth(options.trace)
    if cross is None and (depth == "extended" or (analytic is None and depth is None)):
        derived, why_not = _derive(view, options, seq, limit, frozen, dtype if live else None, own, live=live,
                                   fresh=depth == "extended", structure=structure)
        if derived is None and why_not and depth == "extended":
            notes.append(f"the depth-extended trace declined ({why_not}): every layer traced")
        elif derived is None and why_not:
            notes.append(f"no closed form derived for {class_name} ({why_not}): one step traced")
    extended = derived is not None and depth == "extended"
    if derived is not None:
        figures = derived.recipe.peaks(options.batch, seq)
        how = "depth-extended trace" if extended else "derived"
        if grad_buffer(states) and figures.gradients_at_backward_peak:  # derived under bf16-pure's AccumulateGrad
            notes.append(f"the derived backward peak holds {figures.gradients_at_backward_peak:,} B of bf16 gradients "
                         "(bf16-pure's step), which Megatron's hooks add into the fp32 buffer and free: a bound, up "
                         "to that much over (--trace full runs the hooks)")
        # what the traced step still holds at its optimizer step: the MoE layers' expert offsets
        offsets, offsets_text = expert_offsets(report.params, precision, own, config=view.config)
        step_end = resident + gradients + step_bytes + offsets
        phases = (
            PhaseFigure("forward", resident + figures.forward, how, derived.recipe.words("forward", options.batch, seq), 0,
                        figures.forward),
            PhaseFigure("backward", resident + figures.backward, how, derived.recipe.words("backward", options.batch, seq),
                        figures.gradients_at_backward_peak, figures.backward - figures.gradients_at_backward_peak),
            PhaseFigure("optimizer step", step_end, "optimizer step",
                        f"gradients {gradients:,}; {step_text}" + (f"; held past the backward: {offsets_text}"
                                                                  if offsets else ""), gradients),
        )
        if accumulating:  # a later micro-step, replayed from the same recipe (grad_accum.derived_later)
            from .grad_accum import derived_later

            phases = derived_later(phases, derived, options.batch, seq, resident, gradients)
        activations = Workspace(figures.end_of_forward, derived.recipe.words("end of forward", options.batch, seq),
                                4 * options.batch * seq * (config_int(text, "vocab_size") or 0))
        if extended:
            layers = len(derived.recipe.layer_types)
            notes.append(f"traced, depth-extended: {derived.recipe.traced}; {derived.recipe.check}; extended to "
                         f"the model's {layers:,} layers exactly, allocation by allocation (--trace full traces "
                         "every layer); the optimizer step's moment is counted (gradients, the step's temporaries "
                         "and what a layer keeps referenced past the backward: a MoE layer's 4 B per expert)")
        else:
            notes.extend(derived.notes())
        source_label = "traced (depth-extended)" if extended else "derived"
    elif depth or analytic is None:
        if module is None:
            return None
        settings = StepSettings(batch=options.batch, seq=seq, precision=precision, optimizer=optimizer,
                                grad_checkpointing=checkpointing, attention=options.attention, frozen=frozenset(frozen),
                                weights_dtype=dtype if live else None, own_dtype=own, media=cross,
                                grad_accum=2 if accumulating else 1)
        traced = trace_training(module, settings)
        notes.extend(traced.notes)
        extra = 0 if optimizer in TORCH_OPTIMIZERS[:4] else states.optimizer.bytes  # states the trace lacks
        phases = tuple(PhaseFigure(p.phase, p.bytes + extra, "measured",
                                   "MemTracker: " + ", ".join(f"{k} {v:,}" for k, v in p.by_category.items() if v),
                                   p.by_category["gradients"],
                                   p.by_category["activations"] + p.by_category["temporaries"] +
                                   p.by_category["other"])
                       for p in traced.phases)
        if master_copy:  # MemTracker files the step's fp32 gradient copies under activations: they do not scale
            phases = tuple(dataclasses.replace(p, variable=p.variable - master_copy) if p.phase == "optimizer step"
                           else p for p in phases)
        if extra:
            phases = phases + (PhaseFigure("optimizer step", resident + gradients + step_bytes,
                                           "optimizer step (analytic)", f"gradients {gradients:,}; {step_text}",
                                           gradients),)
        if media is not None:  # the trace runs text only: its optimizer holds no state for the towers, which train
            towers = towers_not_run(view)
            held = model_states([p for p in report.params if any(p.name.startswith(t + ".") for t in towers)],
                                precision=precision, optimizer=optimizer, own=own,
                                trainable=frozenset(p.name for p in report.params if p.name not in set(frozen)
                                                    and any(p.name.startswith(t + ".") for t in towers)))
            kept = held.optimizer.bytes + held.master_weights.bytes
            phases = tuple(dataclasses.replace(p, bytes=p.bytes + kept + (held.gradients.bytes if p.phase ==
                                                                           "optimizer step" else 0)) for p in phases)
            notes.append(f"the traced step runs the text: the towers' optimizer state and master copy ({kept:,} B) "
                         f"are added to each moment, their gradients ({held.gradients.bytes:,} B) to the optimizer "
                         "step's")
        saved = traced.saved_activations
        rows = cross.sequences if cross is not None else options.batch
        activations = Workspace(saved, "measured at the end of the forward (MemTracker, fake tensors)",
                                4 * rows * seq * (config_int(text, "vocab_size") or 0))
        if (recipe is None or adapters) and cross is None:
            notes.append(f"no analytic activation recipe for {class_name}: one step traced on fake "
                         "tensors; the largest batch scales the measured activations (linear in the batch), the "
                         "largest context is left to a trace at that length (--seq)")
        source_label = "traced"
    else:
        phases = analytic_phases(analytic, options.batch, seq)
        activations = Workspace(analytic.saved, analytic.saved_arithmetic, analytic.logits)
        source_label = f"analytic: {analytic.recipe}"
    if tower_saved:
        phases = tuple(dataclasses.replace(p, bytes=p.bytes + tower_saved, variable=p.variable + tower_saved)
                       if p.phase != "optimizer step" else p for p in phases)
        activations = dataclasses.replace(activations, bytes=activations.bytes + tower_saved)
    dropout = attention_dropout(text)
    if dropout and fused:
        layers = dim(text, "layers") or 0
        heads = dim(text, "heads") or 0
        scores = layers * 12 * options.batch * heads * seq * seq
        notes.append(f"attention dropout {dropout:g} in training: torch's fused CPU attention kernels do not support "
                     f"dropout, so sdpa keeps the probabilities and the mask, 12·B·heads·S² B per layer "
                     f"({scores:,} B here); CUDA's flash and memory-efficient kernels support dropout and keep "
                     "only a log-sum-exp, so on a GPU the peak is lower by up to that much")
    top = max(phases, key=lambda p: p.bytes)
    analytic_peak = None
    checked = analytic if analytic is not None else beside
    if (traced is not None or derived is not None) and checked is not None:
        analytic_peak = max(p.bytes for p in analytic_phases(checked, options.batch, seq))
        diff = (analytic_peak - top.bytes) / top.bytes
        if traced is not None:
            saved_diff = (checked.saved - activations.bytes) / activations.bytes if activations.bytes else 0.0
            saved_words = f"; its saved activations {checked.saved:,} B, {100 * saved_diff:+.2f}%"
        else:  # the derived end of the forward holds more than what is saved: no like-for-like figure
            saved_words = ""
        notes.append(f"check: the analytic peak is {analytic_peak:,} B, {100 * diff:+.2f}% from the "
                     f"{'traced' if traced is not None or extended else 'derived'} one{saved_words}")
    sharded = per_device(states, devices=options.devices, zero=zero) if options.devices > 1 and zero else None
    if options.devices > 1 and not zero:
        notes.append(f"data parallel over {options.devices:,} devices without ZeRO: each holds the full model "
                     "states; the figures are per device")
    elif zero and options.devices == 1:
        notes.append(f"ZeRO stage {zero} over one device shards nothing; give --devices N")

    device, layout_at = None, None
    if options.layout is not None and not options.layout.trivial:
        from ..parallel.estimate import StepContext, layout_device
        from ..parallel.states import bf16_optimizer

        # bf16-master: a rank's step casts its partition of the gradients to fp32
        # (under a pipeline each stage's own: parallel/states.stage_step adds it)
        rank_copy, rank_text = (0, optimizer_text) if master_copy and options.layout.pp > 1 else \
            _rank_master_copy(report, view, options.layout, master_copy, optimizer=optimizer, trainable=trainable,
                              own=own, words=optimizer_text) if master_copy else (0, step_text)
        if master_copy:
            notes.append(master_layout_words(options.layout))
        if grad_buffer(states):
            from ..parallel.states import main_grad_layout_words

            notes.append(main_grad_layout_words(options.layout))

        def to_rank(figures: tuple[PhaseFigure, ...]) -> tuple[PhaseFigure, ...]:
            return tuple(dataclasses.replace(p, bytes=p.bytes - master_copy + rank_copy,
                                             arithmetic=p.arithmetic.replace(step_text, rank_text))
                         if p.phase == "optimizer step" else p for p in figures)

        rank_phases = to_rank(phases)
        answer = layout_device(StepContext(
            report=report, view=view, layout=options.layout, states=states, buffer_bytes=weights.buffer_bytes,
            phases=rank_phases, activations=activations.bytes, analytic=analytic,
            derived_or_traced=derived is not None or traced is not None, source_label=source_label,
            precision=run, optimizer=optimizer, trainable=trainable, own=own, text=text, batch=options.batch,
            seq=seq, shape=shape, step=(step_bytes - master_copy + rank_copy, rank_text),
            trace=bool(options.trace),
            attention=options.attention, frozen=frozenset(frozen), weights_dtype=dtype if live else None,
            limit=limit, live=live, structure=structure, derive=options.derive_layout,
            accumulating=accumulating))
        if answer is None:  # its per-device recipe is neither kept nor derivable without the build
            return None
        device, layout_at = answer
        if grad_buffer(states):  # the device's gradients are its resident fp32 buffer (parallel/states.py)
            device = dataclasses.replace(device, gradients_resident=True)
        if bf16_optimizer(states.precision, options.layout):  # half its gradients: BF16_Optimizer's bf16 buffer,
            # zeros_like the flat bf16 group of the stage's trained parameters (their bf16 .grad the other half)
            device = dataclasses.replace(device, accumulation_buffer=device.gradients // 2)
        notes.extend(device.notes)

    rank_later = None
    if accumulating and device is not None:  # the fits table beside a layout: each micro-batch's later micro-step
        from .grad_accum import later_rank_step

        rank_later = later_rank_step(report, trainable, precision, own, device.activations_from, options.layout)

    def on_one_device(figures: tuple[PhaseFigure, ...], batch: int = options.batch,
                      length: int = seq) -> PhaseFigure:
        """The largest moment on one device, each moment's model states replaced by the device's shares."""
        if layout_at is not None and rank_later is not None:  # accumulation: the device's later micro-step too
            return max(rank_later(layout_at(to_rank(figures), batch, length, every=True), batch, length),
                       key=lambda p: p.bytes)
        if layout_at is not None:
            return layout_at(to_rank(figures), batch, length)
        if sharded is None:
            return max(figures, key=lambda p: p.bytes)
        fixed = (states.weights.bytes - sharded["weights"]) + (states.optimizer.bytes - sharded["optimizer"]) + \
            (states.master_weights.bytes - sharded["master_weights"])
        # bf16-master's step casts the device's partition of the gradients only (master_gradient_copy)
        copy = master_copy - master_gradient_copy(states, devices=options.devices, zero=zero)
        return max((PhaseFigure(p.phase, p.bytes - fixed - (p.gradients - -(-p.gradients // options.devices)
                                                              if zero >= 2 else 0)
                                - (copy if p.phase == "optimizer step" else 0), p.where, p.arithmetic)
                    for p in figures), key=lambda p: p.bytes)

    device_top = on_one_device(phases)
    peak = device_top.bytes
    if traced is None and derived is None and device_top.where == "end of forward":
        notes.append("the peak is the end of the forward, as the loss is taken: what the forward saves for backward, "
                     "the loss's buffers, and what the model's output still holds then (named in the phase's "
                     "arithmetic)")
    if sharded is not None:
        sharded = dict(sharded, activations=activations.bytes, peak=peak, peak_phase=device_top.phase)
        if zero >= 3:
            notes.append("ZeRO-3 gathers each layer's full weights while it runs; that transient is not counted")

    def peak_at(batch: int, length: int) -> int:
        return language_peak_at(batch, length) + tower_saved * batch // options.batch

    later = accumulating_moments(report, trainable, precision, own, source_label, options, accumulating)

    def language_peak_at(batch: int, length: int) -> int:
        if derived is not None:
            figures = derived.at(batch, length)
            if figures is None:  # that regime's derivation declined: counted as not fitting, and said
                return 1 << 62
            figures = (
                PhaseFigure("forward", resident + figures.forward, "", ""),
                PhaseFigure("backward", resident + figures.backward, "", "", figures.gradients_at_backward_peak),
                PhaseFigure("optimizer step", resident + gradients + step_bytes, "", "", gradients))
            if accumulating:
                from .grad_accum import derived_later

                figures = derived_later(figures, derived, batch, length, resident, gradients)
            return on_one_device(later(figures, batch, length), batch, length).bytes
        if analytic is not None and traced is None:
            act = training_activations(text, class_name, batch=batch, seq=length, **shape)
            return on_one_device(later(analytic_phases(act, batch, length), batch, length), batch, length).bytes
        # traced: each moment's activations and temporaries scale with the batch (at the traced length only)
        scaled = tuple(dataclasses.replace(p, bytes=p.bytes + p.variable * (batch - options.batch) // options.batch)
                       for p in phases)
        return on_one_device(scaled).bytes

    if options.precision_defaulted and precision == MASTER_PRECISION:  # the default under ZeRO 1-3, named first
        notes.insert(0, default_precision_words(precision))
    settings_out = {
        "precision": precision, "precision_defaulted": options.precision_defaulted, "optimizer": optimizer, "weights_dtype": dtype, "own_dtype": _own_dtypes(report, own),
        "batch": options.batch, "seq": seq,
        "seq_from": "--seq" if options.seq else "default for training (2,048, or the model's maximum)",
        "grad_checkpointing": options.grad_checkpointing, "attention": attention,
        "freeze": list(options.freeze), "idle_towers": list(idle) if unused else [], "devices": options.devices, "zero": zero, "reserve": options.reserve,
        "activations_from": source_label, "max_context": limit,
        "trace": "full" if traced is not None else "extended" if extended else None,
    }
    if accelerator is None and options.budget is not None:
        accelerator = Accelerator("budget", options.budget, "", "budget")
    contexts = traced is None  # a full-depth traced peak is known at its own length only; a derived one at any
    # under a pipeline the largest batch is one its microbatches divide (as the layout requires of --batch)
    step = options.layout.micro_batches if options.layout is not None and options.layout.pp > 1 else 1
    budget = fit_on(accelerator, peak_at, options.reserve, batch=options.batch, seq=seq, max_context=limit,
                    contexts=contexts, batch_step=step) if accelerator else None
    if derived is not None and derived.declined:
        notes.append("largest batch and context: a regime whose derivation declined counts as not fitting (" +
                     "; ".join(derived.declined[:3]) + ")")
    if device is not None:
        from ..parallel.estimate import layout_settings

        settings_out["layout"] = layout_settings(options.layout)
        settings_out["devices"] = options.layout.devices
    detail = TrainingDetail(states, tuple(sorted(frozen)), source_label, phases, sharded, traced, analytic_peak,
                            dict(traced.peak.by_category) if traced is not None else {},
                            checked.saved if traced is not None and checked is not None else None,
                            settings_out["trace"], device, _tower_activations(traced, cross))
    engine = "traced" if traced is not None or extended else "derived" if derived is not None else "analytic"
    if device is not None and device.activations_from.startswith("derived"):
        engine = "derived"
    estimate = MemoryEstimate(
        mode="training",
        engine=engine,
        settings=settings_out,
        weights=weights, kv_cache=None, activations=activations, peak=peak, peak_phase=device_top.phase,
        reserve=options.reserve,
        fits=fit_table(peak_at, options.reserve, batch=options.batch, seq=seq, max_context=limit, contexts=contexts,
                       batch_step=step) if options.fits else (),
        budget=budget, notes=tuple(notes), training=detail)
    return estimate


def accumulating_moments(report: Any, trainable: frozenset[str], precision: str, own: frozenset[str], source: str,
                         options: TrainingOptions, accumulating: bool) -> Any:
    """(phases, batch, length) → the phases the largest batch and context are searched over: under gradient
    accumulation on one device, a later micro-step's moments added (grad_accum.later_micro_step); else as given
    (beside a layout accumulation searches nothing: grad_accum.accumulated says so)."""
    if not accumulating or (options.layout is not None and not options.layout.trivial):
        return lambda phases, batch, length: phases
    from .grad_accum import later_micro_step

    return later_micro_step(report, trainable, precision, own, source)


def _derive(view: Any, options: TrainingOptions, seq: int, limit: int | None, frozen: list[str],
            weights_dtype: str | None, own: frozenset[str], *, live: bool, fresh: bool = False,
            structure: str | None = None) -> tuple[Any, str]:
    """(the derived step, "") for the class's training memory at any batch and length, from the cache or derived
    from the built module; (None, "") when neither (the caller builds); (None, why) where the derivation declines
    (its check failed, or the model has no repeated layers to extend). `fresh`: derived and checked at the asked
    point whatever the cache holds (the depth-extended trace)."""
    from ..derived.step import DerivedStep
    from ..derived.symbols import NotDerivable

    # the derived recipes are activations only: bf16-master's are bf16-pure's (the optimizer step is counted here)
    settings = StepSettings(precision=step_precision(check_precision(options.precision)),
                            optimizer=check_optimizer(options.optimizer),
                            grad_checkpointing=options.grad_checkpointing == "full", attention=options.attention,
                            frozen=frozenset(frozen), weights_dtype=weights_dtype, own_dtype=own)
    try:
        step = DerivedStep.first(view.module, view.class_name, view.config, settings, batch=options.batch, seq=seq,
                                 limit=limit, live=live, fresh=fresh, structure=structure)
    except NotDerivable as err:
        return None, str(err)
    return step, ""


def one_device_derived(report: Any, view: Any, options: TrainingOptions) -> Any:
    """The derived step (derived/step.py's DerivedStep) step_estimate answers one device's step of `options` from,
    for the class as its config builds it: read from the cache, or derived where the view has the module; None where
    neither, or where the derivation declines."""
    seq, limit, _ = step_length(report, text_config(view.config), options.seq, DEFAULT_TRAINING_SEQ)
    step, _ = _derive(view, options, seq, limit, match_all(report.params, options.freeze), None, frozenset(),
                      live=False)
    return step


def _why_built(view: Any, options: TrainingOptions) -> str:
    if options.layout is not None and not options.layout.trivial:
        return ("one device's step under the layout is derived from traces of the real class on torch's fake process "
                "group (kept afterwards): it needs the build")
    return f"{_why_traced(view, options)}: the traced step needs the build"


def _why_traced(view: Any, options: TrainingOptions) -> str:
    recipe = recipe_for(text_config(view.config), view.class_name)
    if recipe is None:
        return f"no analytic activation recipe for {view.class_name}"
    why = recipe_declines(text_config(view.config), view.class_name, batch=options.batch,
                          seq=options.seq or DEFAULT_TRAINING_SEQ,
                          precision=step_precision(check_precision(options.precision)),
                          checkpointing=options.grad_checkpointing == "full")
    if why is not None:
        return f"the analytic {recipe} recipe was not fitted for {why}"
    inside = recipe_peak_inside_layers(recipe)
    if inside:
        return f"the analytic {recipe} recipe's moments do not hold its step's peak ({inside})"
    return f"the analytic {recipe} recipe is not for --attention {options.attention}" if options.attention else \
        f"the analytic {recipe} recipe does not cover this config"


def _tower_activations(traced: TracedStep | None, cross: Any) -> tuple[tuple[str, str, int], ...]:
    """The tower's and projector's lines of a cross-attention family's traced step: what each one's forward leaves
    allocated as it returns (its output, what it saved for backward, autocast's 16-bit weight copies), read off the
    same MemTracker trace; the backward frees them."""
    if traced is None or cross is None:
        return ()
    kept = dict(traced.kept_by_module)
    return tuple((part, path, kept[path]) for part, path in cross.parts if path in kept)


def _own_dtypes(report: Any, own: frozenset[str]) -> dict[str, int]:
    """dtype → parameters stored in their own dtype rather than the precision's (a plan's bf16 adapters)."""
    counts: dict[str, int] = {}
    for param in report.params:
        if param.name in own:
            counts[param.dtype] = counts.get(param.dtype, 0) + param.numel
    return dict(sorted(counts.items()))


# what bf16-master counts of DeepSpeed's bf16 step and what it leaves out (DeepSpeed's source, read: runtime/engine.py,
# runtime/zero/stage_1_and_2.py, runtime/zero/stage3.py, runtime/bf16_optimizer.py)
MASTER_CONVENTION = (
    "bf16-master is DeepSpeed's bf16 (its engine casts the module to bf16; DeepSpeedZeroOptimizer keeps "
    "the fp32 partition it updates, single_partition_of_fp32_groups (ZeRO-3's DeepSpeedZeroOptimizer_Stage3: "
    "fp32_partitioned_groups_flat), and the optimizer's states on it); the states "
    "are counted as torch's fused AdamW per tensor (a 4 B step each), where DeepSpeed's flat partition keeps one per "
    "param group; not counted: DeepSpeed's gradient buckets (reduce_bucket_size, 5e8 elements by default), the flat "
    "bf16 gradient partition its step makes before the fp32 cast, the flat buffer's padding to a multiple of 2 × dp "
    "elements, and BF16_Optimizer's full fp32 gradient buffer (DeepSpeed uses it at ZeRO-1 only with data_types."
    "grad_accum_dtype fp32; by default gradients accumulate in bf16)")


def _with_master_copy(copy: int, words: str, share: str = "") -> str:
    """The optimizer step's words under bf16-master: the fp32 gradient copy first."""
    return (f"the fp32 gradients cast for the master copy, {copy:,} B{share} (held through the optimizer step; the bf16 "
            f"gradients are freed once cast, as DeepSpeed's step does); {words}")


def _rank_master_copy(report: Any, view: Any, layout: Any, whole: int, *, optimizer: str, trainable: frozenset[str],
                      own: frozenset[str], words: str) -> tuple[int, str]:
    """(bytes, words) of the fp32 gradients bf16-master's step casts on one rank of `layout`: its master partition's
    (parallel/states.rank_master_copy: its tp shard, ⌈/ d⌉ under ZeRO 1-3); `whole`: one device's copy."""
    from ..parallel.rules import placements_for
    from ..parallel.states import rank_master_copy

    copy = rank_master_copy(report.params, placements_for(report, view, layout), layout, optimizer=optimizer,
                            trainable=trainable, own=own)
    zero, degree = zero_stage_of(layout), layout.shard_degree
    parts = ["the rank's tensor/expert-parallel shard"] * (layout.tp > 1 or layout.ep > 1 or layout.pp > 1) + \
        [f"ZeRO-{zero}'s partition over {degree} ranks"] * (zero > 0 and degree > 1)
    return copy, _with_master_copy(copy, words, f" ({', '.join(parts)}; one device's {whole:,})" if parts else "")


# what bf16-main-grad counts of Megatron-LM's bf16 step (its source, read: megatron/core/distributed/
# distributed_data_parallel.py, param_and_grad_buffer.py, megatron/core/optimizer/optimizer.py, distrib_optimizer.py)
MAIN_GRAD_CONVENTION = (
    "bf16-main-grad is Megatron-LM's bf16 training (Megatron-Core's DistributedDataParallel with "
    "accumulate_allreduce_grads_in_fp32, its default under bf16): the module in bf16 (Float16Module: the forward and "
    "backward are bf16-pure's), one contiguous fp32 main-gradient buffer allocated when the model is wrapped and held "
    "at every moment (each bf16 gradient is added into param.main_grad by a hook and freed at once, so no .grad is "
    "held), fp32 masters and Adam moments: 2 + 4 + 12 B a parameter, as theoretical_memory_usage.py counts them "
    "(18 B; 6 + 12/d under --use-distributed-optimizer). The step casts nothing: main_param.grad = "
    "main_grad.float() is the fp32 buffer itself; the optimizer updates the masters, which are copied into the bf16 "
    "weights. Not counted: a hook's bf16 gradient for the moment before it is added and freed (none for the linear "
    "layers under Megatron's gradient-accumulation fusion), and the buffer's alignment padding (each bucket to a "
    "multiple of d, each parameter's start to 64 elements, under the distributed optimizer)")


def master_layout_words(layout: Any) -> str:
    """Which framework's rule bf16-master follows under `layout`, named."""
    zero = zero_stage_of(layout)
    ranks = "data-parallel" if layout.cp == 1 else "dp × cp"
    over = f"ZeRO-{zero} partitioning them over the {layout.shard_degree} {ranks} ranks" \
        if zero and layout.shard_degree > 1 else f"each {ranks} rank holding them whole (no ZeRO partition)"
    if layout.pp > 1 and not zero and layout.dp * layout.cp > 1:  # DeepSpeed's BF16_Optimizer (states.py)
        over = f"no ZeRO, but BF16_Optimizer partitioning them over the {layout.dp * layout.cp} {ranks} ranks"
    words = [f"bf16-master: DeepSpeed's bf16 and ZeRO, the fp32 masters and Adam moments of what the rank holds, {over}"]
    if layout.tp > 1:
        words.append(f"beside tp {layout.tp} Megatron-DeepSpeed's composition: each tp rank holds its shard's bf16 "
                     "weights and gradients and the masters and moments of that shard; the tp itself as torch's "
                     "DTensor runs it (traced beside: MasterCopyOptimizer on the rank's DTensor shards, the "
                     "embedding's gradient whole on every rank as DTensor gives it)")
    if layout.cp > 1:
        words.append(f"beside cp {layout.cp} the ZeRO group takes the cp ranks too (they hold the same weights: "
                     "Megatron's data-parallel group with context parallel, DeepSpeed's sequence-data-parallel group)")
    if layout.pp > 1:
        words.append(f"beside pp {layout.pp} each stage's own parameters' (DeepSpeed's PipelineEngine, ZeRO 0-1); "
                     + ("at ZeRO 0 its optimizer is BF16_Optimizer (engine.py's _do_optimizer_sanity_check: bf16 with "
                        "a pipeline), which partitions the fp32 masters and moments over the data-parallel ranks "
                        "as ZeRO-1 does and keeps a bf16 "
                        "gradient-accumulation buffer of the stage's parameters (2 B a parameter, its default "
                        "grad_accum_dtype, the model's) at every moment beside the bf16 gradients, in the "
                        "gradients column; its step casts the rank's partition of the buffer to fp32"
                        if layout.zero_stage == 0 else
                        "at ZeRO-1 its optimizer is DeepSpeedZeroOptimizer (BF16_Optimizer only with data_types "
                        "grad_accum_dtype fp32, not DeepSpeed's default, which would add an fp32 accumulation buffer "
                        "of the stage's parameters, 4 B a parameter, not counted); the step's fp32 gradients counted "
                        "as the stage's cast of its partition at the step"))
    if layout.ep > 1:
        words.append(f"beside ep {layout.ep} each rank's routed experts' states are its own experts', partitioned over "
                     f"their expert-data-parallel group ({max(1, layout.shard_degree // layout.ep)} of the ranks: "
                     "those holding the same experts), as DeepSpeed-MoE partitions an expert param group")
    return "; ".join(words)


def zero_stage_of(layout: Any) -> int:
    """The ZeRO stage of a data-parallel layout's shard mode (FSDP2's full sharding is stage 3's)."""
    return {"none": 0, "zero1": 1, "zero2": 2}.get(layout.shard, 3)


def _step_temporaries(optimizer: str, gradients: int) -> tuple[int, str]:
    """(bytes, words) the optimizer's step allocates beside the states, as the step runs on a GPU."""
    if optimizer in ("adamw", "adam"):
        return 0, f"the fused {'AdamW' if optimizer == 'adamw' else 'Adam'} step keeps no temporaries"
    if optimizer in ("sgd", "sgd-momentum"):
        return 0, "the foreach SGD step updates in place"
    if optimizer == "adafactor":
        # torch.optim.Adafactor with foreach (its default on CUDA) builds every trainable tensor's update at once:
        # one tensor like each gradient (a real CPU step with foreach=True measures exactly this)
        return gradients, (f"Adafactor's foreach step makes an update like every gradient at once, "
                           f"{gradients:,} B")
    return 0, f"{optimizer}'s step temporaries are not counted"


def _tied_embedding_bytes(report: Any, trainable: frozenset[str]) -> int:
    """Bytes of a trainable input embedding tied to the output head: its gradient arrives twice."""
    roles = {p.name: p for p in report.params}
    for group in report.tied:
        param = roles.get(group.canonical)
        if param is not None and param.role.startswith("embedding") and param.name in trainable:
            from ..dtypes import itemsize

            return param.numel * itemsize(param.dtype)
    return 0
