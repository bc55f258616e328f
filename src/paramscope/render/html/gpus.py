"""Serving across GPUs on the memory page (`memory MODEL --tp T [--pp P] --html`): one GPU's peak by part (weights,
buffers, KV cache, prefill workspace) beside the model's on one GPU and at its own scale, each pipeline stage's, the
GPU's figures with their arithmetic, the stages table and how each role is cut. The bars, the stages table and the
rules table are the training layout's (layout_parts.py); the parts are serving's."""

from __future__ import annotations

from ...explain import exact
from ..memory import binary as bytes_text
from .layout_parts import Part, rules_table, stage_bars, stages_table, versus_bars
from .page import Section, escape, figure


def serving_layout(memory: dict) -> dict | None:
    """The JSON "memory" object's layout of serving across GPUs (each GPU's figures within), or None."""
    layout = memory.get("layout")
    return layout if memory["mode"] != "training" and layout is not None and "device" in layout else None


def serving_layout_rows(memory: dict) -> list[tuple[str, str]]:
    """Serving's layout as settings rows: its words, the tensor-parallel cut, the pipeline's stages."""
    layout = memory["layout"]
    tp = (f"tp {layout['tp']}: heads and widths cut {layout['tp']} ways; KV cache: {layout['kv_heads']}"
          if layout["tp"] > 1 else "tp 1: none")
    pp = f"pp {layout['pp']} stages: {layout['pipeline']}" if layout["pp"] > 1 else "pp 1: none"
    return [("layout", layout["words"]),
            ("GPUs", f"{layout['devices']:,} = tp {layout['tp']} × pp {layout['pp']}; every figure below the totals "
                     "is one GPU's"),
            ("tensor parallel", tp), ("pipeline parallel", pp)]


def one_gpu_parts(memory: dict) -> list[Part]:
    """The model on one GPU, no layout, by part: the whole model's weights, buffers, KV cache and prefill workspace
    (the text's "peak on one device": their sum, the analytic one-device peak)."""
    parts = [("weights", _bytes(memory.get("weights")), (memory.get("weights") or {}).get("format_label", "")),
             ("buffers", _bytes(memory.get("buffers")), ""),
             ("KV cache", _bytes(memory.get("kv_cache")), _kv_how(memory.get("kv_cache"), memory["settings"])),
             ("prefill workspace", _bytes(memory.get("activations")),
              (memory.get("activations") or {}).get("arithmetic", ""))]
    return [part for part in parts if part[1]]


def gpu_parts(memory: dict, stage: dict) -> list[Part]:
    """One GPU of a stage (the JSON's layout device or one of its stages) by part; they add up to its peak exactly:
    its weights stay resident, its cache is full at the end of the prefill, its workspace is the prefill's."""
    weights = stage["weights"]
    parts = [("weights", int(weights["bytes"]), _weights_how(weights)),
             ("buffers", int(stage["buffers"]), "the model's own buffers, whole on every GPU"),
             ("KV cache", _bytes(stage.get("kv_cache")), _kv_how(stage.get("kv_cache"), memory["settings"])),
             ("prefill workspace", _bytes(stage.get("workspace")),
              (stage.get("workspace") or {}).get("arithmetic", ""))]
    if stage.get("correction"):  # the one-device correction, the formula's tp cut of the workspace given back
        parts.append(("correction (a bound)", int(stage["correction"]), "what transformers' prefill keeps beyond "
                      "the formula on one device (traced), carried whole, with the formula's tp cut of the "
                      "workspace given back: see the notes"))
    if stage.get("moe_gathered"):  # under --dp, a MoE layer's tokens from every replica
        how = (memory.get("layout") or {}).get("moe_dispatch") or ""
        parts.append(("MoE dispatch, gathered", int(stage["moe_gathered"]),
                      how + " (vLLM's allgather_reducescatter dispatch over the DP group: see the notes)"))
    if stage.get("moe_workspace"):  # vLLM's fused experts' workspace over those tokens
        parts.append(("MoE experts' workspace", int(stage["moe_workspace"]),
                      ((memory.get("layout") or {}).get("moe_workspace") or "")
                      + " (vLLM's fused experts over the gathered tokens: see the notes)"))
    assert sum(value for _, value, _ in parts) == stage["peak"]
    return parts


def serving_sections(memory: dict) -> list[Section]:
    """The page's sections for serving across GPUs: per GPU, the pipeline stages (under --pp), the rules."""
    layout = serving_layout(memory)
    assert layout is not None
    device = layout["device"]
    one = one_gpu_parts(memory)
    alone = sum(v for _, v, _ in one)
    where = f"stage {device['stage']}" if layout["pp"] > 1 else "tensor-parallel rank 0"
    bars = versus_bars(("one GPU, no layout (prefill)", one, f"{bytes_text(alone)}: the model on one GPU"),
                       (f"each of {layout['devices']:,} GPUs ({where})", gpu_parts(memory, device),
                        f"{bytes_text(device['peak'])} per GPU: {device['peak'] / alone * 100:.1f}% of one GPU's"),
                       "each GPU, at its own scale (prefill)", "bytes at the end of the prefill")
    sections = [Section("Per GPU", _smallest_tp(memory) + figure(bars, "bars-gpu") + _gpu_table(memory))]
    if layout["pp"] > 1:
        stages = layout["stages"]
        rows = [{**s, "weights_bytes": s["weights"]["bytes"], "kv_bytes": _bytes(s.get("kv_cache")),
                 "workspace_bytes": _bytes(s.get("workspace"))} for s in stages]
        table = stages_table(rows, (("count", "layer_count"),), (("weights", "weights_bytes"), ("KV cache", "kv_bytes"),
                                                                  ("workspace", "workspace_bytes"), ("peak", "peak")),
                             (), "Each stage's GPUs alike (rank 0's shares of its tensor-parallel group); the worst "
                                 "in bold. Exact bytes in each cell's tooltip.")
        sections.append(Section("Pipeline stages", f'<p id="pipeline">{escape(layout["pipeline"])}.</p>'
                                + figure(stage_bars(stages, [gpu_parts(memory, s) for s in stages],
                                                    "bytes at the end of the prefill"), "bars-stages") + table))
    sections.append(Section("How each role is cut", rules_table(
        layout["rules"], f"Each role's tensor-parallel cut over tp {layout['tp']}, read from its role, as the "
                         "training layouts cut it (transformers' tp plans agree)")))
    return sections


def _bytes(part: dict | None) -> int:
    return int(part["bytes"]) if isinstance(part, dict) and part.get("bytes") else 0


def _weights_how(weights: dict) -> str:
    by_dtype = ", ".join(f"{dtype} {exact(value)} B" for dtype, value in (weights.get("by_dtype") or {}).items())
    return f"the GPU's shards: {by_dtype}" if by_dtype else "the GPU's shards"


def _kv_how(cache: dict | None, settings: dict) -> str:
    if not cache:
        return ""
    out = []
    for group in cache.get("groups") or ():
        tokens = "a fixed state" if group["kind"] in ("recurrent state", "cross-attention") else \
            f"{exact(group['tokens'])} tokens"
        out.append(f"{group['kind']}: {group['layers']} layers × batch {settings['batch']:,} × {tokens} × "
                   f"({group['arithmetic']})")
    return "; ".join(out)


def _smallest_tp(memory: dict) -> str:
    from ..memory import smallest_tp_sentence

    smallest = memory.get("smallest_tp")
    return f'<p id="smallest-tp"><b>{escape(smallest_tp_sentence(smallest))}</b></p>' if smallest else ""


def _gpu_table(memory: dict) -> str:
    """One GPU's figures as the text's table: each part exact, with its arithmetic; the peak."""
    layout = memory["layout"]
    device = layout["device"]
    rows = gpu_parts(memory, device)
    rows.append(("peak (prefill)", int(device["peak"]), "the sum above: this GPU's weights stay resident, its cache "
                                                         "is full at the end of the prefill"))
    body = "".join(f'<tr><th>{escape(label)}</th><td class="num" data-value="{value}">{exact(value)} B</td>'
                   f'<td class="num dim">{bytes_text(value)}</td><td class="dim">{escape(how)}</td></tr>'
                   for label, value, how in rows)
    where = f"stage {device['stage']}'s tensor-parallel rank 0" if layout["pp"] > 1 else "tensor-parallel rank 0"
    return (f'<table class="totals" id="gpu" data-peak="{device["peak"]}"><caption class="dim">One GPU ({where}, '
            f"the largest peak): {escape(layout['words'])}; KV cache: {escape(layout['kv_heads'])}; prefill "
            f"workspace: {escape(layout['workspace_from'])}</caption>{body}</table>")
