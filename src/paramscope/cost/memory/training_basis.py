"""What a training step's answer starts from (training_step.py): the settings checked, what trains, the model states,
the weights as the step holds them, the length, the analytic recipe found, and the optimizer step's temporaries;
`StepBasis.analytic_phases` the analytic recipe's moments at any batch and length."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...selection import match_all
from ..hardware import Accelerator, find_accelerator
from .activations import TrainingActivations
from ..dims import text_config
from .phases import PhaseFigure, cast_weights, moment_phases
from .quantization import weight_format
from .serving import step_length
from .states import (
    as_trained, check_optimizer, check_precision, grad_buffer, master_gradient_copy, model_states, step_precision,
    weight_dtype, zero_stage,
)
from .training_input import StepInput, input_words, step_input
from .training_master import MAIN_GRAD_CONVENTION, MASTER_CONVENTION, with_master_copy
from .training_options import DEFAULT_TRAINING_SEQ, TrainingOptions
from .training_parts import step_temporaries, tied_embedding_bytes
from .training_recipe import StepRecipe, step_recipe
from .weights import weight_memory


@dataclass(frozen=True)
class StepBasis:
    """One step's settings and model states. `precision` the asked one, `run` the forward and backward's
    (bf16-master runs bf16-pure's), `dtype` the weights' as the step holds them; `frozen` what trains not, `own` a
    live module's parameters kept in their own dtype; `seq` the step's length (a media model's tokens added),
    `limit` the model's longest; `resident` weights, buffers, optimizer states and master weights (bf16-main-grad's
    fp32 gradient buffer too), `gradients` what is held as .grad; `shape` the analytic recipe's settings; `step` the
    optimizer step's temporaries and words (bf16-master's fp32 gradient copy in it), `optimizer_text` the words
    without that copy; `notes` the answer's words so far (the caller adds to them)."""

    optimizer: str
    precision: str
    run: str
    zero: int
    accelerator: Accelerator | None
    dtype: str
    frozen: list[str]
    inputs: StepInput
    trainable: frozenset[str]
    own: frozenset[str]
    states: Any
    weights: Any
    text: Any
    seq: int
    limit: int | None
    tower_saved: int
    checkpointing: bool
    resident: int
    gradients: int
    shape: dict[str, Any]
    found: StepRecipe
    tied: int
    step: tuple[int, str]
    master_copy: int
    optimizer_text: str
    notes: list[str]

    def analytic_phases(self, act: TrainingActivations, batch: int, length: int) -> tuple[PhaseFigure, ...]:
        """The analytic recipe's moments at `batch` × `length` from its activations `act`."""
        return moment_phases(act, resident=self.resident, gradients=self.gradients, tied=self.tied, text=self.text,
                             batch=batch, length=length, precision=self.run, step=self.step,
                             # the recomputed layers' moments read each layer's gradient off the total: every
                             # parameter trains (a frozen one would make the per-layer share wrong)
                             recompute=None if self.frozen else (1, 0, False))


def step_basis(report: Any, view: Any, options: TrainingOptions, *, live: bool) -> StepBasis | None:
    """The step's basis from the report and view; None when its input needs the build (the view has no module)."""
    optimizer = check_optimizer(options.optimizer)
    precision = check_precision(options.precision)
    run = step_precision(precision)
    zero = zero_stage(options.zero)
    accelerator = find_accelerator(options.gpu) if options.gpu else None
    dtype = weight_dtype(precision)
    if options.grad_checkpointing == "full" and not live:
        view.check_checkpointing()
    frozen = match_all(report.params, options.freeze)
    if live:  # a user's module (a PEFT model, a half-frozen one) trains what its requires_grad flags say
        frozen = sorted(set(frozen) | {p.name for p in report.params if not p.trainable})
    inputs = step_input(report, view, options, frozen, run)
    if inputs is None:
        return None
    frozen = inputs.frozen
    trainable = frozenset(p.name for p in report.params) - frozenset(frozen)
    own = options.own_dtype if live else frozenset()
    states = model_states(report.params, precision=precision, optimizer=optimizer, trainable=trainable, own=own)
    fmt = weight_format({"float32": "fp32", "bfloat16": "bf16"}[dtype])
    # each parameter in the dtype the step holds it in (a live module is cast to the precision's, as traced)
    weights = weight_memory(as_trained(report.params, precision, own), report.buffers, fmt,
                            components=[c.name for c in report.components])
    text = text_config(view.config)
    seq, limit, notes = step_length(report, text, options.seq, DEFAULT_TRAINING_SEQ)
    notes.extend(inputs.notes)
    notes.extend(input_words(report, view, inputs, seq))
    tower_saved = 0
    if inputs.media is not None:
        seq += inputs.media.tokens
        tower_saved = inputs.media.saved_bytes or 0
    checkpointing = options.grad_checkpointing == "full"
    resident = weights.bytes + weights.buffer_bytes + states.optimizer.bytes + states.master_weights.bytes
    gradients = states.gradients.bytes
    if grad_buffer(states):  # bf16-main-grad: the fp32 gradient buffer is resident, no .grad is held past its hook
        resident, gradients = resident + gradients, 0
        notes.append(MAIN_GRAD_CONVENTION)
    cast, cast_head, cast_biases = cast_weights(view) if precision.endswith("-mixed") else (0, 0, 0)
    shape = dict(precision=run, checkpointing=checkpointing, cast_weights=cast, cast_head=cast_head,
                 cast_biases=cast_biases)
    found = step_recipe(view, text, options, live=live, seq=seq, shape=shape, cross=inputs.cross, notes=notes)
    tied = tied_embedding_bytes(report, trainable)
    step_bytes, step_text = step_temporaries(optimizer, gradients)
    master_copy = master_gradient_copy(states)  # bf16-master: the step's fp32 gradients, beside the bf16 ones
    optimizer_text = step_text
    if master_copy:
        step_bytes += master_copy
        step_text = with_master_copy(master_copy, optimizer_text)
        notes.append(MASTER_CONVENTION)
    if grad_buffer(states):  # Megatron's step reads the buffer itself as the masters' gradients
        step_text = ("the fp32 main-gradient buffer (resident, among the states) is the masters' .grad: nothing cast; "
                     f"{step_text}")
    return StepBasis(optimizer=optimizer, precision=precision, run=run, zero=zero, accelerator=accelerator,
                     dtype=dtype, frozen=frozen, inputs=inputs, trainable=trainable, own=own, states=states,
                     weights=weights, text=text, seq=seq, limit=limit, tower_saved=tower_saved,
                     checkpointing=checkpointing, resident=resident, gradients=gradients, shape=shape, found=found,
                     tied=tied, step=(step_bytes, step_text), master_copy=master_copy, optimizer_text=optimizer_text,
                     notes=notes)
