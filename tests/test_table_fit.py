"""The table layouts of render/_fit.py on tables built here: left as rich lays them out where no figure is cut;
else figure columns at full width and prose wrapped; else turned on its side (a few rows) or stacked."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.table import Table

from paramscope.render._console import to_text
from paramscope.render._fit import add_names_column, figure_width, fitted, holds



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


def tensors(rows: int = 8) -> Table:
    """A list of tensors: their names (a column of names) heading the rows, then their figures and a word."""
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    add_names_column(t, "tensor")
    t.add_column("elements", justify="right")
    t.add_column("shape", no_wrap=True)
    for i in range(rows):
        t.add_row(f"model.layers.{i}.self_attn.q_proj.weight_packed", f"{16_777_216 + i:,}", "4096×512")
    return t


def test_columns_say_what_they_hold_and_a_figure_among_names_is_found_whole():
    assert [holds(c) for c in tensors().columns] == ["names", "figure", "figure"]
    assert [holds(c) for c in table().columns] == ["prose", "figure", "figure", "prose"]
    assert figure_width("model.layers.0.weight 4096×4096: 16,777,216 elements (1.608e10)") == 10
    assert figure_width("model.layers.0.weight: no figure") == 0


def test_names_heading_rows_are_whole_as_heads_where_the_width_allows_else_they_fold():
    at50 = to_text([tensors()], 50).splitlines()  # names of 45 characters: stacked, each heads its rows whole
    assert at50[:4] == ["  model.layers.0.self_attn.q_proj.weight_packed", "    elements: 16,777,216",
                        "    shape:    4096×512", "  model.layers.1.self_attn.q_proj.weight_packed"]
    at40 = [line.split() for line in to_text([tensors()], 40).splitlines()]  # no room for a whole name: folded
    assert at40[1:5] == [["tensor", "elements", "shape"], ["─" * 38], ["model.layers.0", "16,777,216", "4096×512"],
                         [".self_attn.q_p"]]
    grid = Table.grid(padding=(0, 2))  # a label/value grid: its names fold, the grid stays
    grid.add_column(no_wrap=True)
    add_names_column(grid)
    grid.add_row("  unexpected", "model.layers.0.self_attn.q_proj.weight_packed 4096×512: unused when loaded")
    assert fitted(grid, console(40), 40) is grid
    assert to_text([grid], 40).splitlines() == [
        "  unexpected  model.layers.0.self_attn.q", "              _proj.weight_packed",
        "              4096×512: unused when", "              loaded"]


def test_stacked_values_too_narrow_beside_their_labels_go_under_them():
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("count")
    t.add_column("exact", justify="right")
    t.add_column("why it is what it is", overflow="fold", ratio=1)
    for label in ("unique parameters", "with tied duplicates"):
        t.add_row(label, "164,224", "every tensor once, by identity (of 164,224)")
    lines = to_text([t], 26).splitlines()  # beside "    why it is what it is:", 0 columns would be left
    assert lines[:7] == ["  unique parameters", "    exact:", "      164,224", "    why it is what it is:",
                         "      every tensor once,", "      by identity (of", "      164,224)"]
    assert max(map(len, lines)) <= 26
