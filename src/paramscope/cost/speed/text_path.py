"""The weights a text decode step of a multimodal model reads: its language model's, not its towers'.

A text input runs the language model only (model_view.towers_not_run: the FLOP count leaves the vision and audio
towers and their projectors out the same way), so a step reads none of the tower's bytes. They are the stored
weights' (memory/weights.py, in the same storage format, quantised or not as serving quantises them) over the
parameters outside the towers; the towers' bytes are named beside the bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TextPath:
    weights: Any  # memory/weights.WeightMemory of the parameters a text step reads
    params: tuple[Any, ...]  # those parameters (count.ParameterInfo)
    towers: tuple[str, ...]  # the module paths not run
    tower_bytes: int  # their stored bytes, left out

    def words(self) -> str:
        return (f"a text input runs the language model only: its towers ({', '.join(self.towers)}) are not run, so "
                f"a step reads none of their {self.tower_bytes:,} B of weights (an image or audio input runs them "
                "once, before the prefill)")


def text_path(report: Any, view: Any, fmt: Any, not_convert: Any, stored: Any) -> TextPath | None:
    """The language model's weights in `fmt`, or None where the model has no tower a text input skips (and for a
    file whose every tensor has its own type, a GGUF's, which memory/serving.py predicts as a whole). `stored`: the
    whole model's WeightMemory, as serving computed it."""
    from ..memory.weights import input_first_weights, quantized_names, weight_memory
    from ..model_view import towers_not_run

    towers = towers_not_run(view)
    if not towers or getattr(fmt, "mixture", None) or getattr(fmt, "stored_bytes", None):
        return None
    inside = tuple(f"{tower}." for tower in towers)
    params = tuple(p for p in report.params if not p.name.startswith(inside))
    quantized = quantized_names(view, report.params, fmt, not_convert)
    fp32 = view.kept_in_fp32(fmt.compute_dtype, [p.name for p in report.params] + [b.name for b in report.buffers])
    inputs_first = input_first_weights(view, quantized)
    text = weight_memory(params, (), fmt, quantized=quantized, fp32=fp32, inputs_first=inputs_first)
    return TextPath(text, params, towers, stored.bytes - text.bytes)


__all__ = ["TextPath", "text_path"]
