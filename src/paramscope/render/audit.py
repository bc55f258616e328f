"""`paramscope audit`, `inspect --explain-counts` and `inspect --heads`: pure functions of data and width → text.

The JSON producers live on the data (`AuditResult.to_dict`, `CountsExplanation.to_dict`, `Heads.to_dict`);
`render_audit_json` is the document `audit --json` prints.
"""

from __future__ import annotations

import json as _json

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..explain import exact
from ._console import indented, shape, to_text, wrap_words

LIST_LIMIT = 20  # longer lists of keys are cut (with a count) unless every key is asked for


def render_audit_text(result, width: int = 100, *, color: bool = False, all_keys: bool = False) -> str:
    parts = [_header(result, width), _dtypes(result.checkpoint), _reconciliation(result, all_keys)]
    loading = _loading(result)
    if loading is not None:
        parts.append(loading)
    parts.append(counts_table(result.counts))
    return to_text(parts, width, color)


def render_audit_json(result, *, indent: int | None = 2) -> str:
    return _json.dumps(result.to_dict(), indent=indent, ensure_ascii=False)


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
        table.add_row(line.label, value, line.explanation, style="bold" if line.key == "unique" else None)
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
    grid.add_column(overflow="fold")
    room = width - len("  checkpoint") - 2  # the labels' column and the grid's padding

    def paths(text: str) -> str:  # broken between words and after a '/', never inside a folder's name
        return "\n".join(wrap_words(text, room))

    grid.add_row("  checkpoint", paths(f"{ck.path} ({ck.format}, {files} file{'s' if files != 1 else ''}, "
                                       f"{len(ck.tensors)} tensors)"))
    grid.add_row("  found", paths(result.located.description))
    if report.model.source.split(" ", 1)[-1] != result.located.description.split(" ", 1)[-1]:
        grid.add_row("  config", paths(report.model.source))
    grid.add_row("  class", f"{report.model.class_name}: {report.model.class_reason}")
    grid.add_row("  read", "headers only: no tensor data was read")
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
    table.add_row("total", exact(len(ck.tensors)), exact(ck.elements), f"{exact(ck.nbytes)} ({_mib(ck.nbytes)})",
                  style="bold")
    packed = [t for t in ck.tensors if t.role == "packed"]
    for t in packed[:LIST_LIMIT]:
        logical = "unknown from headers" if t.logical_numel is None else exact(t.logical_numel)
        table.add_row(f"  packed {t.name}", "", f"{exact(t.numel)} stored", f"logical {logical} ({t.packing})")
    return table


def _reconciliation(result, all_keys: bool) -> Group:
    audit, report = result.audit, result.report
    complete = "complete" if audit.complete else "incomplete"
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
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
        other = [pair for pair in audit.renamed if pair not in added and pair not in stripped]
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
    return Group(Text(f"Reconciliation with {report.model.class_name}", style="bold"), grid, Text(""))


def _findings(grid: Table, title: str, findings, empty: str, all_keys: bool) -> None:
    if not findings:
        grid.add_row(f"  {title}", empty)
        return
    total = sum(_numel(f.shape) for f in findings)
    grid.add_row(f"  {title}", f"{len(findings)} tensor{'s' if len(findings) != 1 else ''}, "
                               f"{exact(total)} elements")
    for f in _cut(findings, all_keys):
        grid.add_row("", f"{f.name} {shape(f.shape)}: {f.reason}")
    _more(grid, findings, all_keys)


def _loading(result) -> Group | None:
    audit, cls = result.audit, result.report.model.class_name
    grid = Table.grid(padding=(0, 2))
    grid.add_column(overflow="fold")
    if audit.missing:
        names = sorted(f.name for f in audit.missing)
        grid.add_row(f"  newly initialised in {cls} (not in the checkpoint): {_names(names)}")
        if all("newly initialised, must be trained" in f.reason for f in audit.missing):
            grid.add_row("    expected for a new task head: train it (fine-tune) before use")
    if audit.unexpected:
        names = sorted(f.name for f in audit.unexpected)
        grid.add_row(f"  not used by {cls} (in the checkpoint only): {_names(names)}")
        if all("does not have" in f.reason for f in audit.unexpected):
            grid.add_row(f"    expected: they belong to heads or parts that {cls} does not have")
    if not grid.rows:
        return None
    return Group(Text("What transformers reports when loading it", style="bold"), grid, Text(""))


def _names(names: list[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" … and {len(names) - limit} more" if len(names) > limit else "")


def _cut(items, all_keys: bool, limit: int = LIST_LIMIT):
    return items if all_keys else items[:limit]


def _more(grid: Table, items, all_keys: bool, limit: int = LIST_LIMIT) -> None:
    if not all_keys and len(items) > limit:
        grid.add_row("", f"… and {len(items) - limit} more (--all lists them)")


def _numel(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"
