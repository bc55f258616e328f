"""`paramscope flops`: a FlopEstimate and its Compute → text (rich, at a width) and → the JSON "flops" object.

Pure functions of their data. FLOPs are exact integers; the scientific notation beside them is for reading only.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ..explain import exact
from ..frozen import thaw
from ._console import indented, model_source_line, to_text
from .check import check_to_dict
from .memory import stage_layers_words

CONVENTION = {
    "matmul": "a matmul of m×k by k×n costs 2mnk",
    "attention": "scores (q·kᵀ) and the weighted sum (p·v) counted in full, whatever the mask keeps",
    "causal": "full",
    "not_counted": "elementwise ops, norms, softmax, embedding lookups",
    "moe": "each token passes its top-k routed experts, the shared experts and the router",
    "backward": "model FLOPs: 2 × forward for what trains (input and weight gradients); recomputation apart",
}


def sci(value: float | int) -> str:
    return f"{value:.3e}".replace("e+", "e")


def render_flops_text(report, estimate, compute, width: int = 100, *, color: bool = False,
                      notes: tuple[str, ...] = ()) -> str:
    """`notes`: what the command adds about how it read its flags (--devices N read as dp N), after the answer's."""
    return to_text(flops_parts(report, estimate, compute, notes), width, color)


def flops_parts(report, estimate, compute, notes: tuple[str, ...] = ()) -> list:
    training = estimate.backward is not None
    title = Text(f"FLOPs of {'a training step of ' if training else 'a forward pass of '}{report.model.label} "
                 f"({report.model.class_name}): {estimate.engine} engine", style="bold")
    lines = [title, *filter(None, [model_source_line(report.model)]),
             indented(f"batch {estimate.batch:,} × {estimate.seq:,} tokens = {estimate.tokens:,} tokens"),
             Text(""), _terms_table(estimate), Text(""), _totals_table(estimate, compute)]
    if estimate.generation is not None:
        lines += [Text(""), _generation_table(estimate)]
    if estimate.device is not None:
        lines += [Text(""), *_device_parts(estimate.device, compute)]
    if compute.tokens is not None or compute.mfu is not None or compute.seconds is not None:
        lines += [Text(""), _compute_lines(estimate, compute)]
    for note in (*estimate.notes, *compute.notes, *notes):
        lines.append(indented(f"note: {note}"))
    causal = ("attention scores and weighted sum counted in full (no causal halving; FlopCounterMode's and PaLM's "
              "convention)" if estimate.causal == "full" else
              "attention halved for the causal mask (--causal half, Megatron's convention)")
    lines.append(indented(f"convention: a matmul of m×k by k×n costs 2mnk; {causal}; elementwise ops, norms, "
                          "softmax and embedding lookups are not counted"))
    if training:
        lines.append(indented("convention: backward is model FLOPs, 2 × forward for what trains; the recomputation "
                              "(flash attention's scores, checkpointed layers) is hardware FLOPs, counted apart: "
                              "MFU uses model FLOPs, HFU adds the recomputation"))
    return lines


def _terms_table(estimate) -> Table:
    table = Table(title="Forward, by role", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role", no_wrap=True)
    table.add_column("FLOPs", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    for term in estimate.terms:
        share = f"{100 * term.flops / estimate.forward:.1f}%" if estimate.forward else "—"
        table.add_row(term.role, exact(term.flops), sci(term.flops), share, term.arithmetic)
    table.add_row("forward", exact(estimate.forward), sci(estimate.forward), "100%", "", style="bold")
    return table


def _totals_table(estimate, compute) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("FLOPs", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    table.add_row("forward", exact(estimate.forward), sci(estimate.forward),
                  f"of which attention {exact(estimate.attention)} (grows with S²)")
    table.add_row("forward per token", exact(compute.per_token_forward), sci(compute.per_token_forward),
                  f"forward ÷ {estimate.tokens:,} tokens")
    if estimate.backward is not None:
        ratio = estimate.backward / estimate.forward if estimate.forward else 0
        table.add_row("backward", exact(estimate.backward), sci(estimate.backward), f"{ratio:.4f} × forward")
        table.add_row("training step", exact(estimate.step), sci(estimate.step), "forward + backward (model FLOPs)",
                      style="bold")
        table.add_row("recompute", exact(estimate.recompute or 0), sci(estimate.recompute or 0),
                      "hardware FLOPs beyond the model's")
        table.add_row("step per token", exact(compute.per_token_training), sci(compute.per_token_training),
                      f"{compute.per_token_training / max(compute.parameters, 1):.3f} × parameters "
                      f"({exact(compute.parameters)}), against 6 in 6ND")
    return table


def _generation_table(estimate) -> Table:
    generation = estimate.generation
    steps = generation.new_tokens - 1
    table = Table(title=f"generate(): {generation.new_tokens:,} new tokens after the {estimate.seq:,}-token prompt "
                        f"({generation.engine} engine)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("FLOPs", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    skipped = "" if generation.head_skipped is None else \
        f"; {exact(generation.head_skipped)} less than the forward above: the head on the other prompt tokens"
    table.add_row("prefill", exact(generation.prefill), sci(generation.prefill),
                  f"the prompt's forward, the lm head on its last token only (logits_to_keep=1){skipped}")
    if steps:
        table.add_row("first decode step", exact(generation.first_step), sci(generation.first_step),
                      f"one token a sequence over {estimate.seq + 1:,} keys")
        table.add_row("last decode step", exact(generation.last_step), sci(generation.last_step),
                      f"over {estimate.seq + steps:,} keys")
    table.add_row(f"decode ({steps:,} steps)", exact(generation.decode), sci(generation.decode),
                  "the prefill's logits give the first new token; each step after gives one more")
    table.add_row("generate()", exact(generation.total), sci(generation.total), "prefill + decode", style="bold")
    per = generation.total // (estimate.batch * generation.new_tokens)
    table.add_row("per new token", exact(per), sci(per), f"÷ ({estimate.batch:,} × {generation.new_tokens:,}) new "
                  "tokens, rounded down")
    table.add_row("how", "", "", generation.arithmetic)
    if generation.check is not None:
        table.add_row("check", "", "", generation.check.words())
    return table


def _compute_lines(estimate, compute) -> Table:
    table = Table(title="Compute", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    if compute.total is not None:
        per = "step" if estimate.backward is not None else "forward"
        table.add_row(f"{exact(compute.tokens)} tokens", sci(compute.total),
                      f"{per} FLOPs per token × tokens = {exact(compute.total)}")
    if compute.six_nd is not None:
        diff = (compute.total - compute.six_nd) / compute.six_nd
        table.add_row("6ND", sci(compute.six_nd),
                      f"6 × {exact(compute.parameters)} parameters × tokens; the exact count is {100 * diff:+.2f}% "
                      "(6ND counts every parameter a token meets as a matmul weight, embeddings included, and no "
                      "attention)")
    if compute.peak is not None:
        table.add_row("peak", f"{compute.peak / 1e12:,.1f} TFLOP/s", compute.peak_from or "")
    if compute.mfu is not None:
        how = ("model FLOPs per token × tokens/s ÷ (peak × devices)" if compute.step_from != "--step-seconds" else
               "the step's model FLOPs (every replica's) ÷ (step time × peak × devices)")
        table.add_row("MFU", f"{100 * compute.mfu:.2f}%", how)
    if compute.hfu is not None:
        table.add_row("HFU", f"{100 * compute.hfu:.2f}%", "with the recomputation")
    if compute.step_seconds is not None:
        table.add_row("step time", f"{compute.step_seconds:,.3f} s", compute.step_from or "")
    if compute.device_mfu is not None:
        table.add_row("MFU per device", f"{100 * compute.device_mfu:.2f}%",
                      "the busiest device's model FLOPs a step ÷ (step time × peak); recompute excluded (PaLM's "
                      "convention)")
    if compute.device_hfu is not None:
        table.add_row("HFU per device", f"{100 * compute.device_hfu:.2f}%", "its hardware FLOPs (with the recompute) "
                      "÷ (step time × peak)")
    if compute.seconds is not None:
        table.add_row("time", _duration(compute.seconds), f"{sci(compute.total)} ÷ (MFU × peak × devices)")
    return table


# the recompute, with or without checkpointing: flash attention reruns its scores in the backward even without it
RERUN_WORDS = "flash attention's scores and checkpointed layers rerun"
RECOMPUTE_WORDS = f"{RERUN_WORDS} (hardware FLOPs)"


def device_title(device) -> str:
    """"One device: dp 1 × tp 8 × pp 4 (…) = 32 devices; stage 3 (layers 60–79, the head: the busiest), tp rank 0
    (the most vocabulary rows)": which device the figures are (the text's table title, the page's heading)."""
    layout = device.layout
    stage = device.stages[device.stage]
    where = []
    if layout.pp > 1:
        runs = stage_runs(device)[stage.rank]
        held = "layers " + ", ".join(f"{a}–{b}" if a != b else str(a) for a, b in runs) if runs else "no layers"
        extra = [w for w, on in (("the embeddings", stage.first), ("the head", stage.last)) if on]
        where.append(f"stage {stage.rank} ({held}{', ' + ' and '.join(extra) if extra else ''}: the busiest)")
    if layout.tp > 1:
        where.append("tp rank 0 (the most vocabulary rows)")
    return f"One device: {device.layout_words}" + (f"; {', '.join(where)}" if where else "")


def stage_runs(device) -> dict[int, tuple[tuple[int, int], ...]]:
    """Each stage's runs of layers, (first, last) each: one, or v under the interleaved schedule, from the
    pipeline's own split (a stage's first and last layer alone would read 0–19 for 0–3 and 16–19)."""
    from ..cost.parallel.pipeline import stages

    total = sum(s.layer_count for s in device.stages)
    out = {}
    for stage in stages(device.layout, total):
        runs: list[list[int]] = []
        for index in stage.layers:
            if runs and index == runs[-1][1] + 1:
                runs[-1][1] = index
            else:
                runs.append([index, index])
        out[stage.rank] = tuple((a, b) for a, b in runs)
    return out


def _device_parts(device, compute) -> list:
    """One device's FLOPs under the layout: its terms by role, its totals, the stages, the sum over devices."""
    layout = device.layout
    title = device_title(device)
    tokens = f"{device.batch:,} × {device.seq:,} tokens a replica" + (
        f", {device.tokens:,} query tokens on each of {layout.cp} cp ranks" if layout.cp > 1 else "")
    table = Table(title=f"{title}\n{tokens}", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role", no_wrap=True)
    table.add_column("FLOPs", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("of the model's", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    for term in device.terms:
        if not term.flops:  # a role the device holds none of (DeepSeek's dense MLPs on a later stage)
            continue
        share = f"{100 * term.flops / term.whole:.2f}%" if term.whole else "—"
        table.add_row(term.role, exact(term.flops), sci(term.flops), share, term.rule)
    table.add_row("forward", exact(device.forward), sci(device.forward), "", "the device's, a step", style="bold")
    out = [table]
    totals = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    totals.add_column("", no_wrap=True)
    totals.add_column("FLOPs", justify="right", no_wrap=True)
    totals.add_column("", justify="right", no_wrap=True)
    totals.add_column("how", overflow="fold", ratio=1)
    if device.backward is not None:
        totals.add_row("backward", exact(device.backward), sci(device.backward), "2 × forward")
        totals.add_row("model FLOPs a step", exact(device.step), sci(device.step),
                       "forward + backward: what MFU counts", style="bold")
        totals.add_row("recompute", exact(device.recompute or 0), sci(device.recompute or 0),
                       RECOMPUTE_WORDS)
        totals.add_row("hardware FLOPs a step", exact(device.hardware), sci(device.hardware),
                       "model FLOPs + recompute: what HFU counts")
    if layout.micro_batches > 1:
        totals.add_row("per microbatch", exact(device.per_microbatch), sci(device.per_microbatch),
                       f"÷ {layout.micro_batches} microbatches of {device.batch // layout.micro_batches:,} "
                       f"sequence{'s' if device.batch // layout.micro_batches > 1 else ''}")
    count = layout.tp * layout.pp * layout.cp
    replicas = (f"{count:,} device{'s' if count != 1 else ''} of a replica (tp × pp × cp"
                + (f"; the ep {layout.ep} ranks are data-parallel replicas, each computing as many token-expert pairs "
                   "as its own tokens send, at balanced routing" if layout.ep > 1 else "") + ")")
    totals.add_row("Σ over a replica", exact(device.devices_sum), sci(device.devices_sum),
                   f"over the {replicas}: the model's {exact(device.replica)}" +
                   (f" + {exact(device.duplicated)} duplicated (matmuls kept whole on every tp rank, counted once "
                    "a rank)" if device.duplicated else ", exactly") +
                   (f"; at balanced routing (the busiest rank's load moves pairs between ep ranks: its forward is "
                    f"{exact(device.loaded)} above its balanced share)" if device.pairs else ""))
    out.append(totals)
    if layout.pp > 1:
        stages = Table(title=f"Pipeline stages ({device.stages_words})",
                       title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        # forward only: the forward is the stage's whole count (no step, no recompute)
        columns = ("stage", "layers", "forward") + (() if device.forward_only else ("model FLOPs a step", "recompute"))
        for name in columns:  # the layers wrap between their runs (memory's stage table alike)
            stages.add_column(name, justify="left" if name == "layers" else "right", no_wrap=name != "layers",
                              overflow="fold")
        runs = stage_runs(device)
        for s in device.stages:
            trained = () if device.forward_only else (
                sci(s.step), sci(s.recompute or 0) if s.recompute is not None else "—")
            stages.add_row(str(s.rank), stage_layers_words(s.first, runs[s.rank], s.last), sci(s.forward), *trained,
                           style="bold" if s.rank == device.stage else None)
        out += [Text(""), stages]
    for convention in device.conventions:
        out.append(indented(f"convention: {convention}"))
    return out


def _device_to_dict(device, compute) -> dict[str, Any] | None:
    if device is None:
        return None
    layout = device.layout
    return {
        "layout": {"dp": layout.dp, "tp": layout.tp, "sp": layout.sp, "pp": layout.pp,
                   "micro_batches": layout.micro_batches,
                   # forward only (no --training): no backward, so no schedule
                   "schedule": None if device.forward_only else layout.schedule,
                   "virtual_stages": layout.virtual_stages, "cp": layout.cp, "ep": layout.ep,
                   "expert_load": layout.expert_load, "devices": layout.devices, "words": device.layout_words},
        "batch": device.batch, "seq": device.seq, "tokens": device.tokens,
        "stage": device.stage, "tp_rank": 0,
        "forward": device.forward, "backward": device.backward, "step": device.step,
        "recompute": device.recompute, "hardware": device.hardware,
        "per_microbatch": device.per_microbatch,
        "by_role": {t.role: t.flops for t in device.terms},
        "terms": [{"role": t.role, "flops": t.flops, "whole": t.whole, "rule": t.rule, "copies": t.copies}
                  for t in device.terms],
        "stages": [{"rank": s.rank, "layers": list(s.layers) if s.layers else None, "layer_count": s.layer_count,
                    "first": s.first, "last": s.last, "forward": s.forward, "backward": s.backward,
                    "step": s.step, "recompute": s.recompute} for s in device.stages],
        "replica": device.replica, "devices_sum": device.devices_sum, "duplicated": device.duplicated,
        "recompute_sum": device.recompute_sum,
        "loaded": device.loaded,
        "pairs": {"busiest": device.pairs[0], "balanced": device.pairs[1]} if device.pairs else None,
        "bubble": device.bubble, "split": device.split or None,
        "mfu": compute.device_mfu, "hfu": compute.device_hfu,
        "conventions": list(device.conventions),
    }


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:,.1f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:,.1f} hours"
    return f"{seconds:,.1f} s"


def flops_to_dict(estimate, compute, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    convention = dict(CONVENTION, causal=estimate.causal)
    if estimate.causal == "half":
        convention["attention"] = "scores (q·kᵀ) and the weighted sum (p·v) halved for the causal mask (Megatron's)"
    return {
        "engine": estimate.engine,
        "convention": convention,
        "settings": thaw(settings or {}),
        "batch": estimate.batch,
        "seq": estimate.seq,
        "forward": estimate.forward,
        "attention": estimate.attention,
        "by_role": estimate.by_role,
        "arithmetic": {t.role: t.arithmetic for t in estimate.terms},
        "backward": estimate.backward,
        "step": estimate.step,
        "recompute": estimate.recompute,
        "per_token": {"forward": compute.per_token_forward, "training": compute.per_token_training},
        "training_compute": None if compute.total is None else {
            "tokens": compute.tokens, "flops": compute.total, "six_nd": compute.six_nd},
        "peak_flops": compute.peak,
        "peak_from": compute.peak_from,
        "mfu": compute.mfu,
        "hfu": compute.hfu,
        "seconds": compute.seconds,
        "notes": [*estimate.notes, *compute.notes],
        "check": check_to_dict(estimate.check),
        "generation": _generation_to_dict(estimate.generation),
        "step_seconds": compute.step_seconds,
        "step_from": compute.step_from,
        "device": _device_to_dict(estimate.device, compute),
        "media": _media_to_dict(estimate.media),
    }


def _media_to_dict(media) -> dict[str, Any] | None:
    if media is None:
        return None
    return {"kind": media.kind, "input": media.input_words, "per_sequence": media.per_sequence,
            "tokens": media.tokens, "tokens_from": media.tokens_words, "engine": media.engine,
            "forward": media.forward, "backward": media.backward,
            "parts": [{"part": line.part, "module": line.path, "class": line.class_name, "forward": line.forward,
                       "backward": line.backward} for line in media.lines]}


def _generation_to_dict(generation) -> dict[str, Any] | None:
    if generation is None:
        return None
    return {"new_tokens": generation.new_tokens, "engine": generation.engine, "prefill": generation.prefill,
            "head_skipped": generation.head_skipped, "decode": generation.decode,
            "first_step": generation.first_step, "last_step": generation.last_step, "total": generation.total,
            "arithmetic": generation.arithmetic, "check": check_to_dict(generation.check)}
