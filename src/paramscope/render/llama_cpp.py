"""`paramscope memory MODEL --engine llama.cpp`: a LlamaCppPlan → text (rich, at a width) and → the JSON "llama_cpp"
object.

Pure functions of their data. Bytes are exact integers; the binary units beside them are for reading only.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ._console import indented, model_source_line, to_text
from .memory import binary


def render_llama_cpp_text(report: Any, plan: Any, accelerator: Any, reserve: int, width: int = 100, *,
                          color: bool = False) -> str:
    return to_text(llama_cpp_parts(report, plan, accelerator, reserve), width, color)


def _span(layers: list[int]) -> str:
    return "" if not layers else (f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]}–{layers[-1]}")


def _where(plan: Any) -> str:
    p = plan.placement
    gpu_layers = max(plan.n_layer - p.first_gpu_layer, 0)
    if p.gpus > 1:
        names = [d.device for d in plan.gpu_devices]
        held = [" and ".join(filter(None, [_span(p.layers_on(g, plan.n_layer)),
                                           "the output layer" if p.output_device == g else ""])) or "nothing"
                for g in range(p.gpus)]
        each = "; ".join(f"{name} {what}" for name, what in zip(names, held))
        words = (f"-ngl {p.n_gpu_layers}: {gpu_layers} of {plan.n_layer} repeating layers on {p.gpus} GPUs ({each})"
                 + ("" if p.output_on_gpu else ", the output layer on the CPU"))
    else:
        words = (f"-ngl {p.n_gpu_layers}: {gpu_layers} of {plan.n_layer} repeating layers on the GPU"
                 + (f" (layers {p.first_gpu_layer}–{plan.n_layer - 1})" if 0 < gpu_layers < plan.n_layer else "")
                 + (", and the output layer" if p.output_on_gpu else ", the output layer on the CPU"))
    if p.cpu_moe:
        words += f"; --n-cpu-moe {p.cpu_moe}: the experts of layers 0–{p.cpu_moe - 1} on the CPU"
    return words


def llama_cpp_parts(report: Any, plan: Any, accelerator: Any, reserve: int) -> list:
    """`report` None: a model read from its GGUF header alone (no transformers class, no memory report)."""
    o = plan.options
    on = "" if accelerator is None else (f" on a {binary(accelerator.memory)} budget" if accelerator.name == "budget"
                                         else f" on {accelerator.name}")
    title = plan.model if report is None else f"{report.model.label} ({report.model.class_name})"
    lines: list = [
        Text(f"llama.cpp serving memory for {title}{on}", style="bold"),
        *filter(None, [None if report is None else model_source_line(report.model)]),
        indented(f"weights: {plan.weights_from}"),
        indented(_where(plan)),
        indented(f"n_ctx {plan.n_ctx:,} ({plan.n_ctx_from}, padded to 256)"
                 + (f", {plan.streams} streams of {plan.n_ctx_seq:,} cells" if plan.streams > 1 else "")
                 + f"; n_batch {plan.n_batch:,}, n_ubatch {plan.n_ubatch:,}; cache K {o.cache_type_k}, V "
                   f"{o.cache_type_v}; flash attention {'on' if o.flash_attn else 'off'}; --parallel {o.parallel}"),
        Text(""),
        _devices_table(plan),
        _caches_table(plan),
    ]
    if plan.fit is not None:
        f = plan.fit
        several = plan.placement.gpus > 1
        lines.append(Text(f"GPU budget {f.budget:,} B{' each' if several else ''} ({binary(f.budget)}"
                          + (f": {binary(accelerator.memory)} less --reserve {binary(reserve)}" if reserve else "")
                          + f"): the answer above {'fits' if f.fits else 'does NOT fit'} "
                            f"({'the fullest GPU' if several else 'GPU'} {plan.gpu_total:,} B)", style="bold"))
        if f.command:
            lines.append(Text(f"llama.cpp flags that fit ({f.why}):", style="bold"))
            lines.append(indented(f.command, 4))
        else:
            lines.append(indented(f"nothing fits: {f.why}"))
    for note in plan.notes:
        lines.append(indented(f"note: {note}"))
    lines.append(indented(f"compute buffer: {plan.compute_source}; {plan.compute_arithmetic}"))
    return lines


def _devices_table(plan: Any) -> Table:
    # short headers and unwrapped figures: exact bytes are never cut (the compute and output buffers' being
    # estimates is said in the caption)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Memory per device", title_justify="left",
                  caption="compute* and output*: estimates (their source below)", caption_justify="left")
    for name in ("", "weights", "KV cache", "recurrent", "compute*", "output*", "total"):
        table.add_column(name, justify="left" if not name else "right", no_wrap=True)
    for d in plan.devices:
        cells = [d.weights, d.kv, d.recurrent, d.compute, d.output, d.total]
        table.add_row("CPU (host)" if d.device == "CPU" else d.device, *(f"{v:,}" for v in cells))
        table.add_row("", *(binary(v) for v in cells))
    return table


def _caches_table(plan: Any) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Caches (exact)", title_justify="left")
    for name in ("kind", "layers", "on GPU", "cells", "bytes", "one layer"):
        table.add_column(name, justify="right" if name in ("layers", "on GPU", "cells", "bytes") else "left")
    for c in plan.caches:
        table.add_row(c.kind, str(c.layers), str(c.gpu_layers), f"{c.cells:,}", f"{c.bytes:,}", c.arithmetic)
    return table


def llama_cpp_to_dict(plan: Any, accelerator: Any, reserve: int) -> dict[str, Any]:
    o, p = plan.options, plan.placement
    out: dict[str, Any] = {
        "weights_from": plan.weights_from,
        "settings": {"n_gpu_layers": p.n_gpu_layers, "n_cpu_moe": p.cpu_moe, "n_ctx": plan.n_ctx,
                     "n_ctx_from": plan.n_ctx_from, "n_ctx_seq": plan.n_ctx_seq, "streams": plan.streams,
                     "n_batch": plan.n_batch, "n_ubatch": plan.n_ubatch, "cache_type_k": o.cache_type_k,
                     "cache_type_v": o.cache_type_v, "flash_attn": o.flash_attn, "parallel": o.parallel,
                     "swa_full": o.swa_full, "kv_unified": o.kv_unified, "kv_offload": o.kv_offload},
        "placement": {"n_layer": plan.n_layer, "first_gpu_layer": p.first_gpu_layer,
                      "gpu_layers": max(plan.n_layer - p.first_gpu_layer, 0), "output_on_gpu": p.output_on_gpu,
                      "cpu_moe_layers": p.cpu_moe, "moe": plan.moe, "gpus": p.gpus,
                      "tensor_split": None if p.tensor_split is None else list(p.tensor_split),
                      "split_points": list(p.splits),
                      "layers_per_gpu": [len(p.layers_on(g, plan.n_layer)) for g in range(p.gpus)],
                      "output_device": None if p.output_device is None else plan.gpu_devices[p.output_device].device},
        "devices": [{"device": d.device, "weights": d.weights, "kv": d.kv, "recurrent": d.recurrent,
                     "compute_estimate": d.compute, "output_estimate": d.output, "total": d.total}
                    for d in plan.devices],
        "caches": [{"kind": c.kind, "layers": c.layers, "gpu_layers": c.gpu_layers, "cells": c.cells,
                    "streams": c.streams, "bytes": c.bytes, "gpu_bytes": c.gpu_bytes,
                    "gpu_bytes_per_gpu": list(c.per_gpu), "arithmetic": c.arithmetic}
                   for c in plan.caches],
        "compute": {"convention": plan.compute_source, "arithmetic": plan.compute_arithmetic},
        "notes": list(plan.notes),
    }
    if plan.fit is not None:
        f = plan.fit
        out["fit"] = {"gpu": None if accelerator is None else accelerator.name, "reserve": reserve,
                      "budget": f.budget, "fits": f.fits, "n_gpu_layers": f.n_gpu_layers, "n_cpu_moe": f.n_cpu_moe,
                      "ctx_size": f.ctx_size, "command": f.command or None, "why": f.why}
    return out


def header_document(ck: Any, plan: Any, accelerator: Any, reserve: int) -> dict[str, Any]:
    """The JSON document of a model read from its GGUF header alone (docs/json-schema.md): the model as the file
    names it, no parameters or memory report (no transformers class), and "memory": {"llama_cpp": ...}."""
    from .json import SCHEMA_VERSION

    return {"schema_version": SCHEMA_VERSION,
            "model": {"source": ck.path, "source_kind": ck.format, "label": plan.model, "class": None,
                      "model_type": ck.architecture, "engine": {"name": "gguf-header", "detail": None}},
            "memory": {"llama_cpp": llama_cpp_to_dict(plan, accelerator, reserve)}}


def llama_cpp_document(result: Any) -> dict[str, Any]:
    """The JSON document `memory MODEL --engine llama.cpp --json` writes for an estimate_llama_cpp result
    (cost/memory/llama_cpp_answer.LlamaCppEstimate): the inspect document, its "memory" object memory's serving
    answer with "llama_cpp" added; a header-only file's, header_document."""
    if result.memory is None:
        return header_document(result.header, result.plan, result.accelerator, result.reserve)
    from .json import report_to_dict
    from .memory import memory_to_dict

    document = report_to_dict(result.report)
    document["memory"] = {**memory_to_dict(result.memory),
                          "llama_cpp": llama_cpp_to_dict(result.plan, result.accelerator, result.reserve)}
    return document
