"""The layouts and pipeline-stage tables at 80 and 120 columns (issue 28, a newcomer's trial: at 80 columns the
find-layout table became a card a layout, and the stage table took three shapes: a table, turned on its side, cards).
Both keep one shape now: a row a layout or a stage, each figure in its column's one unit (named in the header), and a
legend line; the find-layout table leaves out its communication by kind where a row would need more than two lines
for it, and says so. Golden outputs of the tables, at the two widths, from answers read from recorded cost facts."""

from __future__ import annotations

import pytest

import paramscope
from paramscope.cli import main
from paramscope.render.layout_search import render_layout_search_text

PIPELINE = ["memory", "llama-3-8b", "--training", "--pp", "4", "--micro-batches", "8", "--batch", "8", "--seq", "4096"]

STAGES_80 = """\
Pipeline stages: 32 layers, 8 a stage; the embeddings on stage 0, the final norm
and head on stage 3; microbatches of 1 sequence; bubble 27.3% of the step ((pp −
1) / (v·m + pp − 1))

                               in   weights   grads   optim    acts    peak
 stage   layers            flight       GiB     GiB     GiB     GiB     GiB
 ──────────────────────────────────────────────────────────────────────────
     0   embeddings, 0–7        4      8.46    8.46   16.91   42.78   76.92
     1   8–15                   3      6.50    6.50   13.00   32.07   58.39
     2   16–23                  2      6.50    6.50   13.00   21.38   47.70
     3   24–31, head            1      8.46    8.46   16.91   13.72   51.46

  in GiB (2³⁰ B), one device of each stage; in flight: microbatches; grads:
  gradients; optim: optimizer states; acts: activations saved; peak: the stage's
  largest moment, not the columns' sum (bold: the largest); exact bytes in
  --json"""

# the same table at 120: its title and legend lines wrap to the width, the table keeps its columns
STAGES_120_LINES = """\
Pipeline stages: 32 layers, 8 a stage; the embeddings on stage 0, the final norm and head on stage 3; microbatches of 1
sequence; bubble 27.3% of the step ((pp − 1) / (v·m + pp − 1))"""

# interleaved: two runs of layers a stage, which wrap between runs where the width is short
INTERLEAVED_80 = """\
                                   in   weights   grads   optim    acts    peak
 stage   layers                flight       GiB     GiB     GiB     GiB     GiB
 ──────────────────────────────────────────────────────────────────────────────
     0   embeddings, 0–3,          11      8.46    8.46   16.91   59.18   93.07
         16–19
     1   4–7, 20–23                 9      6.50    6.50   13.00   48.39   74.46
     2   8–11, 24–27                7      6.50    6.50   13.00   37.64   63.70
     3   12–15, 28–31, head         5      8.46    8.46   16.91   29.91   67.66"""

INTERLEAVED_120 = """\
                                      in   weights   grads   optim    acts    peak
 stage   layers                   flight       GiB     GiB     GiB     GiB     GiB
 ─────────────────────────────────────────────────────────────────────────────────
     0   embeddings, 0–3, 16–19       11      8.46    8.46   16.91   59.18   93.07"""


def _out(capsys, argv) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def _block(text: str, first: str, last: str) -> str:
    """The lines of `text` from the one starting with `first` to the one ending with `last`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    end = next(i for i in range(start, len(lines)) if lines[i].endswith(last))
    return "\n".join(lines[start:end + 1])


def _fits(text: str, width: int) -> None:
    """No line wider than `width`, no cell cut ("…" only in "… 6 more that fit")."""
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text.replace("\n  … ", "\n")


@pytest.mark.parametrize("width", [80, 120])
def test_the_stage_table_is_one_table_at_80_and_120(capsys, width):
    text = _out(capsys, [*PIPELINE, "--width", str(width)])
    _fits(text, width)
    block = _block(text, "Pipeline stages", "--json")
    if width == 80:
        assert block == STAGES_80
    else:  # the table itself is the same at both widths
        assert block.startswith(STAGES_120_LINES + "\n\n" + "\n".join(STAGES_80.splitlines()[4:11]) + "\n\n")


def test_the_stage_table_keeps_its_shape_under_every_layout(capsys):
    """Interleaved, context, tensor and 8 stages: the same header, a row a stage (none turned on its side or
    stacked, as 4 stages were at 80 columns and 8 or the interleaved runs were)."""
    header = STAGES_80.splitlines()[4:7]
    wide = _out(capsys, [*PIPELINE, "--virtual-stages", "2", "--width", "120"])
    assert _block(wide, "                                      in", "67.66").startswith(INTERLEAVED_120)
    narrow = _out(capsys, [*PIPELINE, "--virtual-stages", "2", "--width", "80"])
    _fits(narrow, 80)
    assert _block(narrow, "                                   in", "67.66") == INTERLEAVED_80
    for extra in (["--cp", "2"], ["--tp", "2"], ["--pp", "8"]):
        text = _out(capsys, [*PIPELINE, *extra, "--width", "80"])
        _fits(text, 80)
        table = _block(text, "                               in", "GiB").splitlines()
        assert [line.split() for line in table] == [line.split() for line in header[:2]], extra
        stages = int(extra[1]) if extra[0] == "--pp" else 4
        assert [row[0] for row in _stage_rows(text)] == [str(s) for s in range(stages)], extra
        assert all(len(row) == 7 for row in _stage_rows(text))  # stage, in flight and 5 figures a row


def _stage_rows(text: str) -> list[list[str]]:
    """The stage table's rows: the stage, its in-flight count and figures (a wrapped run of layers left out)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Pipeline stages"))
    rule = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith("───"))
    end = next(i for i in range(rule, len(lines)) if not lines[i].strip())
    rows = [line.split() for line in lines[rule + 1:end] if line.split()[0].isdigit()]
    return [[row[0], *(cell for cell in row[1:] if cell.replace(".", "").isdigit())] for row in rows]


@pytest.fixture(scope="module")
def search():
    """Qwen2.5-0.5B on 8 RTX 4090s at 1,024 tokens, DDP: a search with accumulating and pipelined layouts."""
    return paramscope.find_layout("qwen2.5-0.5b", paramscope.SearchOptions(devices=8, gpu="rtx-4090", seq=1024,
                                                                          zero="0"))


LAYOUTS_120 = """\
                                  peak   step ≥   bubble   comm   by kind
  #   dp   tp   pp   cp   accum    GiB        s        %    GiB   GiB
 ─────────────────────────────────────────────────────────────────────────────────────────────────────
  1    4    2    1    1       2   6.75   0.0203        —   3.10   dp 2.76 tp 0.335
  2    8    1    1    1       1   9.71   0.0203        —   3.22   dp 3.22
  3    2    2    1    2       4   5.45   0.0203        —   5.89   dp 5.52 tp 0.335 cp 0.0352
  4    4    1    1    2       2   9.94   0.0203        —   6.48   dp 6.44 cp 0.0352
  5    1    2    1    4       8   4.80   0.0203        —   11.5   dp 11.0 tp 0.335 cp 0.105
  6    2    1    1    4       4   9.11   0.0203        —   13.0   dp 12.9 cp 0.105
  7    1    1    1    8       8   8.70   0.0203        —   26.0   dp 25.8 cp 0.246
  8    1    2    2    2       —   3.61   0.0285     11.1   1.22   dp 0.587 tp 0.335 pp 0.260 cp 0.0352
  9    1    1    2    4       —   5.75   0.0285     11.1   2.38   dp 1.76 pp 0.514 cp 0.105
 10    2    2    2    1       —   4.69   0.0317     20.0   1.18   dp 0.587 tp 0.335 pp 0.260

  … 6 more that fit (--json lists them all)
  GiB = 2³⁰ B; accum: micro-steps a step (—: a pipeline's microbatches instead); peak: the busiest device's; step ≥: the
  bound below; bubble —: no pipeline; comm: the bytes it sends a step, a bound; exact bytes in --json"""

LAYOUTS_80 = """\
                                  peak   step ≥   bubble   comm
  #   dp   tp   pp   cp   accum    GiB        s        %    GiB
 ──────────────────────────────────────────────────────────────
  1    4    2    1    1       2   6.75   0.0203        —   3.10
  2    8    1    1    1       1   9.71   0.0203        —   3.22
  3    2    2    1    2       4   5.45   0.0203        —   5.89
  4    4    1    1    2       2   9.94   0.0203        —   6.48
  5    1    2    1    4       8   4.80   0.0203        —   11.5
  6    2    1    1    4       4   9.11   0.0203        —   13.0
  7    1    1    1    8       8   8.70   0.0203        —   26.0
  8    1    2    2    2       —   3.61   0.0285     11.1   1.22
  9    1    1    2    4       —   5.75   0.0285     11.1   2.38
 10    2    2    2    1       —   4.69   0.0317     20.0   1.18

  … 6 more that fit (--json lists them all)
  GiB = 2³⁰ B; accum: micro-steps a step (—: a pipeline's microbatches instead);
  peak: the busiest device's; step ≥: the bound below; bubble —: no pipeline;
  comm: the bytes it sends a step, a bound; exact bytes in --json; not shown at
  this width: comm by kind (at --width 85 or more; the first's below)"""


@pytest.mark.parametrize("width, golden, last", [(120, LAYOUTS_120, "in --json"), (80, LAYOUTS_80, "below)")])
def test_the_layouts_table_at_80_and_120(search, width, golden, last):
    text = render_layout_search_text(search.report, search, width)
    _fits(text, width)
    assert _block(text, "                                  peak", last) == golden


def test_the_layouts_table_packs_by_kind_in_two_lines_or_leaves_it_out(search):
    """Between the widths: by kind where every row packs it in two lines (at 85, as the legend at 80 says), a row
    over two lines never; below the rest's width the bubble column goes next, named."""
    at85 = render_layout_search_text(search.report, search, 85)
    _fits(at85, 85)
    lines = at85.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  1 "))
    rows = lines[first:lines.index("", first)]
    assert "dp 0.587 tp 0.335" in rows[-2] and rows[-1].split() == ["pp", "0.260"]  # row 10: two lines
    assert "not shown" not in at85
    at84 = render_layout_search_text(search.report, search, 84)
    assert "not shown at this width: comm by kind (at --width 85 or more" in " ".join(at84.split())
    at60 = " ".join(render_layout_search_text(search.report, search, 60).split())
    assert "not shown at this width: comm by kind, bubble (at --width 85 or more" in at60
    assert "bubble —: no pipeline" not in at60 and "# dp tp pp cp accum GiB s GiB" in at60


def test_flops_names_an_interleaved_stages_runs(capsys):
    """flops' stage table and its device's title name each run of an interleaved stage's layers (they read
    "0–19 (8)" for 0–3 and 16–19, the first and last alone), in memory's shape: a row a stage at 80 columns."""
    text = _out(capsys, ["flops", "llama-3-8b", "--training", "--pp", "4", "--virtual-stages", "2", "--micro-batches",
                         "8", "--batch", "8", "--seq", "4096", "--width", "80"])
    _fits(text, 80)
    assert "stage 3 (layers 12–15, 28–31, the head: the busiest)" in " ".join(text.split())
    assert [line.split()[:4] for line in text.splitlines() if line[:6].strip().isdigit()] == [
        ["0", "embeddings,", "0–3,", "16–19"], ["1", "4–7,", "20–23", "1.319e14"], ["2", "8–11,", "24–27", "1.319e14"],
        ["3", "12–15,", "28–31,", "head"]]
