"""The table layouts of render/_fit.py on tables built here: left as rich lays them out where no figure is cut;
else figure columns at full width and prose wrapped; else turned on its side (a few rows) or stacked."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table

from paramscope.render._console import to_text
from paramscope.render._fit import fitted



def table(rows: int = 2) -> Table:
    t = Table(title="Sizes", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("name")
    t.add_column("bytes", justify="right")
    t.add_column("", justify="right")
    t.add_column("how")
    for i in range(rows):
        t.add_row(f"tensor {i}", f"{4_617_396_224 + i:,}", "4.30 GiB",
                  "every layer's weights, quantised to four and a half bits a weight, as llama-quantize writes them")
    return t


def rich_alone(renderable, width: int) -> str:
    out = io.StringIO()
    Console(width=width, file=out, no_color=True).print(renderable)
    return out.getvalue()


def console(width: int) -> Console:
    return Console(width=width, file=io.StringIO())


def test_a_table_that_fits_is_left_as_it_is():
    small = table()
    assert fitted(small, console(200), 200) is small


def caches() -> Table:
    t = Table(title="Caches", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("kind", "layers", "on GPU", "cells", "bytes", "one layer"):
        t.add_column(name, justify="right" if name in ("layers", "on GPU", "cells", "bytes") else "left")
    for kind, cells, total in (("full attention", 8_192, 1_073_741_824), ("sliding window", 4_096, 536_870_912)):
        t.add_row(kind, "32", "32", f"{cells:,}", f"{total:,}", f"(K 1,024 × 2 B + V 1,024 × 2 B) × {cells:,} cells")
    return t


def test_figure_columns_keep_their_width_and_prose_wraps():
    assert "1,073,741,…" in rich_alone(caches(), 70)  # rich shrinks every column alike, the figures too
    text = to_text([caches()], 70)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 70
    rows = [line.split() for line in text.splitlines()]
    assert ["full", "32", "32", "8,192", "1,073,741,824", "(K", "1,024", "×", "2", "B", "+"] in rows
    assert ["sliding", "32", "32", "4,096", "536,870,912", "(K", "1,024", "×", "2", "B", "+"] in rows
    assert ["attention", "V", "1,024", "×", "2", "B)", "×"] in rows  # the prose and the labels wrap between words
    assert ["8,192", "cells"] in rows


def test_too_narrow_a_table_of_few_rows_turns_and_many_rows_stack():
    wide = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    wide.add_column("layer")
    for name in ("query", "key", "value", "output", "gate", "up", "down"):
        wide.add_column(name, justify="right")
    for layer in range(2):
        wide.add_row(f"layer {layer}", *(f"{16_777_216 + i + 10 * layer:,}" for i in range(7)))
    assert "…" in rich_alone(wide, 50)  # what rich makes of it: figures cut
    turned = to_text([wide], 50).splitlines()
    assert turned[1].split() == ["layer", "0", "layer", "1"]  # a column a row
    assert [line.split() for line in turned[3:5]] == [["query", "16,777,216", "16,777,226"],
                                                      ["key", "16,777,217", "16,777,227"]]
    stacked = to_text([table(8)], 40)
    assert "    bytes: 4,617,396,231 (4.30 GiB)" in stacked.splitlines()  # "column: value", its units beside
    assert "…" not in stacked and max(len(line) for line in stacked.splitlines()) <= 40


def test_a_no_wrap_header_wraps_instead_of_being_cut():
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("accelerator", "memory", "largest batch", "largest context"):
        t.add_column(name, justify="right" if name != "accelerator" else "left", no_wrap=True)
    t.add_row("RTX 4090", "24.00 GiB", "4", "8,192")
    assert "largest con…" in rich_alone(t, 50)
    text = to_text([t], 50)  # here the headers wrap between their words over full-width figure columns
    assert "…" not in text
    assert [line.split() for line in text.splitlines()][1:5] == [
        ["largest", "largest"], ["accelerator", "memory", "batch", "context"], ["─" * 43],
        ["RTX", "4090", "24.00", "GiB", "4", "8,192"]]
