"""`paramscope flops` (issue 11): pinned figures, the analytic engine against FlopCounterMode, compute and MFU."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from paramscope.cost.flops.estimate import FlopOptions, estimate_flops
from paramscope.errors import ParamscopeError


def _truncated(preset: str, layers: int = 2) -> dict:
    from paramscope.sources import resolve

    config = dict(resolve(preset).config)
    for key in ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "encoder_layers",
                "decoder_layers"):
        if key in config:
            config[key] = layers
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:layers]
    return config


# --- figures the issue pins ---------------------------------------------------------------------------------------

def test_llama2_7b_forward_and_training_at_128_tokens():
    estimate = estimate_flops("llama-2-7b", FlopOptions(batch=1, seq=128, training=True))
    assert estimate.forward == 1_700_001_742_848
    assert estimate.attention == 8_589_934_592 == 32 * 4 * 128**2 * 4096
    assert estimate.backward == 2 * estimate.forward and estimate.step == 3 * estimate.forward
    assert estimate.recompute == estimate.attention // 2  # flash attention's backward recomputes q·kᵀ
    assert sum(estimate.by_role.values()) == estimate.forward


def test_mixtral_8x7b_forward_is_top2_active_weights_plus_attention():
    estimate = estimate_flops("mixtral-8x7b", FlopOptions(batch=1, seq=128))
    assert estimate.forward == 3_272_228_208_640
    assert estimate.forward == 2 * 128 * 12_748_587_008 + 8_589_934_592
    assert estimate.by_role["moe.router"] == 2 * 128 * 32 * 8 * 4096


def test_gpt3_175b_on_300b_tokens_and_6nd():
    gpt3 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 12288, "n_layer": 96,
            "n_head": 96, "n_positions": 2048, "vocab_size": 50257}
    estimate = estimate_flops(gpt3, FlopOptions(batch=1, seq=2048, training=True, tokens=300 * 10**9))
    report, compute = estimate.report, estimate.compute
    assert 174e9 < report.total < 176e9
    assert abs(compute.six_nd - 3.14e23) / 3.14e23 < 0.005  # the paper's figure is 6ND
    # the exact count adds attention (2·4·L·S·h per token for fwd + bwd: +7.2% at 2,048 tokens) and drops the
    # embedding lookups (-0.36%)
    assert compute.total > compute.six_nd
    assert abs(compute.total / compute.six_nd - 1 - (12 * 96 * 2048 * 12288 / (6 * report.total)
                                                    - 6 * (50257 + 2048) * 12288 / (6 * report.total)
                                                    + 6 * 50257 * 12288 / (6 * report.total))) < 1e-3


def test_nanogpt_gpt2_sizing_notebook_forward_at_1024_tokens():
    """nanoGPT's scaling_laws/transformer_sizing.ipynb counts the same way (2mnk, attention in full, no biases)."""
    n_embd, n_head, n_layer, block, vocab = 768, 12, 12, 1024, 50257
    kqv = 2 * block * (n_embd * 3 * n_embd)
    scores = 2 * block * block * n_embd
    reduce = 2 * n_head * (block * block * (n_embd // n_head))
    proj = 2 * block * (n_embd * n_embd)
    mlp = 2 * block * (n_embd * 4 * n_embd) * 2
    dense = 2 * block * (n_embd * vocab)
    forward_total = n_layer * (kqv + scores + reduce + proj + mlp) + dense
    assert forward_total == 291_648_307_200
    estimate = estimate_flops("gpt2", FlopOptions(batch=1, seq=1024))
    assert estimate.forward == forward_total


# --- the two engines agree exactly --------------------------------------------------------------------------------

FAMILIES = ["llama-3-8b", "mistral-7b", "qwen2.5-0.5b", "gemma-2b", "gemma-2-2b", "phi-3-mini", "gpt2",
            "pythia-160m", "gpt-j-6b", "bert-base-uncased", "roberta-base", "distilbert", "electra-base",
            "modernbert-base", "mixtral-8x7b", "qwen1.5-moe-a2.7b", "deepseek-v3", "t5-small", "bart-base",
            "albert-base-v2", "deberta-v3-base"]


@pytest.mark.parametrize("preset", FAMILIES)
def test_analytic_equals_flopcountermode(preset):
    layers = 4 if preset == "deepseek-v3" else 2  # DeepSeek-V3's first 3 layers are dense
    config = _truncated(preset, layers)
    if preset == "deepseek-v3":
        config["first_k_dense_replace"] = 1
    # ALBERT does not support gradient checkpointing (transformers' supports_gradient_checkpointing)
    steps = ((False, "none"), (True, "none")) + (((True, "full"),) if preset != "albert-base-v2" else ())
    for training, checkpointing in steps:
        estimate = estimate_flops(config, FlopOptions(batch=2, seq=64, training=training,
                                                      grad_checkpointing=checkpointing, trace=True))
        assert estimate.engine == "traced"
        # the analytic answer's own notes come first (under checkpointing, why its recompute is what it is)
        assert [n for n in estimate.notes if n.startswith("check:")] == \
            ["check: the analytic count equals FlopCounterMode's on fake tensors, term for term"]
        assert checkpointing == "full" or estimate.notes[0].startswith("check:")


def test_a_class_without_a_formula_is_traced():
    """DeBERTa (v1)'s fused in_proj attention has no analytic count here."""
    config = {"model_type": "deberta", "architectures": ["DebertaModel"], "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 300,
              "relative_attention": True, "pos_att_type": ["c2p", "p2c"], "max_relative_positions": 32}
    estimate = estimate_flops(config, FlopOptions(batch=1, seq=64, training=True))
    assert estimate.engine == "traced" and estimate.backward > estimate.forward
    assert any("no analytic FLOP formula for DebertaModel" in n for n in estimate.notes)


@pytest.mark.parametrize("variation", [
    {}, {"share_att_key": False}, {"pos_att_type": ["c2p"]}, {"pos_att_type": ["p2c"], "share_att_key": False},
    {"position_buckets": -1, "max_relative_positions": 64}])
def test_deberta_v2_disentangled_attention_equals_flopcountermode(variation):
    """The position terms: each layer projects 2 × span relative-position embeddings (by the content projections
    under share_att_key, else by its own), and c2p and p2c each cost 2·B·heads·S·d·(2 × span); a shared projection
    whose output no term uses runs, but gets no gradient."""
    config = _truncated("deberta-v3-base", 2) | variation
    for training, checkpointing, seq in ((False, "none", 48), (True, "none", 48), (True, "full", 600)):
        estimate = estimate_flops(config, FlopOptions(batch=2, seq=seq, training=training,
                                                      grad_checkpointing=checkpointing, trace=True))
        assert "check: the analytic count equals FlopCounterMode's on fake tensors, term for term" in estimate.notes


def test_deberta_v2_position_projections_at_512_tokens():
    estimate = estimate_flops("deberta-v3-base", FlopOptions(seq=512))
    # 12 layers × the query and key projections (768 × 768 each) run on 2 × 256 relative positions
    assert estimate.by_role["attention.position"] == 2 * 512 * 12 * 2 * 768 * 768
    # q·kᵀ and p·v, plus c2p and p2c against the 512 projected positions
    assert estimate.attention == 12 * 2 * 512 * 512 * 12 * (64 + 64) + 12 * 2 * 2 * 12 * 512 * 64 * 512


def test_encoder_decoders_count_self_and_cross_attention():
    """T5-small at 128 tokens (encoder and decoder each): 6 encoder self-attentions, 6 decoder self-attentions and 6
    cross-attentions of 8 heads × (64 + 64), and every matmul once per token (the tied head included)."""
    estimate = estimate_flops("t5-small", FlopOptions(batch=1, seq=128))
    assert estimate.engine == "analytic"
    assert estimate.attention == (6 + 6 + 6) * 2 * 128 * 128 * 8 * (64 + 64) == 603_979_776
    # the layers' matmul weights (all 60,506,624 parameters less the shared 32,128 × 512 embedding, 32 norms of 512
    # and two 32 × 8 relative biases) and the head tied to the embedding, once each per token
    layers = 60_506_624 - 32_128 * 512 - 32 * 512 - 2 * 32 * 8
    assert estimate.forward - estimate.attention == 2 * 128 * (layers + 32_128 * 512)


@pytest.mark.parametrize("groups, inner", [(1, 1), (2, 1), (2, 2)])
def test_albert_counts_its_shared_layers_once_per_pass(groups, inner):
    """ALBERT runs num_hidden_layers passes over num_hidden_groups groups (pass i runs group int(i / (L / G)), each
    group inner_group_num layers): 5 passes over 2 groups run them 3 and 2 times, exactly as traced."""
    config = _truncated("albert-base-v2", 5) | {"num_hidden_groups": groups, "inner_group_num": inner}
    for training in (False, True):
        estimate = estimate_flops(config, FlopOptions(batch=2, seq=32, training=training, trace=True))
        assert estimate.notes[0] == "check: the analytic count equals FlopCounterMode's on fake tensors, term for term"
    if groups == 1:  # one pass more is one layer's matmuls and attention more, however many passes share them
        once = estimate_flops(config | {"num_hidden_layers": 1}, FlopOptions(seq=32))
        five = estimate_flops(config, FlopOptions(seq=32))
        layer = sum(flops for role, flops in once.by_role.items() if role.startswith(("attention", "mlp")))
        assert five.forward - once.forward == 4 * layer > 0


@pytest.mark.parametrize("preset, freeze", [
    ("deberta-v3-base", ("attention",)),  # the relative-position embeddings and their norm are attention's
    ("bert-base-uncased", ("embeddings",)),  # post-LN: the embeddings' norm is frozen too
    ("gpt2", ("embeddings", "transformer.h.[0-2].*")),  # a frozen prefix through three layers
])
def test_a_frozen_prefix_is_traced_because_autograd_skips_its_input_gradients(preset, freeze):
    """2 × forward less the frozen weights' gradients assumes every matmul's input requires grad; a frozen prefix
    breaks that (autograd stops at the first trainable tensor), so the traced engine answers, and says why."""
    options = FlopOptions(batch=1, seq=32, training=True, freeze=freeze)
    estimate = estimate_flops(_truncated(preset, 4), options)
    assert estimate.engine == "traced"
    assert any(n.startswith("no analytic FLOP count here (") for n in estimate.notes)
    assert estimate.backward < 2 * estimate.forward - sum(
        t.flops for t in estimate.terms if t.role.startswith(("embeddings", "head")))


@pytest.mark.parametrize("preset, freeze", [
    ("llama-3-8b", ("embeddings",)),  # pre-LN: the first layer opens with a trainable norm
    ("gpt2", ("transformer.h.[0-2].*",)),  # frozen layers after trainable embeddings still pass input gradients
    ("t5-small", ("embeddings",)),
])
def test_freezing_that_keeps_input_gradients_stays_analytic_and_exact(preset, freeze):
    options = FlopOptions(batch=1, seq=32, training=True, freeze=freeze, trace=True)
    estimate = estimate_flops(_truncated(preset, 4), options)
    assert "check: the analytic count equals FlopCounterMode's on fake tensors, term for term" in estimate.notes


def test_real_mixtral_with_eager_experts_and_real_routing():
    """FlopCounterMode on a real step, real routing: exactly 2·tokens·active matmul weights + attention."""
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    from paramscope.cost.traced.flops import _missing_formulas

    config = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
                                        num_local_experts=4, num_experts_per_tok=2)
    config._experts_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    ids = torch.randint(0, 300, (2, 32))
    counter = FlopCounterMode(display=False, custom_mapping=_missing_formulas())
    with counter, torch.no_grad():
        model(input_ids=ids)
    estimate = estimate_flops(config, FlopOptions(batch=2, seq=32), model_class="MixtralForCausalLM")
    assert counter.get_total_flops() == estimate.forward


def test_frozen_weights_skip_their_gradients():
    options = FlopOptions(batch=1, seq=64, training=True, freeze=("embeddings", "head"))
    estimate = estimate_flops(_truncated("llama-3-8b"), options)
    head = estimate.by_role["head.lm"]
    assert estimate.backward == 2 * estimate.forward - head
    traced = estimate_flops(_truncated("llama-3-8b"), FlopOptions(**{**options.__dict__, "trace": True}))
    assert traced.backward == estimate.backward


def test_causal_half_halves_attention_only():
    full = estimate_flops("llama-2-7b", FlopOptions(seq=128))
    half = estimate_flops("llama-2-7b", FlopOptions(seq=128, causal="half"))
    assert full.forward - half.forward == full.attention // 2


def test_mfu_and_time():
    estimate = estimate_flops("llama-3-8b", FlopOptions(
        seq=2048, training=True, tokens=10**9, gpu="h100", tokens_per_second=8 * 3000, devices=8))
    compute = estimate.compute
    per_token = estimate.step // estimate.tokens
    assert compute.peak == 989.4e12
    assert compute.mfu == pytest.approx(per_token * 24000 / (989.4e12 * 8))
    timed = estimate_flops("llama-3-8b", FlopOptions(seq=2048, training=True, tokens=10**9, gpu="h100", mfu=0.4,
                                                     devices=8)).compute
    assert timed.seconds == pytest.approx(timed.total / (0.4 * 989.4e12 * 8))
    with pytest.raises(ParamscopeError, match="^tokens_per_second needs gpu NAME") as caught:
        estimate_flops("gpt2", FlopOptions(seq=128, tokens_per_second=100.0))
    assert caught.value.spelled(lambda option: "--" + option.replace("_", "-")).startswith(
        "--tokens-per-second needs --gpu NAME (with a peak in the table) or --peak-tflops")


# --- the command --------------------------------------------------------------------------------------------------

def _cli(*args):
    return subprocess.run([sys.executable, "-m", "paramscope", *args], capture_output=True, text=True, timeout=300)


def test_cli_json_contract():
    result = _cli("flops", "llama-2-7b", "--seq", "128", "--training", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["schema_version"] == 3
    flops = document["flops"]
    assert flops["forward"] == 1_700_001_742_848 and flops["attention"] == 8_589_934_592
    assert sum(flops["by_role"].values()) == flops["forward"]
    assert flops["backward"] == 2 * flops["forward"] and flops["step"] == 3 * flops["forward"]
    assert flops["per_token"] == {"forward": flops["forward"] // 128, "training": flops["step"] // 128}
    assert flops["convention"]["causal"] == "full" and flops["engine"] == "analytic"


def test_cli_text_states_the_convention():
    result = _cli("flops", "gpt2", "--seq", "1024", "--training", "--tokens", "1e9", "--gpu", "a100-80gb",
                  "--mfu", "0.4", "--width", "250")
    assert result.returncode == 0, result.stderr
    assert "2mnk" in result.stdout and "no causal halving" in result.stdout and "6ND" in result.stdout
    assert "time" in result.stdout


@pytest.mark.parametrize("args, named", [
    (("--seq", "0"), "--seq"),
    (("--gpu", "abacus"), "'abacus'"),
    (("--mfu", "2"), "--mfu"),
    (("--tokens", "-3"), "--tokens"),
    (("--freeze", "embeddings"), "--training"),
    (("--seq", "2048"), "1,024 learned positions"),
])
def test_cli_bad_options_give_one_line(args, named):
    result = _cli("flops", "gpt2", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and named in result.stderr


def test_moe_6nd_uses_the_parameters_a_token_meets_and_tied_heads_are_heads():
    estimate = estimate_flops("mixtral-8x7b", FlopOptions(seq=128, training=True, tokens=10**9))
    compute = estimate.compute
    assert compute.parameters == 12_879_925_248  # Mixtral's active parameters
    assert compute.six_nd == 6 * 12_879_925_248 * 10**9
    gpt2 = estimate_flops("gpt2", FlopOptions(seq=128))
    assert "head.lm" in gpt2.by_role and not any(r.startswith("embeddings") for r in gpt2.by_role)


def test_causal_half_is_for_causal_decoders():
    with pytest.raises(ParamscopeError, match="bidirectional"):
        estimate_flops("bert-base-uncased", FlopOptions(seq=128, causal="half"))


def test_hfu_adds_the_recomputation_exactly():
    estimate = estimate_flops("llama-2-7b", FlopOptions(seq=128, training=True, gpu="a100-80gb",
                                                         tokens_per_second=1000.0))
    compute = estimate.compute
    hardware = estimate.step + estimate.recompute  # flash attention's recomputed scores: 4,294,967,296
    assert estimate.recompute == 4_294_967_296
    assert compute.hfu == hardware / 128 * 1000.0 / 312e12
    assert compute.mfu == estimate.step // 128 * 1000.0 / 312e12


# --- matmuls that run on one token of each sequence (issue 31 §2) --------------------------------------------------

ONCE_PER_SEQUENCE = [
    ("bert-base-uncased", "BertModel"),  # the pooler: each sequence's first token
    ("bert-base-uncased", "BertForSequenceClassification"),  # pooler + classifier
    ("bert-base-uncased", "BertForPreTraining"),  # pooler + next-sentence prediction
    ("roberta-base", "RobertaForSequenceClassification"),  # its head's dense and out_proj on the first token
    ("deberta-v3-base", "DebertaV2ForSequenceClassification"),  # the context pooler
    ("distilbert", "DistilBertForSequenceClassification"),  # pre_classifier and classifier
    ("electra-base", "ElectraForSequenceClassification"),
    ("albert-base-v2", "AlbertForSequenceClassification"),
    ("bart-base", "BartForSequenceClassification"),  # the end-of-sequence token's representation
    ("gpt2", "GPT2ForSequenceClassification"),  # `score` runs on every token, then the last real one is taken
    ("llama-3-8b", "LlamaForSequenceClassification"),
    ("bert-base-uncased", "BertForTokenClassification"),  # every token
]


@pytest.mark.slow
@pytest.mark.parametrize("preset, model_class", ONCE_PER_SEQUENCE)
def test_heads_on_one_token_of_each_sequence_equal_flopcountermode(preset, model_class):
    for training in (False, True):
        estimate = estimate_flops(_truncated(preset), FlopOptions(batch=2, seq=64, training=training, trace=True),
                                  model_class=model_class)
        assert estimate.engine == "traced"
        assert "check: the analytic count equals FlopCounterMode's on fake tensors, term for term" in estimate.notes


def test_the_pooler_runs_on_the_first_token_only():
    """LaBSE (BertModel) was 2·512·768·768 = 603,979,776 FLOPs over at 1 × 512: the pooler counted for every token."""
    estimate = estimate_flops(_truncated("bert-base-uncased"), FlopOptions(batch=1, seq=512),
                              model_class="BertModel")
    pooler = next(term for term in estimate.terms if term.role == "pooler")
    assert pooler.flops == 2 * 1 * 768 * 768
    assert pooler.arithmetic == ("2 × 1 sequences × 589,824 weights (one token each: the pooler reads each "
                                 "sequence's first token)")
