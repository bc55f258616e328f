"""Live modules never crash: lazy (uninitialised) tensors, cycles, parameterless modules reused, layer counts of
stacks with an odd first block or mixed layer types, unknown tree paths, and very wide flat models."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import paramscope
from paramscope.render.json import render_json, report_to_dict
from paramscope.render.text import TextOptions, render_text


class Blob(nn.Module):
    """Bare parameters with names no role rule knows: they stay in `other`."""

    def __init__(self, names: list[str]):
        super().__init__()
        for name in names:
            self.register_parameter(name, nn.Parameter(torch.empty(3, device="meta")))


# --- uninitialised parameters and buffers ---------------------------------------------------------------------

def test_lazy_linear_counts_what_is_initialised_and_names_the_rest():
    report = paramscope.inspect(nn.Sequential(nn.Linear(3, 4), nn.LazyLinear(4, bias=False)))
    assert report.total == 16  # 3×4 + 4: the Linear; the LazyLinear's weight has no shape yet
    assert report.parameters.with_tied_duplicates == 16
    assert report.uninitialized == ("1.weight",)
    assert [p.name for p in report.params] == ["0.weight", "0.bias"]
    assert report.tree.params == 16 and report.node("1").params == 0


def test_lazy_modules_with_bias_and_buffers_are_listed_in_text_and_json():
    report = paramscope.inspect(nn.Sequential(nn.Linear(3, 4), nn.LazyLinear(4), nn.LazyBatchNorm1d()))
    assert report.total == 16
    assert report.uninitialized == ("1.weight", "1.bias", "2.weight", "2.bias", "2.running_mean", "2.running_var")
    assert report.parameters.buffers == 1  # num_batches_tracked is an ordinary scalar buffer
    assert [b.name for b in report.buffers] == ["2.num_batches_tracked"]
    text = render_text(report, TextOptions(width=200))
    assert ("Uninitialised (6 tensors of lazy modules: no shape before the first forward pass, so not counted)"
            in text)
    assert "\n  2.running_var\n" in text
    assert report_to_dict(report)["uninitialized"] == list(report.uninitialized)
    assert report_to_dict(paramscope.inspect(nn.Linear(3, 4)))["uninitialized"] == []


# --- cycles ------------------------------------------------------------------------------------------------------

def test_a_module_holding_itself_is_walked_once():
    model = nn.Sequential(nn.Linear(2, 2))
    model.me = model
    report = paramscope.inspect(model)
    assert report.total == 6
    assert [p.name for p in report.params] == ["0.weight", "0.bias"]
    me = report.tree.children[1]
    assert (me.attr, me.params, me.children, me.back_reference) == ("me", 0, (), "")
    assert "me → the root (a cycle back to an enclosing module, counted once there)" in render_text(report)
    assert json.loads(render_json(report))["tree"]["children"][1]["back_reference"] == ""


def test_a_cycle_through_two_modules_is_walked_once():
    outer = nn.Sequential(nn.Linear(2, 3))
    inner = nn.Sequential(nn.Linear(3, 1))
    outer.inner = inner
    inner.outer = outer
    report = paramscope.inspect(outer)
    assert report.total == 13  # 2×3 + 3 + 3×1 + 1
    assert [p.name for p in report.params] == ["0.weight", "0.bias", "inner.0.weight", "inner.0.bias"]
    assert report.node("inner").params == 4
    assert report.node("inner").children[1].back_reference == ""


# --- shared layers only when parameters are shared ---------------------------------------------------------------

def test_a_parameterless_module_reused_is_no_shared_layer():
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(2, 2), relu, nn.Linear(2, 2), relu, nn.Linear(2, 2), relu, relu)
    report = paramscope.inspect(model)
    assert report.total == 18
    assert report.shared_layers == ()
    assert "Shared layers" not in render_text(report)


def test_a_reused_block_beside_a_reused_activation_counts_only_the_block():
    block, relu = nn.Linear(2, 2), nn.ReLU()
    report = paramscope.inspect(nn.Sequential(block, relu, block, relu, block, relu))
    [shared] = report.shared_layers
    assert (shared.layers, shared.sets, shared.params_per_set) == (3, 1, (6,))
    assert shared.text == "3 layers sharing one set of 6"


# --- the layer count: one stack of blocks of one class ---------------------------------------------------------

def test_t5_small_has_six_layers_though_block_0_holds_the_relative_bias():
    from transformers import T5Config

    config = T5Config(d_model=512, d_ff=2048, num_layers=6, num_heads=8, d_kv=64, vocab_size=32128)
    assert paramscope.inspect(config).num_layers == 6
    assert paramscope.inspect("t5-small").num_layers == 6


def test_flan_t5_large_has_24_layers():
    from transformers import T5Config

    config = T5Config(d_model=1024, d_ff=2816, num_layers=24, num_heads=16, d_kv=64, vocab_size=32128,
                      feed_forward_proj="gated-gelu")
    assert paramscope.inspect(config).num_layers == 24


def test_qwen3_next_hybrid_layers_are_one_stack_of_48():
    from transformers import Qwen3NextConfig

    config = Qwen3NextConfig()
    assert config.num_hidden_layers == 48
    assert len(set(config.layer_types)) == 2  # linear and full attention: two structures, one class
    assert paramscope.inspect(config).num_layers == 48


# --- Report.node --------------------------------------------------------------------------------------------------

def test_node_names_the_path_it_cannot_find():
    relu = nn.ReLU()
    model = nn.Sequential(nn.Linear(2, 2), relu, nn.Linear(2, 2), relu)
    model.me = model
    report = paramscope.inspect(model)
    assert report.node("2").params == 6
    with pytest.raises(KeyError, match="no module at '9'"):
        report.node("9")
    with pytest.raises(KeyError, match="no module at '0.weight.x'"):
        report.node("0.weight.x")
    with pytest.raises(KeyError, match="'3' is an alias: the module is in the tree at '1'"):
        report.node("3")
    with pytest.raises(KeyError, match="'me' is an alias: the module is in the tree at ''"):
        report.node("me")


# --- wide flat models: runs at the root collapse ---------------------------------------------------------------

def test_ten_thousand_flat_layers_collapse_to_one_line():
    report = paramscope.inspect(nn.Sequential(*[nn.Linear(8, 8) for _ in range(10_000)]))
    assert report.total == 720_000 and report.num_layers == 10_000
    text = render_text(report, TextOptions(width=120))
    assert "└── 0–9999: 10,000 × Linear, 72 each = 720,000" in text
    assert "0–9999      10,000 × Linear, 72 each      720,000" in text  # the Components row
    assert len(text.splitlines()) < 60


def test_alternating_layers_collapse_around_the_parameterless_ones():
    model = nn.Sequential(*[nn.Linear(8, 8) if i % 2 == 0 else nn.ReLU() for i in range(10_000)])
    report = paramscope.inspect(model)
    assert report.total == 360_000
    text = render_text(report, TextOptions(width=120))
    assert "└── 0, 2, …, 9998: 5,000 × Linear, 72 each = 360,000" in text
    assert len(text.splitlines()) < 60
    assert len(report_to_dict(report)["components"]) == 5_000  # the data keeps every part


# --- the unclassified list folds by pattern, the data keeps every name ----------------------------------------

def test_unclassified_names_fold_by_layer_index_and_are_capped():
    stack = nn.ModuleList([Blob(["zq_a", "zq_b"]) for _ in range(32)])
    loose = Blob([f"zq_{i}" for i in range(25)])
    report = paramscope.inspect(nn.ModuleDict({"layers": stack, "loose": loose}))
    assert report.total == 3 * (64 + 25)
    assert len(report.unclassified) == 89
    assert report_to_dict(report)["unclassified"] == list(report.unclassified)
    text = render_text(report, TextOptions(width=120))
    section = text[text.index("Unclassified"):].split("\n\n")[0].splitlines()
    assert section == [
        "Unclassified (89 tensors, role 'other')",
        "  layers.*.zq_a ×32",
        "  layers.*.zq_b ×32",
        *(f"  loose.zq_{i}" for i in range(18)),
        "  … and 7 more patterns (7 tensors)",
    ]


def test_a_half_frozen_module_tree_says_what_trains_and_folds_only_alike_layers():
    """Layers of one structure fold into one line only where they train alike; each line says what trains."""
    model = nn.Sequential(*(nn.Linear(10, 10) for _ in range(5)))
    model[0].requires_grad_(False)
    model[4].bias.requires_grad_(False)
    text = render_text(paramscope.inspect(model), TextOptions(width=100))
    tree = text[text.rindex("Sequential"):].splitlines()
    assert tree == ["Sequential 550  430 trainable",
                    "├── 0 (Linear) 110  frozen",
                    "├── 1–3: 3 × Linear, 110 each = 330  trains",
                    "└── 4 (Linear) 110  100 trainable"]
    model.requires_grad_(True)  # all trainable: no annotation, one line, as before
    text = render_text(paramscope.inspect(model), TextOptions(width=100))
    assert text[text.rindex("Sequential"):].splitlines() == ["Sequential 550", "└── 0–4: 5 × Linear, 110 each = 550"]
