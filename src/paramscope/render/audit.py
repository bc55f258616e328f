"""`paramscope audit`, `inspect --explain-counts` and `inspect --heads`: pure functions of data and width → text.

The JSON producers live on the data (`AuditResult.to_dict`, `CountsExplanation.to_dict`, `Heads.to_dict`);
`render_audit_json` is the document `audit --json` prints.
"""

from __future__ import annotations

import io
import json as _json
import math
import re
import secrets
from json.encoder import encode_basestring as _encode_str
from operator import attrgetter
from typing import Any, Iterator

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..explain import exact
from ._console import indented, shape, to_text, wrap_words
from ._fit import add_names_column, figure_width
from .memory import binary

LIST_LIMIT = 20  # longer lists of keys are cut (with a count) unless every key is asked for


def render_audit_text(result, width: int = 100, *, color: bool = False, all_keys: bool = False) -> str:
    return "".join(iter_audit_text(result, width, color=color, all_keys=all_keys))


def iter_audit_text(result, width: int = 100, *, color: bool = False, all_keys: bool = False) -> Iterator[str]:
    """`render_audit_text` in pieces, the same text: `--all` on a checkpoint of a million keys is written as it is
    laid out."""
    parts = [_header(result, width), _dtypes(result.checkpoint), *_packed_tensors(result.checkpoint),
             *_quantisation(result), *_reconciliation(result, all_keys)]
    loading = _loading(result)
    if loading is not None:
        parts.append(loading)
    parts.append(counts_table(result.counts))
    # Each part is printed on its own (to_text prints them one by one), so a run of rich parts printed together,
    # then the rows `_Rows` lays out itself, then the next run, is the same text as all printed on one console.
    run: list = []
    for part in parts:
        if isinstance(part, _Rows):
            if run:
                yield to_text(run, width, color)
                run = []
            yield from part.pieces(width, color)
        else:
            run.append(part)
    if run:
        yield to_text(run, width, color)


def render_audit_json(result, *, indent: int | None = 2) -> str:
    return "".join(iter_audit_json(result, indent=indent))


def iter_audit_json(result, *, indent: int | None = 2) -> Iterator[str]:
    """`render_audit_json` in pieces, the same text: the document without the checkpoint's long lists, then each
    list written in its place a chunk at a time. A million findings cost seconds and a few MB at a time, not the
    2 GB of one json.dumps (indent makes json use its pure-Python encoder, and the whole text is held twice)."""
    if indent is None:  # json's C encoder, in one piece
        yield _json.dumps(result.to_dict(), ensure_ascii=False)
        return
    token = secrets.token_hex(8)
    lists = result.long_lists()
    stand_ins = {key: f"\0paramscope-{token}-{key}\0" for key in lists}
    text = _json.dumps(result.to_dict_with(stand_ins), indent=indent, ensure_ascii=False)
    step = " " * indent
    done = 0
    for key in sorted(lists, key=lambda k: text.index(_json.dumps(stand_ins[k]))):
        quoted = _json.dumps(stand_ins[key])  # "\u0000paramscope-…" as json wrote it
        at = text.index(quoted, done)
        pad = " " * (at - text.rindex("\n", 0, at) - 1 - len(f'"{key}": '))  # the indent of the key's line
        yield text[done:at]
        yield from _json_list(lists[key], _packed_json if key == "packed" else _finding_json, pad, step)
        done = at + len(quoted)
    yield text[done:]


_CHUNK = 4096  # items per piece of a long list


def _json_list(items, formatter, pad: str, step: str) -> Iterator[str]:
    """`items` as json.dumps writes the list with indent=len(step) and ensure_ascii=False, its key on a line
    indented by `pad`, `_CHUNK` items a piece; `formatter(chunk, item_pad, step)` writes each item."""
    if not items:
        yield "[]"
        return
    inner = pad + step
    for start in range(0, len(items), _CHUNK):
        body = (",\n" + inner).join(formatter(items[start:start + _CHUNK], inner, step))
        yield ("[\n" + inner if start == 0 else ",\n" + inner) + body
    yield "\n" + pad + "]"


def _finding_json(findings, pad: str, step: str) -> list[str]:
    """Each Finding as json.dumps writes `Finding.to_dict()` at an item indent `pad`; shapes and reasons are shared
    among findings, so each is written once (a memo per chunk)."""
    field = pad + step
    shapes: dict = {}
    reasons: dict = {}
    head = "{\n" + field + '"name": '
    out = []
    for f in findings:
        shape = shapes.get(f.shape)
        if shape is None:
            shape = shapes[f.shape] = _json_value(list(f.shape), field, step)
        reason = reasons.get(f.reason)
        if reason is None:
            reason = reasons[f.reason] = _encode_str(f.reason)
        out.append(f'{head}{_encode_str(f.name)},\n{field}"shape": {shape},\n{field}"reason": {reason}\n{pad}}}')
    return out


def _packed_json(tensors, pad: str, step: str) -> list[str]:
    """Each packed tensor as json.dumps writes `audit.packed_dict(t)` at an item indent `pad` (its keys in that
    order); dtypes, shapes, packings and notes are shared among tensors, so each is written once."""
    field = pad + step
    shapes: dict = {}
    texts: dict = {}

    def text(value: str) -> str:
        done = texts.get(value)
        if done is None:
            done = texts[value] = _encode_str(value)
        return done

    out = []
    for t in tensors:
        shape = shapes.get(t.shape)
        if shape is None:
            shape = shapes[t.shape] = _json_value(list(t.shape), field, step)
        logical = "null" if t.logical_numel is None else int.__repr__(t.logical_numel)
        out.append(f'{{\n{field}"name": {_encode_str(t.name)},\n{field}"dtype": {text(t.dtype)},\n{field}"shape": '
                   f'{shape},\n{field}"stored_elements": {int.__repr__(t.numel)},\n{field}"logical_elements": '
                   f'{logical},\n{field}"packing": {text(t.packing)},\n{field}"note": {text(t.note)}\n{pad}}}')
    return out


def _json_value(value, pad: str, step: str) -> str:
    """One value as json.dumps writes it with indent=len(step), ensure_ascii=False, on a line indented by `pad`."""
    if type(value) is str:
        return _encode_str(value)
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is list and value and all(type(d) is int for d in value):  # a shape
        inner = pad + step
        return "[\n" + inner + (",\n" + inner).join(map(int.__repr__, value)) + "\n" + pad + "]"
    return _json.dumps(value, indent=len(step), ensure_ascii=False).replace("\n", "\n" + pad)


def render_counts_text(counts, width: int = 100, *, color: bool = False) -> str:
    return to_text([counts_table(counts)], width, color)


def render_heads_text(heads, width: int = 100, *, color: bool = False) -> str:
    return to_text([heads_group(heads)], width, color)


def counts_table(counts) -> Table:
    table = Table(title=f"Reconciling the counts of {counts.class_name}", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("count", max_width=24)
    table.add_column("exact", justify="right", no_wrap=True)
    table.add_column("why it is what it is", overflow="fold", ratio=1)
    for line in counts.lines:
        value = "—" if line.value is None else exact(line.value)
        table.add_row(line.label, value, Text(line.explanation), style="bold" if line.key == "unique" else None)
    return table


def heads_group(heads) -> Group:
    lines = [Text(f"What the heads of {heads.class_name} add: {exact(heads.total)}", style="bold")]
    if not heads.parts:
        lines.append(indented("no head: this is the bare model"))
    lines.extend(indented(p.line) for p in heads.parts)
    if heads.uses_pooler:
        lines.append(indented("reads the pooled first token: the pooler belongs to the base model"))
    if heads.task_description:
        lines.append(indented(f"task {heads.task}: {heads.task_description}"))
    if heads.suggestion_note:
        lines.append(indented(heads.suggestion_note))
    return Group(*lines, Text(""))


def _header(result, width: int = 100) -> Group:
    ck, report = result.checkpoint, result.report
    files = len(ck.files)
    title = Text.assemble(("Audit", "bold"), " · ", (report.model.class_name, "bold cyan"), " · ",
                          f"{exact(report.total)} parameters")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    add_names_column(grid)  # paths, the class and what it was chosen by
    room = width - len("  checkpoint") - 2  # the labels' column and the grid's padding

    def paths(text: str) -> Text:  # broken between words and after a '/', never inside a folder's name
        return Text("\n".join(wrap_words(text, room)))  # Text: a path is never taken as markup

    grid.add_row("  checkpoint", paths(f"{ck.path} ({ck.format}, {files} file{'s' if files != 1 else ''}, "
                                       f"{len(ck.tensors)} tensors)"))
    grid.add_row("  found", paths(result.located.description))
    if report.model.source.split(" ", 1)[-1] != result.located.description.split(" ", 1)[-1]:
        grid.add_row("  config", paths(report.model.source))
    grid.add_row("  class", Text(f"{report.model.class_name}: {report.model.class_reason}"))
    records = getattr(result.packed, "shape_records", 0)
    grid.add_row("  read", "headers only: no tensor data was read" if not records else
                 f"headers, and the {records:,} weight_shape records of compressed-tensors (at most 32 bytes each, "
                 "the packed weights' unpacked shapes); no other tensor data")
    return Group(title, grid, Text(""))


def _dtypes(ck) -> Table:
    table = Table(title="Stored tensors by dtype", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("dtype")
    table.add_column("tensors", justify="right")
    table.add_column("elements", justify="right")
    table.add_column("bytes", justify="right")
    for dtype, row in ck.by_dtype.items():
        table.add_row(dtype, exact(row["tensors"]), exact(row["elements"]), exact(row["bytes"]))
    table.add_section()
    table.add_row("total", exact(len(ck.tensors)), exact(ck.elements), f"{exact(ck.nbytes)} ({binary(ck.nbytes)})",
                  style="bold")
    return table


def _packed_tensors(ck) -> list[Table]:
    """The packed weights, each with its stored elements and the parameters it holds unpacked: a table of its own,
    so that a long tensor name widens no figure column of the dtype table (where it was cut at 100 columns)."""
    packed = [t for t in ck.tensors if t.role == "packed"]
    if not packed:
        return []
    shown = f" (the first {LIST_LIMIT} of {exact(len(packed))})" if len(packed) > LIST_LIMIT else ""
    table = Table(title=f"Packed tensors{shown}: elements stored, parameters unpacked", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    add_names_column(table, "tensor")
    table.add_column("stored", justify="right")
    table.add_column("unpacked", justify="right")
    table.add_column("packing")
    for t in packed[:LIST_LIMIT]:
        logical = "unknown from headers" if t.logical_numel is None else exact(t.logical_numel)
        table.add_row(Text(t.name), exact(t.numel), logical, t.packing)
    return [table]


def _quantisation(result) -> list:
    """A quantised checkpoint per role (logical parameters, stored bytes, the bookkeeping's bytes) and its
    quantization_config checked against the headers; nothing for a checkpoint with neither."""
    packed = result.packed
    if packed is None:
        return []
    table = Table(title="Quantised storage by role (parameters unpacked; bytes as stored)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("role", overflow="fold", max_width=22)
    table.add_column("weights", justify="right")
    table.add_column("parameters", justify="right")
    table.add_column("stored bytes", justify="right")
    table.add_column("scales", justify="right")
    table.add_column("zeros", justify="right")
    table.add_column("index", justify="right")
    table.add_column("bits/param", justify="right")
    for r in packed.roles:
        table.add_row(r.role, exact(r.tensors), exact(r.parameters), exact(r.stored_bytes), exact(r.scale_bytes),
                      exact(r.zero_bytes), exact(r.index_bytes), _bits(r.bits_per_parameter))
    table.add_section()
    stored, over, params = packed.stored_bytes, packed.overhead_bytes, packed.parameters
    table.add_row("total", exact(sum(r.tensors for r in packed.roles)), exact(params), exact(stored),
                  exact(sum(r.scale_bytes for r in packed.roles)), exact(sum(r.zero_bytes for r in packed.roles)),
                  exact(sum(r.index_bytes for r in packed.roles)),
                  _bits((stored + over) * 8 / params if params else None), style="bold")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    add_names_column(grid)  # the schemes, the roles and tensors they hold, the mismatches' tensor names
    for i, (scheme, weights) in enumerate(packed.schemes.items()):
        held = ", ".join(r.role for r in packed.roles if scheme in r.schemes)
        grid.add_row("  stored as" if i == 0 else "", Text(f"{scheme}: {exact(weights)} weight"
                                                           f"{'s' if weights != 1 else ''} ({held})"))
    grid.add_row("  config", Text(f"quantization_config: {packed.declared}" if packed.declared else
                                  "no quantization_config"))
    if not packed.mismatches:
        grid.add_row("  headers", "agree with it" if packed.declared else "hold no quantised weight")
    for i, m in enumerate(packed.mismatches):
        grid.add_row("  mismatch" if i == 0 else "", Text(m.line))
    return [table, Text("bits/param: (stored + scales + zeros + index bytes) × 8 / parameters"), grid, Text("")]


def _bits(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _reconciliation(result, all_keys: bool) -> list:
    audit, report = result.audit, result.report
    complete = "complete" if audit.complete else "incomplete"
    grid = _Rows()
    grid.add_row("  matched", f"{len(audit.matched)} names, {exact(audit.parameters)} of {exact(report.total)} "
                              f"parameters: {complete}")
    _findings(grid, "missing", audit.missing, "none: every parameter is in the checkpoint", all_keys)
    _findings(grid, "unexpected", audit.unexpected, "none: every tensor is used", all_keys)
    _findings(grid, "not parameters", audit.non_parameters, "none", all_keys)
    if audit.mismatched:
        grid.add_row("  shape mismatch", f"{len(audit.mismatched)} tensors")
        for m in _cut(audit.mismatched, all_keys):
            grid.add_row("", f"{m.checkpoint_key}: checkpoint {shape(m.checkpoint_shape)}, model "
                             f"{shape(m.model_shape)}: {m.reason}")
        _more(grid, audit.mismatched, all_keys)
    else:
        grid.add_row("  shape mismatch", "none")
    if audit.renamed:
        prefix = getattr(report.model, "base_model_prefix", None) or ""
        added = [(o, n) for o, n in audit.renamed if prefix and n == f"{prefix}.{o}"]
        stripped = [(o, n) for o, n in audit.renamed if prefix and o == f"{prefix}.{n}"]
        either = set(added) | set(stripped)  # a set: a model's 100,000 names would cost 10^10 list comparisons
        other = [pair for pair in audit.renamed if pair not in either]
        if added:
            grid.add_row("  renamed", f"{len(added)} keys gain the base-model prefix '{prefix}.', as transformers "
                                      "adds it when loading")
        if stripped:
            grid.add_row("  renamed", f"{len(stripped)} keys lose the base-model prefix '{prefix}.', as "
                                      "transformers strips it when loading")
        if other:
            grid.add_row("  renamed", f"{len(other)} keys mapped the way transformers loads them "
                                      "(legacy names such as LayerNorm.gamma/beta)")
            for old_key, new_key in _cut(other, all_keys, limit=8):
                grid.add_row("", f"{old_key} → {new_key}")
            _more(grid, other, all_keys, limit=8)
    return [Text(f"Reconciliation with {report.model.class_name}", style="bold"), grid, Text("")]


# More rows than this (`--all` on a large checkpoint) are laid out by `_Rows` itself: rich lays out a table row in
# about 250 µs, so the million keys a checkpoint may list would take minutes.
_FAST_ROWS = 200
_PIECE = 4096  # rows per piece of text


class _Rows:
    """The rows (label, text) of a two-column grid: labels unwrapped, texts folded at the width left, as rich's
    Table.grid(padding=(0, 2)) lays them out, and the same text either way.

    Up to `_FAST_ROWS` rows, that grid itself. Past it, each row whose label and text are printable with one cell
    a character is laid out here with rich's own line breaking (`_breaks`), and any other row by rich, in a grid of
    its own with both columns at the widths rich gives them in the whole grid. A list of findings is added as
    one block, its rows written out only as they are laid out (a million of them at the bound)."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, Any, Any]] = []  # (label, text) or ("", items, format_each)
        self.count = 0

    def add_row(self, label: str, text: str) -> None:
        self.blocks.append((label, text, None))
        self.count += 1

    def add_rows(self, items, format_each) -> None:
        """A row with an empty label for each item, its text `format_each(item)`."""
        self.blocks.append(("", items, format_each))
        self.count += len(items)

    def rows(self) -> Iterator[tuple[str, str]]:
        for label, text, format_each in self.blocks:
            if format_each is None:
                yield label, text
            else:
                for item in text:
                    yield label, format_each(item)

    def grid(self, rows, label_width: int | None = None, text_width: int | None = None) -> Table:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, width=label_width)
        add_names_column(grid, width=text_width)  # tensor names folded where they must, their shapes whole
        for label, text in rows:
            grid.add_row(label, Text(text))  # Text: a name read from a file is never taken as markup
        return grid

    def __rich_console__(self, console, options):  # a few rows: rich's grid
        yield self.grid(self.rows())

    def pieces(self, width: int, color: bool) -> Iterator[str]:
        labels = [label for label, _, _ in self.blocks]
        label_width = max(map(len, labels), default=0)
        room = width - label_width - 2
        if (self.count <= _FAST_ROWS or _divide_line is None or room < 1 or not all(map(_one_cell_each, labels))
                or self._figure_wider_than(room)):
            yield to_text([self.grid(self.rows())], width, color)
            return
        text_width = None  # worked out (one more pass) only for a row that rich lays out
        indent = " " * (label_width + 2)
        lines: list[str] = []
        others: list[tuple[str, str]] = []
        done = 0
        for label, text in self.rows():
            if not _one_cell_each(text):
                others.append((label, text))
                continue
            if others:
                text_width = text_width or self._text_width(room)
                yield "".join(lines)
                yield to_text([self.grid(others, label_width, text_width)], width, color)
                lines, others = [], []
            first = label.ljust(label_width) + "  "
            if len(text) <= room:
                lines.append((first + text).rstrip() + "\n")
            else:
                breaks = _breaks(text, room)
                for i in range(len(breaks) - 1):
                    lines.append(((indent if i else first) + text[breaks[i]:breaks[i + 1]]).rstrip() + "\n")
            done += 1
            if done % _PIECE == 0:
                yield "".join(lines)
                lines = []
        yield "".join(lines)
        if others:
            yield to_text([self.grid(others, label_width, text_width or self._text_width(room))], width, color)

    def _figure_wider_than(self, room: int) -> bool:
        """Whether a figure in a text is wider than the texts' column can be: then the grid is not laid out as rich
        lays it out (it would fold the figure) but stacked (render/_fit.py), by rich. Only a text with a word wider
        than `room` is looked into."""
        long_word = re.compile(r"\S{%d}" % (room + 1))
        return any(long_word.search(text) and figure_width(text) > room for _, text in self.rows())

    def _text_width(self, room: int) -> int:
        """The width rich gives the texts' column of the whole grid: the widest text as rich measures it (a tab
        counts as it measures, not as it is laid out), at most `room`. The rows rich lays out are laid out in it."""
        widest = 0
        console = None
        for _, text in self.rows():
            if _one_cell_each(text):
                widest = max(widest, len(text))
            else:
                if console is None:
                    console = Console(width=room, file=io.StringIO(), highlight=False, emoji=False)
                widest = max(widest, Measurement.get(console, console.options, Text(text)).maximum)
        return min(widest, room)


def _one_cell_each(text: str) -> bool:
    """Printable (no newline, tab or control character: rich would act on them), and each character one cell wide
    (ASCII, or such as ×): then rich's layout counts characters."""
    return text.isprintable() and (text.isascii() or cell_len(text) == len(text))


def _breaks(text: str, width: int) -> list[int]:
    """0, where rich's divide_line(text, width, fold=True) breaks `text`, and len(text). For a text of words parted
    by single spaces (what audit writes), found with str.rfind: a line holds every word that ends within `width`
    of its start, and a word longer than the line is cut every `width` characters from a line of its own, its last
    piece starting the next line; any other text, by divide_line itself."""
    if "  " in text or text[:1] == " " or text[-1:] == " ":
        return [0, *_divide_line(text, width, fold=True), len(text)]
    breaks = [0]
    start, end = 0, len(text)
    while end - start > width:
        space = text.rfind(" ", start, start + width + 1)
        if space > start:  # the words up to it fit
            start = space + 1
            breaks.append(start)
            continue
        if text[start] == " ":  # the line is the lone last piece of a cut word, its space: the next word cannot fit
            start += 1
            breaks.append(start)
            continue
        word_end = text.find(" ", start)
        word_end = end if word_end < 0 else word_end + 1  # the word with its space, as divide_line cuts it
        while word_end - start > width:
            start += width
            breaks.append(start)
    breaks.append(end)
    return breaks


try:  # rich's own line breaking, which Text.wrap uses; without it, rich lays out every row
    from rich._wrap import divide_line as _divide_line
except ImportError:  # pragma: no cover - another rich
    _divide_line = None


def _findings(grid: _Rows, title: str, findings, empty: str, all_keys: bool) -> None:
    if not findings:
        grid.add_row(f"  {title}", empty)
        return
    total = sum(map(math.prod, map(_shape, findings)))  # C loops: a list may hold a million findings
    grid.add_row(f"  {title}", f"{len(findings)} tensor{'s' if len(findings) != 1 else ''}, "
                               f"{exact(total)} elements")
    shapes: dict = {}  # shape() of each distinct shape once

    def row(f) -> str:
        dims = shapes.get(f.shape)
        if dims is None:
            dims = shapes[f.shape] = shape(f.shape)
        return f"{f.name} {dims}: {f.reason}"

    grid.add_rows(_cut(findings, all_keys), row)
    _more(grid, findings, all_keys)


def _loading(result) -> Group | None:
    audit, cls = result.audit, result.report.model.class_name
    grid = Table.grid(padding=(0, 2))
    add_names_column(grid)  # the lists of tensor names transformers would print
    # Findings are sorted by name, and their reasons are shared strings: a million of them cost C loops only.
    if audit.missing:
        grid.add_row(Text(f"  newly initialised in {cls} (not in the checkpoint): {_names(audit.missing)}"))
        if all("newly initialised, must be trained" in reason for reason in set(map(_reason, audit.missing))):
            grid.add_row("    expected for a new task head: train it (fine-tune) before use")
    if audit.unexpected:
        grid.add_row(Text(f"  not used by {cls} (in the checkpoint only): {_names(audit.unexpected)}"))
        if all("does not have" in reason for reason in set(map(_reason, audit.unexpected))):
            grid.add_row(Text(f"    expected: they belong to heads or parts that {cls} does not have"))
    if not grid.rows:
        return None
    return Group(Text("What transformers reports when loading it", style="bold"), grid, Text(""))


def _names(findings, limit: int = 8) -> str:
    shown = ", ".join(f.name for f in findings[:limit])
    return shown + (f" … and {len(findings) - limit} more" if len(findings) > limit else "")


def _cut(items, all_keys: bool, limit: int = LIST_LIMIT):
    return items if all_keys else items[:limit]


def _more(grid: _Rows, items, all_keys: bool, limit: int = LIST_LIMIT) -> None:
    if not all_keys and len(items) > limit:
        grid.add_row("", f"… and {len(items) - limit} more (--all lists them)")


_shape, _reason = attrgetter("shape"), attrgetter("reason")


