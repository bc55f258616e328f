"""`paramscope plan`: a Plan (and its training memory) → text (rich, at a width) and → the JSON "plan" object."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ..cost.dtypes import short_name
from ..explain import exact
from ._console import indented, to_text
from .text import module_tree
from .memory import binary, memory_to_dict


def render_plan_text(report, plan, estimate, width: int = 100, *, color: bool = False, flops=None, planned=None,
                     depth: int = 3) -> str:
    """`planned`: the report of the planned module (api.inspect(plan.module)); with it, the module tree says what
    of each module trains."""
    return to_text(plan_parts(report, plan, estimate, flops, planned, depth), width, color)


def _share(part: int, total: int) -> str:
    return f"{100 * part / total:.4g}%" if total else "—"


def plan_parts(report, plan, estimate, flops=None, planned=None, depth: int = 3) -> list:
    lines: list = [Text(f"Fine-tuning plan for {report.model.label} ({report.model.class_name}): {plan.method}",
                        style="bold"), indented(f"engine: {engine_words(plan, estimate)}")]
    if plan.rules:
        first = plan.rules[0]
        start = "everything else starts frozen" if first.action == "train" else "everything else starts trainable"
        for index, rule in enumerate(plan.rules):
            tensors = "tensor" if rule.tensors == 1 else "tensors"
            lines.append(indented(f"rule {index + 1}: {rule.action} {rule.pattern} → {rule.tensors} {tensors}, "
                                  f"{exact(rule.parameters)} parameters" + (f" ({start})" if index == 0 else "")))
    if plan.targets:
        lines.append(indented(f"adapters on: {', '.join(plan.targets)} (as PEFT resolved them); "
                              f"{adapter_dtype_words(plan)}"))
    if plan.storage:
        lines.append(indented(storage_line(plan)))
    lines.append(indented(f"trainable {exact(plan.trainable)} of {exact(plan.total)} ({_share(plan.trainable, plan.total)})"
                          f"; frozen {exact(plan.frozen)}; adapter parameters {exact(plan.adapter)}"
                          + ("; total includes the adapters, as PEFT counts" if plan.adapter else "")))
    if plan.peft_counts is not None:
        same = plan.peft_counts == (plan.trainable, plan.total)
        lines.append(indented(f"PEFT's get_nb_trainable_parameters(): {exact(plan.peft_counts[0])} of "
                              f"{exact(plan.peft_counts[1])}" + (" (the same)" if same else " (differs!)")))
    lines += [Text(""), _roles_table(plan)]
    if planned is not None:
        # PEFT wraps the model twice (PeftModel → LoraModel → the model): the tree starts at the model
        root = "base_model.model" if plan.peft_counts is not None else ""
        lines += [Text(""), Text("What trains, by module", style="bold"), module_tree(planned, depth, root=root)]
    if estimate is not None:
        lines += [Text(""), _memory_table(estimate)]
    if flops is not None:
        tokens = estimate.settings["batch"] * estimate.settings["seq"]
        step = flops.forward + flops.model_backward
        lines.append(indented(f"FLOPs (traced): forward {exact(flops.forward)}, backward {exact(flops.model_backward)} "
                              f"(model FLOPs; {flops.model_backward / flops.forward:.3f} × forward), step per token "
                              f"{exact(step // tokens)}"))
        for note in estimate.notes:
            lines.append(indented(f"note: {note}"))
    return lines


def engine_words(plan, estimate=None) -> str:
    """What counted the plan: PEFT on the meta build, or the template and PEFT's arithmetic
    (plan_arithmetic.plan_counts), with the memory and FLOPs an earlier run kept under the plan's key."""
    adapters = plan.peft_counts is not None
    if plan.engine == "arithmetic":
        counts = "counts from the template and PEFT's arithmetic (no build)" if adapters else \
            "counts from the template (no build)"
        return counts + ("; memory and FLOPs as an earlier run of this plan derived and traced them (the cache)"
                         if estimate is not None else "")
    return "counts from the meta build, adapters applied by PEFT" if adapters else "counts from the meta build"


def storage_line(plan) -> str:
    how = "double quantisation" if plan.storage == "nf4-dq" else "fp32 absmax per 64"
    return (f"base: {len(plan.quantized):,} frozen nn.Linear weights stored {plan.storage} by bitsandbytes "
            f"(4-bit, {how}; dequantised to bf16 per matmul), as transformers' quantiser chooses them; every "
            "other base weight follows --precision")


def adapter_dtype_words(plan) -> str:
    if plan.adapter_dtype is None:
        return "stored in --precision's weights dtype (fp32 under mixed precision, as PEFT makes them)"
    why = "QLoRA's recipe" if plan.storage else "--adapter-dtype"
    return f"stored in {short_name(plan.adapter_dtype)} under any --precision ({why})"


def plan_settings_rows(plan, memory: dict[str, Any] | None, estimate=None) -> list[tuple[str, str]]:
    """Every setting a plan's figures depend on, as (setting, words) for its page: the plan itself (method, rules,
    adapters and their dtype, the base's storage and dtype, what counted it), then the training memory's settings
    (render.memory.settings_rows, the memory page's), the frozen row in the plan's terms. `memory` None (counts
    only, --no-memory): the plan's rows alone."""
    from .memory import settings_rows

    rows = [("plan", plan.method + (f" ({plan.storage})" if plan.storage else ""))]
    if plan.rules:
        rows.append(("rules", "; ".join(f"{r.action} {r.pattern} → {r.tensors:,} "
                                        f"{'tensor' if r.tensors == 1 else 'tensors'}, {exact(r.parameters)} parameters"
                                        for r in plan.rules)))
    if plan.targets:
        rows += [("adapters on", f"{', '.join(plan.targets)} (as PEFT resolved them)"),
                 ("adapter dtype", adapter_dtype_words(plan))]
    if plan.storage:
        rows.append(("base storage", storage_line(plan)))
    if memory is not None and memory["settings"].get("base_dtype"):  # LoRA/DoRA: the frozen base's, and why
        dtype = memory["settings"]["base_dtype"]
        source = (memory["settings"].get("base_dtype_from") or "").removeprefix(dtype + ": ")
        rows.append(("base dtype", short_name(dtype) + (f" ({source})" if source else "")))
    rows.append(("counts", engine_words(plan, estimate)))
    if memory is None:
        return rows
    frozen = (f"{exact(plan.frozen)} parameters, by the plan (no gradient, no optimizer state); "
              f"{exact(plan.trainable)} train" if plan.frozen else f"nothing; {exact(plan.trainable)} parameters train")
    return rows + [(name, frozen if name == "frozen" else value) for name, value in settings_rows(memory)]


def render_plan_compare_text(report, rows, width: int = 100, *, color: bool = False) -> str:
    """Plans side by side: [(name, Plan, MemoryEstimate, FLOPs)]."""
    first = rows[0][2]
    settings = first.settings
    budget = any(estimate.budget is not None for _, _, estimate, _ in rows)
    on = f"; largest batch on {first.budget.accelerator.name}" if budget else ""
    table = Table(title=f"Fine-tuning plans for {report.model.label} ({report.model.class_name})",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  caption=f"{settings['precision']}, {settings['optimizer']}, batch {settings['batch']:,} × "
                          f"{settings['seq']:,} tokens; FLOPs per token of the step: forward + backward (model "
                          f"FLOPs, traced){on}",
                  caption_justify="left")
    # numbers are never cut: the binary size goes first when the width is short
    wide = width is None or width >= 118
    engine = width is None or width >= 90  # below, each plan's engine is named under the table
    for name, justify in (("plan", "left"), ("trainable", "right"), ("share", "right"), ("peak bytes", "right"),
                          *((("", "right"),) if wide else ()), *((("engine", "left"),) if engine else ()),
                          ("FLOPs/token", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    if budget:
        table.add_column("batch", justify="right", no_wrap=True)
    for name, plan, estimate, flops in rows:
        tokens = estimate.settings["batch"] * estimate.settings["seq"]
        cells = [f"{name} ({plan.method})" if plan.method != name else name, exact(plan.trainable),
                 _share(plan.trainable, plan.total), exact(estimate.peak),
                 *((binary(estimate.peak),) if wide else ()), *((estimate.engine,) if engine else ()),
                 exact((flops.forward + flops.model_backward) // tokens)]
        if budget:
            fit = estimate.budget
            cells.append("none" if not fit.fits else exact(fit.largest_batch) if fit.largest_batch else "—")
        table.add_row(*cells)
    lines: list = [table]
    if not engine:
        lines.append(indented("memory engines: " + ", ".join(f"{name} {estimate.engine}"
                                                              for name, _, estimate, _ in rows)))
    for name, plan, _, _ in rows:
        if plan.rules:
            lines.append(indented(f"{name}: " + "; ".join(f"{r.action} {r.pattern}" for r in plan.rules)))
        if plan.targets:
            lines.append(indented(f"{name}: adapters on {', '.join(plan.targets)}, {adapter_dtype_words(plan)}"))
        if plan.storage:
            lines.append(indented(f"{name}: {storage_line(plan)}"))
    return to_text(lines, width, color)


def compare_plans_to_dict(rows) -> list[dict[str, Any]]:
    return [dict(name=name, **plan_to_dict(plan, estimate, flops)) for name, plan, estimate, flops in rows]


def _roles_table(plan) -> Table:
    table = Table(title="By role", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role", no_wrap=True)
    table.add_column("trainable", justify="right", no_wrap=True)
    table.add_column("frozen", justify="right", no_wrap=True)
    for role, (trainable, frozen) in plan.by_role.items():
        table.add_row(role, exact(trainable), exact(frozen), style="bold" if trainable else None)
    table.add_row("total", exact(plan.trainable), exact(plan.frozen), style="bold")
    return table


def _memory_table(estimate) -> Table:
    settings, detail = estimate.settings, estimate.training
    table = Table(title=f"Training memory ({estimate.engine} engine)", title_justify="left",
                  caption=f"{settings['precision']}, {settings['optimizer']}, batch {settings['batch']:,} × "
                          f"{settings['seq']:,} tokens; details: paramscope memory --training",
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    states = detail.states
    rows = [("weights", states.weights.bytes)]
    if estimate.weights.overhead and estimate.weights.quantized:  # QLoRA: the 4-bit base's absmax and code books
        rows.append(("quantization scales", estimate.weights.overhead))
    rows += [("gradients", states.gradients.bytes), ("optimizer states", states.optimizer.bytes),
             ("activations saved", estimate.activations.bytes)]
    for label, value in rows:
        table.add_row(label, exact(value), binary(value))
    table.add_row(f"peak ({estimate.peak_phase})", exact(estimate.peak), binary(estimate.peak), style="bold")
    if estimate.budget is not None:
        fit = estimate.budget
        table.add_row(f"on {fit.accelerator.name}", "fits" if fit.fits else "does not fit",
                      f"largest batch {fit.largest_batch if fit.largest_batch is not None else '—'}")
    return table


def plan_to_dict(plan, estimate, flops=None) -> dict[str, Any]:
    return {
        "engine": plan.engine,
        "method": plan.method,
        "rules": [{"action": r.action, "pattern": r.pattern, "tensors": r.tensors, "parameters": r.parameters}
                  for r in plan.rules],
        "targets": list(plan.targets),
        "storage": None if plan.storage is None else {"format": plan.storage, "quantized": list(plan.quantized)},
        "adapter_dtype": plan.adapter_dtype,
        "trainable": plan.trainable,
        "frozen": plan.frozen,
        "adapter": plan.adapter,
        "total": plan.total,
        "by_role": {role: {"trainable": t, "frozen": f} for role, (t, f) in plan.by_role.items()},
        "peft_counts": None if plan.peft_counts is None else {"trainable": plan.peft_counts[0],
                                                             "total": plan.peft_counts[1]},
        "memory": None if estimate is None else memory_to_dict(estimate),
        "flops": None if flops is None else {
            "engine": "traced", "forward": flops.forward, "backward": flops.model_backward,
            "step": flops.forward + flops.model_backward, "recompute": flops.recompute},
    }
