"""The memory text's cells: bytes in binary units, a column's one unit, dtypes' short names, shares, a pipeline
stage's layers in words. Pure functions of their data; shared by the serving, training, layout and fits tables."""

from __future__ import annotations


def binary(n: int) -> str:
    """1,073,741,824 → '1.00 GiB'; small values in B, KiB, MiB. A value reaches the next unit at 1,000 of its own
    (1,048,576,000 B → '0.98 GiB', not '1000.00 MiB'), so no figure is written with four digits before its point.
    The one byte formatter of the text and pages."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if round(abs(value), 2) < 1000 or unit == "TiB":  # as written: 999.996 would print as 1000.00
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{n} B"


def short_dtype(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)


def share(value: int, total: int) -> str:
    return f"{100 * value / total:.1f}%" if total else "—"


def table_unit(values) -> tuple[str, int]:
    """The binary unit a column of byte figures is written in (its name for the header, its size): the one binary()
    writes the largest in, so that every figure of the column reads in one unit."""
    largest = max((abs(v) for v in values), default=0)
    for name, size in (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30)):
        if round(largest / size, 2) < 1000:
            return name, size
    return "TiB", 2**40


def in_unit(value: int, unit: tuple[str, int]) -> str:
    """`value` bytes in `unit`, two decimals ("0" for none: a true zero, not a rounded one; bytes whole)."""
    name, size = unit
    if value == 0:
        return "0"
    return f"{value:,}" if size == 1 else f"{value / size:,.2f}"


def unit_words(unit: tuple[str, int]) -> str:
    """"in GiB (2³⁰ B)": a table's unit, said once in its legend."""
    name = unit[0]
    return "in bytes" if name == "B" else f"in {name} ({UNIT_POWERS[name]} B)"


UNIT_POWERS = {"KiB": "2¹⁰", "MiB": "2²⁰", "GiB": "2³⁰", "TiB": "2⁴⁰"}


def stage_layers(stage) -> str:
    return stage_layers_words(stage.first, stage.chunks, stage.last)


def stage_layers_words(first: bool, runs, last: bool) -> str:
    """"embeddings, 0–19": what a pipeline stage holds in the model's order (the embeddings, its runs of layers,
    (first, last) each, the head), a comma between each, so that a narrow column wraps between them."""
    parts = (["embeddings"] if first else []) + [f"{a}–{b}" if a != b else str(a) for a, b in runs] + (
        ["head"] if last else [])
    return ", ".join(parts) or "—"
