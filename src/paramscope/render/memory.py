"""`paramscope memory`: a MemoryEstimate → text (rich, at a width) and → the JSON "memory" object.

Pure functions of their data. Bytes are exact integers; the binary units beside them (GiB = 2³⁰ B) are for
reading only. This module is the entry (the serving text's order, training's in memory_training) and re-exports the
names callers import from it; the parts live one concern each: memory_cells (bytes, units, words of cells),
memory_serving (the serving tables), memory_training (the training text), memory_layout (one device's tables under a
training layout), memory_fits (what fits where, the --gpu/--budget sentence), memory_settings (the settings in words),
memory_json (the JSON object).
"""

from __future__ import annotations

from rich.text import Text

from ..explain import exact
from ._console import indented, model_source_line, to_text
from .memory_cells import UNIT_POWERS, binary, in_unit, short_dtype, stage_layers_words, table_unit
from .memory_fits import budget_line, budget_sentence, fits_table
from .memory_json import memory_to_dict, smallest_to_dict
from .memory_serving import (cache_table, gpu_table, roles_table, serving_rules_table, serving_stages_table,
                             serving_totals, smallest_tp_sentence, sum_one_device)
from .memory_settings import settings_rows
from .memory_training import training_parts

__all__ = ["UNIT_POWERS", "binary", "budget_sentence", "in_unit", "memory_parts", "memory_to_dict",
           "render_memory_text", "settings_rows", "smallest_to_dict", "smallest_tp_sentence", "stage_layers_words",
           "sum_one_device", "table_unit", "training_parts"]


def render_memory_text(report, estimate, width: int = 100, *, color: bool = False) -> str:
    return to_text(memory_parts(report, estimate), width, color)


def memory_parts(report, estimate) -> list:
    if estimate.mode == "training":
        return training_parts(report, estimate)
    settings = estimate.settings
    weights = estimate.weights
    title = Text(f"Memory to serve {report.model.label} ({report.model.class_name}): {estimate.engine} engine, "
                 "allocator level", style="bold")
    seq_from = "" if settings["seq_from"] == "--seq" else f" ({settings['seq_from']})"
    if settings.get("media") is not None and settings["media"]["kind"] == "audio":
        media = settings["media"]
        seq_from += (f" of the decoder a sequence, one audio window a sequence ({media['input']}); the audio "
                     "encoder runs before the prefill")
    elif settings.get("media") is not None and settings["media"].get("vision_tokens"):  # read by cross-attention
        media = settings["media"]
        seq_from += (f" of text, and {media['input']} read by cross-attention ({media['vision_tokens']:,} vision "
                     "tokens a sequence); the vision tower runs before the prefill")
    elif settings.get("media") is not None:
        media = settings["media"]
        seq_from += (f": {media['text_seq']:,} text + {media['image_tokens']:,} image tokens ({media['input']}); the "
                     "vision tower runs before the prefill")
    lines = [
        title,
        *filter(None, [model_source_line(report.model)]),
        indented(f"storage: {weights.format.label}, from {settings['dtype_from']}"),
        indented(f"batch {settings['batch']:,} × {settings['seq']:,} tokens{seq_from}"
                 + (f"; KV cache in {short_dtype(settings['kv_dtype'])}" if estimate.kv_cache else "")),
    ]
    parallel = estimate.parallel
    layout = parallel.layout if parallel is not None else None
    if layout is not None:
        lines.append(indented(f"across GPUs: {layout.words()}; the model's figures first, then one GPU's"))
    lines += [Text(""), serving_totals(estimate)]
    if weights.format.quantized and weights.kept:
        lines.append(indented("left unquantised: " + "; ".join(
            f"{why} ({exact(numel)} parameters, {storage})" for why, numel, storage in weights.kept)))
    if estimate.kv_cache is not None:
        lines.append(cache_table(estimate.kv_cache))
    lines.append(roles_table(weights))
    if layout is not None:
        lines += [gpu_table(estimate, layout), Text("")]  # its caption ends it: a blank line before the next
        if layout.pp > 1:
            lines += [*serving_stages_table(layout), Text("")]
        if layout.tp > 1:
            lines += [serving_rules_table(layout), Text("")]
    lines.append(fits_table(estimate))
    if estimate.budget is not None:
        lines.append(budget_line(estimate))
    if parallel is not None and parallel.smallest is not None:
        lines.append(Text(smallest_tp_sentence(smallest_to_dict(parallel.smallest)), style="bold"))
    for note in estimate.notes:
        lines.append(indented(f"note: {note}"))
    if estimate.kv_cache is not None:
        lines.append(indented(f"convention: {estimate.kv_cache.convention}"))
    lines.append(indented("convention: figures are bytes of tensors (what torch's allocator is asked for); the CUDA "
                          f"context and fragmentation are the reserve, {binary(estimate.reserve)} (--reserve)"))
    return lines
