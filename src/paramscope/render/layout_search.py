"""`paramscope memory --training --find-layout`: the layouts that fit (cost/parallel/search.py's LayoutSearch) → text
(rich, at a width: the settings, the layouts table, the first layout's communication and its links, the fewest devices
that fit, the notes) and → the JSON "layout_search" object (docs/json-schema.md).

Pure functions of their data, as render/memory.py's: bytes are exact integers; the binary units beside them are for
reading only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from rich import box
from rich.table import Table
from rich.text import Text

from ..explain import exact
from ._console import indented, model_source_line, to_text
from .memory import UNIT_POWERS, binary, in_unit, table_unit

_KINDS = ("dp", "tp", "pp", "ep", "cp")


def render_layout_search_text(report, search, width: int = 100, *, color: bool = False) -> str:
    return to_text(layout_search_parts(report, search, width), width, color)


def layout_degrees(layout) -> str:
    """"dp 2 · tp 8 · pp 4": the degrees above 1 (dp always)."""
    parts = [f"dp {layout.dp}"] + [f"{name} {getattr(layout, name)}" for name in ("tp", "pp", "cp", "ep")
                                   if getattr(layout, name) > 1]
    return " · ".join(parts)


def seconds_words(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3g} s" if value >= 0.01 else f"{value * 1e3:.3g} ms"


def search_precision_words(search) -> str:
    """The search's precision as it ran: a mixed one where FSDP2 shards is its MixedPrecisionPolicy by default, which
    "bf16-mixed" alone would read as torch.autocast."""
    if search.fsdp_mixed_precision == "policy" and search.shard in ("fsdp", "hsdp"):
        return (f"{search.precision} as FSDP2's MixedPrecisionPolicy where it shards over more than one rank "
                "(--fsdp-mixed-precision autocast for torch.autocast)")
    return search.precision


def layout_search_parts(report, search, width: int | None = None) -> list:
    """The search's text parts; `width` (None: unbounded) is what the layouts table fits its last column to."""
    title = Text(f"Layouts to train {report.model.label} ({report.model.class_name}) on {search.devices:,} × "
                 f"{search.accelerator}", style="bold")
    shard = {"none": "no data-parallel sharding (DDP)", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
             "fsdp": "FSDP2 (full sharding)", "hsdp": "FSDP2 hybrid sharding"}[search.shard]
    pipeline = search.schedule if search.virtual_stages == 1 else f"{search.schedule}, {search.virtual_stages} chunks"
    fitting, rest, skipped = search.fitting, search.not_fitting, search.skipped
    total = len(fitting) + len(rest) + len(skipped)
    passed = [entry for entry in skipped if entry.bounded]  # they cannot fit: their bound exceeds the GPU
    lines = [
        title,
        *filter(None, [model_source_line(report.model)]),
        indented(f"global batch {search.global_batch:,} sequences × {search.seq:,} tokens a step, each replica "
                 f"global batch / dp; {search_precision_words(search)}; {search.optimizer}; gradient checkpointing "
                 f"{search.grad_checkpointing}"),
        indented(f"every layout: {shard} over dp × cp; sequence parallel with tp; pipelines {pipeline} with "
                 "microbatches of one sequence; without a pipeline, gradient accumulation over micro-steps of one "
                 "sequence (accum N: N micro-steps a step)"),
        indented(f"{total:,} layouts of {search.devices:,} devices: {len(fitting):,} fit (peak + "
                 f"{binary(search.reserve)} reserve ≤ {binary(search.memory)}), {len(rest):,} do not"
                 + (f", {len(skipped) - len(passed):,} not answered (below)" if len(skipped) > len(passed) else "")
                 + (f", {len(passed):,} passed over on a lower bound" if passed else "")),
        Text(""),
    ]
    if fitting:
        numbers = shown_layouts(fitting)
        table, legend = _layouts_table([fitting[n - 1] for n in numbers], width, numbers)
        lines.append(table)
        if len(fitting) > len(numbers):
            marked = (f"; #{numbers[-1]} shown as the first whose tp spans nodes ({SPANS_MARK})"
                      if numbers[-1] > SHOWN_LAYOUTS else "")
            lines.append(indented(f"… {len(fitting) - len(numbers):,} more that fit{marked} (--json lists them all)"))
        lines.append(legend)
        from ..cost.parallel.search_result import layout_words

        best = fitting[0]
        lines += [Text(""), indented(f"the first, {layout_words(best.layout, search.precision)}: each device's "
                                     "communication a step"
                                     + (f" (stage {best.comm_stage}'s, the most)" if best.layout.pp > 1 else "")),
                  _comm_table(best), *_link_lines(best)]
    elif len(skipped) > len(passed):  # only the answered ones were tried: one of the others may fit
        lines.append(indented(f"none of the {len(rest):,} answered layouts of {search.devices:,} devices fits on "
                              f"{search.accelerator}; " + ("the one not answered (below) was not tried"
                                                          if len(skipped) - len(passed) == 1 else
                                                          f"the {len(skipped) - len(passed):,} not answered (below) "
                                                          "were not tried"),
                              style="bold"))
    else:
        lines.append(indented(f"no layout of {search.devices:,} devices fits on {search.accelerator}", style="bold"))
    lines += [Text(""),
              indented(step_time_words(search)),
              indented("bubble: (pp − 1) / (v·m + pp − 1) of the step idle (m microbatches, v chunks a device)"),
              indented("communication: the bytes each device sends a step (as many received), a bound: ring "
                       "collectives ((n − 1)/n of the buffer for an all-gather or a reduce-scatter, twice that for "
                       "an all-reduce), balanced expert routing; parameters and gradients in the dtype they train "
                       "in; kinds apart, since they cross different links (the step time's line above says which)"),
              Text(""), indented(minimum_sentence(search))]
    if rest:
        closest = ", ".join(f"{layout_degrees(c.layout)}{c.accumulation_words} {binary(c.peak)}" for c in rest[:3])
        lines.append(indented(f"closest that do not fit, peak per device: {closest}"))
    if skipped:
        counts: dict[str, int] = {}
        for entry in skipped:
            counts[entry.reason] = counts.get(entry.reason, 0) + 1
        bounded = {entry.reason for entry in skipped if entry.bounded}
        for reason, count in sorted(counts.items(), key=lambda item: -item[1]):
            lines.append(indented(f"{'passed over' if reason in bounded else 'not answered'}, {count:,} "
                                  f"layout{'s' if count > 1 else ''}: {reason}"))
    for note in search.notes:
        lines.append(indented(f"note: {note}"))
    return lines


SHOWN_LAYOUTS = 10
SPANS_MARK = "†"  # beside a tp degree whose group spans nodes


def shown_layouts(fitting) -> list[int]:
    """The numbers (from 1) of the layouts the table prints: the first SHOWN_LAYOUTS, and past them the first whose
    tp spans nodes where none of those does, so that the mark the bound's sentence names is seen (after a "…" row)."""
    numbers = list(range(1, min(len(fitting), SHOWN_LAYOUTS) + 1))
    if not any(c.tp_spans_nodes for c in fitting[:SHOWN_LAYOUTS]):
        numbers += [i for i, c in enumerate(fitting, 1) if c.tp_spans_nodes][:1]
    return numbers


@dataclass(frozen=True)
class LayoutColumn:
    """A figure column of the layouts table: its header (the unit on its second line), its cell for a layout, what
    the legend says of it, and whether it may be left out where the width is short (in the order the columns are
    listed, after the communication by kind)."""

    header: str
    cell: Callable[[Any], str]
    legend: str = ""
    optional: bool = False


def _layout_columns(rows) -> list[LayoutColumn]:
    """The layouts table's columns: a parallel degree each (those some row uses; dp always), the micro-steps where
    a row accumulates, then the figures, each in its column's one unit."""
    used = [kind for kind in ("tp", "pp", "cp", "ep") if any(getattr(c.layout, kind) > 1 for c in rows)]
    peak, comm = table_unit([c.peak for c in rows]), _comm_unit(rows)
    degrees = [LayoutColumn(kind, lambda c, kind=kind: str(getattr(c.layout, kind))) for kind in ("dp", *used)]
    if any(c.tp_spans_nodes for c in rows):  # the tp column marks a group across nodes, its collectives exposed
        degrees[1] = LayoutColumn("tp", lambda c: f"{c.layout.tp}{SPANS_MARK if c.tp_spans_nodes else ''}",
                                  f"tp {SPANS_MARK}: tp spans nodes (its collectives exposed, added to compute)")
    if any(c.accumulation > 1 for c in rows):
        degrees.append(LayoutColumn("accum", lambda c: "—" if c.layout.pp > 1 else str(c.accumulation),
                                    "accum: micro-steps a step (—: a pipeline's microbatches instead)"))
    return degrees + [
        LayoutColumn(f"peak\n{peak[0]}", lambda c: in_unit(c.peak, peak), "peak: the busiest device's"),
        LayoutColumn("step ≥\ns", lambda c: _three_figures(c.step_bound), "step ≥: the bound below"),
        *([LayoutColumn("no overlap\ns", lambda c: _three_figures(c.no_overlap),
                        "no overlap: compute, NVLink and the network one after another", optional=True)]
          if any(c.comm_time is not None for c in rows) else []),
        LayoutColumn("bubble\n%", lambda c: f"{100 * c.bubble:.1f}" if c.layout.pp > 1 else "—",
                     "bubble —: no pipeline", optional=True),  # the step's bound has it already
        LayoutColumn(f"comm\n{comm[0]}", lambda c: _three_figures(c.comm_bytes / comm[1]),
                     "comm: the bytes it sends a step, a bound")]


def _comm_unit(rows) -> tuple[str, int]:
    """The unit of the communication columns: the one binary() writes the least total in (not the most, as the
    other columns: the totals span a hundredfold and more, and a unit that writes the least as 0.0123 reads badly)."""
    return table_unit([min((c.comm_bytes for c in rows if c.comm_bytes), default=0)])


def _layouts_table(rows, width: int | None, numbers: list[int] | None = None) -> tuple[Table, Any]:
    """The layouts that fit, a row each, in one shape at any width (_layout_columns), and last each kind's
    communication, packed a kind a piece into the width left. Where a row would need more than BY_KIND_LINES lines
    for it, that column is left out, then the optional columns one by one while the table is wider than the width;
    the legend line names what is left out and the width that shows it all; `numbers`: the rows' numbers (default
    1, 2, …), a "…" row where they skip. Returns the table and the legend."""
    numbered = numbers or list(range(1, len(rows) + 1))
    columns = _layout_columns(rows)
    comm = _comm_unit(rows)
    pieces = [[f"{kind} {_three_figures(value / comm[1])}" for kind, value in
               sorted(c.comm_by_kind().items(), key=lambda item: _KINDS.index(item[0]))] or ["none"] for c in rows]
    by_kind = f"by kind\n{comm[0]}"

    def room(shown: list[LayoutColumn]) -> int:
        """The by-kind column's room beside `shown`: the width less the rest of the table laid out with the column
        at its header's width, so that its padding and separator count as rich lays them out."""
        return width - _measured_width(_layouts_rows(rows, shown, by_kind, [""] * len(rows), numbered)) + len("by kind")

    units = ", ".join(f"{u} = {UNIT_POWERS[u]} B" for u in dict.fromkeys(
        (table_unit([c.peak for c in rows])[0], comm[0])) if u != "B")
    legend = "; ".join(filter(None, [units, *(column.legend for column in columns)])) + "; exact bytes in --json"
    if width is None or _packs(pieces, room(columns)):
        packed = ["\n".join(_packed(row, None if width is None else room(columns))) for row in pieces]
        return _layouts_rows(rows, columns, by_kind, packed, numbered), indented(legend)
    everything = width - room(columns) + _narrowest_packing(pieces)
    shown, left_out = list(columns), ["comm by kind"]
    for column in [c for c in columns if c.optional]:
        if _measured_width(_layouts_rows(rows, shown, by_kind, None, numbered)) <= width:
            break
        shown.remove(column)
        left_out.append(column.header.split("\n")[0])
    legend = "; ".join(filter(None, [units, *(column.legend for column in shown)]))
    return _layouts_rows(rows, shown, by_kind, None, numbered), indented(
        f"{legend}; exact bytes in --json; not shown at this width: {', '.join(left_out)} (at --width {everything} "
        "or more; the first's below)")


def _layouts_rows(rows, columns: list[LayoutColumn], by_kind: str, packed: list[str] | None,
                  numbers: list[int]) -> Table:
    """The layouts table of `columns`, a row a layout numbered by `numbers` (a "…" row where they skip), with the
    column `by_kind` where `packed` gives its cells."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("#", justify="right", no_wrap=True)
    for column in columns:
        table.add_column(column.header, justify="right", no_wrap=True)
    if packed is not None:
        table.add_column(by_kind, no_wrap=True)
    for index, (number, candidate) in enumerate(zip(numbers, rows)):
        if index and number != numbers[index - 1] + 1:
            table.add_row("…", *([""] * (len(columns) + (packed is not None))))
        table.add_row(str(number), *(column.cell(candidate) for column in columns),
                      *([packed[index]] if packed is not None else []))
    return table


# The most lines a row's communication by kind takes: more, and a table of a few columns reads as a list of cards.
BY_KIND_LINES = 2


def _packs(pieces: list[list[str]], room: int) -> bool:
    """Whether every row's pieces pack into BY_KIND_LINES lines of `room` characters (and the header fits)."""
    return room >= len("by kind") and all(
        len(lines) <= BY_KIND_LINES and max(map(len, lines)) <= room for lines in (_packed(r, room) for r in pieces))


def _narrowest_packing(pieces: list[list[str]]) -> int:
    """The narrowest room in which every row packs (_packs)."""
    room = max(len(piece) for row in pieces for piece in row)
    while not _packs(pieces, room):
        room += 1
    return room


def _packed(pieces: list[str], room: int | None) -> list[str]:
    """`pieces` joined by spaces into lines of at most `room` characters, a piece never split."""
    lines: list[str] = []
    for piece in pieces:
        if lines and (room is None or len(lines[-1]) + 1 + len(piece) <= room):
            lines[-1] += " " + piece
        else:
            lines.append(piece)
    return lines


def _measured_width(table: Table) -> int:
    """The width `table` prints at, unconstrained (its columns' widest cells and headers, padding and edges)."""
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), width=10_000).measure(table).maximum


def _three_figures(value: float | None) -> str:
    """At least three significant figures, no exponent: 0.902, 60.4, 1.90, 831, 11,918, 0.00452; "—" for none."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def step_time_words(search) -> str:
    """What the step's bound is: compute, and communication over the links where the GPU has link figures."""
    from ..cost.parallel.layout_time import EXPOSURE, describe

    compute = (f"the busiest device's hardware FLOPs a step (recompute included) ÷ {search.peak_flops / 1e12:,.1f} "
               f"TFLOP/s ({search.peak_dtype} dense peak) ÷ (1 − bubble)")
    links = search.links
    if links is None:
        return (f"step time: a bound at the GPU's peak, not a prediction: {compute}; communication is not in it (no "
                f"link figures for {search.accelerator} here)")
    return (f"step time: a lower bound, not a prediction: max(compute + exposed tp, NVLink, network), the rest "
            f"perfectly overlapped; {EXPOSURE}; exposed tp: the slower of the tp collectives' NVLink and network "
            f"parts where its group spans nodes; compute: {compute}; communication: each kind's bytes over the link "
            f"its group crosses, NVLink inside a node, the network across (ranks laid out tp innermost, then cp, dp, "
            f"pp outermost, as torchtitan's mesh; a group across nodes sends its hierarchical share), each link's "
            f"kinds one after another, the two links at once; {describe(links)}; no overlap: compute + NVLink + "
            f"network{spans_words(search)}")


def spans_words(search) -> str:
    """"; tp spans nodes in 10 of the 56 layouts that fit (marked †), the first of them #25 (dp 1 · tp 16 · pp 2 ·
    cp 2, step ≥ 1.62 s)": where the layouts that fit put tp across nodes, said beside the bound; "" where none does."""
    spanning = [(i, c) for i, c in enumerate(search.fitting, 1) if c.tp_spans_nodes]
    if not spanning:
        return ""
    index, first = spanning[0]
    return (f"; tp spans nodes in {len(spanning):,} of the {len(search.fitting):,} layouts that fit (marked "
            f"{SPANS_MARK}), the first of them #{index} ({layout_degrees(first.layout)}{first.accumulation_words}, step ≥ "
            f"{seconds_words(first.step_bound)})")


def _link_lines(candidate) -> list:
    """The first layout's communication on the links, and its step's bound and no-overlap sum."""
    time = candidate.comm_time
    if time is None:
        return []
    where = ", ".join(f"{candidate.comm[t.term].kind} {t.link}" + (f" {exact(t.bytes)} B" if t.link == "network"
                                                                    and t.bytes != candidate.comm[t.term].bytes
                                                                    else "") + (" exposed" if t.exposed else "")
                      for t in time.terms)
    exposed = (f" + exposed tp {seconds_words(time.exposed)} (tp spans nodes: the slower of its two links)"
               if time.tp_spans_nodes else "")
    return [indented(f"on the links ({where}): NVLink {exact(time.nvlink_bytes)} B in ≥ {seconds_words(time.nvlink)}, "
                     f"the network {exact(time.network_bytes)} B in ≥ {seconds_words(time.network)}; step ≥ "
                     f"max(compute {seconds_words(candidate.seconds)}{exposed}, NVLink, network) = "
                     f"{seconds_words(candidate.step_bound)}; no overlap {seconds_words(candidate.no_overlap)}")]


def _comm_table(candidate) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("kind", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("", justify="right", no_wrap=True)
    table.add_column("what, formula = arithmetic", overflow="fold", ratio=1)
    for term in candidate.comm:
        table.add_row(term.kind, exact(term.bytes), binary(term.bytes),
                      f"{term.what}: {term.formula} = {term.arithmetic}")
    table.add_row("all", exact(candidate.comm_bytes), binary(candidate.comm_bytes), "a bound, not a prediction",
                  style="bold")
    return table


def minimum_sentence(search) -> str:
    minimum = search.minimum
    before = ""
    if minimum.floor > 1:
        below = "1" if minimum.floor == 2 else f"1–{minimum.floor - 1:,}"
        before = f"; {below}: the model states alone, spread evenly, exceed the GPU"
    others = [t for t in minimum.tried if t.outcome in ("none fits", "no layout")]
    if others:
        runs = _runs([t.devices for t in others])
        tried = sum(t.layouts for t in others)
        before += (f"; {runs}: " + ("no layout answered" if not tried else
                                    f"none of {'its' if len(others) == 1 else 'their'} {tried:,} layout"
                                    f"{'s' if tried != 1 else ''} tried fits"))
    if minimum.bounded:
        before += (f" ({minimum.bounded:,} more passed over on a lower bound: the first stage's model states and its "
                   "layers' activations for the microbatches in flight (where the step is not the analytic "
                   "recipe's: without a pipeline its share of one device's derived activations, with one the states "
                   "alone), terms of its peak, exceed the GPU)")
    if minimum.untried is not None:
        first, last = minimum.untried
        span = f"{first:,}" if first == last else f"{first:,}–{last:,}"
        before += (f"; {span}: {'not' if first == last else 'the counts not listed were not'} tried (the search "
                   f"below the first power of two that fits stops after {minimum.budget:,} layouts)")
    if minimum.unanswered:
        before += (f"; {minimum.unanswered:,} layouts of those counts not answered, so not tried (the reasons below): "
                   "one of them may fit")
    done = f"; {search.evaluated:,} layouts evaluated in {search.seconds:.1f} s"
    among = " among the answered layouts" if minimum.unanswered else ""
    if minimum.devices is None:
        return (f"fewest devices that fit{among}: none up to {minimum.limit:,} (counts tried upward from 1 at the "
                f"same global batch{before}{done})")
    layout = minimum.layout.layout
    shown = ("one device" if layout.devices == 1 else layout_degrees(layout)) + minimum.layout.accumulation_words
    found = ("fewest devices found to fit" if minimum.untried is not None or minimum.unanswered else
             "fewest devices that fit") + among
    return (f"{found}: {minimum.devices:,} ({shown}, peak {binary(minimum.layout.peak)} a device; counts tried "
            f"upward from 1 at the same global batch{before}{done})")


def _runs(counts: list[int]) -> str:
    """Ascending counts as runs: 14–17, 19, 22–23."""
    out: list[str] = []
    start = prev = counts[0]
    for count in counts[1:] + [0]:
        if count == prev + 1:
            prev = count
            continue
        out.append(f"{start:,}" if start == prev else f"{start:,}–{prev:,}")
        start = prev = count
    return ", ".join(out)


def _candidate_to_dict(candidate) -> dict[str, Any]:
    from ..cost.parallel.search import candidate_settings

    return {**candidate_settings(candidate), "replica_batch": candidate.replica_batch, "fits": candidate.fits,
            "peak": candidate.peak, "peak_phase": candidate.peak_phase, "free": candidate.free,
            "flops": candidate.flops, "model_flops": candidate.model_flops, "bubble": candidate.bubble,
            "seconds": candidate.seconds, "comm_bytes": candidate.comm_bytes if candidate.fits else None,
            "comm_stage": candidate.comm_stage,
            "comm": [{"kind": t.kind, "what": t.what, "bytes": t.bytes, "formula": t.formula,
                      "arithmetic": t.arithmetic} for t in candidate.comm],
            "step_bound": candidate.step_bound, "no_overlap_seconds": candidate.no_overlap,
            "tp_spans_nodes": candidate.tp_spans_nodes, "comm_time": _comm_time_to_dict(candidate.comm_time)}


def _comm_time_to_dict(time) -> dict[str, Any] | None:
    if time is None:
        return None
    return {"nvlink_bytes": time.nvlink_bytes, "network_bytes": time.network_bytes, "nvlink_seconds": time.nvlink,
            "network_seconds": time.network, "seconds": time.seconds, "exposed_seconds": time.exposed,
            "tp_spans_nodes": time.tp_spans_nodes,
            "terms": [{"kind": t.kind, "term": t.term, "link": t.link, "bytes": t.bytes, "seconds": t.seconds,
                       "why": t.why, "exposed": t.exposed} for t in time.terms]}


def _links_to_dict(links) -> dict[str, Any] | None:
    if links is None:
        return None
    return {"gpus_per_node": links.gpus_per_node, "nvlink": links.nvlink_words,
            "nvlink_bytes_per_second": int(links.nvlink), "network": links.network_words,
            "network_bytes_per_second": int(links.network), "source": links.source}


def layout_search_to_dict(search) -> dict[str, Any]:
    """The JSON "layout_search" object (docs/json-schema.md)."""
    from ..cost.parallel.layout_time import EXPOSURE

    minimum = search.minimum
    return {
        "accelerator": search.accelerator, "memory": search.memory, "reserve": search.reserve,
        "peak_flops": search.peak_flops, "peak_dtype": search.peak_dtype, "devices": search.devices,
        "global_batch": search.global_batch, "seq": search.seq, "precision": search.precision,
        "fsdp_mixed_precision": search.fsdp_mixed_precision,
        "optimizer": search.optimizer, "grad_checkpointing": search.grad_checkpointing, "shard": search.shard,
        "schedule": search.schedule, "virtual_stages": search.virtual_stages,
        "seconds_are": "a bound at the GPU's peak, not a prediction: the busiest device's hardware FLOPs a step / "
                       "peak FLOP/s / (1 - bubble); communication not included",
        "comm_is": "bytes each device sends a step (as many received), a bound: ring collectives, balanced routing",
        "links": _links_to_dict(search.links),
        "step_bound_is": ("a lower bound, not a prediction: max(seconds + comm_time.exposed_seconds, "
                          "comm_time.nvlink_seconds, comm_time.network_seconds): tp's collectives exposed where its "
                          "group spans nodes (tp_spans_nodes; exposed_seconds the slower of their NVLink and network "
                          "parts, the terms marked exposed), the rest overlapped with compute (exposure_is); "
                          "comm_time: each kind's bytes over the link its group crosses (NVLink inside a node, the "
                          "network across), the two links at once; no_overlap_seconds: seconds + comm_time's NVLink "
                          "and network seconds one after another" if search.links is not None else
                          "seconds: the GPU has no link figures here, so communication is not timed"),
        "exposure_is": EXPOSURE if search.links is not None else None,
        "layouts": [_candidate_to_dict(c) for c in search.fitting],
        "not_fitting": [_candidate_to_dict(c) for c in search.not_fitting],
        "skipped": [{"dp": s.dp, "tp": s.tp, "pp": s.pp, "cp": s.cp, "ep": s.ep, "reason": s.reason,
                     "bounded": s.bounded} for s in search.skipped],
        "minimum": {"devices": minimum.devices,
                    "layout": _candidate_to_dict(minimum.layout) if minimum.layout is not None else None,
                    "limit": minimum.limit, "floor": minimum.floor,
                    "untried": list(minimum.untried) if minimum.untried is not None else None,
                    "budget": minimum.budget, "bounded": minimum.bounded, "unanswered": minimum.unanswered,
                    "tried": [{"devices": t.devices, "outcome": t.outcome, "layouts": t.layouts,
                               "unanswered": t.unanswered, "words": t.words} for t in minimum.tried]},
        "evaluated": search.evaluated, "search_seconds": round(search.seconds, 3),
        "notes": list(search.notes),
    }
