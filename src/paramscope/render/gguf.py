"""`paramscope audit FILE.gguf`: a GGUF checkpoint's header as text (a pure function of the data and a width).

The JSON document is `GGUFCheckpoint.to_dict` (checkpoint/gguf_read.py), printed as it is.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

from .memory import binary

LIST_LIMIT = 20  # tensors listed unless every one is asked for


def render_gguf_json(ck: Any, reconciliation: Any = None, *, indent: int | None = 2) -> str:
    document = ck.to_dict()
    if reconciliation is not None:
        document["reconcile"] = reconciliation.to_dict()
    return json.dumps({"checkpoint": document}, indent=indent, ensure_ascii=False) + "\n"


def reconcile_lines(rec: Any, width: int, *, all_rows: bool = False) -> list[str]:
    """The file against the class built from its metadata: one verdict line, then the differences (every one) and
    the roles that differ, or the matches' ways of storing that are not "as is" when all is equal."""
    if rec.cannot is not None:
        return [f"cannot reconcile: {rec.cannot}", ""]
    extra = rec.explained_extra
    if rec.equal:
        tail = f" + {extra:,} in tensors no parameter holds (below)" if extra else ""
        head = (f"reconciles with {rec.class_name}: equal — {rec.class_parameters:,} parameters, "
                f"{len(rec.matches):,} parameters each matched to its GGUF tensor(s) at its shape and role{tail}")
    else:
        wrong = sum(1 for d in rec.differences if not d.explained)
        head = (f"does not reconcile with {rec.class_name}: {wrong:,} difference{'s' * (wrong != 1)} — the file "
                f"{rec.file_parameters:,} parameters, the class {rec.class_parameters:,}, "
                f"{rec.matched_parameters:,} matched")
    out = _wrap(head, width)
    ways: dict[str, int] = {}
    for m in rec.matches:
        if m.how != "as is":
            ways[m.how] = ways.get(m.how, 0) + 1
    for how, n in ways.items():
        out += _wrap(f"{n:,} tensor{'s' * (n != 1)}: {how}", width, "  ")
    if rec.differences:
        shown = rec.differences if all_rows else rec.differences[:LIST_LIMIT]
        out += ["", "Differences"]  # one a line, the reason whole: it is what the reader came for
        out += [f"  {d.name} ({d.kind}, {d.elements:,} parameters): {'explained: ' if d.explained else ''}{d.why}"
                for d in shown]
        if len(shown) < len(rec.differences):
            out.append(f"  … and {len(rec.differences) - len(shown):,} more (--all lists every one)")
    unequal = [(role, f"{f:,}", f"{c:,}") for role, (f, c) in rec.roles.items() if f != c]
    if unequal:
        out += [""] + _table("Roles that differ", ("role", "file", "class"), unequal, width)[:-1]
    return out + [""]




def _bpw(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _wrap(text: str, width: int, indent: str = "", more: str = "    ") -> list[str]:
    """`text` over lines of `width`, broken between words only: a figure or a name is never cut."""
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + more, break_long_words=False,
                         break_on_hyphens=False) or [indent]


def _table(title: str, header: tuple[str, ...], rows: list[tuple[str, ...]], width: int) -> list[str]:
    """Aligned columns where they fit `width`; else each row stacked, its first cell then `column value` pairs
    wrapped between pairs (as render/_fit.py stacks a rich table): no figure is cut."""
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = "  ".join(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))
        return f"  {first}  {rest}".rstrip()

    if len(line(header)) <= width and all(len(line(r)) <= width for r in rows):
        return [title, line(header), *(line(r) for r in rows), ""]
    stacked = [title]
    for row in rows:
        # each "column value" pair kept on one line (no break inside "72.00 KiB")
        pairs = [f"{name} {value}".replace(" ", "\u00a0") for name, value in zip(header[1:], row[1:])]
        stacked.append(f"  {row[0]}")
        stacked += [line.replace("\u00a0", " ") for line in textwrap.wrap(
            ", ".join(pairs), width, initial_indent="    ", subsequent_indent="    ", break_long_words=False,
            break_on_hyphens=False)]
    return stacked + [""]


def _grouped(rows: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    return [(key, f"{r['tensors']:,}", f"{r['elements']:,}", f"{r['bytes']:,}", binary(r["bytes"]),
             _bpw(r["bits_per_weight"])) for key, r in rows.items()]


def render_gguf_text(ck: Any, width: int = 100, *, all_tensors: bool = False, reconciliation: Any = None) -> str:
    """Header, the model's shape from its metadata, bytes and bits per weight by ggml type and by role, and the
    tensors (the first LIST_LIMIT unless `all_tensors`)."""
    width = max(width, 20)
    meta = ck.metadata
    files = f" ({len(ck.files)} shards)" if len(ck.files) > 1 else ""
    out = [*_wrap(f"GGUF checkpoint {ck.path}{files}: GGUF v{ck.version}, {len(ck.tensors):,} tensors, "
                  f"{ck.elements:,} parameters (unpacked), {ck.nbytes:,} bytes of tensor data ({binary(ck.nbytes)}), "
                  f"{_bpw(ck.bits_per_weight)} bits per weight", width), ""]
    model = [("architecture", str(ck.architecture or "-"))]
    for key in ("general.name", "general.file_type", "general.quantization_version"):
        if key in meta and not isinstance(meta[key], (dict, tuple, list)) and not hasattr(meta[key], "keys"):
            value = meta[key]
            if key == "general.file_type":
                value = _file_type(value)
            model.append((key.removeprefix("general."), str(value)))
    for key, value in ck.hparams().items():
        model.append((key, ", ".join(map(str, value)) if isinstance(value, list) else str(value)))
    pad = max(len(k) for k, _ in model)
    out += ["Model (from the metadata)"]
    for key, value in model:  # a long value (a list per layer) wraps under itself
        out += textwrap.wrap(f"{key.ljust(pad)}  {value}", width, initial_indent="  ",
                             subsequent_indent=" " * (pad + 4), break_long_words=False, break_on_hyphens=False)
    out.append("")
    if reconciliation is not None:
        out += reconcile_lines(reconciliation, width, all_rows=all_tensors)
    header = ("", "tensors", "parameters", "bytes", "size", "bits/weight")
    out += _table("By ggml type", ("type", *header[1:]), _grouped(ck.by_type()), width)
    out += _table("By role", ("role", *header[1:]), _grouped(ck.by_role()), width)
    shown = ck.tensors if all_tensors else ck.tensors[:LIST_LIMIT]
    rows = [(t.name, t.ggml_type, "×".join(map(str, t.shape)) or "scalar", f"{t.elements:,}", f"{t.nbytes:,}",
             t.role) for t in shown]
    out += _table("Tensors", ("name", "type", "shape", "parameters", "bytes", "role"), rows, width)[:-1]
    if len(shown) < len(ck.tensors):
        out.append(f"  … and {len(ck.tensors) - len(shown):,} more (--all lists every tensor)")
    return "\n".join(out) + "\n"


def _file_type(value: Any) -> str:
    try:
        import gguf

        return f"{gguf.LlamaFileType(value).name.removeprefix('MOSTLY_')} ({value})"
    except (ImportError, ValueError, TypeError):
        return str(value)
