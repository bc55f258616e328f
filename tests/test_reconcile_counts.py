"""The numbers people see, reconciled: unique, with tied duplicates, torchinfo 1.8, exclude_embeddings."""

from __future__ import annotations

import json

import pytest

from paramscope.cli import main
from paramscope.reconcile_counts import explain_counts, meta_module, reconcile_counts, torchinfo_count

from conftest import report_of


@pytest.fixture(scope="module")
def masked_lm():
    return explain_counts("bert-base-uncased", model_class="BertForMaskedLM")


def test_bert_for_masked_lm_figures(masked_lm):
    report, counts = masked_lm
    assert counts.value("unique") == 109_514_298
    assert counts.value("with_tied_duplicates") == 132_985_716
    assert counts.value("torchinfo_1_8") == 132_955_194
    assert counts.value("exclude_embeddings") == 85_678_650
    assert counts.value("buffers") == 1_024
    assert counts.value("state_dict_elements") == 132_985_716  # transformers 5: both buffers non-persistent
    assert report.total == counts.unique


def test_torchinfo_counts_the_tied_decoder_weight_twice_but_the_bias_once(masked_lm):
    _, counts = masked_lm
    ti = counts.torchinfo
    assert ti.counted_twice == (("bert.embeddings.word_embeddings.weight", 23_440_896, 2),)
    assert ti.total == 109_514_298 + 23_440_896
    assert ti.trainable == ti.total
    assert ti.not_counted == ()
    words = next(line.explanation for line in counts.lines if line.key == "torchinfo_1_8")
    assert words.startswith("109,514,298 + 23,440,896: it sums parameters module by module")
    assert "cls.predictions.decoder.bias is counted once" in words


def test_tied_duplicates_explained_term_by_term(masked_lm):
    _, counts = masked_lm
    words = next(line.explanation for line in counts.lines if line.key == "with_tied_duplicates")
    assert words.startswith(
        "109,514,298 + 23,440,896 (cls.predictions.decoder.weight = bert.embeddings.word_embeddings.weight) "
        "+ 30,522 (cls.predictions.decoder.bias = cls.predictions.bias)")


def test_exclude_embeddings_matches_transformers_on_the_meta_build():
    module = meta_module("bert-base-uncased", model_class="BertForMaskedLM")
    assert module.num_parameters(exclude_embeddings=True) == 85_678_650
    assert module.num_parameters() == 109_514_298
    counts = reconcile_counts(report_of("bert-base-uncased", "BertForMaskedLM"), module)
    assert counts.exclude_embeddings == 85_678_650 == 109_514_298 - 23_440_896 - 393_216 - 1_536


def test_bert_model_has_no_ties():
    _, counts = explain_counts("bert-base-uncased", model_class="BertModel")
    assert counts.value("unique") == counts.value("with_tied_duplicates") == 109_482_240
    assert counts.value("torchinfo_1_8") == 109_482_240
    assert counts.value("exclude_embeddings") == 85_646_592
    assert counts.torchinfo.counted_twice == ()


def test_gpt2_tied_lm_head():
    _, counts = explain_counts("gpt2")
    assert counts.value("unique") == 124_439_808
    assert counts.value("with_tied_duplicates") == 124_439_808 + 38_597_376
    assert counts.value("torchinfo_1_8") == 163_037_184
    assert counts.value("exclude_embeddings") == 124_439_808 - 38_597_376 - 786_432


def test_without_the_module_torchinfo_is_unknown_and_the_reports_conventions_are_used():
    counts = reconcile_counts(report_of("bert-base-uncased", "BertForMaskedLM"))
    assert counts.value("torchinfo_1_8") is None
    assert counts.value("exclude_embeddings") == 85_678_650  # the report's own convention figure
    assert counts.value("with_tied_duplicates") == 132_985_716


def test_nanogpt_non_embedding_is_listed_too(masked_lm):
    _, counts = masked_lm
    assert counts.value("non_embedding_nanogpt") == 109_514_298 - 393_216 == 109_121_082


def test_a_shared_module_and_a_frozen_tensor():
    import torch
    shared = torch.nn.Linear(4, 4)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = shared
            self.b = shared
            self.seq = torch.nn.Sequential(shared, torch.nn.Linear(4, 2))
            self.own = torch.nn.Parameter(torch.zeros(3))

    net = Net()
    net.seq[1].weight.requires_grad_(False)
    ti = torchinfo_count(net)
    # torchinfo lists `shared` three times but counts it through `a` and again through `seq`'s leftover,
    # while the root's own parameter is lost to the clamped (negative) leftover of the root.
    assert (ti.total, ti.trainable) == (50, 42)
    assert ti.not_counted == (("own", 3),)
    _, counts = explain_counts(net)
    assert counts.value("unique") == 33


@pytest.mark.parametrize(("preset", "model_class"), [
    ("bert-base-uncased", "BertForMaskedLM"), ("bert-base-uncased", "BertForPreTraining"),
    ("gpt2", "GPT2LMHeadModel"), ("t5-small", "T5ForConditionalGeneration"),
    ("albert-base-v2", "AlbertForMaskedLM"),
])
def test_agrees_with_torchinfo_itself(preset, model_class):
    torchinfo = pytest.importorskip("torchinfo")
    module = meta_module(preset, model_class=model_class)
    summary = torchinfo.summary(module, verbose=0)
    ti = torchinfo_count(module)
    assert (ti.total, ti.trainable) == (summary.total_params, summary.trainable_params)


def test_cli_explain_counts(capsys):
    assert main(["inspect", "bert-base-uncased", "--explain-counts", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["parameters"]["total"] == 109_514_298
    counts = doc["counts"]
    assert (counts["unique"], counts["with_tied_duplicates"], counts["torchinfo_1_8"],
            counts["exclude_embeddings"]) == (109_514_298, 132_985_716, 132_955_194, 85_678_650)
    assert counts["torchinfo_counted_twice"] == [
        {"name": "bert.embeddings.word_embeddings.weight", "numel": 23_440_896, "times": 2}]
    assert main(["inspect", "bert-base-uncased", "--explain-counts", "--no-tree", "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "Reconciling the counts of BertForMaskedLM" in out
    assert "132,955,194" in out and "85,678,650" in out


@pytest.mark.parametrize("preset, model_class", [
    ("bert-base-uncased", "BertForMaskedLM"),  # a tied decoder and a bias shared inside one module
    ("t5-small", None),  # one embedding reached through the encoder, the decoder and the head
    ("albert-base-v2", None),  # one layer group shared by every layer: a recursive module for torchinfo
    ("mixtral-8x7b", None),  # fused experts
    ("llama-2-7b", None),  # the model: 5.4 s built, 0.27 s from the template
])
def test_explain_counts_from_the_template_equals_the_build(capsys, preset, model_class):
    """`inspect --explain-counts` answers from the template's stand-ins; the table is the meta build's, word for
    word (--no-cache builds)."""
    argv = ["inspect", preset, "--explain-counts", "--json"] + (["--class", model_class] if model_class else [])
    assert main(argv) == 0
    template = json.loads(capsys.readouterr().out)
    assert main(argv + ["--no-cache"]) == 0
    built = json.loads(capsys.readouterr().out)
    assert (template["model"]["engine"]["name"], built["model"]["engine"]["name"]) == ("template", "build")
    assert template["counts"] == built["counts"]
    assert template["counts"]["unique"] == built["parameters"]["total"]
