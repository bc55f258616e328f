"""`paramscope memory --training`'s text: the header, the step's totals and moments, activations by module, the
per-device shares under --devices/--zero, then the layout's tables (memory_layout), the fits and the conventions. Pure
functions of their data."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from ..explain import exact
from ._console import indented, model_source_line
from .memory_cells import binary
from .memory_fits import budget_line, fits_table
from .memory_layout import device_table, rules_table, stages_table
from .memory_settings import PRECISIONS


def training_parts(report, estimate) -> list:
    settings, detail = estimate.settings, estimate.training
    states = detail.states
    title = Text(f"Memory to train {report.model.label} ({report.model.class_name}): {estimate.engine} engine, "
                 "allocator level", style="bold")
    seq_from = "" if settings["seq_from"] == "--seq" else " (default for training)"
    policy = (settings.get("layout") or {}).get("fsdp_mixed_precision") == "policy"
    described = (f"fp32 weights sharded, gathered as {settings['precision'][:4]} by FSDP2's MixedPrecisionPolicy, no "
                 "autocast") if policy else PRECISIONS[settings['precision']]
    step = (f"{settings['precision']} ({described}); {settings['optimizer']}"
            + (" (fused)" if settings["optimizer"] in ("adamw", "adam") else ""))
    shape = (f"batch {settings['batch']:,} × {settings['seq']:,} tokens{seq_from}; attention "
             f"{settings['attention']}; gradient checkpointing {settings['grad_checkpointing']}")
    lines = [title, *filter(None, [model_source_line(report.model)]), indented(step), indented(shape)]
    if detail.device is not None:  # the whole-model tables are the one-device step's (torch.autocast when mixed)
        alone = settings["precision"] + (", torch.autocast" if settings["precision"].endswith("-mixed") else "")
        lines.append(indented(f"across GPUs: {detail.device.layout.words()}; the model's figures on one device "
                              f"({alone}) first, then one device's under the layout"))
    if detail.frozen:
        tensors = "tensor" if len(detail.frozen) == 1 else "tensors"
        towers = settings.get("idle_towers") or []
        named = "; ".join(filter(None, [", ".join(settings["freeze"]),
                                        f"{', '.join(towers)}: not run by a text input" if towers else ""])) \
            or "requires_grad False in the class"
        lines.append(indented(f"frozen: {exact(states.frozen)} parameters in {len(detail.frozen)} {tensors} "
                              f"({named}); {exact(states.trainable)} train"))
    lines += [Text(""), _training_totals(estimate), Text(""), _phases_table(estimate)]
    if detail.traced is not None and detail.traced.kept_by_module:
        lines += [Text(""), _kept_table(detail.traced)]
    if detail.per_device is not None:
        lines.append(_per_device_table(estimate))
        if settings["zero"] == 3:  # the one stage where the layout's answer differs: say where, and by what
            lines.append(indented(f"DeepSpeed's flat ZeRO-3 shares alone (TrainingOptions(devices, zero)): the "
                                  f"layout --dp {settings['devices']:,} --zero 3, which --devices "
                                  f"{settings['devices']:,} --zero 3 answers on the command line, adds the layer and "
                                  "the head ZeRO-3 gathers while each runs"))
    if detail.device is not None:
        lines += [device_table(estimate)]
        if detail.device.stages:
            lines += [Text(""), *stages_table(detail.device), Text("")]
        lines.append(rules_table(detail.device))
    lines.append(fits_table(estimate))
    if estimate.budget is not None:
        lines.append(budget_line(estimate))
    for note in estimate.notes:
        lines.append(indented(f"note: {note}"))
    if settings["precision"].endswith("-mixed") and not policy:
        lines.append(indented("convention: mixed precision is torch.autocast's: matmuls (and sdpa) in 16 bits with "
                              "16-bit weight copies cached for the step, norms, softmax and the loss in fp32; "
                              "traced with the CPU autocast rules, which cast the same matmuls as CUDA's"))
        if settings.get("precision_defaulted"):  # the default where no DeepSpeed bf16 or FSDP2 policy applies: named
            lines.append(indented(f"convention: {settings['precision']}, the default where neither DeepSpeed's bf16 "
                                  "(ZeRO 1-3) nor FSDP2's MixedPrecisionPolicy applies (HF Trainer's --bf16); "
                                  "--precision bf16-pure, bf16-master, bf16-main-grad or fp32 for another"))
        shard = (settings.get("layout") or {}).get("shard", "")
        if settings.get("zero") or shard.startswith("zero"):  # a DeepSpeed layout priced with autocast's states
            lines.append(indented("convention: ZeRO is priced over autocast's fp32 weights and gradients; DeepSpeed "
                                  "with bf16 enabled keeps bf16 weights and gradients and an fp32 master copy "
                                  "instead (the ZeRO paper's 2 + 2 + 12 B a parameter): --precision bf16-master"))
    if policy and not any("--fsdp-mixed-precision autocast" in note for note in estimate.notes):
        # the policy's own note names the other convention; where a pipeline's note speaks instead, say it here
        lines.append(indented("convention: FSDP2's MixedPrecisionPolicy is the default under --zero fsdp and "
                              "hybrid_shard (torchtitan's); --fsdp-mixed-precision autocast for torch.autocast over "
                              "the fp32 parameters FSDP2 gathers"))
    lines.append(indented("convention: the steady step (optimizer states already allocated): loss = model(ids, "
                          "labels=ids).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True); outputs "
                          "are not kept past the loss"))
    lines.append(indented("convention: figures are bytes of tensors (what torch's allocator is asked for); the CUDA "
                          f"context and fragmentation are the reserve, {binary(estimate.reserve)} (--reserve)"))
    return lines


def _training_totals(estimate) -> Table:
    states, detail = estimate.training.states, estimate.training
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    for label, term in (("weights", states.weights), ("gradients", states.gradients),
                        ("optimizer states", states.optimizer), ("master weights", states.master_weights)):
        table.add_row(label, exact(term.bytes), binary(term.bytes), term.arithmetic)
    weights = estimate.weights
    if weights.buffer_bytes:
        parts = ", ".join(f"{exact(v)} B {k}" for k, v in weights.buffers_by_dtype.items())
        table.add_row("buffers", exact(weights.buffer_bytes), binary(weights.buffer_bytes), parts)
    act = estimate.activations
    table.add_row("activations saved", exact(act.bytes), binary(act.bytes),
                  f"{detail.activation_source}: {act.arithmetic}")
    for part, path, value in detail.towers:  # a cross-attention family's tower, traced in the same step
        table.add_row(f"  of which {part}", exact(value), binary(value),
                      f"{path}: what its forward leaves allocated as it returns (its output and what it saves for "
                      "backward), traced in the same step")
    top = max(detail.phases, key=lambda p: p.bytes)
    where = "" if top.where == "measured" else f"{top.where}: "
    table.add_row(f"peak ({top.phase})", exact(top.bytes), binary(top.bytes),
                  f"{where}the largest moment of the step, not the sum of the rows", style="bold")
    if detail.per_device is not None or detail.device is not None:
        table.add_row(f"peak per device ({estimate.peak_phase})", exact(estimate.peak), binary(estimate.peak),
                      "each moment with the device's shares of the model states, below", style="bold")
    table.add_row("+ reserve", exact(estimate.reserve), binary(estimate.reserve),
                  "CUDA context and allocator fragmentation (--reserve)")
    return table


def _phases_table(estimate) -> Table:
    detail = estimate.training
    table = Table(title="The step's moments: resident weights, buffers and optimizer states, plus", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("phase", no_wrap=True)
    table.add_column("moment", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    top = max(detail.phases, key=lambda p: p.bytes)
    for phase in detail.phases:
        table.add_row(phase.phase, phase.where, exact(phase.bytes), binary(phase.bytes), phase.arithmetic,
                      style="bold" if phase is top else None)
    return table


def _kept_table(traced) -> Table:
    """Activations by module: what each leaves allocated as its forward returns; identical layers folded."""
    import re

    table = Table(title="Activations by module (traced)", title_justify="left",
                  caption="what each module's forward leaves allocated, its output included", caption_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("module", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    rows = list(traced.kept_by_module)
    index = 0
    while index < len(rows):
        path, value = rows[index]
        match = re.match(r"^(.*)\.(\d+)$", path)
        if match:
            run = [index]
            probe = index + 1
            while probe < len(rows):
                other, other_value = rows[probe]
                if other.startswith(path + "."):
                    probe += 1
                    continue
                same = re.match(r"^(.*)\.(\d+)$", other)
                if same and same.group(1) == match.group(1) and other_value == value:
                    run.append(probe)
                    probe += 1
                    continue
                break
            last = re.match(r"^(.*)\.(\d+)$", rows[run[-1]][0]).group(2)
            label = path if len(run) == 1 else f"{match.group(1)}.{match.group(2)}–{last} (each)"
            table.add_row(label, exact(value), binary(value), style="bold" if len(run) > 1 else None)
            for child, child_value in rows[index + 1:]:
                if not child.startswith(path + "."):
                    break
                table.add_row("  " + child[len(path) + 1:], exact(child_value), binary(child_value))
            index = probe
            continue
        table.add_row(path, exact(value), binary(value))
        index += 1
    return table


def _per_device_table(estimate) -> Table:
    settings, shares = estimate.settings, estimate.training.per_device
    table = Table(title=f"Per device: ZeRO-{settings['zero']} over {settings['devices']:,} devices",
                  caption=f"each device runs its own batch of {settings['batch']:,}", caption_justify="left",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    for key in ("weights", "gradients", "optimizer", "master_weights", "activations", "peak"):
        if key not in shares:
            continue
        table.add_row(key.replace("_", " "), exact(shares[key]), binary(shares[key]),
                      style="bold" if key == "peak" else None)
    return table
