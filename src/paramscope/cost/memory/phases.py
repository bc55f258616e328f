"""A training step's moments as figures: each phase's bytes at a moment, with its arithmetic.

The analytic recipes give the forward's and backward's moments over the resident bytes; moment_phases adds the end
of backward and the optimizer step. The one-device answer (training.py) and each device of a layout (parallel/)
compose them alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .activations import TrainingActivations, embedding_gradient, recomputed_backward_moments
from .activations.step import ONE_DEVICE, SP_RANK, TP_RANK


@dataclass(frozen=True)
class PhaseFigure:
    phase: str  # "forward" | "backward" | "optimizer step"
    bytes: int
    where: str  # the moment ("start of backward") or "measured"
    arithmetic: str
    gradients: int = 0  # bytes of gradients live at this moment (ZeRO-2 shards them)
    variable: int = 0  # traced: activations, temporaries and other bytes, the part that grows with the batch



def moment_phases(act: TrainingActivations, *, resident: int, gradients: int, tied: int, text: Any, batch: int,
                  length: int, precision: str, step: tuple[int, str],
                  recompute: tuple[int, int, bool] | None = None) -> tuple[PhaseFigure, ...]:
    """The step's moments from an analytic recipe's activations: its forward and backward moments over the
    resident bytes, the end of backward (every gradient, and the embedding output's), and the optimizer step.
    `recompute` (vocab_shards, ids, sp): the first and last recomputed layers' backward moments too
    (recomputed_figures), on one device (1, 0, False) or a tensor-parallel rank alone (tp, the 8·T token ids its
    vocabulary-parallel embedding references, whether sequence parallel); None where the gradients are shared out
    otherwise."""
    # a tied embedding's backward frees its output's gradient before its two gradients are summed
    kept = not tied
    output_gradient = embedding_gradient(text, batch=batch, seq=length, precision=precision) if kept else 8
    end = gradients + output_gradient + 2 * tied
    figures = [PhaseFigure(m.phase, resident + m.bytes, m.where, m.arithmetic) for m in act.moments]
    if recompute is not None:
        figures += recomputed_figures(act, resident=resident, gradients=gradients, tied=tied, precision=precision,
                                      vocab_shards=recompute[0], ids=recompute[1], sequence_parallel=recompute[2])
    how = f"gradients {gradients:,} + {end - gradients:,}: " + (
        "the embedding output's gradient" if kept else "8 B (the embedding output's gradient freed)")
    if tied:
        how += f" and 2 × the tied embedding's gradient {tied:,} (its own and their sum, beside the head's)"
    figures.append(PhaseFigure("backward", resident + end, "end of backward", how, gradients))
    step_bytes, step_text = step
    figures.append(PhaseFigure("optimizer step", resident + gradients + step_bytes, "optimizer step",
                               f"gradients {gradients:,}; {step_text}", gradients))
    return tuple(figures)


# the first micro-step's recomputed layers' backward moments (recomputed_figures): a later micro-step accumulates each
# new gradient into the held one and frees it, so it does not hold them (grad_accum names its own)
RECOMPUTED_MOMENTS = ("last layer's backward (recomputed)", "first layer's backward (recomputed)")
# the precisions whose recomputed layer's backward was read off the traces (recomputed_backward_moments)
RECOMPUTED_PRECISIONS = ("fp32", "bf16-pure", "bf16-mixed")


def recomputed_figures(act: TrainingActivations, *, resident: int, gradients: int, tied: int, precision: str,
                       vocab_shards: int = 1, ids: int = 0, sequence_parallel: bool = False) -> list[PhaseFigure]:
    """The first and last recomputed layers' backward moments (full checkpointing, a Llama-style recipe), each with
    the gradients it holds: the head's (V / `vocab_shards` rows, a tp rank's shard) and the final norm's, and every
    later layer's, the step's `gradients` less the embedding's and the head's (once, when `tied`) and the final
    norm's, over the layers; on a tp rank with `sequence_parallel`, the tp + sp rank's backward. Empty where the
    recipe does not name the layer or the gradients are not every parameter's."""
    shape = act.recomputed
    if shape is None or precision not in RECOMPUTED_PRECISIONS or not act.layers:
        return []
    size = 2 if precision == "bf16-pure" else 4
    vocab = act.logits // (4 * shape.tokens) // vocab_shards
    head = size * vocab * shape.hidden
    held_last = head + size * shape.hidden
    layers = gradients - held_last - (0 if tied else head)
    if layers <= 0 or layers % act.layers:
        return []
    layout = ONE_DEVICE if vocab_shards == 1 else SP_RANK if sequence_parallel else TP_RANK
    return [PhaseFigure("backward", resident + n, where, words, held)
            for where, n, words, held in recomputed_backward_moments(act, held_last=held_last,
                                                                     layer_gradients=layers // act.layers, ids=ids,
                                                                     layout=layout, tp=vocab_shards)]


def cast_weights(view: Any, local: dict[str, int] | None = None) -> tuple[int, int, int]:
    """Elements of the matmul weights autocast copies to 16 bits each step (each distinct tensor once), of those
    the ones outside the repeated layers (a ModuleList index in the name), which checkpointing keeps, and of the
    matmuls' biases (cast too, and cached until the forward ends, but no backward reads them). `local`: parameter
    name → the elements one device holds of it (a tensor-parallel shard)."""
    import re

    def size(path: str, attr: str, tensor: Any) -> int:
        name = f"{path}.{attr}" if path else attr
        return local.get(name, tensor.numel()) if local is not None else tensor.numel()

    seen: set[int] = set()
    total = outside = biases = 0
    for name, sub in view.root.named_modules():
        if not view.is_matmul(sub):
            continue
        weight, bias = sub._parameters.get("weight"), sub._parameters.get("bias")
        if weight is not None and id(weight) not in seen:
            seen.add(id(weight))
            n = size(name, "weight", weight)
            total += n
            if not re.search(r"\.\d+\.", f".{name}."):
                outside += n
        if bias is not None and id(bias) not in seen:
            seen.add(id(bias))
            biases += size(name, "bias", bias)
    return total, outside, biases


def whole_sum(figure: PhaseFigure, resident: tuple[tuple[str, int], ...]) -> str:
    """A device's moment as the whole sum it is: the resident model states (`resident`: (name, bytes) each, which
    the figure holds beside what its words name) + the moment's own terms = its bytes. The moment's words open each
    term on its value or end it on one, with the parts in parentheses, so that the line reads as one sum."""
    held = sum(value for _, value in resident)
    parts = " + ".join(f"{name} {value:,}" for name, value in resident)
    return f"resident {held:,} ({parts}) + {figure.arithmetic} = {figure.bytes:,}"
