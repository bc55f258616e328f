"""`paramscope memory MODEL --engine vllm`: a VllmPreflight → text (rich, at a width) and → the JSON "vllm" object.

Pure functions of their data. Bytes are exact integers; the binary units beside them are for reading only.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ._console import indented, model_source_line, to_text
from .memory import binary


def render_vllm_text(report: Any, preflight: Any, width: int = 100, *, color: bool = False) -> str:
    return to_text(vllm_parts(report, preflight), width, color)


def vllm_parts(report: Any, p: Any) -> list:
    gpu = f"a {binary(p.total)} budget" if p.gpu == "budget" else p.gpu
    lines: list = [
        Text(f"vLLM pre-flight for {report.model.label} ({report.model.class_name}) on {gpu}"
             + (f", each GPU of tp {p.tp}" if p.tp > 1 and p.pp == 1 else "")
             + (f", tp {p.tp} × pp {p.pp} = {p.tp * p.pp} GPUs" if p.pp > 1 else ""), style="bold"),
        *filter(None, [model_source_line(report.model)]),
        indented(f"max_model_len {p.max_model_len:,} ({p.max_model_len_from}); block size {p.block_size}; KV cache "
                 f"in {p.kv_dtype}; max_num_seqs {p.max_num_seqs:,}, max_num_batched_tokens "
                 f"{p.max_num_batched_tokens:,} ({p.defaults_from} unless given)"),
        Text(""),
        _budget_table(p),
        *([_stages_table(p)] if p.stages else []),
        _groups_table(p),
        _answer(p),
    ]
    if p.tried:
        lines.append(_tried_table(p))
    if p.command:
        lines.append(Text("vllm serve flags that fit" + (f" ({p.command_changes})" if p.command_changes else "")
                          + ":", style="bold"))
        lines.append(indented(shell_lines(p.command), 4))
    else:
        lines.append(Text(p.command_changes, style="bold"))
    for note in p.notes:
        lines.append(indented(f"note: {note}"))
    for part in (p.activation, p.non_torch, p.cuda_graphs):
        lines.append(indented(f"estimate: {part.source}"))
    lines.append(indented(f"total: {p.total_from}"))
    lines.append(indented(f"follows: {p.follows}"))
    lines.append(indented("convention: vLLM's V1 engine as read in its source (gpu_worker.determine_available_memory, "
                          "mem_utils.memory_profiling, kv_cache_utils, kv_cache_interface); the KV bytes per token "
                          "and layer are paramscope's KV engine's (memory/kv.py), paged in blocks"))
    return lines


def shell_lines(command: str, limit: int = 92) -> str:
    """`command` broken at spaces into lines of at most `limit` characters, each but the last ending in a shell
    continuation: a long command still copies and pastes as one (a line wrapped by the terminal does not)."""
    lines: list[str] = []
    for word in command.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= limit:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return " \\\n    ".join(lines)


def _row(table: Table, label: str, value: int, how: str) -> None:
    table.add_row(label, f"{value:,}", binary(value), how)


def _budget_table(p: Any) -> Table:
    title = ("Memory vLLM budgets on one GPU" if p.pp == 1 else
             f"Memory vLLM budgets on one GPU of stage {p.limiting_stage}, the stage with the fewest blocks")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=title, title_justify="left")
    for name, justify in (("", "left"), ("bytes", "right"), ("", "right"), ("how", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    _row(table, "total", p.total, "the GPU's memory")
    _row(table, f"× utilization {p.utilization:g}", p.requested, f"⌈{p.total:,} × {p.utilization:g}⌉ (vLLM rounds up)")
    _row(table, "− weights", p.weights, p.weights_from)
    _row(table, "− activation peak", p.activation.bytes, f"estimate: {p.activation.arithmetic}")
    _row(table, "− non-torch", p.non_torch.bytes, f"estimate: {p.non_torch.arithmetic}")
    _row(table, "− CUDA graphs", p.cuda_graphs.bytes, f"estimate: {p.cuda_graphs.arithmetic}")
    _row(table, "= KV cache available", p.available, "vLLM's \"Available KV cache memory\"")
    _row(table, "headroom (1 − u)", p.headroom, f"CUDA context: needs about {p.headroom_needs:,} B (--reserve)")
    return table


def _stages_table(p: Any) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Each pipeline stage's GPU (rank 0 of its tensor-parallel "
                  "group); vLLM gives every worker the fewest blocks", title_justify="left")
    # short headers and unwrapped figures, so that no exact figure is split across lines at the default width
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=table.title, title_justify="left",
                  caption="activation*: an estimate; ← the fewest blocks, which every worker gets",
                  caption_justify="left")
    for name in ("stage", "layers", "weights", "activation*", "KV available", "pool", "block B", "blocks"):
        table.add_column(name, justify="left" if name == "layers" else "right", no_wrap=True)
    for st in p.stages:
        table.add_row(str(st.rank), f"{st.first_layer}–{st.last_layer} ({st.layers})", f"{st.weights:,}",
                      f"{st.activation.bytes:,}", f"{st.available:,}", str(st.pool_layers), f"{st.bytes_per_block:,}",
                      f"{st.blocks:,}" + (" ←" if st.rank == p.limiting_stage else ""))
    return table


def _groups_table(p: Any) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title=f"KV cache specs ({p.group_size} layers a pool)",
                  title_justify="left")
    for name, justify in (("layers", "left"), ("spec", "left"), ("count", "right"), ("per token and layer", "left"),
                          ("page (one block)", "right"), ("blocks a request", "left")):
        table.add_column(name, justify=justify, overflow="fold", no_wrap=name in ("layers", "spec"))
    for g in p.groups:
        mamba = g.spec == "MambaSpec"
        table.add_row(g.kind, g.spec, f"{g.layers:,}" + (f" ({g.groups} groups)" if g.groups > 1 else ""),
                      f"{g.token_arithmetic} = {g.bytes_per_token:,} B" + (" a sequence" if mamba else ""),
                      (f"the state, padded to {g.page_bytes:,} B" if mamba and g.page_bytes != g.bytes_per_token
                       else f"{g.page_bytes:,} B" if mamba else
                       f"{p.block_size} × {g.bytes_per_token:,} = {g.page_bytes:,} B"),
                      g.blocks_arithmetic + (f" × {g.groups} groups" if g.groups > 1 else ""))
    return table


def _answer(p: Any) -> Text:
    lines = [
        f"bytes per block: page {p.page_bytes:,} B × {p.group_size} layers = {p.bytes_per_block:,} B",
        f"KV blocks: {max(p.available, 0):,} // {p.bytes_per_block:,} = {p.blocks:,} "
        f"({p.blocks * p.block_size:,} token slots a layer)",
        f"one sequence of {p.max_model_len:,} tokens: {p.blocks_per_request:,} blocks",
        f"Maximum concurrency for {p.max_model_len:,} tokens per request: {p.max_concurrency:.2f}x "
        f"({int(p.max_concurrency):,} whole sequences); GPU KV cache size: {p.kv_tokens:,} tokens",
        f"largest --max-model-len that fits: {p.largest_max_model_len:,}"
        + (f" (of the model's {p.model_max_len:,})" if p.largest_max_model_len < p.model_max_len else
           " (the model's own)") if p.largest_max_model_len else "largest --max-model-len that fits: none",
    ]
    verdict = "fits" if p.fits else f"does not fit: {p.why}"
    return Text("\n".join(lines) + f"\nAt --max-model-len {p.max_model_len:,}: {verdict}", style="bold")


def _tried_table(p: Any) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Larger tensor-parallel degrees at this length",
                  title_justify="left")
    for name, justify in (("tp", "right"), ("weights a GPU", "right"), ("KV available", "right"),
                          ("fits", "left"), ("why not", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for t in p.tried:
        table.add_row(str(t.tp), "—" if t.weights is None else f"{t.weights:,}",
                      "—" if t.available is None else f"{t.available:,}", "yes" if t.fits else "no", t.why)
    return table


def vllm_to_dict(p: Any) -> dict[str, Any]:
    def estimate(e: Any) -> dict[str, Any]:
        return {"bytes": e.bytes, "arithmetic": e.arithmetic, "source": e.source, "estimate": True}

    return {
        "gpu": p.gpu, "total_bytes": p.total, "total_from": p.total_from,
        "gpu_memory_utilization": p.utilization, "requested_bytes": p.requested, "tp": p.tp,
        "weights_bytes": p.weights, "weights_from": p.weights_from,
        "activation": estimate(p.activation), "non_torch": estimate(p.non_torch),
        "cuda_graphs": estimate(p.cuda_graphs),
        "non_kv_bytes": p.non_kv, "available_bytes": p.available,
        "headroom_bytes": p.headroom, "headroom_needs_bytes": p.headroom_needs,
        "block_size": p.block_size, "kv_dtype": p.kv_dtype,
        "groups": [{"kind": g.kind, "spec": g.spec, "layers": g.layers, "groups": g.groups,
                    "bytes_per_token": g.bytes_per_token, "arithmetic": g.token_arithmetic,
                    "page_bytes": g.page_bytes, "window": g.window, "blocks_per_request": g.blocks_per_request,
                    "blocks_arithmetic": g.blocks_arithmetic, "encoder_tokens": g.encoder_tokens}
                   for g in p.groups],
        "group_size": p.group_size, "page_bytes": p.page_bytes, "bytes_per_block": p.bytes_per_block,
        "blocks": p.blocks, "max_model_len": p.max_model_len, "max_model_len_from": p.max_model_len_from,
        "max_num_seqs": p.max_num_seqs, "max_num_batched_tokens": p.max_num_batched_tokens,
        "defaults_from": p.defaults_from, "blocks_per_request": p.blocks_per_request,
        "max_concurrency": p.max_concurrency, "kv_tokens": p.kv_tokens,
        "largest_max_model_len": p.largest_max_model_len, "model_max_len": p.model_max_len,
        "fits": p.fits, "why": p.why or None, "smallest_tp": p.smallest_tp,
        "tried": [{"tp": t.tp, "weights_bytes": t.weights, "available_bytes": t.available, "fits": t.fits,
                   "why": t.why or None} for t in p.tried],
        "command": p.command or None, "command_changes": p.command_changes or None, "notes": list(p.notes),
        "pp": p.pp, "limiting_stage": p.limiting_stage, "follows": p.follows,
        "stages": [{"rank": st.rank, "first_layer": st.first_layer, "last_layer": st.last_layer, "layers": st.layers,
                    "weights_bytes": st.weights, "activation": estimate(st.activation),
                    "available_bytes": st.available, "pool_layers": st.pool_layers,
                    "bytes_per_block": st.bytes_per_block, "blocks": st.blocks, "fits": st.fits,
                    "largest_max_model_len": st.largest} for st in p.stages],
    }


def vllm_document(result: Any) -> dict[str, Any]:
    """The JSON document `memory MODEL --engine vllm --json` writes for an estimate_vllm result
    (cost/memory/vllm_answer.VllmEstimate): the inspect document, its "memory" object memory's serving answer with
    "vllm" added."""
    from .json import report_to_dict
    from .memory import memory_to_dict

    document = report_to_dict(result.report)
    document["memory"] = {**memory_to_dict(result.memory), "vllm": vllm_to_dict(result.preflight)}
    return document
