"""One device's tables under a training layout: its figures with the peak as a whole sum, its pipeline stages (one
unit a table), how each role is cut. Pure functions of their data."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from ..cost.memory.phases import whole_sum
from ..explain import exact
from ._console import indented
from .memory_cells import binary, in_unit, stage_layers, table_unit, unit_words


def device_table(estimate) -> Table:
    device = estimate.training.device
    table = Table(title=f"{device_words(device)}: {device.layout.words()}", title_justify="left",
                  caption=f"each data-parallel replica runs a batch of {estimate.settings['batch']:,}; "
                          f"{device.states_arithmetic}{_flat_zero3_words(device)}", caption_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("how", overflow="fold", ratio=1)
    for label, value in (("weights", device.weights), ("gradients", device.gradients),
                         ("optimizer states", device.optimizer), ("master weights", device.master_weights),
                         ("buffers", device.buffers)):
        table.add_row(label, exact(value), binary(value), "")
    table.add_row("activations saved", exact(device.activations), binary(device.activations),
                  device.activations_from)
    for buffer in device.comm:
        table.add_row(buffer.name, exact(buffer.bytes), binary(buffer.bytes),
                      f"{buffer.arithmetic}; held at the {' and '.join(buffer.moments)} moments")
    top = device.peak_figure
    table.add_row(f"peak ({top.phase})", exact(top.bytes), binary(top.bytes), f"{top.where}: {peak_sum(device)}",
                  style="bold")
    return table


def peak_sum(device) -> str:
    """The device's peak as the whole sum: its resident states + the moment's terms = the peak."""
    resident = (("weights", device.weights), ("optimizer states", device.optimizer),
                ("master weights", device.master_weights), ("buffers", device.buffers))
    if device.gradients_resident:  # bf16-main-grad's fp32 gradient buffer, held at every moment
        resident = resident[:1] + (("fp32 gradient buffer", device.gradients),) + resident[1:]
    if device.accumulation_buffer:  # bf16-master's BF16_Optimizer: its bf16 gradient-accumulation buffer, held always
        resident = resident[:1] + (("BF16_Optimizer's bf16 gradient-accumulation buffer", device.accumulation_buffer),) \
            + resident[1:]
    return whole_sum(device.peak_figure, resident)


def device_words(device) -> str:
    """Which device the table shows, and why: under a pipeline the stage whose peak is the largest (its figures are
    that stage's), named with its rank under torchtitan's mesh order (pp outermost: stage s's first rank is
    s × devices / pp); else rank 0, whose share is the largest wherever a cut is uneven."""
    if not device.stages:
        return "One device (rank 0, the largest share)"
    stage = max(device.stages, key=lambda s: s.peak)
    layout = device.layout
    rank = stage.rank * (layout.devices // layout.pp)
    return (f"One device, pipeline stage {stage.rank} at rank {rank:,} (pp outermost, as torchtitan's mesh orders the "
            f"ranks): its peak is the largest of the {layout.pp} stages'")


def _flat_zero3_words(device) -> str:
    """Under ZeRO-3 over data parallel alone: `--devices N --zero 3` is this layout (cli/memory._layout), so the two
    spellings give this one answer, the gathered buffers counted; said, with the bytes they add at this peak."""
    layout = device.layout
    if layout.shard != "zero3" or layout.devices != layout.dp or layout.ep != 1:
        return ""
    gathered = sum(b.bytes for b in device.comm if device.peak_figure.phase in b.moments)
    return (f"; --devices {layout.dp:,} --zero 3 is this layout and gives this answer, the gathered buffers above "
            f"counted ({exact(gathered)} B at the peak; DeepSpeed's flat shares alone, the Python API's "
            f"TrainingOptions(devices={layout.dp}, zero=\"3\"), leave them out)")


# The stage table's columns: (key, header, legend words); master weights only where some stage holds them.
_STAGE_COLUMNS = (("weights", "weights", ""), ("gradients", "grads", "grads: gradients"),
                  ("optimizer", "optim", "optim: optimizer states"),
                  ("master_weights", "master", "master: the fp32 master weights"),
                  ("activations", "acts", "acts: activations saved"),
                  ("peak", "peak", ""))


def stages_table(device) -> list:
    """One shape at any width and under any layout: a row a stage, every figure in the table's one binary unit
    (named in its header), the layers wrapping between runs; a column no stage has (master weights) left out. The
    title line, the table and its legend line (the two lines wrap to the width, not to the table's)."""
    stages = device.stages
    columns = [c for c in _STAGE_COLUMNS if c[0] != "master_weights" or any(s.master_weights for s in stages)]
    unit = table_unit([s.peak for s in stages])
    legend = "; ".join(filter(None, (words for _, _, words in columns)))
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("stage", justify="right", no_wrap=True)
    table.add_column("layers", overflow="fold")
    table.add_column("in\nflight", justify="right", no_wrap=True)
    for _, header, _ in columns:
        table.add_column(f"{header}\n{unit[0]}", justify="right", no_wrap=True)
    for stage in stages:
        table.add_row(str(stage.rank), stage_layers(stage), str(stage.in_flight),
                      *(in_unit(getattr(stage, key), unit) for key, _, _ in columns),
                      style="bold" if stage.peak == device.peak else None)
    return [Text(f"Pipeline stages: {device.pipeline}; bubble {100 * device.bubble:.1f}% of the step "
                 "((pp − 1) / (v·m + pp − 1))"), table,
            indented(f"{unit_words(unit)}, one device of each stage; in flight: microbatches; {legend}; peak: the "
                     "stage's largest moment, not the columns' sum (bold: the largest); exact bytes in --json")]


def rules_table(device) -> Table:
    return role_cuts_table(device.rules, "How each role is cut (from its role; transformers' tp plans agree)")


def role_cuts_table(rules: dict[str, str], title: str, caption: str | None = None) -> Table:
    """Each role and the rule that cuts it: a training device's table and a serving layout's."""
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    table.add_column("role", no_wrap=True)
    table.add_column("rule", overflow="fold", ratio=1)
    for role, rule in rules.items():
        table.add_row(role, rule)
    return table
