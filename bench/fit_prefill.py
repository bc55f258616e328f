"""Fit the analytic prefill workspace (src/paramscope/cost/prefill.py) to the traced prefill, exactly.

    python bench/fit_prefill.py [--fp32] [--ops] [--layers] [FAMILY ...]    # default: every family, in bf16

For each family, the prefill generate() runs (use_cache, the last token's logits; every token, and no cache, for a
model that does not generate) is traced on fake tensors in bf16 or fp32 (cost/probe.py, MemTracker) at varied small
configs, batches and lengths. The workspace is the traced peak less the weights, buffers and KV cache, which the
analytic engine has exactly (memory/weights.py, memory/kv.py; a windowed layer's cache as the prefill ends holds the whole
prompt, `prefill_extra`).

The peak is the largest moment of the last layer's forward, and which op that is depends on the config (the MLP's
intermediates against the attention's scores). So each config is also run on real CPU tensors under MemTracker to
find the module (and with --ops the op) at its peak; the configs are grouped by it, each group is solved by least
squares for whole-byte coefficients of the family's terms (T·h, T·i, B·heads·S², …), and the largest of the exact
moments is checked on every config. A group with too few configs lists them, to add configs in its regime. The
encoder's moments (T5) are before any cache. Prints each moment's formula, ready for memory/prefill.py.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from fit_activations import (_albert_config, _bart_config, _bert_config, _bert_dims, _deberta_config, _deberta_dims,
                             _electra_config, _gpt2_config, _gpt2_dims, _gptj_config, _llama_config, _mixtral_config,
                             _moe_dims, _neox_config, _phi3_config, _qwen2_moe_config, solve, _T, _t5_config,
                             _t5_dims)


@dataclass(frozen=True)
class Family:
    cls: str
    config: Callable[[dict], dict]
    dims: tuple[dict, ...]
    terms: tuple[tuple[str, Callable[[dict], int]], ...]


def _varied(count: int, seed: int, **ranges: tuple[int, ...]) -> tuple[dict, ...]:
    """`count` configs, each dimension drawn from its choices (seeded: the same configs every run)."""
    import random

    rng = random.Random(seed)
    return tuple({key: rng.choice(choices) for key, choices in ranges.items()} for _ in range(count))


_SCORES = ("B·heads·S²", lambda d: d["B"] * d["heads"] * d["S"] ** 2)
_SCORES_ = _SCORES
_BV = ("B·V", lambda d: d["B"] * d["V"])

# encoders' and encoder-decoders' configs: the MLP's regime, the attention's (long, many heads), the norms'
_ENCODER_VARIED = (
    _varied(24, 11, h=(64, 96, 128, 192, 256), heads=(2, 4, 8), i=(128, 256, 512, 1024), V=(300, 500), B=(1, 2, 3),
            S=(16, 32, 48, 80, 128))
    + _varied(20, 12, h=(32, 64), heads=(4, 8, 16), i=(64, 128), V=(300,), B=(1, 2), S=(128, 192, 256, 320))
    + _varied(14, 13, h=(256, 384), heads=(2, 4), i=(64, 128), V=(300,), B=(1, 2, 3), S=(16, 24, 40)))

def _decoders(count: int, seed: int, **ranges: tuple[int, ...]) -> tuple[dict, ...]:
    """Decoder configs: kv heads a divisor of the heads, h = heads × hd unless `h` is given."""
    import random

    rng = random.Random(seed)
    configs = []
    for d in _varied(count, seed, **ranges):
        d["kv"] = rng.choice([k for k in range(1, d["heads"] + 1) if d["heads"] % k == 0])
        d.setdefault("h", d["heads"] * d["hd"])
        configs.append(d)
    return tuple(configs)


_DECODER_RANGES = dict(heads=(2, 4, 6, 8), hd=(16, 32, 64), i=(128, 256, 512, 1024), V=(300, 700, 1200),
                       B=(1, 2, 3), S=(16, 32, 64, 96, 128))
_DECODER_LONG = dict(heads=(4, 8, 16), hd=(8, 16), i=(32, 64), V=(300,), B=(1, 2), S=(192, 256, 384))
_DECODER_VARIED = _decoders(36, 21, **_DECODER_RANGES) + _decoders(16, 22, **_DECODER_LONG)
# head_dim given apart from h / heads (Llama, Mistral, Gemma-2)
# a sliding window the sequence fills (W ≤ S), varied apart from S
_WINDOWED = tuple(dict(d, W=min(d["S"], (8, 16, 24)[n % 3])) for n, d in enumerate(
    _decoders(36, 24, **_DECODER_RANGES) + _decoders(16, 25, **_DECODER_LONG)))
_WINDOW_TERMS = ("B·W", lambda d: d["B"] * d["W"]), ("W", lambda d: d["W"]), ("S·W", lambda d: d["S"] * d["W"])
_DECODER_FREE = _DECODER_VARIED + tuple(d for d in _decoders(30, 23, h=(96, 192, 256, 384), **_DECODER_RANGES)
                                        if d["h"] % d["heads"] == 0)
_DECODER_TERMS = (("T·h", lambda d: _T(d) * d["h"]), ("T·q", lambda d: _T(d) * d["heads"] * d["hd"]),
                  ("T·kv", lambda d: _T(d) * d["kv"] * d["hd"]), ("T·i", lambda d: _T(d) * d["i"]),
                  ("T·heads", lambda d: _T(d) * d["heads"]), _SCORES_, ("B·S²", lambda d: d["B"] * d["S"] ** 2),
                  ("S²", lambda d: d["S"] ** 2),
                  ("S·hd", lambda d: d["S"] * d["hd"]), ("B·V", lambda d: d["B"] * d["V"]), ("T", _T),
                  ("S", lambda d: d["S"]), ("1", lambda d: 1))

# MoE configs: every width a multiple of 16 (grouped_mm's alignment), E experts, k of them a token
_MOE_VARIED = _moe_dims() + tuple(dict(d, h=16 * (d["h"] // 16), i=16 * (d["i"] // 16 + 1), E=e, k=k)
                                  for d, e, k in zip(_DECODER_FREE, (4, 8, 6, 3, 16, 5, 2, 12) * 9,
                                                     (2, 1, 3, 2, 4, 1, 2, 3) * 9)
                                  if d["hd"] % 16 == 0 and d["h"] >= 64)
_MOE_TERMS = (("T·h", lambda d: _T(d) * d["h"]), ("T·q", lambda d: _T(d) * d["heads"] * d["hd"]),
              ("T·kv", lambda d: _T(d) * d["kv"] * d["hd"]), ("T·k·i", lambda d: _T(d) * d["k"] * d["i"]),
              ("T·k·h", lambda d: _T(d) * d["k"] * d["h"]), ("T·E", lambda d: _T(d) * d["E"]),
              ("T·k", lambda d: _T(d) * d["k"]), ("T", _T), ("S·hd", lambda d: d["S"] * d["hd"]),
              ("E", lambda d: d["E"]), ("S", lambda d: d["S"]), ("1", lambda d: 1))
_PHI3_TERMS = tuple(t for t in _DECODER_TERMS if t[0] != "T·q")  # Phi-3 has no head_dim: q = h

FAMILIES = {
    # Qwen1.5-MoE (routed experts of width i and a shared expert of width 4i with a sigmoid gate): NOT EXACT yet
    # with these terms (2026-11-25), so memory/prefill.py has no moments for it (the Llama formula: -1.5% at its defaults)
    "qwen2_moe": Family("Qwen2MoeForCausalLM", lambda d: dict(_qwen2_moe_config(d), max_position_embeddings=512),
                        _MOE_VARIED, _MOE_TERMS + (("T·i (the shared expert)", lambda d: _T(d) * d["i"]),)),
    # Mixtral (a router, then each token's k experts, run grouped: tokens sorted by expert)
    "mixtral": Family("MixtralForCausalLM", lambda d: dict(_mixtral_config(d), max_position_embeddings=512),
                      _MOE_VARIED, _MOE_TERMS),
    # Phi-3 (fused qkv and gate-up projections; no head_dim: q = h), below and at its sliding window
    "phi3": Family("Phi3ForCausalLM", lambda d: dict(_phi3_config(d), head_dim=d["hd"], max_position_embeddings=512),
                   _DECODER_VARIED, _PHI3_TERMS),
    "phi3_window": Family("Phi3ForCausalLM", lambda d: dict(_phi3_config(d), max_position_embeddings=512,
                                                            sliding_window=d["W"]), _WINDOWED,
                          _PHI3_TERMS + _WINDOW_TERMS),
    "mistral_window": Family("MistralForCausalLM", lambda d: dict(_llama_config(d), sliding_window=d["W"],
                                                                  max_position_embeddings=512),
                             _WINDOWED, _DECODER_TERMS + _WINDOW_TERMS),
    # Gemma-2 (eager attention: softcapped fp32 scores; sliding and global layers alternate)
    # (grouped K and V only: with as many kv heads as heads eager attention uses the cache's K and V as they are)
    "gemma2": Family("Gemma2ForCausalLM", lambda d: dict(_llama_config(d), sliding_window=4096,
                                                         query_pre_attn_scalar=d["hd"]),
                     tuple(d for d in _DECODER_FREE if d["kv"] < d["heads"]),
                     _DECODER_TERMS + (("h", lambda d: d["h"]),)),
    "gemma2_window": Family("Gemma2ForCausalLM", lambda d: dict(_llama_config(d), sliding_window=d["W"],
                                                                query_pre_attn_scalar=d["hd"]), _WINDOWED,
                            _DECODER_TERMS + (("h", lambda d: d["h"]),) + _WINDOW_TERMS),
    # GPT-J (parallel attention and MLP, the unfused tanh GELU, rotary on the first rd of each head)
    "gptj": Family("GPTJForCausalLM", lambda d: dict(_gptj_config(d), n_positions=512),
                   tuple(dict(d, h=d["heads"] * d["hd"], rd=d["hd"] // (1, 2, 4)[n % 3])
                         for n, d in enumerate(_DECODER_VARIED)),
                   (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]),
                    ("T·heads·rd", lambda d: _T(d) * d["heads"] * d["rd"]), ("S·rd", lambda d: d["S"] * d["rd"]),
                    ("T·rd", lambda d: _T(d) * d["rd"]), ("T·heads", lambda d: _T(d) * d["heads"]), _SCORES,
                    _BV, ("T", _T), ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    # GPT-NeoX (Pythia: parallel residual, rotary on a quarter of each head, exact GELU)
    "gpt_neox": Family("GPTNeoXForCausalLM", lambda d: dict(_neox_config(d), max_position_embeddings=512),
                       tuple(dict(d, h=d["heads"] * d["hd"], rd=d["hd"] // 4) for d in _DECODER_VARIED),
                       (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]),
                        ("T·heads", lambda d: _T(d) * d["heads"]), ("S·rd", lambda d: d["S"] * d["rd"]),
                        ("T·rd", lambda d: _T(d) * d["rd"]), _SCORES, _BV, ("T", _T), ("S", lambda d: d["S"]),
                        ("1", lambda d: 1))),
    "gpt_neox_fast": Family("GPTNeoXForCausalLM", lambda d: dict(_neox_config(d), max_position_embeddings=512,
                                                                  hidden_act="gelu_fast"),
                            tuple(dict(d, h=d["heads"] * d["hd"], rd=d["hd"] // 4) for d in _DECODER_VARIED),
                            (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]),
                             ("T·heads", lambda d: _T(d) * d["heads"]), ("S·rd", lambda d: d["S"] * d["rd"]),
                             ("T·rd", lambda d: _T(d) * d["rd"]), _SCORES, _BV, ("T", _T), ("S", lambda d: d["S"]),
                             ("1", lambda d: 1))),
    # ALBERT (the unfused tanh GELU, embeddings of width e) and ELECTRA's discriminator: every token scored
    "albert": Family("AlbertForMaskedLM", lambda d: dict(_albert_config(d), max_position_embeddings=512),
                     tuple(dict(d, e=e) for d, e in zip(_bert_dims() + _ENCODER_VARIED, (16, 32, 48, 64) * 20)),
                     (("T·h", lambda d: _T(d) * d["h"]), ("T·e", lambda d: _T(d) * d["e"]),
                      ("T·i", lambda d: _T(d) * d["i"]), ("T·V", lambda d: _T(d) * d["V"]), _SCORES, ("T", _T),
                      ("S·h", lambda d: d["S"] * d["h"]), ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    "electra": Family("ElectraForPreTraining", lambda d: dict(_electra_config(d), max_position_embeddings=512),
                      _bert_dims() + _ENCODER_VARIED,
                      (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]), _SCORES, ("T", _T),
                       ("S·h", lambda d: d["S"] * d["h"]), ("B·S²", lambda d: d["B"] * d["S"] ** 2),
                       ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    # n_inner varied apart from 4h (every GPT-2 preset has 4h)
    "gpt2": Family("GPT2LMHeadModel", lambda d: dict(_gpt2_config(d), n_inner=d["i"]),
                   tuple(dict(d, i=i) for d, i in zip(_gpt2_dims(), (1000, 300, 640, 400, 900, 512, 200))),
                   (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]),
                    ("S·h", lambda d: d["S"] * d["h"]), _BV, ("T", _T), ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    "t5": Family("T5ForConditionalGeneration", _t5_config,
                 _t5_dims() + _varied(30, 5, h=(64, 96, 128, 192, 256), heads=(2, 4, 6, 8), dkv=(16, 32, 48, 64),
                                      i=(128, 256, 384, 512, 1024, 2048), V=(300, 500, 700), B=(1, 2, 3),
                                      S=(16, 32, 48, 80, 96, 128, 160))
                 # the norms' regime (wide, narrow MLP and heads) and the attentions' (long, narrow)
                 + _varied(14, 6, h=(256, 320, 384), heads=(2, 4), dkv=(8, 16), i=(64, 96, 128), V=(300,),
                           B=(1, 2, 3), S=(16, 24, 32, 40))
                 + _varied(16, 7, h=(32, 48, 64), heads=(4, 8, 12), dkv=(8, 16), i=(64, 128), V=(300,),
                           B=(1, 2, 3), S=(160, 192, 256, 320))
                 + _varied(20, 8, h=(32, 64), heads=(8, 12, 16), dkv=(8,), i=(64,), V=(300,), B=(1, 2),
                           S=(192, 256, 320, 384))
                 + _varied(16, 9, h=(32, 48, 64, 96), heads=(1, 2, 4), dkv=(8, 16, 32), i=(64, 128, 256), V=(300,),
                           B=(1, 2), S=(160, 256, 384, 448))
                 + _varied(20, 10, h=(16, 32, 48), heads=(1, 2), dkv=(8, 16), i=(32, 64), V=(300,), B=(1, 2),
                           S=(320, 384, 448, 512))
                 # the head's regime: every decoder token's logits over a large vocabulary
                 + _varied(14, 17, h=(64, 128), heads=(2, 4), dkv=(16, 32), i=(128, 256), V=(4000, 6000, 8000),
                           B=(1, 2), S=(32, 64, 96, 128)),
                 (("T·h", lambda d: _T(d) * d["h"]), ("T·inner", lambda d: _T(d) * d["heads"] * d["dkv"]),
                  ("T·i", lambda d: _T(d) * d["i"]), _SCORES, ("heads·S²", lambda d: d["heads"] * d["S"] ** 2),
                  ("T·V", lambda d: _T(d) * d["V"]), ("T", _T), ("S²", lambda d: d["S"] ** 2), ("S", lambda d: d["S"]),
                  ("1", lambda d: 1))),
    "bart_model": Family("BartModel", lambda d: dict(_bart_config(d), max_position_embeddings=512),
                         _bert_dims() + _ENCODER_VARIED,
                         (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]), _SCORES,
                          ("S·h", lambda d: d["S"] * d["h"]), ("T", _T), ("S²", lambda d: d["S"] ** 2),
                          ("B·S²", lambda d: d["B"] * d["S"] ** 2), ("S", lambda d: d["S"]), ("1", lambda d: 1))),
    "deberta_v2_model": Family("DebertaV2Model",
                               lambda d: dict(_deberta_config(d), max_position_embeddings=512),
                               _deberta_dims() + tuple(dict(d, P=p) for d, p in zip(_ENCODER_VARIED,
                                                                                    (8, 16, 24, 32, 64, 128) * 10))
                               # the MLP's regime (short, wide MLP) and the relative embeddings' (many positions)
                               + _varied(16, 14, h=(64, 128, 192), heads=(2, 4), i=(1024, 1536, 2048), V=(300,),
                                         B=(1, 2, 3), S=(8, 12, 16, 24), P=(4, 8))
                               + _varied(16, 15, h=(128, 192, 256), heads=(2, 4), i=(64, 128), V=(300,),
                                         B=(1, 2, 3), S=(8, 12, 16), P=(128, 192, 256))
                               # the projections' regime (wide, one sequence, short)
                               + _varied(24, 16, h=(256, 320, 384, 512), heads=(2, 4), i=(32, 64, 128), V=(300,),
                                         B=(1,), S=(8, 16, 24, 32, 40), P=(8, 16, 32, 64))
                               # deberta-v3-base's proportions: many narrow heads, 2P about S
                               + tuple(dict(d, h=8 * d["heads"]) for d in _varied(
                                   24, 18, heads=(8, 12, 16), i=(256, 384, 512), V=(300,), B=(1, 2),
                                   S=(48, 64, 96, 128), P=(24, 32, 48, 64))),
                               (("T·h", lambda d: _T(d) * d["h"]), ("T·i", lambda d: _T(d) * d["i"]), _SCORES,
                                ("B·heads·S·2P", lambda d: d["B"] * d["heads"] * d["S"] * 2 * d["P"]),
                                ("B·2P·h", lambda d: d["B"] * 2 * d["P"] * d["h"]),
                                ("2P·h", lambda d: 2 * d["P"] * d["h"]), ("S²", lambda d: d["S"] ** 2),
                                ("B·S²", lambda d: d["B"] * d["S"] ** 2), ("T", _T), ("1", lambda d: 1))),
}


def workspace(family: Family, dims: dict, layers: int = 2) -> tuple[int, int, str]:
    """The traced prefill peak less the weights and buffers (bf16), the KV cache, and the module running at the
    peak (from the same prefill on real CPU tensors, digits as *)."""
    import transformers

    from paramscope.cost.memory.serving import MemoryOptions
    from paramscope.cost.memory.serving_answer import estimate_memory
    from paramscope.cost.traced.cache_probe import traced_prefill_peak

    kwargs = dict(family.config(dims))
    for key in ("n_layer", "num_layers", "num_hidden_layers", "encoder_layers", "decoder_layers",
                "num_decoder_layers"):
        if key in kwargs:
            kwargs[key] = layers
    import re

    config_class = getattr(transformers, re.sub(
        r"(ForCausalLM|ForMaskedLM|LMHeadModel|ForPreTraining|ForConditionalGeneration|Model)$", "Config", family.cls))
    config = config_class(**kwargs)
    raw = config.to_dict()
    raw["architectures"] = [family.cls]
    memory = estimate_memory(raw, MemoryOptions(dtype=DTYPE[0], batch=dims["B"], seq=dims["S"]),
                             model_class=family.cls)
    traced = traced_prefill_peak(getattr(transformers, family.cls), config, batch=dims["B"], seq=dims["S"],
                                 dtype=DTYPES[DTYPE[0]])
    # the cache as the prefill ends: a windowed layer still holds the whole prompt's K and V (memory/kv.py)
    kv = memory.kv_cache.bytes + memory.kv_cache.prefill_extra(dims["B"], dims["S"]) if memory.kv_cache else 0
    return traced - memory.weights.bytes - memory.weights.buffer_bytes, kv, _peak_module(family, config, dims)


def _peak_module(family: Family, config, dims: dict) -> str:
    import inspect
    import re

    import torch
    import transformers
    from torch.distributed._tools.mem_tracker import MemTracker

    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, DTYPES[DTYPE[0]]))
    try:
        model = getattr(transformers, family.cls)(config).eval()
    finally:
        torch.set_default_dtype(previous)
    ids = torch.zeros((dims["B"], dims["S"]), dtype=torch.long)
    kwargs = {"input_ids": ids}
    if config.is_encoder_decoder:
        kwargs["decoder_input_ids"] = ids
    if model.can_generate():
        kwargs.update(use_cache=True, logits_to_keep=1)
    elif "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False  # as the traced engine runs a model that does not generate
    tracker = MemTracker()
    tracker.track_external(model)
    where = [0, ""]
    update = tracker._update_peak_stats

    from torch.utils._python_dispatch import TorchDispatchMode

    last = {"module": "", "op": "", "counts": {}}

    class Ops(TorchDispatchMode):  # the op running at each moment, and its count within the innermost module
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            module = max(tracker._mod_tracker.parents, key=len)
            if module != last["module"]:
                last.update(module=module, counts={})
            name = func.__name__
            last["counts"][name] = last["counts"].get(name, 0) + 1
            last["op"] = f"{name}#{last['counts'][name]}"
            return func(*args, **(kwargs or {}))

    def watch(state):  # the module path innermost and the op at each new peak
        total = sum(snap["Total"] for snap in tracker._curr_mem_snap.values())
        if total > where[0]:
            where[:] = [total, max(tracker._mod_tracker.parents, key=len) + (":" + last["op"] if OPS[0] else "")]
        update(state)

    tracker._update_peak_stats = watch
    with tracker, Ops(), torch.no_grad():
        model(**kwargs)
    path = where[1].split(".", 1)[-1]
    return path if KEEP_DIGITS[0] else re.sub(r"\.\d+\.", ".*.", path)


DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
DTYPE = ["bf16"]  # --fp32: fit the fp32 prefill
KEEP_DIGITS = [False]  # --layers: group by the layer too
OPS = [False]  # --ops: group the configs by the op at the peak too, not the module alone


def fit(name: str) -> None:
    family = FAMILIES[name]
    groups: dict[str, tuple[list, list, list]] = {}
    seen: dict[str, list] = {}  # location → the configs peaking there (listed where too few to fit)
    for dims in family.dims:
        value, kv, where = workspace(family, dims)
        rows, values, caches = groups.setdefault(where, ([], [], []))
        seen.setdefault(where, []).append(dims)
        values.append(value)
        caches.append(kv)
        rows.append([term(dims) for _, term in family.terms])
    moments = []
    for where, (rows, values, caches) in groups.items():
        # the encoder runs before the decoder caches anything: its moments are fitted without the cache
        cached = not where.startswith("encoder.")
        print(f"{name} at {where} ({len(rows)} configs)" + ("" if cached else ", the cache not yet held"))
        exact = _report(name, family, rows, [v - k if cached else v for v, k in zip(values, caches)])
        if exact:
            moments.append((exact, cached))
    if not moments:
        return
    # the workspace is the largest moment: check the max of the exact ones on every config
    misses = []
    for rows, values, caches in groups.values():
        for row, value, kv in zip(rows, values, caches):
            best = max(sum(c * x for c, x in zip(m, row)) + (kv if cached else 0) for m, cached in moments)
            if best != value:
                misses.append((value, best))
    for where, configs in seen.items():
        if len(configs) < len(family.terms):
            print(f"{'':18} configs at {where}: {configs[:4]}")
    print(f"{name:18} the largest moment: " + ("exact on every config" if not misses else
                                                 f"{len(misses)} misses (traced, max): {misses[:6]}"))


def _report(name: str, family: Family, rows: list, values: list) -> list | None:
    if len(rows) < len(family.terms):
        print(f"{'':18} too few configs for {len(family.terms)} terms")
        return None
    exact, worst = solve(rows, values)
    formula = " + ".join(f"{c}·{n}" for c, (n, _) in zip(exact, family.terms) if c)
    if worst is None:
        print(f"{name:18} terms not independent: {formula}")
    elif worst == 0:
        print(f"{name:18} exact: {formula}")
        return exact
    else:
        misses = [v - sum(c * x for c, x in zip(exact, row)) for row, v in zip(rows, values)]
        print(f"{name:18} NOT EXACT: {formula}\n{'':18} residuals {', '.join(str(m) for m in misses)}")


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Fit the prefill workspace's moments to the traced prefill.")
    parser.add_argument("families", nargs="*", metavar="FAMILY", help=f"one of {', '.join(FAMILIES)} (default: all)")
    parser.add_argument("--fp32", action="store_true", help="fit the fp32 prefill (default: bf16)")
    parser.add_argument("--ops", action="store_true", help="group the configs by the op at the peak too")
    parser.add_argument("--layers", action="store_true", help="group by the layer too (digits kept)")
    args = parser.parse_args(argv)
    DTYPE[0] = "fp32" if args.fp32 else "bf16"
    OPS[0], KEEP_DIGITS[0] = args.ops, args.layers
    unknown = [name for name in args.families if name not in FAMILIES]
    if unknown:
        parser.error(f"unknown family {unknown[0]!r}; known: {', '.join(FAMILIES)}")
    for name in args.families or list(FAMILIES):
        fit(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
