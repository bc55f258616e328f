"""The pages of memory, flops and plan: phases as stacked bars, FLOPs by role and against context, what trains."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...explain import exact, human
from ..flops import RERUN_WORDS
from ..memory import binary as bytes_text
from ..treemap import TRAINABLE, active_share, module_treemap
from .gpus import serving_layout, serving_layout_rows, serving_sections
from .layout_parts import PART_COLORS, rules_table, stage_bars, stages_table, versus_bars
from .page import (FONT, LEGEND_ABOVE, Section, color_key, escape, figure, html_page, notes_section, role_bars,
                   small_multiple, subtitle, totals_table, treemap_figure)

if TYPE_CHECKING:
    from ...report import Report


def render_memory_html(report: Report | None, estimate, *, fragment: bool = False) -> str:
    """memory: the totals with the --gpu/--budget answer, every setting the figures depend on, the bytes of each
    phase as stacked bars, the "fits on" table, and (given the report) the model's treemap. An estimate without a
    report (a plan's step, one made by hand) leaves the model's parts out. A training step under a multi-GPU layout
    adds the layout to the settings, one device's peak by part beside the one-device step's, each pipeline stage's
    peak by part (the worst marked) with the bubble, and the rules each role is cut by; the fits table says it reads
    per device."""
    from ..memory import memory_to_dict

    memory = memory_to_dict(estimate)
    layout = training_layout(memory)
    sections = [
        Section("Memory", _memory_totals(memory) + _budget_answer(memory)),
        Section("Settings", _settings_table(memory)),
    ]
    if layout is not None:
        sections.append(Section("Per device", figure(_device_bars(memory), "bars-device") + _device_table(memory)))
        if layout["device"]["stages"]:
            sections.append(Section("Pipeline stages", _stages_words(layout) + figure(_stage_bars(memory),
                                                                                      "bars-stages")
                                    + _stages_table(memory)))
        sections.append(Section("How each role is cut", _rules_table(layout["device"])))
    gpus = serving_layout(memory)
    if gpus is not None:  # its one phase's bar is the per-GPU figure's first: the model on one GPU
        sections += serving_sections(memory)
    else:
        sections.append(Section("By phase" + (", one device (no layout)" if layout is not None else ""),
                                figure(_phase_bars(memory), "bars-phases")))
    sections.append(Section("Fits on", _fits_table(memory)))
    if report is not None:
        treemap = module_treemap(report, active_share(report))
        sections.append(Section("Parameters by module", figure(treemap_figure(treemap), "treemap-module"),
                                open=False))
    notes = list(memory.get("notes") or ())
    if memory.get("kv_cache"):  # the convention the cache's figure follows, as the text report states it
        notes.append(f"KV cache, {memory['kv_cache']['layout']} layout: {memory['kv_cache']['convention']}")
    if notes:
        sections.append(notes_section(notes))
    verb = "train" if memory["mode"] == "training" else "serve"
    settings = memory["settings"]
    asked = (f"{settings['precision']}, {settings['optimizer']}" if memory["mode"] == "training"
             else f"{memory['weights']['format']} weights")  # the rest in the settings table
    if layout is not None:
        asked += f" · {layout['words']}"
    per = " per device" if layout is not None or memory.get("per_device") else " per GPU" if gpus is not None else ""
    peak = (f"{memory['engine']} engine · {asked} · batch {settings['batch']:,} × {settings['seq']:,} tokens · "
            f"peak{per} {bytes_text(memory['peak']['bytes'])} in {memory['peak']['phase']}")
    return html_page(_titled(report, f"memory to {verb}"), _subtitled(report, peak), sections, fragment)


def _settings_table(memory: dict) -> str:
    """What the figures depend on, in the text report's words (render/memory.settings_rows)."""
    from ..memory import settings_rows

    rows = settings_rows(memory)
    if training_layout(memory) is not None:  # the layout's rows in place of --devices/--zero's, which it replaces
        at = next((i for i, (name, _) in enumerate(rows) if name == "devices"), len(rows))
        rows = rows[:at] + layout_rows(memory) + [row for row in rows[at:] if row[0] != "devices"]
    elif serving_layout(memory) is not None:  # before the reserve, which each GPU sets aside
        at = next((i for i, (name, _) in enumerate(rows) if name == "reserve"), len(rows))
        rows = rows[:at] + serving_layout_rows(memory) + rows[at:]
    body = "".join(f"<tr><th>{escape(name)}</th><td>{escape(value)}</td></tr>" for name, value in rows)
    return f'<table class="totals" id="settings">{body}</table>'


def training_layout(memory: dict) -> dict | None:
    """The JSON "memory" object's layout of a training step (its device's figures within), or None: none given, or
    the step is serving's."""
    layout = memory.get("layout")
    return layout if memory["mode"] == "training" and layout is not None and "device" in layout else None


def layout_rows(memory: dict) -> list[tuple[str, str]]:
    """A multi-GPU layout as settings rows (from the JSON "memory" object's layout): its words, each degree and the
    shard mode, as the figures depend on them."""
    layout, settings = memory["layout"], memory["settings"]
    batch, seq = settings["batch"], settings["seq"]
    shard = (layout["shard_words"] if layout["shard"] == "none" else
             f"{layout['shard_words']} over {layout['shard_degree']:,} rank{'s' if layout['shard_degree'] > 1 else ''}")
    shard += {"none": ": every data-parallel rank holds the model states whole",
              "zero1": ": the optimizer states sharded", "zero2": ": optimizer states and gradients sharded",
              "zero3": ": optimizer states, gradients and weights sharded",
              "fsdp": ": each parameter, its gradient and optimizer states cut along dim 0 (all-gathered to run)",
              "hsdp": ": sharded within each group, replicated across groups"}.get(layout["shard"], "")
    tp = (f"tp {layout['tp']}: heads and widths cut {layout['tp']} ways" + ("; sequence parallel (--sp)"
                                                                            if layout["sp"] else "")
          if layout["tp"] > 1 else "tp 1: none")
    if layout["pp"] > 1:
        micro = batch // layout["micro_batches"]
        schedule = {"gpipe": "GPipe", "1f1b": "1F1B",
                    "interleaved": f"interleaved, {layout['virtual_stages']} chunks a device"}[layout["schedule"]]
        pp = (f"pp {layout['pp']} stages: {schedule}; {layout['micro_batches']:,} microbatch"
              f"{'es' if layout['micro_batches'] > 1 else ''} of {micro:,} sequence{'s' if micro > 1 else ''} each")
    else:
        pp = "pp 1: none"
    cp = (f"cp {layout['cp']}: each rank holds {-(-seq // layout['cp']):,} of the {seq:,} tokens (ring attention)"
          if layout["cp"] > 1 else "cp 1: none")
    ep = f"ep {layout['ep']}: routed experts split over the data-parallel ranks" if layout["ep"] > 1 else "ep 1: none"
    return [("layout", layout["words"]),
            ("devices", f"{layout['devices']:,} = dp {layout['dp']} × tp {layout['tp']} × pp {layout['pp']} × cp "
                        f"{layout['cp']}; each data-parallel replica takes a batch of {batch:,} a step"),
            ("data parallel", f"dp {layout['dp']}"),
            ("shard mode", shard),
            ("tensor parallel", tp),
            ("pipeline parallel", pp),
            ("context parallel", cp),
            ("expert parallel", ep)]


def _budget_answer(memory: dict) -> str:
    """The --gpu or --budget answer, the text's bold line; nothing when neither was asked."""
    from ..memory import budget_sentence

    budget = memory.get("budget")
    if budget is None:
        return ""
    batch, context = budget["largest_batch"], budget["largest_context"]
    return (f'<p id="budget" data-fits="{str(budget["fits"]).lower()}" data-free="{budget["free"]}" '
            f'data-largest-batch="{"" if batch is None else batch}" '
            f'data-largest-context="{"" if context is None else context}">'
            f'<b>{escape(budget_sentence(budget, memory["settings"]))}</b></p>')


def render_flops_html(report: Report | None, estimate, compute=None, *, fragment: bool = False) -> str:
    """flops: the forward by role with the attention term apart, and the forward against context length."""
    sections = [Section("FLOPs", _flop_totals(estimate, compute)),
                Section("Forward by role", figure(_flop_bars(estimate), "bars-flops"))]
    if estimate.device is not None:  # under a layout: the busiest device, its stages (render/html/flops_layout.py)
        from .flops_layout import device_sections

        sections += device_sections(estimate.device, compute)
    if estimate.by_context:
        sections.append(Section("Against context length", figure(_flop_curve(estimate), "line-context")))
    else:
        sections.append(Section("Against context length", '<p class="dim">Not counted: the analytic engine gives '
                                                          "the curve (FlopOptions(context_curve=True), which --html "
                                                          "sets); FlopCounterMode counts one length.</p>"))
    if estimate.notes:
        sections.append(notes_section(estimate.notes))
    settings = (f"{estimate.engine} engine · batch {estimate.batch} × {estimate.seq:,} tokens · attention "
                f"convention: {estimate.causal}")
    if estimate.device is not None:
        settings += f" · {estimate.device.layout_words}"
    return html_page(_titled(report, "FLOPs"), _subtitled(report, settings), sections, fragment)


def render_plan_html(report: Report | None, plan, planned: Report | None, estimate=None, flops=None, *,
                     fragment: bool = False) -> str:
    """plan: the counts, what trains as the treemap of the model with the plan applied (frozen parts pale), and,
    given the estimate, the training step's memory with the --gpu/--budget answer, its FLOPs (traced, given) and
    every setting the figures depend on (render.plan.plan_settings_rows). `planned` None (a plan counted without a
    build) leaves the treemap out, and says so."""
    from ..plan import plan_settings_rows

    rows = [("trainable", plan.trainable, "requires_grad, adapters included"),
            ("frozen", plan.frozen, "no gradient, no optimizer state"),
            ("adapters add", plan.adapter, "parameters of the LoRA/DoRA matrices"),
            ("total", plan.total, "base + adapters, as PEFT counts")]
    share = plan.trainable / plan.total * 100 if plan.total else 0.0
    memory = None
    if estimate is not None:
        from ..memory import memory_to_dict

        memory = memory_to_dict(estimate)
    sections = [Section("Plan", totals_table(rows, "plan", {"trainable": plan.trainable}, human)
                        + f"<p>{share:.4f}% of the parameters train.</p>"),
                Section("Settings", _rows_table(plan_settings_rows(plan, memory, estimate)))]
    if planned is not None:
        treemap = module_treemap(planned, TRAINABLE)
        sections.append(Section("What trains", figure(treemap_figure(treemap), "treemap-plan") + color_key(treemap)))
    else:
        sections.append(Section("What trains", "<p>Counted from the template and PEFT's arithmetic, without a build: "
                                               "no planned module to draw (make the plan from a built model for "
                                               "its treemap).</p>"))
    if memory is not None:
        sections += [Section("Memory of a training step", _memory_totals(memory) + _budget_answer(memory)
                             + figure(_phase_bars(memory), "bars-phases")),
                     Section("Fits on", _fits_table(memory), open=False)]
    if flops is not None and memory is not None:
        sections.append(Section("FLOPs of a training step", _step_flops(flops, memory["settings"])))
    if estimate is not None and estimate.notes:
        sections.append(notes_section(estimate.notes))
    method = plan.method + (f" ({plan.storage})" if plan.storage else "")
    return html_page(_titled(report, f"fine-tuning plan, {method}"), _subtitled(report, _step_words(memory)),
                     sections, fragment)


def _rows_table(rows, table_id: str = "settings") -> str:
    """(setting, words) rows as the settings table the memory pages have."""
    body = "".join(f"<tr><th>{escape(name)}</th><td>{escape(value)}</td></tr>" for name, value in rows)
    return f'<table class="totals" id="{table_id}">{body}</table>'


def _step_words(memory: dict | None) -> str:
    """The subtitle's settings: engine, precision and optimizer, batch × sequence, the peak (as the memory page's
    subtitle says them); '' without a memory estimate."""
    if memory is None:
        return ""
    settings = memory["settings"]
    return (f"{memory['engine']} engine · {settings['precision']}, {settings['optimizer']} · batch "
            f"{settings['batch']:,} × {settings['seq']:,} tokens · peak {bytes_text(memory['peak']['bytes'])} in "
            f"{memory['peak']['phase']}")


def _step_flops(flops, settings: dict) -> str:
    """A plan's traced training step, as the text's FLOPs line: forward, backward, the step and per token."""
    tokens = settings["batch"] * settings["seq"]
    step = flops.forward + flops.model_backward
    rows = [("forward", flops.forward, "model FLOPs: 2 per multiply-add, traced (FlopCounterMode)"),
            ("backward", flops.model_backward, f"model FLOPs, {flops.model_backward / flops.forward:.3f} × forward"),
            ("training step", step, "forward + backward"),
            ("per token", step // tokens, f"the step over batch × sequence = {tokens:,} tokens")]
    if flops.recompute:
        rows.append(("recompute", flops.recompute, f"hardware FLOPs beyond the model's: {RERUN_WORDS}"))
    body = "".join(f'<tr><th>{escape(label)}</th><td class="num" data-value="{value}">{exact(value)}</td>'
                   f'<td class="num dim">{value:.3e}</td><td class="dim">{escape(note)}</td></tr>'
                   for label, value, note in rows)
    return f'<table class="totals" id="step-flops" data-step="{step}">{body}</table>'


def _titled(report: Report | None, what: str) -> str:
    return f"{report.model.label}: {what}" if report is not None else what[:1].upper() + what[1:]


def _subtitled(report: Report | None, settings: str) -> str:
    parts = ([subtitle(report)] if report is not None else []) + ([settings] if settings else [])
    return " · ".join(parts)


_PHASE_PARTS = (("weights", "weights"), ("buffers", "buffers"), ("optimizer", "optimizer state"),
                ("master_weights", "master weights"), ("kv_cache", "KV cache"))


def _held(memory: dict, key: str) -> int:
    part = memory.get(key)
    return int(part["bytes"]) if isinstance(part, dict) and part.get("bytes") else 0


def _phase_bars(memory: dict) -> dict:
    """Per phase, the bytes held: the state that persists (weights, buffers, optimizer, KV cache) and what the
    phase adds (the rest of its figure). Each bar is exactly the phase's figure."""
    if memory["mode"] == "training":
        phases = memory.get("phases") or []
        moments = [(p["moment"], int(p["bytes"]), p.get("arithmetic", "")) for p in phases]
        gradients = [int(p.get("gradients") or 0) for p in phases]
        rest = "activations and temporaries"
    else:
        moments = [("peak (" + memory["peak"]["phase"] + ")", int(memory["peak"]["bytes"]),
                    (memory.get("activations") or {}).get("arithmetic", ""))]
        gradients = [0]
        rest = "activations and workspace"
    names = [m[0] for m in moments]
    traces = []
    persistent = {label: _held(memory, key) for key, label in _PHASE_PARTS}
    for label, value in persistent.items():
        if value:
            traces.append(_bar(label, names, [value] * len(moments), [""] * len(moments)))
    if any(gradients):
        traces.append(_bar("gradients", names, gradients, [""] * len(moments)))
    held = sum(persistent.values())
    traces.append(_bar(rest, names, [total - held - g for (_, total, _), g in zip(moments, gradients)],
                       [a for _, _, a in moments]))
    layout = {"barmode": "stack", "height": 380, "margin": {"t": 40, "l": 10, "r": 10, "b": 60},
              "yaxis": {"title": {"text": "bytes"}, "tickformat": ".3s", "automargin": True},
              "font": FONT, "legend": LEGEND_ABOVE}
    return {"data": traces, "layout": layout}


def _bar(label: str, names: list[str], values: list[int], notes: list[str]) -> dict:
    return {"type": "bar", "name": label, "x": names, "y": values, "marker": {"color": PART_COLORS.get(label)},
            "customdata": [f"{exact(v)} B ({bytes_text(v)})" + (f"<br>{escape(n)}" if n else "") for v, n in
                           zip(values, notes)],
            "hovertemplate": f"<b>{escape(label)}</b><br>%{{customdata}}<extra>%{{x}}</extra>"}


# --- a multi-GPU layout: one device's peak by part, each pipeline stage's, the rules -------------------------------

_NOT_HELD = ("end of backward", "optimizer step")  # moments after the backward has freed what the forward saved
_STATE_PARTS = (("weights", "weights"), ("optimizer", "optimizer state"), ("master_weights", "master weights"),
                ("buffers", "buffers"))
_SAVED = "activations saved"
_REST = "the rest of the moment"


def _peak_parts(peak: int, resident: list[tuple[str, int, str]], gradients: int, comm: list[tuple[str, int, str]],
                saved: int, saved_how: str, moment: str, rest_how: str, *, grads_known: bool = True
                ) -> list[tuple[str, int, str]]:
    """A peak as (part, bytes, arithmetic) parts that add up to it exactly: the resident states, the gradients the
    moment holds, the communication buffers it holds, what the forward saved (when the moment still holds it: not
    at the end of backward or the optimizer step, and no more than is left), and the rest of the moment's figure
    (the loss's and logits' temporaries, the gradient arriving from the next stage). `grads_known` False: whether
    the moment holds the gradients is not recorded; they go with the rest, named so."""
    held = sum(value for _, value, _ in resident) + sum(value for _, value, _ in comm)
    grads = gradients if grads_known else 0
    left = peak - held - grads
    saved_here = saved if moment not in _NOT_HELD and 0 <= saved <= left else 0
    parts = list(resident) + [("gradients", grads, "the gradients held at this moment")] + list(comm)
    parts.append((_SAVED, saved_here, saved_how if saved_here else
                  f"none held at this moment ({moment}): the backward has freed them"))
    rest = left - saved_here
    parts.append((_REST if grads_known else "gradients and the rest of the moment", rest, rest_how))
    assert sum(value for _, value, _ in parts) == peak
    return parts


def _one_device_parts(memory: dict) -> tuple[dict, list[tuple[str, int, str]]]:
    """The one-device step's largest moment, by part (as the phase bars cut it)."""
    top = max(memory["phases"], key=lambda p: p["bytes"])
    resident = [(label, _held(memory, key), (memory.get(key) or {}).get("arithmetic", "")) for key, label in
                _STATE_PARTS]
    act = memory.get("activations") or {}
    return top, _peak_parts(int(top["bytes"]), resident, int(top.get("gradients") or 0), [],
                            int(act.get("bytes") or 0), act.get("arithmetic", ""), top["moment"],
                            f"{top['moment']}: {top.get('arithmetic', '')}")


def device_parts(memory: dict) -> list[tuple[str, int, str]]:
    """One device's peak under the layout, by part; the parts add up to the device's peak exactly. A communication
    buffer is a part where the peak moment holds it (its figure names it)."""
    device = memory["layout"]["device"]
    top = next(p for p in device["phases"] if p["bytes"] == device["peak"]["bytes"]
               and p["moment"] == device["peak"]["moment"])
    how = device["states_arithmetic"]
    resident = [(label, int(device[key]), how if key != "buffers" else "the model's own buffers, whole on "
                 "every device") for key, label in _STATE_PARTS]
    comm = [(b["name"], int(b["bytes"]), b["arithmetic"]) for b in device["communication"]
            if top["phase"] in b["moments"] and f"{b['name']} {b['bytes']:,}" in top["arithmetic"]]
    return _peak_parts(int(top["bytes"]), resident, int(top["gradients"]), comm, int(device["activations"]),
                       device["activations_from"], top["moment"], f"{top['moment']}: {top['arithmetic']}")


def stage_parts(memory: dict, stage: dict) -> list[tuple[str, int, str]]:
    """A pipeline stage's peak by part; the parts add up to the stage's peak exactly. A stage records its peak's
    phase, not its moment: every moment of a stage holds its gradients but the last stage's forward and start of
    backward with a single microbatch; there, a backward peak is read from the device's own moments where the stage
    is the device's, and otherwise its gradients go with the rest, named so."""
    layout, device = memory["layout"], memory["layout"]["device"]
    buffers = int(device["buffers"])
    resident = [(label, int(stage[key]) if key != "buffers" else buffers, "") for key, label in _STATE_PARTS]
    phase = stage["peak_phase"]
    moment, gradients = phase, int(stage["gradients"])
    known = not (stage["last"] and layout["micro_batches"] == 1 and phase == "backward")
    if stage["last"] and layout["micro_batches"] == 1 and phase == "forward":
        gradients = 0  # a single microbatch: no gradient exists before its backward
    if not known:  # the device's stage: its own moments are the device's, less the buffers they hold
        for figure_ in device["phases"]:
            held = sum(b["bytes"] for b in device["communication"] if f"{b['name']} {b['bytes']:,}"
                       in figure_["arithmetic"])
            if figure_["phase"] == phase and figure_["bytes"] - held == stage["peak"]:
                moment, gradients, known = figure_["moment"], int(figure_["gradients"]), True
                break
    return _peak_parts(int(stage["peak"]), resident, gradients, [], int(stage["activations"]),
                       f"{stage['in_flight']} microbatch{'es' if stage['in_flight'] > 1 else ''} in flight × the "
                       "stage's layers" + (" + the embedding output" if stage["first"] else ""), moment,
                       f"the rest of the stage's peak ({phase})" + (": the gradient arriving from the next stage"
                                                                    if not stage["last"] else
                                                                    ": the loss's and logits' temporaries"),
                       grads_known=known)


def _device_bars(memory: dict) -> dict:
    """One device's peak under the layout by part, beside the one-device step's at one scale (the saving shows);
    below, the device's bar again at its own scale (its parts show)."""
    layout = memory["layout"]
    top, alone = _one_device_parts(memory)
    peak, one = layout["device"]["peak"], int(top["bytes"])
    return versus_bars(
        (f"one device, no layout ({top['moment']})", alone, f"{bytes_text(one)}: the step on one device"),
        (f"each of {layout['devices']:,} devices ({peak['moment']})", device_parts(memory),
         f"{bytes_text(peak['bytes'])} per device: {peak['bytes'] / one * 100:.1f}% of one device's"),
        f"each device, at its own scale ({peak['moment']})", "bytes at the step's largest moment")


def _stage_bars(memory: dict) -> dict:
    """Each pipeline stage's peak by part; the worst stage marked."""
    stages = memory["layout"]["device"]["stages"]
    return stage_bars(stages, [stage_parts(memory, s) for s in stages], "bytes at the stage's largest moment")


def _stages_words(layout: dict) -> str:
    device = layout["device"]
    v, m, pp = layout["virtual_stages"], layout["micro_batches"], layout["pp"]
    return (f'<p id="pipeline" data-bubble="{device["bubble"]!r}">{escape(device["pipeline"])}. Bubble '
            f"<b>{100 * device['bubble']:.1f}%</b> of the step: (pp − 1) / (v·m + pp − 1) = {pp - 1} / "
            f"({v}·{m} + {pp - 1}) = {pp - 1} / {v * m + pp - 1}.</p>")


def _stages_table(memory: dict) -> str:
    device = memory["layout"]["device"]
    stages = device["stages"]
    worst = max(stages, key=lambda s: s["peak"])
    note = ""
    if worst["peak"] != device["peak"]["bytes"]:
        note = (f'<p class="dim">The worst stage\'s figure, {exact(worst["peak"])} B, leaves out the communication '
                f"buffers the device's figure, {exact(device['peak']['bytes'])} B, adds at its peak moment.</p>")
    columns = tuple((c.replace("_", " "), c) for c in ("weights", "gradients", "optimizer", "master_weights",
                                                         "activations", "peak"))
    return stages_table(stages, (("count", "layer_count"), ("in flight", "in_flight")), columns,
                        (("peak in", "peak_phase"),),
                        "Each stage's device (rank 0 of its tensor and data-parallel groups); the worst in bold. "
                        "Exact bytes in each cell's tooltip.") + note


def _device_table(memory: dict) -> str:
    """One device's figures as the text's table: each part exact, with its arithmetic; the peak and its moment."""
    layout = memory["layout"]
    device = layout["device"]
    rows = [("weights", device["weights"], ""), ("gradients", device["gradients"], ""),
            ("optimizer state", device["optimizer"], ""), ("master weights", device["master_weights"], ""),
            ("buffers", device["buffers"], ""),
            (_SAVED, device["activations"], device["activations_from"])]
    rows += [(b["name"], b["bytes"], f"{b['arithmetic']}; held at the {' and '.join(b['moments'])} moments")
             for b in device["communication"]]
    peak = device["peak"]
    rows.append((f"peak ({peak['phase']})", peak["bytes"], f"{peak['moment']}: {peak['arithmetic']}"))
    body = "".join(f'<tr><th>{escape(label)}</th><td class="num" data-value="{value}">{exact(value)} B</td>'
                   f'<td class="num dim">{bytes_text(value)}</td><td class="dim">{escape(how)}</td></tr>'
                   for label, value, how in rows)
    return (f'<table class="totals" id="device" data-peak="{peak["bytes"]}"><caption class="dim">'
            f"{escape(device['shown'])}: {escape(layout['words'])}; {escape(device['states_arithmetic'])}</caption>"
            f"{body}</table>")


def _rules_table(device: dict) -> str:
    return rules_table(device["rules"], "Each role's tensor- and expert-parallel cut, read from its role "
                                        "(transformers' tp plans agree)")


def _memory_totals(memory: dict) -> str:
    rows = [(label, _held(memory, key)) for key, label in (("weights", "weights"), ("buffers", "buffers"),
                                                            ("gradients", "gradients"),
                                                            ("optimizer", "optimizer state"),
                                                            ("master_weights", "master weights"),
                                                            ("kv_cache", "KV cache"),
                                                            ("activations", "activations"))]
    rows = [(label, value) for label, value in rows if value]
    if serving_layout(memory) is not None:  # the rows above are the whole model's; the peak is one GPU's
        rows.append(("peak, the model on one GPU (the sum above)", sum(value for _, value in rows)))
        rows.append(("peak per GPU", int(memory["peak"]["bytes"])))
        rows.append(("peak per GPU + reserve", int(memory["peak"]["bytes"]) + int(memory.get("reserve") or 0)))
    elif training_layout(memory) is not None or memory.get("per_device"):
        # the rows above are the step on one device; the peak the fits table and the answer read is one device's
        # share (the text's "peak per device")
        rows.append(("peak, one device alone", max(int(p["bytes"]) for p in memory["phases"])))
        rows.append(("peak per device", int(memory["peak"]["bytes"])))
        rows.append(("peak per device + reserve", int(memory["peak"]["bytes"]) + int(memory.get("reserve") or 0)))
    else:
        rows.append(("peak", int(memory["peak"]["bytes"])))
        rows.append(("peak + reserve", int(memory["peak"]["bytes"]) + int(memory.get("reserve") or 0)))
    body = "".join(f'<tr><th>{escape(label)}</th><td class="num" data-value="{value}">{exact(value)} B</td>'
                   f'<td class="num dim">{bytes_text(value)}</td></tr>' for label, value in rows)
    return f'<table class="totals" id="memory" data-peak="{memory["peak"]["bytes"]}">{body}</table>'


def _fits_table(memory: dict) -> str:
    caption = ""
    if serving_layout(memory) is not None:
        settings = memory["settings"]
        caption = (f'<caption class="dim" id="fits-caption">Per GPU ({escape(memory["layout"]["words"])}): each row '
                   f"compares one GPU's peak, {bytes_text(memory['peak']['bytes'])}, plus the reserve with the "
                   f"accelerator's memory; the largest batch (at {settings['seq']:,} tokens) and the largest context "
                   f"(at a batch of {settings['batch']:,}) are those every GPU of the layout holds.</caption>")
    elif training_layout(memory) is not None or memory.get("per_device"):
        settings = memory["settings"]
        what = (memory["layout"]["words"] if training_layout(memory) is not None else
                f"ZeRO-{settings['zero']} over {settings['devices']:,} devices")
        caption = (f'<caption class="dim" id="fits-caption">Per device ({escape(what)}): each row compares one '
                   f"device's peak, {bytes_text(memory['peak']['bytes'])}, plus the reserve with the accelerator's "
                   f"memory; the largest batch is each data-parallel replica's (sequences a step, at "
                   f"{settings['seq']:,} tokens), the largest context at its batch of {settings['batch']:,}."
                   "</caption>")
    head = "<tr><th>accelerator</th><th>memory</th><th>fits</th><th>free</th><th>largest batch</th>" \
           "<th>largest context</th></tr>"
    rows = "".join(
        f'<tr><td>{escape(f["accelerator"])}</td><td class="num">{bytes_text(f["memory"])}</td>'
        f'<td>{"yes" if f["fits"] else "no"}</td><td class="num">{bytes_text(f["free"])}</td>'
        f'<td class="num">{"—" if f["largest_batch"] is None else exact(f["largest_batch"])}</td>'
        f'<td class="num">{"—" if f.get("largest_context") is None else exact(f["largest_context"])}</td></tr>'
        for f in memory.get("fits") or [])
    return f'<div class="scroll"><table class="fits">{caption}{head}{rows}</table></div>' if rows else \
        '<p class="dim">No accelerator table for these settings.</p>'


def _flop_totals(estimate, compute) -> str:
    rows = [("forward", estimate.forward, "model FLOPs of one forward: 2 per multiply-add"),
            ("of which attention scores", estimate.attention, f"QKᵀ and AV, convention {estimate.causal}")]
    if estimate.backward is not None:
        rows.append(("backward", estimate.backward, "model FLOPs, about 2 × forward"))
        rows.append(("training step", estimate.step, "forward + backward"))
    if estimate.recompute:
        rows.append(("recompute", estimate.recompute, f"hardware FLOPs beyond the model's: {RERUN_WORDS}"))
    if compute is not None:
        rows.append(("per token, forward", compute.per_token_forward, ""))
    if compute is not None and compute.total is not None:
        rows.append((f"for {exact(compute.tokens)} tokens", compute.total, "model FLOPs"))
    body = "".join(f'<tr><th>{escape(label)}</th><td class="num" data-value="{value}">{exact(value)}</td>'
                   f'<td class="num dim">{value:.3e}</td><td class="dim">{escape(note)}</td></tr>'
                   for label, value, note in rows)
    extra = ""
    if compute is not None and compute.mfu is not None:
        extra += (f"<p>MFU {compute.mfu * 100:.1f}% of {escape(compute.accelerator)}'s peak "
                  f"({escape(compute.peak_from)}).</p>")
    return f'<table class="totals" id="flops" data-forward="{estimate.forward}">{body}</table>{extra}'


def _flop_bars(estimate) -> dict:
    terms = sorted(estimate.terms, key=lambda t: t.flops)
    return role_bars(terms, [f"{exact(t.flops)} FLOPs ({t.flops / estimate.forward * 100:.2f}%)<br>"
                             f"{escape(t.arithmetic)}" for t in terms], "forward FLOPs")


def _flop_curve(estimate) -> dict:
    seqs = [p[0] for p in estimate.by_context]
    line = lambda name, values, color: {  # noqa: E731
        "type": "scatter", "mode": "lines+markers", "name": name, "x": seqs, "y": values,
        "line": {"color": color}, "customdata": [exact(v) for v in values],
        "hovertemplate": f"{name}<br>%{{x:,}} tokens: %{{customdata}} FLOPs<extra></extra>"}
    traces = [line("forward", [p[1] for p in estimate.by_context], "#4e79a7"),
              line("attention scores (∝ S²)", [p[2] for p in estimate.by_context], "#e15759"),
              line("the rest (∝ S)", [p[1] - p[2] for p in estimate.by_context], "#59a14f")]
    layout = {"height": 420, "margin": {"t": 40, "l": 10, "r": 10, "b": 50},
              "xaxis": {"title": {"text": f"context length (tokens), batch {estimate.batch}"}, "type": "log"},
              "yaxis": {"title": {"text": "forward FLOPs"}, "type": "log", "tickformat": ".2s", "automargin": True},
              "legend": LEGEND_ABOVE, "font": FONT}
    return {"data": traces, "layout": layout}


def render_plans_html(report: Report, rows, planned: list[Report], *, fragment: bool = False) -> str:
    """plan --compare: each plan's counts, training memory, step FLOPs and --gpu/--budget answer side by side, every
    setting the figures depend on (one cell where the plans agree), and each model-with-plan's treemap at one scale
    with its frozen parts pale. `rows` are (name, Plan, MemoryEstimate, FLOPs) as the CLI makes them."""
    from ..memory import budget_sentence, memory_to_dict
    from ..plan import plan_settings_rows

    memories = [memory_to_dict(estimate) for _, _, estimate, _ in rows]
    budgets = [memory.get("budget") for memory in memories]
    on = next((b for b in budgets if b is not None), None)
    where = None if on is None else (f"{bytes_text(on['memory'])} budget" if on["accelerator"] == "budget"
                                     else on["accelerator"])
    head = ("<tr><th>plan</th><th>trainable</th><th>total</th><th>share</th><th>peak</th><th>memory engine</th>"
            "<th>FLOPs per token</th>" + (f"<th>on {escape(where)}</th>" if where else "")
            + "<th>fits on</th></tr>")
    body = ""
    for (name, plan, estimate, flops), memory, budget in zip(rows, memories, budgets):
        fits = sum(1 for fit in memory.get("fits") or [] if fit["fits"])
        tokens = memory["settings"]["batch"] * memory["settings"]["seq"]
        per_token = None if flops is None else (flops.forward + flops.model_backward) // tokens
        answer = ""
        if where:
            answer = ("<td>—</td>" if budget is None else
                      f'<td data-fits="{str(budget["fits"]).lower()}" '
                      f'data-largest-batch="{"" if budget["largest_batch"] is None else budget["largest_batch"]}">'
                      + ("fits, largest batch " + ("—" if budget["largest_batch"] is None else
                                                    exact(budget["largest_batch"]))
                         if budget["fits"] else f"does not fit (short by {bytes_text(-budget['free'])})")
                      + "</td>")
        body += (f'<tr data-plan="{escape(name)}"><th>{escape(name)}</th>'
                 f'<td class="num" data-value="{plan.trainable}">{exact(plan.trainable)}</td>'
                 f'<td class="num">{exact(plan.total)}</td>'
                 f'<td class="num">{plan.trainable / plan.total * 100 if plan.total else 0:.4f}%</td>'
                 f'<td class="num" data-value="{estimate.peak}">{bytes_text(estimate.peak)}</td>'
                 f'<td>{escape(estimate.engine)}</td>'
                 + ('<td class="num">—</td>' if per_token is None else
                    f'<td class="num" data-value="{per_token}">{exact(per_token)}</td>')
                 + answer + f'<td class="num">{fits} of {len(memory.get("fits") or [])} accelerators</td></tr>')
    answers = "".join(f'<li data-plan="{escape(name)}"><b>{escape(name)}</b>: '
                      f'{escape(budget_sentence(budget, memory["settings"]))}</li>'
                      for (name, *_), memory, budget in zip(rows, memories, budgets) if budget is not None)
    names = [name for name, *_ in rows]
    traces = [_bar(label, names, [_held(memory, key) for memory in memories], [""] * len(rows))
              for key, label in (("weights", "weights"), ("gradients", "gradients"),
                                 ("optimizer", "optimizer state"), ("activations", "activations"))]
    layout = {"barmode": "group", "height": 380, "margin": {"t": 40, "l": 10, "r": 10, "b": 40},
              "yaxis": {"title": {"text": "bytes"}, "tickformat": ".3s", "automargin": True},
              "legend": LEGEND_ABOVE, "font": FONT}
    largest = max(r.total for r in planned)
    cells = [small_multiple(name, "", module_treemap(model, TRAINABLE), f"treemap-{index}", total=model.total,
                            largest=largest, side=420, least=160, depth=4)
             for index, ((name, *_), model) in enumerate(zip(rows, planned))]
    settings = [plan_settings_rows(plan, memory, estimate) for (_, plan, estimate, _), memory in zip(rows, memories)]
    sections = [
        Section("Plans", f'<div class="scroll"><table class="compare" id="plans">{head}{body}</table></div>'
                         + (f'<ul id="budget">{answers}</ul>' if answers else "")
                         + '<p class="dim">FLOPs per token: the training step, forward + backward (model FLOPs, '
                           "traced), over batch × sequence tokens.</p>"),
        Section("Settings", _settings_by_plan(names, settings)),
        Section("Training memory by part", figure({"data": traces, "layout": layout}, "bars-plans")),
        Section("What trains in each", '<p class="dim">Frozen parts pale; area ∝ parameters.</p>'
                                       f'<div class="multiples">{"".join(cells)}</div>'),
    ]
    notes: dict[str, list[str]] = {}  # a note the plans share is said once, naming them
    for name, _, estimate, _ in rows:
        for note in estimate.notes:
            notes.setdefault(note, []).append(name)
    if notes:
        sections.append(notes_section([note if len(who) == len(rows) else f"{', '.join(who)}: {note}"
                                       for note, who in notes.items()]))
    first = memories[0]["settings"]
    shared = (f"{first['precision']}, {first['optimizer']} · batch {first['batch']:,} × {first['seq']:,} tokens"
              + (f" · on {where}" if where else ""))
    return html_page(_titled(report, "fine-tuning plans compared"), _subtitled(report, shared), sections, fragment)


def _settings_by_plan(names: list[str], settings: list[list[tuple[str, str]]]) -> str:
    """One row per setting, a column per plan; where every plan has the same words, one cell across them."""
    order: list[str] = []  # every plan's rows in its order; a row the plans before lacked goes before its next one
    by_plan = [dict(rows) for rows in settings]
    for rows in settings:
        names_here = [name for name, _ in rows]
        for index, name in enumerate(names_here):
            if name not in order:
                after = next((n for n in names_here[index + 1:] if n in order), None)
                order.insert(len(order) if after is None else order.index(after), name)
    head = "<tr><th>setting</th>" + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>"
    body = ""
    for setting in order:
        values = [plan.get(setting, "—") for plan in by_plan]
        if len(set(values)) == 1:
            cells = f'<td colspan="{len(names)}">{escape(values[0])}</td>'
        else:
            cells = "".join(f"<td>{escape(value)}</td>" for value in values)
        body += f'<tr data-setting="{escape(setting)}"><th>{escape(setting)}</th>{cells}</tr>'
    return f'<div class="scroll"><table class="compare" id="settings">{head}{body}</table></div>'


# Results displayed alone (a notebook, `.to_html()`), by type name (display.PAGES): with the report (and the
# compute) `estimate_memory`, `estimate_training` and `estimate_flops` keep on them, the CLI's page; the plan's
# report is the planned module's own.
def memory_page(estimate, fragment: bool) -> str:
    return render_memory_html(estimate.report, estimate, fragment=fragment)


def flops_page(estimate, fragment: bool) -> str:
    return render_flops_html(estimate.report, estimate, estimate.compute, fragment=fragment)


def plan_page(plan, fragment: bool) -> str:
    from ...api import inspect
    from ...plan import counted_module

    return render_plan_html(None, plan, None if plan.module is None else inspect(counted_module(plan)),
                            fragment=fragment)
