"""The traced engine: one real step of the actual module on fake tensors, measured by torch's own MemTracker.

    module (meta, live or built) → a fake copy (FakeTensorMode: shapes and dtypes, no storage) → a warm-up step
    (optimizer states allocated) → the measured steady step under MemTracker, phase by phase → TracedStep

A training step is transformers' Trainer's:

    loss = model(ids, labels=ids).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

in train mode (dropout masks are real memory), with the optimizer's states already allocated. An inference step is
what generate() does: a prefill over the prompt with use_cache and last-token logits, then decode steps of one token.

MemTracker sorts every byte into parameters, buffers, gradients, activations (the forward's tensors, and the
recomputation of checkpointed layers), temporaries (the backward's own tensors) and optimizer states. The peak of
each phase is measured on its own (the tracker's running peak is restarted at the phase's start), so the report can
say which phase the peak is in. The tracker's module hooks keep no gradient (tracker_hooks.py), so the step it
measures frees what a step without it frees. `fake=False` runs the same step on real CPU tensors, which the tests
use to check that the fake step equals reality to the byte on small models.
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Iterator

from ... import progress
from ...errors import OptionError, ParamscopeError, UnsupportedError
from ...frozen import FrozenDict, freeze_fields
from .tracker_hooks import gradients_not_held

CATEGORIES = ("parameters", "buffers", "gradients", "optimizer states", "activations", "temporaries", "other")
_TRACKER_NAMES = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients",
                  "Optstate": "optimizer states", "Activation": "activations", "Temp": "temporaries",
                  "Other": "other"}
TORCH_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor")
ATTENTION = ("sdpa", "eager", "flash")
# the phases of a later micro-step under gradient accumulation: its forward and backward start with every gradient
# the earlier micro-steps left (the step's first micro-step's phases are "forward" and "backward")
HELD_FORWARD = "forward, gradients held"
HELD_BACKWARD = "backward, gradients held"


@dataclass(frozen=True)
class PhasePeak:
    phase: str  # "forward" | "backward" | "optimizer step" | "prefill" | "decode"
    bytes: int
    by_category: FrozenDict[str, int]  # the tracker's breakdown at this phase's peak

    def __post_init__(self) -> None:
        freeze_fields(self, "by_category")


@dataclass(frozen=True)
class TracedStep:
    mode: str  # "training" | "inference"
    resident: FrozenDict[str, int]  # before the step: parameters, buffers, optimizer states
    end_of_forward: FrozenDict[str, int]  # after the forward (the loss computed): what backward will read
    phases: tuple[PhasePeak, ...]
    attention: str
    notes: tuple[str, ...] = field(default=())
    # (module path below the model, activation bytes it leaves allocated when its forward returns), in call
    # order: the top-level modules, each layer, and the first layer's own modules
    kept_by_module: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        freeze_fields(self, "resident", "end_of_forward")

    @property
    def peak(self) -> PhasePeak:
        return max(self.phases, key=lambda p: p.bytes)

    @property
    def saved_activations(self) -> int:
        """Bytes the forward leaves for backward: activations live at its end (logits and loss included)."""
        return self.end_of_forward.get("activations", 0)


@dataclass(frozen=True)
class StepSettings:
    batch: int = 1
    seq: int = 512
    precision: str = "fp32"  # training: fp32 | bf16-mixed | fp16-mixed | bf16-pure | bf16-master | bf16-main-grad
    optimizer: str = "adamw"
    grad_checkpointing: bool = False
    attention: str | None = None  # None: the model's own (transformers picks sdpa where the model supports it)
    frozen: frozenset[str] = frozenset()  # parameter names that do not train
    decode_steps: int = 1  # inference
    encoder_seq: int | None = None
    weights_dtype: str | None = None  # floating parameters become this dtype in the copy; None: as they are
    own_dtype: frozenset[str] = frozenset()  # parameter names that keep their own dtype (a plan's bf16 adapters)
    # one rank of a multi-GPU layout, (dp, shard, tp, sp) as traced/parallel.Layout takes them; None: one device
    layout: tuple | None = None
    # a cross-attention family's audio or images (traced/media_step.StepMedia): the step feeds them with the text
    media: Any = None
    # gradient accumulation: the step runs this many micro-steps of `batch` sequences each (batch is the micro-batch)
    # before the optimizer's; 2 are measured (the first, and a later one, which starts with the gradients held: every
    # later micro-step is that one again)
    grad_accum: int = 1


def trace_training(module: Any, settings: StepSettings, *, fake: bool = True) -> TracedStep:
    """Measure one steady training step of `module` (a meta-built, fake or live model; it is not modified)."""
    with progress.status(f"tracing one training step of {type(module).__name__} on fake tensors (MemTracker)"):
        return measure_training(module, settings, fake=fake)


def measure_training(module: Any, settings: StepSettings, *, fake: bool) -> TracedStep:
    """trace_training's step without its status line: `module` is copied to fake tensors (fake=True) or measured as it
    is (fake=False: a live module, or one a caller already laid out on fake tensors, as traced/parallel.py does)."""
    check_attention(settings.attention)
    notes = list(_attention_notes(settings.attention))
    with fake_mode(fake) as mode, assumed_values(fake) as assumed:
        model = training_copy(module, mode, settings)
        inputs = training_inputs(model, settings)
        optimizer, note = make_optimizer(model, settings.optimizer, settings.precision)
        if note:
            notes.append(note)
        autocast = autocast_for(settings.precision)

        def forward():
            with autocast:
                return loss_of(model(**inputs))

        micro_steps = min(settings.grad_accum, 2)

        def step():
            for _ in range(micro_steps):
                loss = forward()
                loss.backward()
                del loss
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            else:
                model.zero_grad(set_to_none=True)

        with running(model):
            step()  # warm-up: allocates the optimizer states, as in every step after the first
            tracker = make_tracker(model, optimizer)
            with gradients_not_held() as spared, tracker:
                resident = _current(tracker)
                restart_peak(tracker)
                loss = forward()
                end_of_forward = _current(tracker)
                forward_peak = phase_peak(tracker, "forward")
                kept = _kept_by_module(tracker, type(model).__name__)
                restart_peak(tracker)
                loss.backward()
                del loss
                backward_peak = phase_peak(tracker, "backward")
                phases = [forward_peak, backward_peak]
                if micro_steps > 1:  # a later micro-step: its forward and backward over the gradients held
                    tracker.reset_mod_stats()  # the tracker's per-module stats allow one call per module
                    restart_peak(tracker)
                    loss = forward()
                    phases.append(phase_peak(tracker, HELD_FORWARD))
                    restart_peak(tracker)
                    loss.backward()
                    del loss
                    phases.append(phase_peak(tracker, HELD_BACKWARD))
                if optimizer is not None:
                    restart_peak(tracker)
                    optimizer.step()
                    phases.append(phase_peak(tracker, "optimizer step"))
                    optimizer.zero_grad(set_to_none=True)
                else:
                    model.zero_grad(set_to_none=True)
    notes.extend(assumed.notes())
    if spared.note():
        notes.append(spared.note())
    return TracedStep("training", resident, end_of_forward, tuple(phases), attention_of(model), tuple(notes), kept)


def training_copy(module: Any, mode: Any, settings: StepSettings) -> Any:
    """The working copy a training step runs: in train mode, `settings.frozen` frozen, checkpointed if asked."""
    model = working_copy(module, mode, settings.attention, settings.weights_dtype, settings.own_dtype)
    model.train()
    for name, param in model.named_parameters():
        if name in settings.frozen:
            param.requires_grad_(False)
    if settings.grad_checkpointing:
        enable_checkpointing(model)
    return model


def trace_inference(module: Any, settings: StepSettings, *, fake: bool = True) -> TracedStep:
    """Measure generate()'s prefill of `settings.seq` tokens and `decode_steps` steps of one token each."""
    with progress.status(f"tracing {type(module).__name__}'s prefill and a decode step on fake tensors"):
        return _trace_inference(module, settings, fake=fake)


def _trace_inference(module: Any, settings: StepSettings, *, fake: bool) -> TracedStep:
    import torch

    check_attention(settings.attention)
    notes = list(_attention_notes(settings.attention))
    with fake_mode(fake) as mode, assumed_values(fake) as assumed:
        model = working_copy(module, mode, settings.attention)
        model.eval()
        inputs = _ids(model, settings.batch, settings.seq)
        generating = _accepts(model, "use_cache") and bool(getattr(model, "can_generate", lambda: False)())
        kwargs: dict[str, Any] = {"input_ids": inputs}
        if generating:
            kwargs.update(use_cache=True)
            if _accepts(model, "logits_to_keep"):
                kwargs["logits_to_keep"] = 1
        elif _accepts(model, "use_cache"):  # a forward for its outputs (a bare BartModel) keeps no cache
            kwargs["use_cache"] = False
        if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
            kwargs["input_ids"] = _ids(model, settings.batch, settings.encoder_seq or settings.seq)
            kwargs["decoder_input_ids"] = inputs
        with running(model), torch.no_grad():
            tracker = make_tracker(model, None)
            with tracker:
                resident = _current(tracker)
                restart_peak(tracker)
                output = model(**kwargs)
                end_of_forward = _current(tracker)
                phases = [phase_peak(tracker, "prefill")]
                cache = output_cache(output) if generating else None
                cache_name = cache_argument(model)
                if cache is not None and settings.decode_steps > 0:
                    restart_peak(tracker)
                    step_ids = _ids(model, settings.batch, 1)
                    for _ in range(settings.decode_steps):
                        tracker.reset_mod_stats()  # the tracker's per-module stats allow one call per module
                        step_kwargs = dict(kwargs, **{cache_name: cache})
                        step_kwargs["decoder_input_ids" if "decoder_input_ids" in kwargs else "input_ids"] = step_ids
                        if "decoder_input_ids" in kwargs:
                            step_kwargs["encoder_outputs"] = (output.encoder_last_hidden_state,)
                            step_kwargs.pop("input_ids")
                        del output
                        output = model(**step_kwargs)
                        cache = output_cache(output)
                    phases.append(phase_peak(tracker, "decode"))
                del output, cache
        if not generating:
            notes.append(f"{type(model).__name__} does not generate: one forward over every token, no KV cache")
    notes.extend(assumed.notes())
    return TracedStep("inference", resident, end_of_forward, tuple(phases), attention_of(model), tuple(notes))


def cache_argument(model: Any) -> str:
    """The name `model.forward` takes its cache by. transformers ≥ 5.x names it `cache` (generate() passes it so) in
    Mamba's, Falcon-Mamba's, Mamba-2's and Jamba's classes: a `past_key_values` would fall into their **kwargs, and
    each decode step would be a fresh one-token prefill."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(output: Any) -> Any:
    """The cache a forward returns: `past_key_values`, or `cache` (Mamba's and Jamba's outputs in transformers 5)."""
    found = getattr(output, "past_key_values", None)
    return found if found is not None else getattr(output, "cache", None)


# --- the model's copy -------------------------------------------------------------------------------------------

@contextmanager
def fake_mode(fake: bool) -> Iterator[Any]:
    if not fake:
        yield None
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False) as mode, _as_in_eager():
        yield mode


class _AssumedValues:
    """How often a step asked fake tensors for `nonzero`, which they answer as if every element were nonzero, and
    for the truth of a whole-tensor `all` or `any` (a finite-values or padding check), answered all: True, any:
    False."""

    def __init__(self) -> None:
        self.calls = 0
        self.checks = 0
        self.uniques = 0

    def notes(self) -> list[str]:
        notes = []
        if self.calls:
            notes.append(f"nonzero, whose size depends on values fake tensors lack, was taken as every element nonzero "
                         f"({self.calls} call{'s' if self.calls > 1 else ''} a step; exact where it selects the "
                         "labelled rows, as the traced labels are all valid)")
        if self.checks:
            notes.append(f"{self.checks} check{'s' if self.checks > 1 else ''} on values (all / any over a tensor, "
                         "such as fp16's isfinite(...).all()) taken as all True and any False: finite values, no "
                         "padding")
        if self.uniques:
            notes.append(f"unique_consecutive ({self.uniques} call{'s' if self.uniques > 1 else ''} a step, BART's "
                         "check that every sequence holds as many end-of-sequence tokens) taken as one value: every "
                         "sequence alike")
        return notes


@contextmanager
def assumed_values(fake: bool) -> Iterator[_AssumedValues]:
    """Answer what fake tensors cannot, as real inputs without padding or overflow would: aten.nonzero as if every
    element were nonzero (torch's own meta kernel does so under `meta_nonzero_assume_all_nonzero`; DeBERTa's
    sequence classification loss selects its rows with a label ≥ 0 so: every row, with the step's labels), and the
    truth of a whole-tensor all() as True and any() as False (fp16 BART's isfinite(h).all()). Counted for the notes."""
    counter = _AssumedValues()
    if not fake:
        yield counter
        return
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from torch.utils.weak import WeakTensorKeyDictionary

    truths = WeakTensorKeyDictionary()  # a whole-tensor all / any → the truth it is taken to have
    aten = torch.ops.aten

    class Assume(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's signature
            if func is aten.nonzero.default:
                counter.calls += 1
                (tensor,) = args
                count = tensor.numel()
                return torch.empty_strided((count, tensor.dim()), (1, count), dtype=torch.long, device=tensor.device)
            if func is aten.index.Tensor and any(
                    index is not None and index.dtype in (torch.bool, torch.uint8) for index in args[1]):
                # a boolean mask's nonzero runs inside the fake kernel, below this mode: expand every mask into the
                # positions of all its elements, as the nonzero above takes them (BART's end-of-sequence tokens)
                counter.calls += 1
                expanded = []
                for index in args[1]:
                    if index is not None and index.dtype in (torch.bool, torch.uint8):
                        grids = torch.meshgrid(*(torch.arange(n) for n in index.shape), indexing="ij")
                        expanded += [grid.reshape(-1) for grid in grids]
                    else:
                        expanded.append(index)
                return func(args[0], expanded)
            if func is aten.unique_consecutive.default:  # every sequence alike: one value
                counter.uniques += 1
                tensor = args[0]
                options = dict(zip(("return_inverse", "return_counts", "dim"), args[1:])) | (kwargs or {})
                inverse = tensor.new_zeros(tensor.shape if options.get("return_inverse") else (0,), dtype=torch.long)
                counts = tensor.new_empty((1,) if options.get("return_counts") else (0,), dtype=torch.long)
                return tensor.new_empty((1,)), inverse, counts
            if func is aten._local_scalar_dense.default and args[0] in truths:
                counter.checks += 1
                return truths[args[0]]
            result = func(*args, **(kwargs or {}))
            if func in (aten.all.default, aten.any.default):
                truths[result] = func is aten.all.default
            return result

    with Assume():
        yield counter


# The transformers internals _as_in_eager replaces while a step runs, as (module, attribute). Each is looked up by
# its module-level name by the code that calls it, so replacing the attribute changes what that code does.
# tests/test_training_memory.py checks that every one still exists and is still called that way, so a transformers
# release that renames one fails a test instead of silently changing traced figures.
PATCHED_TRANSFORMERS = (
    ("transformers.masking_utils", "is_tracing"),
    ("transformers.masking_utils", "fast_all"),
    ("transformers.masking_utils", "find_packed_sequence_indices"),
    ("transformers.integrations.moe", "_can_use_grouped_mm"),
)


@contextmanager
def _as_in_eager() -> Iterator[None]:
    """Make transformers take the paths on fake tensors that it takes on real ones, for these inputs.

    - Masks: transformers takes a fake tensor for a compile trace and then always builds the causal mask
      (B × 1 × S × S) that eager code skips when nothing is padded, for sdpa's is_causal. The mask helpers are
      told what eager finds: not tracing, no padding, one sequence per row (the inputs never pad or pack).
    - MoE experts: torch's fake kernel for grouped_mm accepts only bf16 (the CUDA kernel's rule); for other
      dtypes the experts run transformers' own grouped-mm op, which has a fake kernel and the same inputs,
      outputs and saved tensors.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    patches: list[tuple[Any, str, Any]] = []
    try:
        from transformers import masking_utils
    except ImportError:
        masking_utils = None
    names = ("is_tracing", "fast_all", "find_packed_sequence_indices")
    if masking_utils is not None and all(hasattr(masking_utils, name) for name in names):
        tracing, fast_all, packed = (getattr(masking_utils, name) for name in names)
        patches += [
            (masking_utils, "is_tracing",
             lambda tensor=None: tracing(None if isinstance(tensor, FakeTensor) else tensor)),
            (masking_utils, "fast_all", lambda tensor: True if isinstance(tensor, FakeTensor) else fast_all(tensor)),
            (masking_utils, "find_packed_sequence_indices",
             lambda positions: None if isinstance(positions, FakeTensor) else packed(positions)),
        ]
    try:
        from transformers.integrations import moe
    except ImportError:
        moe = None
    can_use = getattr(moe, "_can_use_grouped_mm", None)
    if can_use is not None:
        def grouped_mm_allowed(input, weight, offs):  # noqa: A002 - transformers' argument names
            if isinstance(weight, FakeTensor) and weight.dtype != torch.bfloat16:
                return False
            return can_use(input, weight, offs)

        patches.append((moe, "_can_use_grouped_mm", grouped_mm_allowed))
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def working_copy(module: Any, mode: Any, attention: str | None, weights_dtype: str | None = None,
                 own_dtype: frozenset[str] = frozenset()) -> Any:
    """A copy whose parameters and buffers are fake CPU tensors of the same shapes, dtypes, flags and sharing.

    With `weights_dtype`, floating parameters take that dtype, except those named in `own_dtype`.

    Ties survive: each distinct tensor becomes one fake tensor, however many modules hold it. With `mode` None
    (a real run, for the tests) the module itself is used."""
    import torch

    if mode is None:
        model = module
    else:
        memo: dict[int, Any] = {}
        own = {id(p) for name, p in module.named_parameters(remove_duplicate=False) if name in own_dtype} \
            if own_dtype else set()
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            if id(tensor) in memo:
                continue
            dtype = tensor.dtype
            if weights_dtype and isinstance(tensor, torch.nn.Parameter) and dtype.is_floating_point \
                    and id(tensor) not in own:
                dtype = getattr(torch, weights_dtype)
            fake = torch.empty_strided(tuple(tensor.shape), tuple(tensor.stride()), dtype=dtype, device="cpu")
            if isinstance(tensor, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = fake
        model = copy.deepcopy(module, memo)
        config = getattr(model, "config", None)
        # transformers' decoder sequence classifiers (GPT-2, Llama) refuse a batch without a pad token, to find each
        # row's last real token; the copy gets one the step's ids (all 0) never hold, so every token is real
        if (type(model).__name__.endswith("ForSequenceClassification") and config is not None
                and getattr(config, "pad_token_id", 0) is None):
            config.pad_token_id = 1
    config = getattr(model, "config", None)
    if attention is not None and config is not None and hasattr(config, "_attn_implementation"):
        implementation = {"flash": "sdpa"}.get(attention, attention)
        for sub in _configs(config):
            try:
                sub._attn_implementation = implementation
            except (AttributeError, ValueError, TypeError):  # a config that refuses the setter keeps its own
                pass
    return model


def attention_of(model: Any) -> str:
    """The attention implementation the model runs ("sdpa", "eager", …; "" when it has no config)."""
    return str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")


def _configs(config: Any) -> list[Any]:
    found = [config]
    for key in ("text_config", "vision_config", "audio_config", "encoder", "decoder"):
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "_attn_implementation"):
            found.append(sub)
    return found


@contextmanager
def running(model: Any) -> Iterator[None]:
    """A forward that cannot run on fake tensors becomes one line that names the model and the reason."""
    import logging

    from ...build import quiet_transformers

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")  # logs a kernel's failure before raising it
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with quiet_transformers():
            yield
    except ParamscopeError:
        raise
    except Exception as err:  # broad on purpose: the model's own code (data-dependent control flow, other inputs, …)
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnsupportedError(f"cannot trace a step of {type(model).__name__}: {text[:200]}") from None
    finally:
        fake_log.setLevel(level)


def check_attention(attention: str | None) -> None:
    if attention is not None and attention not in ATTENTION:
        raise OptionError("unknown {0} {attention!r}; use one of {choices}", "attention", attention=attention[:40],
                          choices=", ".join(ATTENTION))


def _attention_notes(attention: str) -> tuple[str, ...]:
    if attention == "flash":
        return ("flash attention is traced as sdpa's flash kernel (the CPU one): no score matrix, a log-sum-exp "
                "per head and token is saved, as flash-attn saves",)
    return ()


# --- inputs, loss, optimizer -------------------------------------------------------------------------------------

def generation_inputs(model: Any, batch: int, seq: int) -> tuple[dict[str, Any] | None, Any]:
    """(the prefill's keyword arguments as generate() passes them: the cache on, logits for the last token only;
    a decode step's token ids), or (None, None) for a model that does not generate (or an encoder-decoder)."""
    generating = _accepts(model, "use_cache") and bool(getattr(model, "can_generate", lambda: False)())
    if not generating or getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None, None
    kwargs: dict[str, Any] = {"input_ids": _ids(model, batch, seq), "use_cache": True}
    if _accepts(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = 1
    return kwargs, _ids(model, batch, 1)


def _ids(model: Any, batch: int, seq: int) -> Any:
    import torch

    return torch.zeros((batch, seq), dtype=torch.long)


def _accepts(model: Any, name: str) -> bool:
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def enable_checkpointing(model: Any) -> None:
    """Full, non-reentrant gradient checkpointing, as the Trainer turns it on; one line for a class without it."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise UnsupportedError("{name} does not support gradient checkpointing ({0} full)", "grad_checkpointing",
                               name=type(model).__name__)
    if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def training_inputs(model: Any, settings: StepSettings) -> dict[str, Any]:
    import torch

    if settings.media is not None:
        from .media_step import media_inputs

        return media_inputs(model, settings.media, settings.seq)
    # A PeftModel with no task type forwards *args, **kwargs to the model it wraps: that model's signature counts.
    wrapped = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        names = inspect.signature(wrapped.forward).parameters
    except (TypeError, ValueError):
        names = {}
    if "input_ids" not in names:
        raise UnsupportedError(f"the traced step feeds token ids; {type(model).__name__}.forward takes no input_ids")
    ids = _ids(model, settings.batch, settings.seq)
    inputs: dict[str, Any] = {"input_ids": ids}
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        inputs["input_ids"] = _ids(model, settings.batch, settings.encoder_seq or settings.seq)
        if "labels" not in names:
            inputs["decoder_input_ids"] = ids
    if "labels" in names:
        name = type(model).__name__
        if "SequenceClassification" in name or "MultipleChoice" in name:
            inputs["labels"] = torch.zeros((settings.batch,), dtype=torch.long)
        else:
            inputs["labels"] = ids
    if "next_sentence_label" in names:  # BERT's pre-training loss is the masked LM's and next-sentence prediction's
        inputs["next_sentence_label"] = torch.zeros((settings.batch,), dtype=torch.long)
    return inputs


def loss_of(output: Any) -> Any:
    """The model's loss; a model without one (a bare encoder) trains on the sum of its first output."""
    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    first = output[0] if isinstance(output, (tuple, list)) or hasattr(output, "to_tuple") else output
    return first.float().sum()


def make_optimizer(model: Any, name: str, precision: str = "fp32") -> tuple[Any, str | None]:
    """torch's optimizer as the Trainer builds it (fused AdamW, its default on GPUs); None for one torch lacks.
    Under bf16-master, that optimizer on fp32 master copies of the bf16 weights (MasterCopyOptimizer); under
    bf16-main-grad, on fp32 masters whose gradients are a resident fp32 buffer (MainGradOptimizer)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise OptionError("nothing trains: every parameter is frozen")
    if precision == "bf16-master":
        return MasterCopyOptimizer(params, name), None
    if precision == "bf16-main-grad":
        return MainGradOptimizer(params, name), None
    return _torch_optimizer(params, name)


def _torch_optimizer(params: list, name: str) -> tuple[Any, str | None]:
    import torch

    if name in ("adamw", "adam"):
        cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
        return cls(params, lr=1e-4, fused=True), None
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3, foreach=True), None
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True), None
    return None, (f"{name} is not a torch optimizer: the forward and backward are traced, the optimizer's states "
                  "are the analytic figure (exact) and its step's temporaries are not counted")


class MasterCopyOptimizer:
    """bf16-master's step, DeepSpeed's (runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer.step, on one rank's
    partition; here every trained tensor): the optimizer's parameters are fp32 copies of the bf16 weights (its
    single_partition_of_fp32_groups); at the step each bf16 gradient is cast to fp32 into its master's gradient
    (`flat_grad_partition.to(fp32)`), the bf16 gradients are freed (free_grad_in_param_list), the optimizer updates the
    masters, their fp32 gradients are freed (`.grad = None`) and the masters are copied into the bf16 weights
    (`bit16_partitions[...].data.copy_(fp32_partition.data)`). DeepSpeed casts one flat buffer; here each tensor is
    cast on its own, all before the first is freed: the same bytes held. A tensor that is not floating point keeps
    no master (none trains)."""

    def __init__(self, params: list, name: str) -> None:
        import torch

        self.params = [p for p in params if p.is_floating_point()]
        self.masters = torch.nn.ParameterList([torch.nn.Parameter(p.detach().float()) for p in self.params])
        inner, note = _torch_optimizer(list(self.masters), name)
        if inner is None:
            raise OptionError("{0} bf16-master runs torch's optimizers on the master copy: {note}", "precision",
                              note=note)
        self.inner = inner

    def tracked(self) -> tuple[Any, ...]:
        """What the tracker counts as resident: the masters (parameters of their own module) and the states."""
        return self.masters, self.inner

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for param, master in zip(self.params, self.masters):
                master.grad = None if param.grad is None else param.grad.float()
            for param in self.params:
                param.grad = None
            _step_masters(self.inner, self.masters, self.params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None
        self.inner.zero_grad(set_to_none=set_to_none)


def _step_masters(inner: Any, masters: Any, params: list) -> None:
    """The master-copy step both 16-bit optimizers share (under no_grad): the optimizer updates the fp32 masters,
    their .grad is dropped, and each master is copied into its 16-bit weight."""
    inner.step()
    for master in masters:
        master.grad = None
    for param, master in zip(params, masters):
        param.copy_(master)


class MainGradOptimizer:
    """bf16-main-grad's step, Megatron-LM's (megatron/core/distributed/distributed_data_parallel.py and
    param_and_grad_buffer.py; megatron/core/optimizer/optimizer.py, Float16OptimizerWithFloat16Params): each trained
    bf16 weight gets an fp32 `main_grad` when the model is wrapped (Megatron carves them out of one contiguous
    buffer; here one tensor each: the same bytes, the buffer's alignment padding apart), held from before the forward;
    a hook after each gradient is accumulated adds it into `main_grad` and frees it (`param.main_grad.add_(
    param.grad.data); param.grad = None`); at the step each fp32 master's gradient is its main_grad itself
    (`main_param.grad = model_param.main_grad.float()`: no copy, it is fp32), the optimizer updates the masters, whose
    .grad is dropped, the masters are copied into the bf16 weights, and zero_grad zeroes the buffer in place
    (`zero_grad_buffer`) rather than freeing it. A tensor that is not floating point keeps no master."""

    def __init__(self, params: list, name: str) -> None:
        import torch

        self.params = [p for p in params if p.is_floating_point()]
        self.masters = torch.nn.ParameterList([torch.nn.Parameter(p.detach().float()) for p in self.params])
        self.main_grads = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        inner, note = _torch_optimizer(list(self.masters), name)
        if inner is None:
            raise OptionError("{0} bf16-main-grad runs torch's optimizers on the master copy: {note}", "precision",
                              note=note)
        self.inner = inner
        for param, main_grad in zip(self.params, self.main_grads):
            param.register_post_accumulate_grad_hook(functools.partial(_add_into_main_grad, main_grad))

    def tracked(self) -> tuple[Any, ...]:
        """What the tracker counts as resident: the masters, the states and the fp32 gradient buffer."""
        return self.masters, self.inner, *self.main_grads

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for master, main_grad in zip(self.masters, self.main_grads):
                master.grad = main_grad.float()  # already fp32: the buffer itself, as Megatron's step reads it
            _step_masters(self.inner, self.masters, self.params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None
        for main_grad in self.main_grads:  # Megatron's zero_grad_buffer: zeroed in place, still held
            main_grad.zero_()
        self.inner.zero_grad(set_to_none=set_to_none)


def _add_into_main_grad(main_grad: Any, param: Any) -> None:
    """Megatron-Core DDP's backward hook: the bf16 gradient added into the fp32 main_grad, then freed."""
    import torch

    with torch.no_grad():
        main_grad.add_(param.grad)
    param.grad = None


def autocast_for(precision: str) -> Any:
    import torch

    if precision in ("bf16-mixed", "fp16-mixed"):
        dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
        return torch.autocast("cpu", dtype=dtype)
    return nullcontext()


# --- the tracker --------------------------------------------------------------------------------------------------

class _NoHook:
    def remove(self) -> None:
        pass


def make_tracker(model: Any, *external: Any) -> Any:
    """The tracker every traced step runs under: MemTracker (ListedMemTracker), with `model` and `external` (an
    optimizer, tensors made before the step) in its resident baseline."""
    from .tracker import ListedMemTracker

    tracker = ListedMemTracker()
    # MemTracker hooks every parameter's gradient, and torch refuses a hook on a frozen one: mark them hooked.
    for param in model.parameters():
        if not param.requires_grad:
            tracker._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())
    # an optimizer with parts of its own (bf16-master's fp32 masters and their optimizer) is tracked by those parts
    parts = [part for obj in external for part in (obj.tracked() if hasattr(obj, "tracked") else (obj,))]
    tracker.track_external(model, *parts)
    return tracker


def _kept_by_module(tracker: Any, root: str) -> tuple[tuple[str, int], ...]:
    """Activation bytes each module leaves allocated when its forward returns (its output and what it saved),
    for the modules one or two levels down, every layer, and the first layer's own modules."""
    rows: list[tuple[str, int]] = []
    first_layer: str | None = None
    for stats in tracker.memory_tracking.values():
        path = stats.mod_fqn[len(root) + 1:] if stats.mod_fqn.startswith(root + ".") else ""
        if not path:
            continue
        depth = path.count(".")
        layer = re.match(r"^(.*?\.\d+)$", path)
        if layer and first_layer is None:
            first_layer = path
        inside_first = first_layer is not None and path.startswith(first_layer + ".") and \
            path.count(".") == first_layer.count(".") + 1
        if depth <= 1 or layer or inside_first:
            before = _activations(stats.snapshots, "Pre-Forward")
            after = _activations(stats.snapshots, "Post-Forward")
            if before is not None and after is not None:
                rows.append((path, after - before))
    return tuple(rows)


def _activations(snapshots: dict[Any, list], state: str) -> int | None:
    for key, values in snapshots.items():
        if getattr(key, "value", str(key)) == state and values:
            return sum(v for device in values[0].values() for k, v in device.items()
                       if getattr(k, "value", str(k)) == "Activation")
    return None


def restart_peak(tracker: Any) -> None:
    """Start the running peak afresh at the current total, so each phase's peak is its own."""
    current = tracker.get_tracker_snapshot("current")
    tracker._peak_mem_snap = current
    tracker._peak_mem = {device: snap["Total"] for device, snap in current.items()}


def by_category(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    totals = dict.fromkeys(CATEGORIES, 0)
    for device_snap in snapshot.values():
        for key, value in device_snap.items():
            name = _TRACKER_NAMES.get(getattr(key, "value", str(key)))
            if name is not None:
                totals[name] += value
    return totals


def _current(tracker: Any) -> dict[str, int]:
    return by_category(tracker.get_tracker_snapshot("current"))


def phase_peak(tracker: Any, phase: str) -> PhasePeak:
    snapshot = tracker.get_tracker_snapshot("peak")
    total = sum(snap.get("Total", 0) for snap in snapshot.values())
    return PhasePeak(phase, total, by_category(snapshot))
