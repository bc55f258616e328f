"""What fits where: the fits table, and the --gpu or --budget answer in one sentence (the text and the page say the
same words). Pure functions of their data."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from ..explain import exact
from .memory_cells import binary


# One accelerator per memory size for the text table; the JSON lists them all.
_SHOWN = ("RTX 3060", "T4", "RTX 4090", "RTX 5090", "A100 40GB", "L40S", "H100 80GB", "H200", "B200", "MI300X",
          "MI355X")


def fits_table(estimate) -> Table:
    settings = estimate.settings
    limit = settings.get("max_context")
    layout = settings.get("layout") if estimate.mode == "inference" else None
    each = f", each GPU of {layout['words']}" if layout else ""
    table = Table(title=f"Fits on: peak + reserve within the accelerator's memory{each}", title_justify="left",
                  caption=f"largest {_fit_batch(settings)[0]} at {settings['seq']:,} tokens"
                          f"{_in_microbatches(settings)}; largest context at {_fit_batch(settings)[0]} "
                          f"{_fit_batch(settings)[1]:,}"
                          + ((f", up to the model's {limit:,}" if limit >= settings["seq"] else
                              f", up to --seq {settings['seq']:,} (beyond the model's {limit:,})") if limit else ""),
                  caption_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("accelerator", no_wrap=True)
    table.add_column("memory", justify="right", no_wrap=True)
    table.add_column("fits", no_wrap=True)
    table.add_column("free", justify="right", no_wrap=True)
    table.add_column("largest batch", justify="right", no_wrap=True)
    table.add_column("largest context", justify="right", no_wrap=True)
    for fit in estimate.fits:
        if fit.accelerator.name in _SHOWN:
            table.add_row(*_fit_row(fit))
    return table


def _fit_batch(settings) -> tuple[str, int]:
    """(what the largest batch counts, the batch the largest context is at): under gradient accumulation the fits
    are one micro-step's (grad_accum.py), so a micro-batch."""
    if settings.get("grad_accum", 1) > 1:
        return "micro-batch", settings["micro_batch"]
    return "batch", settings["batch"]


def _in_microbatches(settings) -> str:
    """Under a pipeline the largest batch is one its m microbatches divide, as --batch must be: said beside it."""
    layout = settings.get("layout") or {}
    if layout.get("pp", 1) > 1 and layout.get("micro_batches", 1) > 1:
        return f", a multiple of the pipeline's {layout['micro_batches']:,} microbatches"
    return ""


def _fit_row(fit) -> tuple[str, ...]:
    return (fit.accelerator.name, binary(fit.accelerator.memory), "yes" if fit.fits else "no",
            binary(fit.free) if fit.free >= 0 else f"short {binary(-fit.free)}",
            "—" if fit.largest_batch is None else exact(fit.largest_batch),
            "—" if fit.largest_context is None else exact(fit.largest_context))


def budget_line(estimate) -> Text:
    return Text(budget_sentence(fit_to_dict(estimate.budget), estimate.settings), style="bold")


def budget_sentence(budget: dict[str, Any], settings) -> str:
    """The answer for --gpu or --budget in one sentence, from the JSON form of the fit (the text and the page say
    the same words). A --budget is the accelerator named "budget" (cost/memory: Accelerator("budget", …))."""
    name = f"{binary(budget['memory'])} budget" if budget["accelerator"] == "budget" else budget["accelerator"]
    layout = settings.get("layout")
    if layout and "shard" not in layout:  # serving across GPUs (a training layout has a shard): each GPU's
        name += f", each GPU of {layout['words']}"
    if budget["fits"]:
        head = f"On {name}: fits, {binary(budget['free'])} to spare"
    else:
        head = f"On {name}: does not fit, short by {binary(-budget['free'])}"
    word, at = _fit_batch(settings)
    batch = f"no {word} fits" if budget["largest_batch"] is None else f"largest {word} {exact(budget['largest_batch'])}"
    context = ("no context fits" if budget["largest_context"] is None
               else f"largest context {exact(budget['largest_context'])}")
    multiple = f" ({_in_microbatches(settings)[2:]})" if budget["largest_batch"] and _in_microbatches(settings) else ""
    return f"{head}; {batch} at {settings['seq']:,} tokens{multiple}, {context} at {word} {at:,}"


def fit_to_dict(fit) -> dict[str, Any]:
    return {"accelerator": fit.accelerator.name, "memory": fit.accelerator.memory, "fits": fit.fits, "free": fit.free,
            "largest_batch": fit.largest_batch, "largest_context": fit.largest_context}
