"""Fit the analytic activation recipes (src/paramscope/cost/activations/) to the traced engine, exactly.

    python bench/fit_activations.py [--checkpointing] [FAMILY ...]     # default: every family below

For each family and precision kind (fp32, bf16-mixed, bf16-pure), one training step of a 2- and a 3-layer model is
traced on fake tensors (cost/trace.py, MemTracker) at varied small configs, batches and lengths. What one more
layer adds to the bytes the forward saves, and what is saved outside the layers, are solved by least squares for
whole (or half) byte coefficients of the family's terms (T·h, T·i, B·heads·S², …), and the solution is checked on
every config. Under mixed precision autocast's 16-bit copies of the matmul weights (2 B per element) are taken out
first: the recipe adds them from the model (`cast_weights`).

A layer's bytes are the difference between 3 layers and 2, not what the tracker finds allocated as a layer returns
(`kept_by_module`): that includes the layer's output, which the next layer frees as it makes its own.

Prints each family's coefficients, ready for memory/activations/, and whether they hold exactly (outside the layers a
few bytes of index tensors may differ at batch 1: "within 8 B"). Rerun after a torch or transformers upgrade: the
recipes are fitted to the installed implementation; tests/test_training_memory.py holds them to the traced engine.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

KINDS = ("fp32", "bf16-mixed", "bf16-pure")
CHECKPOINTING = False  # --checkpointing: fit what checkpointed layers keep


@dataclass(frozen=True)
class Family:
    cls: str
    layers: str  # the layer list's path: "model.layers"
    config: Callable[[dict], dict]  # dims → config kwargs (2 layers)
    dims: tuple[dict, ...]  # varied dims, each with B and S
    layer_terms: tuple[tuple[str, Callable[[dict], int]], ...]
    outside_terms: tuple[tuple[str, Callable[[dict], int]], ...]
    period: int = 1  # layers that repeat as a unit (Gemma-2 alternates sliding and full attention)
    per_period: bool = False  # fit a whole period's bytes rather than the average layer's
    decoder_key: str | None = None  # encoder-decoders: the decoder's layer count; its layers are fitted apart
    layers_key: str | None = None  # the config's layer count, where not n_layer, n_layers, num_layers or num_hidden_layers


def _T(d):
    return d["B"] * d["S"]


def _llama_dims():
    return (
        dict(h=256, heads=8, kv=2, hd=32, i=688, V=1000, B=2, S=64),
        dict(h=128, heads=4, kv=4, hd=64, i=300, V=700, B=1, S=128),
        dict(h=384, heads=12, kv=4, hd=16, i=1000, V=1200, B=2, S=32),
        dict(h=256, heads=4, kv=1, hd=128, i=512, V=500, B=3, S=48),
        dict(h=192, heads=6, kv=3, hd=32, i=640, V=900, B=1, S=96),
        dict(h=320, heads=5, kv=5, hd=64, i=800, V=1100, B=2, S=40),
        dict(h=512, heads=8, kv=8, hd=32, i=256, V=640, B=1, S=80),
        dict(h=64, heads=2, kv=1, hd=16, i=128, V=300, B=4, S=24),
        dict(h=160, heads=10, kv=2, hd=16, i=432, V=800, B=2, S=56),
    )


_DECODER_LAYER = (
    ("h", lambda d: _T(d) * d["h"]), ("q", lambda d: _T(d) * d["heads"] * d["hd"]),
    ("kv", lambda d: _T(d) * d["kv"] * d["hd"]), ("i", lambda d: _T(d) * d["i"]),
    ("heads", lambda d: _T(d) * d["heads"]), ("1", _T),
)
_DECODER_OUTSIDE = (
    ("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]), ("S·hd", lambda d: d["S"] * d["hd"]),
    ("T", _T), ("S", lambda d: d["S"]), ("1", lambda d: 1),
)


def _llama_config(d):
    return dict(hidden_size=d["h"], num_attention_heads=d["heads"], num_key_value_heads=d["kv"], head_dim=d["hd"],
                intermediate_size=d["i"], vocab_size=d["V"], num_hidden_layers=2, pad_token_id=0, bos_token_id=0,
                eos_token_id=0)


def _phi3_dims():  # Phi-3 has no head_dim: hd = h / heads
    return tuple(dict(d, hd=d["h"] // d["heads"]) for d in _llama_dims())


def _phi3_config(d):
    return dict(hidden_size=d["h"], num_attention_heads=d["heads"], num_key_value_heads=d["kv"],
                intermediate_size=d["i"], vocab_size=d["V"], num_hidden_layers=2, pad_token_id=0, bos_token_id=0,
                eos_token_id=0)


_PHI3_LAYER = tuple(t for t in _DECODER_LAYER if t[0] != "q")  # q = h: one term


def _gpt2_dims():
    return (
        dict(h=256, heads=8, V=1000, B=2, S=64), dict(h=128, heads=4, V=700, B=1, S=128),
        dict(h=192, heads=6, V=1200, B=2, S=32), dict(h=64, heads=2, V=500, B=3, S=48),
        dict(h=320, heads=4, V=900, B=1, S=96), dict(h=128, heads=8, V=1100, B=2, S=80),
        dict(h=96, heads=3, V=640, B=4, S=24),
    )


def _gpt2_config(d):
    return dict(n_embd=d["h"], n_head=d["heads"], n_layer=2, vocab_size=d["V"], n_positions=256, bos_token_id=0,
                eos_token_id=0)


def _bert_dims():
    return (
        dict(h=256, heads=8, i=1024, V=1000, B=2, S=64), dict(h=128, heads=4, i=300, V=700, B=1, S=128),
        dict(h=192, heads=6, i=700, V=1200, B=2, S=32), dict(h=64, heads=2, i=256, V=500, B=3, S=48),
        dict(h=320, heads=4, i=500, V=900, B=1, S=96), dict(h=128, heads=8, i=512, V=1100, B=2, S=80),
        dict(h=96, heads=3, i=200, V=640, B=2, S=40), dict(h=160, heads=5, i=640, V=800, B=1, S=72),
    )


def _bert_config(d):
    return dict(hidden_size=d["h"], num_attention_heads=d["heads"], intermediate_size=d["i"], vocab_size=d["V"],
                num_hidden_layers=2, max_position_embeddings=256, pad_token_id=0)


_SCORES = ("B·heads·S²", lambda d: d["B"] * d["heads"] * d["S"] ** 2)
_ENCODER_LAYER = (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]), _SCORES, ("T", _T))
_ENCODER_OUTSIDE = (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]), ("T", _T),
                    ("S", lambda d: d["S"]), ("1", lambda d: 1))


def _albert_dims():  # embeddings narrower than the layers, projected up
    return tuple(dict(d, e=e) for d, e in zip(_bert_dims(), (64, 32, 48, 16, 80, 128, 24, 40)))


def _albert_config(d):  # albert-base-v2: one shared layer, no dropout, the unfused tanh GELU
    return dict(_bert_config(d), embedding_size=d["e"], num_hidden_groups=1, inner_group_num=1,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, hidden_act="gelu_new")


def _t5_dims():
    dims = tuple(dict(d, dkv=d["h"] // d["heads"] * m) for d, m in zip(_bert_dims(), (1, 2, 1, 1, 2, 1, 2, 1)))
    return dims + tuple(dict(d, B=d["B"] + 1, S=d["S"] + 16) for d in dims[:6])


def _t5_config(d):  # T5 v1 (t5-small/base/large): ReLU MLP, dropout 0.1, the head tied and rescaled
    return dict(d_model=d["h"], d_kv=d["dkv"], d_ff=d["i"], num_heads=d["heads"], vocab_size=d["V"],
                num_layers=2, num_decoder_layers=2, feed_forward_proj="relu", dropout_rate=0.1,
                decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


# what checkpointed layers' kept arguments may add outside the layers (masks, position biases, positions); zero
# without checkpointing
_KEPT_ARGUMENTS = (("B·S² (kept)", lambda d: d["B"] * d["S"] ** 2), ("heads·S² (kept)", lambda d: d["heads"] * d["S"] ** 2),
                   ("B·heads·S² (kept)", lambda d: d["B"] * d["heads"] * d["S"] ** 2), ("S (kept)", lambda d: d["S"]))
_T5_LAYER = (("T·h", lambda d: _T(d) * d["h"]), ("T·inner", lambda d: _T(d) * d["heads"] * d["dkv"]),
             ("T·i", lambda d: _T(d) * d["i"]), _SCORES, ("T", _T), ("S²", lambda d: d["S"] ** 2))


def _bart_config(d):  # BART (bart-base/large): post-LN, exact GELU, dropout on everything, learned positions
    return dict(d_model=d["h"], encoder_layers=2, decoder_layers=2, encoder_attention_heads=d["heads"],
                decoder_attention_heads=d["heads"], encoder_ffn_dim=d["i"], decoder_ffn_dim=d["i"],
                vocab_size=d["V"], max_position_embeddings=256, dropout=0.1, attention_dropout=0.1,
                activation_dropout=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                forced_eos_token_id=2)


def _roberta_config(d):  # positions count from padding_idx + 1: room for S + 2
    return dict(_bert_config(d), pad_token_id=1)


def _distilbert_config(d):
    return dict(dim=d["h"], n_heads=d["heads"], hidden_dim=d["i"], vocab_size=d["V"], n_layers=2,
                max_position_embeddings=256, pad_token_id=0)


def _electra_config(d):  # the discriminator: embeddings as wide as the layers (electra-base)
    return dict(_bert_config(d), embedding_size=d["h"])




def _deberta_dims():  # P: position buckets (the relative embeddings are 2P wide), varied apart from S
    more = (dict(h=128, heads=4, i=256, V=300, B=3, S=20), dict(h=96, heads=6, i=384, V=300, B=1, S=60),
            dict(h=256, heads=2, i=200, V=300, B=2, S=24), dict(h=64, heads=4, i=128, V=300, B=4, S=36),
            dict(h=192, heads=3, i=320, V=300, B=1, S=44), dict(h=160, heads=10, i=160, V=300, B=3, S=28))
    return tuple(dict(d, P=p) for d, p in zip(_bert_dims() + more, (16, 32, 24, 64, 40, 8, 48, 20, 12, 28, 36, 6,
                                                                      52, 18)))


def _deberta_config(d):  # deberta-v3-base's layout: disentangled attention (c2p and p2c, shared keys), log buckets
    return dict(hidden_size=d["h"], num_attention_heads=d["heads"], intermediate_size=d["i"], vocab_size=d["V"],
                num_hidden_layers=2, max_position_embeddings=256, relative_attention=True, position_buckets=d["P"],
                norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
                position_biased_input=False, type_vocab_size=0, hidden_act="gelu", pad_token_id=0)


def _neox_dims():  # rotary on a quarter of each head (Pythia, GPT-NeoX-20B)
    return tuple(dict(h=d["h"], heads=d["heads"], hd=d["h"] // d["heads"], rd=d["h"] // d["heads"] // 4, i=d["i"],
                      V=d["V"], B=d["B"], S=d["S"]) for d in _bert_dims())


def _neox_config(d):
    return dict(hidden_size=d["h"], num_attention_heads=d["heads"], intermediate_size=d["i"], vocab_size=d["V"],
                num_hidden_layers=2, rotary_pct=0.25, max_position_embeddings=256, use_parallel_residual=True,
                bos_token_id=0, eos_token_id=0)

def _moe_dims():  # E experts, k of them a token; every dimension a multiple of 16 (grouped_mm's alignment)
    return (
        dict(h=256, heads=8, kv=2, hd=32, i=352, E=4, k=2, V=1000, B=2, S=64),
        dict(h=128, heads=4, kv=4, hd=32, i=192, E=8, k=2, V=704, B=1, S=128),
        dict(h=384, heads=12, kv=4, hd=16, i=512, E=4, k=1, V=1200, B=2, S=32),
        dict(h=256, heads=4, kv=1, hd=64, i=256, E=6, k=3, V=512, B=3, S=48),
        dict(h=192, heads=6, kv=3, hd=32, i=320, E=16, k=4, V=912, B=1, S=96),
        dict(h=320, heads=5, kv=5, hd=32, i=384, E=2, k=2, V=1104, B=2, S=40),
        dict(h=512, heads=8, kv=8, hd=64, i=128, E=8, k=1, V=640, B=1, S=80),
        dict(h=64, heads=2, kv=1, hd=32, i=128, E=5, k=2, V=304, B=4, S=24),
        dict(h=160, heads=10, kv=2, hd=32, i=432, E=3, k=3, V=800, B=2, S=56),
        dict(h=224, heads=7, kv=7, hd=32, i=256, E=12, k=2, V=960, B=2, S=72),
        dict(h=288, heads=9, kv=3, hd=32, i=480, E=7, k=4, V=1024, B=1, S=112),
        dict(h=128, heads=8, kv=2, hd=16, i=96, E=10, k=3, V=600, B=3, S=40),
        dict(h=352, heads=11, kv=1, hd=32, i=224, E=4, k=4, V=720, B=2, S=48),
        dict(h=96, heads=3, kv=3, hd=64, i=640, E=6, k=1, V=1300, B=1, S=64),
        dict(h=256, heads=16, kv=4, hd=16, i=160, E=9, k=5, V=880, B=2, S=24),
    )


def _mixtral_config(d):
    return dict(_llama_config(d), num_local_experts=d["E"], num_experts_per_tok=d["k"])


_MOE_LAYER = _DECODER_LAYER[:3] + (
    ("k·i", lambda d: _T(d) * d["k"] * d["i"]), ("k·h", lambda d: _T(d) * d["k"] * d["h"]),
    ("heads", lambda d: _T(d) * d["heads"]), ("E", lambda d: _T(d) * d["E"]), ("k", lambda d: _T(d) * d["k"]),
    ("1", _T), ("E (no T)", lambda d: d["E"]), ("E·h (no T)", lambda d: d["E"] * d["h"]))


def _qwen2_moe_config(d):  # Qwen1.5-MoE: routed experts of width i, a shared expert of width 4i with a sigmoid gate
    return dict(_llama_config(d), num_experts=d["E"], num_experts_per_tok=d["k"], moe_intermediate_size=d["i"],
                shared_expert_intermediate_size=4 * d["i"], decoder_sparse_step=1, mlp_only_layers=[],
                norm_topk_prob=False, use_sliding_window=False)


def _mla_dims():  # DeepSeek-V3's MLA and MoE: every width varied apart; E a multiple of the groups
    import random

    rng = random.Random(3)
    dims = []
    for _ in range(20):
        groups = rng.choice((1, 2, 4))
        experts = groups * rng.choice((2, 3, 4))
        dims.append(dict(h=16 * rng.randint(4, 24), heads=rng.randint(2, 12), rq=16 * rng.randint(2, 12),
                         rkv=16 * rng.randint(2, 10), nope=16 * rng.randint(1, 6), rope=8 * rng.randint(1, 6),
                         v=16 * rng.randint(1, 6), i=16 * rng.randint(4, 40), ie=16 * rng.randint(2, 20),
                         E=experts, k=rng.randint(1, 3), groups=groups, topk_groups=rng.randint(1, groups),
                         shared=rng.randint(1, 2), V=rng.randint(300, 1300), B=rng.randint(1, 3),
                         S=8 * rng.randint(3, 14)))
        dims[-1]["k"] = min(dims[-1]["k"], dims[-1]["topk_groups"] * experts // groups)
        if dims[-1]["v"] >= dims[-1]["nope"] + dims[-1]["rope"]:  # V3's layout: q and k wider than v (192, 128),
            dims[-1]["v"] = dims[-1]["nope"] + dims[-1]["rope"] - 8  # so CPU sdpa runs its math kernel
    return tuple(dims)


def _deepseek_config(d, dense_layers):
    return dict(hidden_size=d["h"], num_attention_heads=d["heads"], num_key_value_heads=d["heads"],
                q_lora_rank=d["rq"], kv_lora_rank=d["rkv"], qk_nope_head_dim=d["nope"], qk_rope_head_dim=d["rope"],
                v_head_dim=d["v"], intermediate_size=d["i"], moe_intermediate_size=d["ie"], n_routed_experts=d["E"],
                num_experts_per_tok=d["k"], n_group=d["groups"], topk_group=d["topk_groups"],
                n_shared_experts=d["shared"], first_k_dense_replace=dense_layers, vocab_size=d["V"],
                num_hidden_layers=2, norm_topk_prob=True, pad_token_id=0, bos_token_id=0, eos_token_id=0)


_MLA_LAYER = (
    ("h", lambda d: _T(d) * d["h"]), ("rq", lambda d: _T(d) * d["rq"]), ("rkv", lambda d: _T(d) * d["rkv"]),
    ("heads·nope", lambda d: _T(d) * d["heads"] * d["nope"]), ("heads·rope", lambda d: _T(d) * d["heads"] * d["rope"]),
    ("heads·v", lambda d: _T(d) * d["heads"] * d["v"]), ("rope", lambda d: _T(d) * d["rope"]),
    ("heads", lambda d: _T(d) * d["heads"]), ("1", _T), _SCORES, ("S·rope (no B)", lambda d: d["S"] * d["rope"]))
_MLA_OUTSIDE = (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]),
                ("S·rope", lambda d: d["S"] * d["rope"]), ("T", _T), ("S", lambda d: d["S"]), ("1", lambda d: 1))


def _gptj_dims():  # GPT-J: rotary on the first rd of each head; the MLP's width set apart from 4h
    return tuple(dict(d, rd=rd, i=i) for d, rd, i in zip(_gpt2_dims() + _gpt2_dims()[:3],
                                                          (16, 8, 16, 8, 32, 4, 8, 16, 8, 16),
                                                          (1024, 300, 700, 256, 500, 512, 200, 640, 900, 100)))


def _gptj_config(d):  # gpt-j-6b: no dropout, the unfused tanh GELU, parallel attention and MLP
    return dict(n_embd=d["h"], n_head=d["heads"], n_layer=2, n_inner=d["i"], rotary_dim=d["rd"], vocab_size=d["V"],
                n_positions=256, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0)


def _modernbert_config(d):  # ModernBERT: a global layer every 3, local ones attend ±8 tokens here (±64 in -base)
    return dict(hidden_size=d["h"], num_attention_heads=d["heads"], intermediate_size=d["i"], vocab_size=d["V"],
                num_hidden_layers=3, global_attn_every_n_layers=3, local_attention=16, max_position_embeddings=256,
                pad_token_id=0, bos_token_id=0, eos_token_id=0, cls_token_id=0, sep_token_id=0)


FAMILIES = {
    "llama": Family("LlamaForCausalLM", "model.layers", _llama_config, _llama_dims(), _DECODER_LAYER,
                    _DECODER_OUTSIDE),
    # Gemma's RMSNorm multiplies by (1 + weight) in fp32: a vector of h per norm, whatever the tokens
    "gemma": Family("GemmaForCausalLM", "model.layers", _llama_config, _llama_dims(),
                    _DECODER_LAYER + (("h (per norm, no T)", lambda d: d["h"]),),
                    _DECODER_OUTSIDE + (("h (no T)", lambda d: d["h"]),)),
    # a sliding window no longer than the sequence: sdpa takes a mask (float, like the scores, one per sequence),
    # and with a mask transformers repeats K and V to the query heads rather than sdpa's enable_gqa
    "mistral_window": Family("MistralForCausalLM", "model.layers", lambda d: dict(_llama_config(d), sliding_window=16),
                             _llama_dims(), _DECODER_LAYER + (("B·S²", lambda d: d["B"] * d["S"] ** 2), _SCORES),
                             _DECODER_OUTSIDE),
    # Mixtral: a router, then each token's k experts, run grouped (tokens sorted by expert)
    "mixtral": Family("MixtralForCausalLM", "model.layers", _mixtral_config, _moe_dims(), _MOE_LAYER,
                      _DECODER_OUTSIDE),
    "qwen2_moe": Family("Qwen2MoeForCausalLM", "model.layers", _qwen2_moe_config, _moe_dims(),
                        _MOE_LAYER + (("si (the shared expert's width)", lambda d: _T(d) * 4 * d["i"]),),
                        _DECODER_OUTSIDE),
    # DeepSeek-V3: multi-head latent attention; dense MLP layers (the first k) and MoE layers fitted apart
    "deepseek_v3_dense": Family("DeepseekV3ForCausalLM", "model.layers", lambda d: _deepseek_config(d, 99),
                                _mla_dims(), _MLA_LAYER + (("i", lambda d: _T(d) * d["i"]),), _MLA_OUTSIDE),
    "deepseek_v3_moe": Family("DeepseekV3ForCausalLM", "model.layers", lambda d: _deepseek_config(d, 0),
                              _mla_dims(), _MLA_LAYER + (
                                  ("k·ie", lambda d: _T(d) * d["k"] * d["ie"]), ("k·h", lambda d: _T(d) * d["k"] * d["h"]),
                                  ("shared·ie", lambda d: _T(d) * d["shared"] * d["ie"]), ("E", lambda d: _T(d) * d["E"]),
                                  ("groups", lambda d: _T(d) * d["groups"]), ("k", lambda d: _T(d) * d["k"]),
                                  ("E (no T)", lambda d: d["E"]), ("E·h (no T)", lambda d: d["E"] * d["h"])),
                              _MLA_OUTSIDE),
    "gptj": Family("GPTJForCausalLM", "transformer.h", _gptj_config, _gptj_dims(),
                   (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]),
                    ("T·heads·rd", lambda d: _T(d) * d["heads"] * d["rd"]), ("S·rd", lambda d: d["S"] * d["rd"]),
                    ("T·rd", lambda d: _T(d) * d["rd"]), ("T·heads", lambda d: _T(d) * d["heads"]), ("T", _T)),
                   (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]),
                    ("S·rd", lambda d: d["S"] * d["rd"]), ("T·rd", lambda d: _T(d) * d["rd"]), ("T", _T),
                    ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    "modernbert": Family("ModernBertForMaskedLM", "model.layers", _modernbert_config,
                         _bert_dims() + tuple(dict(d, B=d["B"] + 1, S=d["S"] + 8) for d in _bert_dims()[:4]),
                         (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]),
                          ("T·heads", lambda d: _T(d) * d["heads"]), ("T", _T), ("B·S²", lambda d: d["B"] * d["S"] ** 2),
                          ("S·h/heads", lambda d: d["S"] * d["h"] // d["heads"]), _SCORES),
                         (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]), ("T", _T),
                          ("S", lambda d: d["S"]), ("B·S²", lambda d: d["B"] * d["S"] ** 2),
                          ("S·h/heads", lambda d: d["S"] * d["h"] // d["heads"]), ("S²", lambda d: d["S"] ** 2),
                          ("1", lambda d: 1)), period=3,
                         per_period=True),
    "phi3": Family("Phi3ForCausalLM", "model.layers", _phi3_config, _phi3_dims(), _PHI3_LAYER, _DECODER_OUTSIDE),
    "gpt2": Family("GPT2LMHeadModel", "transformer.h", _gpt2_config, _gpt2_dims(),
                   (("T·h", lambda d: _T(d) * d["h"]), _SCORES, ("T", _T)),
                   (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]), ("T", _T),
                    ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    "gpt_neox": Family("GPTNeoXForCausalLM", "gpt_neox.layers", _neox_config, _neox_dims(),
                       (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]),
                        ("T·heads", lambda d: _T(d) * d["heads"]), ("T", _T)),
                       (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]),
                        ("S·rd", lambda d: d["S"] * d["rd"]), ("T", _T), ("S", lambda d: d["S"]),
                        ("1", lambda d: 1))),
    "gpt_neox_fast": Family("GPTNeoXForCausalLM", "gpt_neox.layers",
                            lambda d: dict(_neox_config(d), hidden_act="gelu_fast"), _neox_dims(),
                            (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]),
                             ("T·heads", lambda d: _T(d) * d["heads"]), ("T", _T)),
                            (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]),
                             ("S·rd", lambda d: d["S"] * d["rd"]), ("T", _T), ("S", lambda d: d["S"]),
                             ("1", lambda d: 1))),
    "roberta": Family("RobertaForMaskedLM", "roberta.encoder.layer", _roberta_config, _bert_dims(), _ENCODER_LAYER,
                      _ENCODER_OUTSIDE),
    "distilbert": Family("DistilBertForMaskedLM", "distilbert.transformer.layer", _distilbert_config, _bert_dims(),
                         _ENCODER_LAYER, _ENCODER_OUTSIDE),
    "electra": Family("ElectraForPreTraining", "electra.encoder.layer", _electra_config, _bert_dims(),
                      _ENCODER_LAYER, _ENCODER_OUTSIDE),
    # Gemma-2: eager attention (sdpa cannot softcap the scores), four norms a layer, softcapped logits; sliding and
    # full attention alternate, so a layer's bytes are the average over a pair
    # Gemma-2 with checkpointing: what each layer keeps beside the recomputation (its input, the masks it is given)
    "gemma2_checkpointed": Family(
        "Gemma2ForCausalLM", "model.layers", lambda d: dict(_llama_config(d), sliding_window=4096,
                                                          query_pre_attn_scalar=d["hd"]), _llama_dims(),
        (("T·h", lambda d: _T(d) * d["h"]), ("T·hd", lambda d: _T(d) * d["hd"]), ("S·hd", lambda d: d["S"] * d["hd"]),
         ("B·S²", lambda d: d["B"] * d["S"] ** 2), ("S²", lambda d: d["S"] ** 2), ("1", lambda d: 1)),
        _DECODER_OUTSIDE + (("h (no T)", lambda d: d["h"]), ("B·S²", lambda d: d["B"] * d["S"] ** 2),
                            ("S²", lambda d: d["S"] ** 2), ("T·hd", lambda d: _T(d) * d["hd"])), period=2),
    "gemma2": Family("Gemma2ForCausalLM", "model.layers", lambda d: dict(_llama_config(d), sliding_window=4096,
                                                                        query_pre_attn_scalar=d["hd"]),
                     _llama_dims(), _DECODER_LAYER + (_SCORES, ("h (per norm, no T)", lambda d: d["h"])),
                     _DECODER_OUTSIDE + (("h (no T)", lambda d: d["h"]),), period=2),
    "albert": Family("AlbertForMaskedLM", "albert.encoder", _albert_config, _albert_dims(),
                     (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]),
                      ("T·heads", lambda d: _T(d) * d["heads"]), ("T", _T)),
                     (("T·h", lambda d: _T(d) * d["h"]), ("T·e", lambda d: _T(d) * d["e"]),
                      ("T·V", lambda d: _T(d) * d["V"]), ("T", _T), ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    # T5: encoder and decoder each at --seq tokens; a decoder layer adds cross-attention
    "t5": Family("T5ForConditionalGeneration", "", _t5_config, _t5_dims(), _T5_LAYER,
                 (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]), ("T", _T),
                  ("S²", lambda d: d["S"] ** 2), ("1", lambda d: 1)) + _KEPT_ARGUMENTS, decoder_key="num_decoder_layers"),
    # BART: encoder and decoder each at --seq tokens (the labels shifted right); a decoder layer adds cross-attention
    "bart": Family("BartForConditionalGeneration", "", _bart_config, _bert_dims(),
                   (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]), _SCORES, ("T", _T),
                    ("S²", lambda d: d["S"] ** 2)),
                   (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]), ("T", _T),
                    ("S", lambda d: d["S"]), ("S²", lambda d: d["S"] ** 2), ("1", lambda d: 1)) + _KEPT_ARGUMENTS[:3],
                   decoder_key="decoder_layers", layers_key="encoder_layers"),
    # the bare BartModel (the preset's class), trained on the sum of its output: the same layers
    "bart_model": Family("BartModel", "", _bart_config, _bert_dims(),
                         (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]), _SCORES,
                          ("T", _T), ("S²", lambda d: d["S"] ** 2)),
                         (("T·h", lambda d: _T(d) * d["h"]), ("T", _T), ("S", lambda d: d["S"]),
                          ("S²", lambda d: d["S"] ** 2), ("1", lambda d: 1)),
                         decoder_key="decoder_layers", layers_key="encoder_layers"),
    # DeBERTa-v2/v3 (the preset's bare DebertaV2Model, trained on its output's sum): each layer projects the 2P
    # relative embeddings through the shared query and key projections, repeated over the batch
    "deberta_v2_model": Family("DebertaV2Model", "encoder.layer", _deberta_config, _deberta_dims(),
                               (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]), _SCORES,
                                ("T", _T), ("B·2P·h", lambda d: d["B"] * 2 * d["P"] * d["h"]),
                                ("2P·h", lambda d: 2 * d["P"] * d["h"]), ("S²", lambda d: d["S"] ** 2),
                                ("B·S²", lambda d: d["B"] * d["S"] ** 2),
                                ("B·heads·S·2P", lambda d: d["B"] * d["heads"] * d["S"] * 2 * d["P"]), ("1", lambda d: 1)),
                               (("T·h", lambda d: _T(d) * d["h"]), ("T", _T), ("2P·h", lambda d: 2 * d["P"] * d["h"]),
                                ("2P", lambda d: 2 * d["P"]), ("S²", lambda d: d["S"] ** 2),
                                ("B·S²", lambda d: d["B"] * d["S"] ** 2), ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    # DeBERTa-v2 masked LM (the legacy head: dense, GELU, norm, the tied decoder): the same layers
    "deberta_v2_mlm": Family("DebertaV2ForMaskedLM", "deberta.encoder.layer", _deberta_config, _deberta_dims(),
                             (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]), _SCORES,
                              ("T", _T), ("B·2P·h", lambda d: d["B"] * 2 * d["P"] * d["h"]),
                              ("2P·h", lambda d: 2 * d["P"] * d["h"]), ("S²", lambda d: d["S"] ** 2),
                              ("B·S²", lambda d: d["B"] * d["S"] ** 2),
                              ("B·heads·S·2P", lambda d: d["B"] * d["heads"] * d["S"] * 2 * d["P"]),
                              ("1", lambda d: 1)),
                             (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]), ("T", _T),
                              ("2P·h", lambda d: 2 * d["P"] * d["h"]), ("2P", lambda d: 2 * d["P"]),
                              ("S²", lambda d: d["S"] ** 2), ("B·S²", lambda d: d["B"] * d["S"] ** 2),
                              ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    "bert": Family("BertForMaskedLM", "bert.encoder.layer", _bert_config, _bert_dims(),
                   (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]), _SCORES, ("T", _T)),
                   (("T·h", lambda d: _T(d) * d["h"]), ("T·V", lambda d: _T(d) * d["V"]), ("T", _T),
                    ("S", lambda d: d["S"]), ("1", lambda d: 1))),
}


def measure(family: Family, dims: dict, kind: str) -> tuple[int, ...]:
    """(bytes one more layer adds to what the forward saves, [one more decoder layer,] bytes saved outside the
    layers), autocast's 16-bit weight copies taken out."""
    from paramscope.cost.model_view import from_module
    from paramscope.cost.memory.training import _cast_weights

    def saved(layers: int, decoder_layers: int | None = None) -> int:
        model, step = _trace(family, dims, kind, layers, decoder_layers)
        # checkpointed layers do not keep their copies (the recomputation casts again); the head's is kept
        casts = _cast_weights(from_module(model))[1 if CHECKPOINTING else 0] if kind == "bf16-mixed" else 0
        return step.saved_activations - 2 * casts

    base, more = 2 * family.period, 3 * family.period
    if family.decoder_key:
        start = saved(2, 2)
        encoder, decoder = saved(3, 2) - start, saved(2, 3) - start
        return encoder, decoder, start - 2 * encoder - 2 * decoder
    low, high = saved(base), saved(more)
    if family.per_period:  # layers of several kinds: the bytes of one whole period
        return high - low, low - 2 * (high - low)
    if (high - low) % family.period:
        raise SystemExit(f"{family.cls}: {family.period} layers add {high - low} B, not a multiple")
    layer = (high - low) // family.period  # the average over the period
    return layer, low - base * layer


def _trace(family: Family, dims: dict, kind: str, layers: int, decoder_layers: int | None = None):
    import torch
    import transformers

    from paramscope.cost.traced.step import StepSettings, trace_training
    from paramscope.cost.memory.states import weight_dtype

    config_class = re.sub(r"(ForCausalLM|ForMaskedLM|LMHeadModel|ForPreTraining|ForConditionalGeneration|Model)$", "Config",
                          family.cls)
    kwargs = family.config(dims)
    key = family.layers_key or next((k for k in ("n_layer", "n_layers", "num_layers") if k in kwargs),
                                    "num_hidden_layers")
    kwargs[key] = layers
    if decoder_layers is not None:
        kwargs[family.decoder_key] = decoder_layers
    config = getattr(transformers, config_class)(**kwargs)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, weight_dtype(kind)))
    try:
        with torch.device("meta"):
            model = getattr(transformers, family.cls)(config)
    finally:
        torch.set_default_dtype(previous)
    return model, trace_training(model, StepSettings(batch=dims["B"], seq=dims["S"], precision=kind,
                                                     grad_checkpointing=CHECKPOINTING))


def solve(rows: list[list[int]], values: list[int]) -> tuple[list[Fraction], Fraction | None]:
    """Coefficients rounded to half bytes, and the largest miss over the configs (None: the terms are not
    independent over these configs)."""
    a, y = np.array(rows, dtype=float), np.array(values, dtype=float)
    coefficients, *_ = np.linalg.lstsq(a, y, rcond=None)
    exact = [Fraction(round(c * 2), 2) for c in coefficients]  # whole or half bytes per element
    worst = max(abs(v - sum(c * x for c, x in zip(exact, row))) for row, v in zip(rows, values))
    return exact, worst if np.linalg.matrix_rank(a) == len(exact) else None


def fit(name: str) -> None:
    family = FAMILIES[name]
    parts = [("layer", family.layer_terms)] + ([("decoder", family.layer_terms)] if family.decoder_key else []) + \
        [("outside", family.outside_terms)]
    for kind in KINDS:
        rows: dict[str, list] = {what: [] for what, _ in parts}
        values: dict[str, list] = {what: [] for what, _ in parts}
        for dims in family.dims:
            for (what, terms), value in zip(parts, measure(family, dims, kind)):
                rows[what].append([f(dims) for _, f in terms])
                values[what].append(value)
        for what, terms in parts:
            coefficients, worst = solve(rows[what], values[what])
            text = " + ".join(f"{c}·{t}" for c, (t, _) in zip(coefficients, terms) if c)
            verdict = "terms not independent" if worst is None else "exact" if worst == 0 else \
                f"within {worst} B" if worst <= 8 else "NOT EXACT"
            print(f"{name:6} {kind:10} {what:7} {verdict}: {text}", flush=True)
            if worst is None or worst > 8:
                misses = [v - sum(c * x for c, x in zip(coefficients, row)) for row, v in zip(rows[what], values[what])]
                print(f"{'':6} {'':10} {'':7} residuals {', '.join(str(m) for m in misses)}")


def main(argv: list[str]) -> int:
    global CHECKPOINTING
    CHECKPOINTING = "--checkpointing" in argv
    argv = [a for a in argv if a != "--checkpointing"]
    for name in argv or list(FAMILIES):
        if name not in FAMILIES:
            raise SystemExit(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
        fit(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
