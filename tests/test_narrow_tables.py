"""Tables at narrow widths never cut a figure (render/_fit.py): rich's "14.23 …" and "4,617,39…" are gone.

Each command's answer is computed once (the CLI's own render call, spied on), then rendered at 60, 70 and 80
columns and compared with the same answer at 200 columns, where nothing is cut: every figure of the wide text is
in the narrow one, whole, as often; no line is wider than the width; the only "…" are the prose's own.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections import Counter

import pytest
from paramscope.cli import main

WIDE = 200
NARROW = (60, 70, 80)
# 4,617,396,224 · 14.23 · 1.608e10 · 2.08: a figure cut or folded anywhere leaves a token not in the wide text
FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")


def assert_figures_whole(wide: str, narrow: str, width: int) -> None:
    assert max(len(line) for line in narrow.splitlines()) <= width
    assert not re.search(r"\d…|…\d", narrow), "a figure cut with …"
    assert narrow.count("…") == wide.count("…")  # the prose's own ellipses only, as at full width
    assert Counter(FIGURE.findall(narrow)) == Counter(FIGURE.findall(wide))


def answer(argv: list[str], module, name: str):
    """The render function and the arguments the CLI gives it, from one run of the command (its width last)."""
    original = getattr(module, name)
    seen: list = []

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO()):
        patch.setattr(module, name, spy)
        assert main([*argv, "--width", "100"]) == 0
    (args, kwargs), = seen
    kwargs.pop("color", None)
    return lambda width: original(*args[:-1], width, **kwargs)


def _render(module_name: str, name: str, argv: list[str]):
    import importlib

    return answer(argv, importlib.import_module(f"paramscope.render.{module_name}"), name)


COMMANDS = {
    "serve": ("serve", "render_serve_text", ["serve", "llama-3-8b", "--gpu", "H100"]),
    "llama.cpp": ("llama_cpp", "render_llama_cpp_text",
                  ["memory", "llama-3-8b", "--engine", "llama.cpp", "--gpu", "RTX4090", "--dtype", "Q4_K_M"]),
    "memory": ("memory", "render_memory_text", ["memory", "llama-3-8b", "--gpu", "H100"]),
    "vllm": ("vllm", "render_vllm_text",
             ["memory", "llama-3-8b", "--engine", "vllm", "--gpu", "H100", "--max-model-len", "8192", "--tp", "2"]),
    "training": ("memory", "render_memory_text", ["memory", "llama-3-8b", "--training", "--dp", "4", "--tp", "2"]),
    "flops": ("flops", "render_flops_text", ["flops", "llama-3-8b", "--gpu", "H100"]),
}


@pytest.fixture(scope="module")
def rendered():
    cache: dict = {}

    def get(command: str):
        if command not in cache:
            render = _render(*COMMANDS[command])
            cache[command] = (render, render(WIDE))
        return cache[command]
    return get


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_figure_is_cut_at_narrow_widths(rendered, command):
    render, wide = rendered(command)
    for width in NARROW:
        assert_figures_whole(wide, render(width), width)


def test_the_decode_table_turns_on_its_side_then_stacks(rendered):
    render, _ = rendered("serve")
    at70 = render(70).splitlines()
    header = next(line for line in at70 if "batch 1" in line)
    assert header.split() == ["batch", "1", "batch", "8", "batch", "32", "batch", "128"]  # a column a batch
    row = next(line for line in at70 if line.lstrip().startswith("bytes/step"))
    assert len(row.split()) == 1 + 2 * 4  # the label, then each batch's figure and unit whole on one line
    assert render(100) == render(100) and "  batch   bytes/step" in render(100)  # as before at 100 columns


def test_the_llama_cpp_devices_table_keeps_each_exact_figure_whole(rendered):
    render, wide = rendered("llama.cpp")
    exact = [f for f in FIGURE.findall(wide[wide.index("Memory per device"):wide.index("Caches")])
             if "," in f]
    assert exact  # the per-device bytes, exact
    for width in NARROW:
        text = render(width)
        block = text[text.index("Memory per device"):text.index("Caches")]
        assert sorted(FIGURE.findall(block)) == sorted(FIGURE.findall(
            wide[wide.index("Memory per device"):wide.index("Caches")]))
        for figure in exact:
            assert re.search(rf"(?<![\d,]){re.escape(figure)}(?![\d,])", block)


def test_a_packed_audit_lists_each_packed_tensor_whole(tmp_path):
    pytest.importorskip("torch")
    from test_packed_audit import LLAMA, ct_config, int_packed, write

    from paramscope.audit import audit
    from paramscope.render.audit import render_audit_text

    weights = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 128}
    result = audit(write(tmp_path, {**LLAMA, "quantization_config": ct_config("pack-quantized", weights)},
                         int_packed(4, 128, zero_points=True)), use_cache=False)
    at100 = render_audit_text(result, 100)
    # the packed weights in a table of their own: at 100 columns each on one line, its name whole
    assert "model.layers.0.mlp.down_proj.weight_packed       4,096     32,768   compressed-tensors" in at100
    dtypes = at100[at100.index("Stored tensors by dtype"):at100.index("Packed tensors")]
    assert [line.split() for line in dtypes.splitlines() if line.startswith(" total")] == [
        ["total", "33", "36,510", "110,256", "(107.67", "KiB)"]]
    wide = render_audit_text(result, WIDE)
    for width in (60, 80, 100):
        text = render_audit_text(result, width)
        tables = text[:text.index("Reconciliation")]  # the tables (the findings below list names, not figures)
        assert_figures_whole(wide[:wide.index("Reconciliation")], tables, width)
        for name in ("model.layers.0.mlp.down_proj.weight_packed", "model.layers.0.self_attn.v_proj.weight_packed"):
            assert name in tables


@pytest.mark.parametrize("model", ["meta-llama/Meta-Llama-3-8B", "mixtral-8x7b"])
def test_inspect_keeps_figures_whole(model):
    from paramscope import inspect
    from paramscope.render.text import TextOptions, render_text

    report = inspect(model)
    wide = render_text(report, TextOptions(width=WIDE))
    for width in NARROW:
        assert_figures_whole(wide, render_text(report, TextOptions(width=width)), width)


# The audit's findings: tensor names, each with its shape, in a label/value grid whose values are a column of names
# (render/_fit.add_names_column). A name longer than the width folds; a shape or a count never does.
LONG_NAME = "model.extra_projection_of_the_adapter_for_a_rather_long_named_module.weight"
FIGURE_TOKEN = re.compile(r"[(\[]?\d[\d,×]*[)\]:,]*")  # "164,224", "0×4096:", "(30522×0": shapes and counts


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    """An audit of a tiny Llama against a checkpoint that holds none of its 12 tensors (each missing, with its
    shape) and two it does not have, one named longer than any narrow width."""
    import json

    from test_bounded_audit import header_file
    from test_packed_audit import LLAMA

    from paramscope.audit import audit

    folder = tmp_path_factory.mktemp("findings")
    header_file(folder / "model.safetensors", [
        (LONG_NAME, '{"dtype":"F32","shape":[0,4096],"data_offsets":[0,0]}'),
        ("model.extra.bias", '{"dtype":"F32","shape":[30522,0],"data_offsets":[0,0]}')])
    (folder / "config.json").write_text(json.dumps(LLAMA))
    return audit(str(folder), use_cache=False)


def reconciliation(text: str) -> str:
    return text[text.index("Reconciliation with"):text.index("What transformers")]


def figure_tokens(text: str) -> Counter:
    return Counter(word for word in text.split() if FIGURE_TOKEN.fullmatch(word))


@pytest.mark.parametrize("width", [40, 60])
def test_the_audits_findings_fold_names_and_never_a_figure(findings, width):
    from paramscope.render.audit import render_audit_text

    wide = reconciliation(render_audit_text(findings, WIDE))
    assert "  unexpected      2 tensors, 0 elements\n" in wide and f"{LONG_NAME} 0×4096: " in wide
    narrow = reconciliation(render_audit_text(findings, width))
    assert max(len(line) for line in narrow.splitlines()) <= width
    tokens = figure_tokens(wide)
    assert tokens["164,224"] == 2 and tokens["128×128:"] == 2 and tokens["0×4096:"] == 1  # the data's figures
    assert figure_tokens(narrow) == tokens  # each whole, as often as at full width
    # a grid still (each label beside its value), not stacked; the long name folded over lines, its shape whole
    assert "  unexpected      2 tensors, 0 elements\n" in narrow
    assert LONG_NAME not in narrow and f"{LONG_NAME} 0×4096:" in "".join(line.strip() for line in narrow.splitlines())


def test_past_the_rows_laid_out_by_hand_a_figure_wider_than_the_room_is_laid_out_by_rich(findings, monkeypatch):
    """At 24 columns the texts have 6 (the labels take 18): "164,224" would fold, so the grid is stacked, and the
    rows laid out by hand (past _FAST_ROWS) give way to rich; at 30 (12 columns) they are rich's layout."""
    from paramscope.render import audit as render_audit

    by_rich = {width: render_audit.render_audit_text(findings, width) for width in (24, 30)}
    monkeypatch.setattr(render_audit, "_FAST_ROWS", 0)  # every grid past it: laid out by hand where it can be
    for width, text in by_rich.items():
        assert render_audit.render_audit_text(findings, width) == text
        assert figure_tokens(reconciliation(text)) == figure_tokens(reconciliation(
            render_audit.render_audit_text(findings, WIDE)))
    assert "\n    unexpected\n" in by_rich[24] and "  unexpected      2 tensors, 0\n" in by_rich[30]
