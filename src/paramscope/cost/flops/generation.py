"""FLOPs of generate(): the prompt's prefill and the decode steps after it (`flops --generate N`).

    prefill  = the forward over the prompt's B × S tokens, the lm head on the last token of each sequence only
               (generate asks for logits_to_keep=1): forward − head + head ÷ S
    decode   = N − 1 steps (the prefill's logits give the first new token); step j runs one token a sequence over a
               cache of S + j − 1 tokens, so its attention reads S + j keys in a full layer and min(window, S + j) in
               a sliding or chunked one (the cache keeps the window; its decode mask changes no FLOP):
               step(c) = 2·B·(matmul weights a token meets) + 2·B·heads·(d_qk + d_v) per key and attention layer
               + MLA: 2·B·(c − 1)·kv_up (transformers caches the latent and decompresses every cached token each
               step)
               + recurrent layers (Mamba and Mamba-2 mixers, short convolutions, gated DeltaNet): their conv and
               scan, the same at every c (recurrent_decode.py; they add theirs to the prefill too); an
               attention-free model's linears are read from its modules

Checked once per config against FlopCounterMode on a cut (a prefill and two decode steps at each check point, the
long one past any window), as the forward is (engine_check.py); where they differ, FlopCounterMode counts the
prefill and the steps, each stretch of steps between the config's windows traced at its ends and summed on its
line (checked on a third step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..dims import is_mla, text_config
from ..memory.kv import layer_kinds

_NO_ATTENTION = ("none", "linear_attention", "mamba", "conv", "recurrent", "shared")
MAX_NEW_TOKENS = 1 << 24


@dataclass(frozen=True)
class GenerationFlops:
    new_tokens: int
    prefill: int  # the prompt's forward, the head on the last token of each sequence
    head_skipped: int | None  # the head FLOPs a full forward would spend on the other prompt tokens (analytic)
    decode: int  # the N − 1 decode steps
    first_step: int | None  # keys S + 1 (None when N = 1)
    last_step: int | None  # keys S + N − 1
    arithmetic: str
    engine: str  # "analytic" | "traced"
    check: Any = None  # engine_check.EngineCheck: the analytic count held against FlopCounterMode for this config

    @property
    def total(self) -> int:
        return self.prefill + self.decode


def analytic_generation(view: Any, params: Any, *, batch: int, seq: int, new_tokens: int,
                        causal: str = "full") -> GenerationFlops | None:
    """generate()'s FLOPs from the analytic forward at S and at one token; None where the forward has no closed
    form or the attention layers' kinds are not known here."""
    from .analytic import analytic_flops
    from .recurrent_decode import NoRecurrentFormula, attention_free_linears, recurrent_flops

    config = text_config(view.config)
    if getattr(config, "is_encoder_decoder", False):
        return None
    try:  # recurrent layers: their conv and scan, a fixed count a step (recurrent_decode.py)
        recurrent = recurrent_flops(view, config)
    except NoRecurrentFormula:
        return None
    windows = [window for kind, window in layer_kinds(config) if kind not in _NO_ATTENTION]
    if recurrent is not None and not windows:  # attention-free: no analytic forward, only its linears
        linears = attention_free_linears(view, params, config)
        if linears is None:
            return None
        weights, head_weights = linears
        head, kept, per_key = 2 * batch * seq * head_weights, 2 * batch * head_weights, 0
        forward = 2 * batch * seq * weights
        prefill = forward - head + kept
        matmul = 2 * batch * weights
    else:
        prompt = analytic_flops(view, params, batch=batch, seq=seq, training=False, causal=causal)
        token = analytic_flops(view, params, batch=batch, seq=1, training=False)
        if prompt is None or token is None or not windows or token.attention % len(windows):
            return None
        forward, head = prompt.forward, prompt.by_role.get("head.lm", 0)
        kept = head // seq
        prefill = forward - head + kept
        per_key = token.attention // len(windows)  # 2·B·heads·(d_qk + d_v): one layer, one key
        matmul = token.forward - token.attention
    if recurrent is not None:
        prefill += recurrent.prefill(batch, seq)
        matmul += recurrent.step(batch)
    kv_up = sum(p.numel for p in params if p.role == "attention.kv_up") if is_mla(config) else 0

    def step(keys: int) -> int:
        return matmul + per_key * sum(min(w, keys) if w else keys for w in windows) + 2 * batch * (keys - 1) * kv_up

    steps = new_tokens - 1
    first, last = (step(seq + 1), step(seq + steps)) if steps else (None, None)
    decode = matmul * steps + per_key * sum(_keys_sum(seq + 1, seq + steps, w) for w in windows) \
        + 2 * batch * kv_up * (_keys_sum(seq + 1, seq + steps, None) - steps)
    full = sum(1 for w in windows if not w)
    sliding = sorted({w for w in windows if w})
    words = (f"prefill: forward {forward:,} − the head on every prompt token {head:,} + on the last "
             f"{kept:,}; decode: {steps:,} steps × (2·B·{matmul // (2 * batch):,} weights = {matmul:,}) + "
             f"{per_key:,} per key and attention layer × keys ({full} full layers read S + j"
             + (f", {len(windows) - full} windowed read min({'/'.join(f'{w:,}' for w in sliding)}, S + j)"
                if sliding else "") + ")"
             + (f" + MLA's kv_up 2·B·{kv_up:,} per cached token" if kv_up else "")
             + (f"; the recurrent layers' conv and scan (in the step's fixed count): {recurrent.words()}"
                if recurrent is not None else ""))
    return GenerationFlops(new_tokens, prefill, head - kept, decode, first, last, words, "analytic")


def _keys_sum(low: int, high: int, window: int | None) -> int:
    """Σ min(window, c) for c from low to high (Σ c without a window); 0 when high < low."""
    if high < low:
        return 0
    if not window or high <= window:
        return (low + high) * (high - low + 1) // 2
    if low >= window:
        return window * (high - low + 1)
    return (low + window) * (window - low + 1) // 2 + window * (high - window)


def traced_generation(module: Any, *, batch: int, seq: int, new_tokens: int) -> GenerationFlops:
    """FlopCounterMode's prefill at S and its decode steps. A step's FLOPs are affine in its keys between the
    config's windows (where a windowed layer stops reading more), so each such stretch of steps is traced at its
    first two and its last step, and summed on that line once the last step is on it; a stretch off its line is
    refused rather than guessed."""
    from ...errors import UnsupportedError
    from ..traced.flops import count_generation

    steps = new_tokens - 1
    prefill = count_generation(module, batch, seq, 0).prefill

    def step_at(keys: int) -> int:  # a prefill of keys − 1 tokens, then one step
        return count_generation(module, batch, keys - 1, 1).steps[0]

    windows = sorted({w for kind, w in layer_kinds(text_config(module.config)) if w and seq + 1 < w < seq + steps})
    stretches, start = [], seq + 1
    for window in windows:
        stretches.append((start, window))
        start = window + 1
    if steps:
        stretches.append((start, seq + steps))
    decode, traced, first, last = 0, 0, None, None
    for low, high in stretches:
        count = high - low + 1
        if count <= 3:
            values = [step_at(keys) for keys in range(low, high + 1)]
            decode += sum(values)
            traced += count
        else:
            a, b, z = step_at(low), step_at(low + 1), step_at(high)
            values = [a, z]
            slope = b - a
            traced += 3
            if z != a + slope * (count - 1):
                raise UnsupportedError(f"the decode steps of {type(module).__name__} do not grow by the same each "
                                       f"key between {low:,} and {high:,} keys: not summed from traced steps")
            decode += a * count + slope * count * (count - 1) // 2
        first = values[0] if first is None else first
        last = values[-1]
    words = (f"FlopCounterMode on fake tensors: generate()'s prefill (logits for the last token) and {traced} of "
             f"the {steps:,} decode steps, each stretch between the config's windows summed on the line its traced "
             "steps draw")
    return GenerationFlops(new_tokens, prefill, None, decode, first, last, words, "traced")


__all__ = ["GenerationFlops", "analytic_generation", "traced_generation", "MAX_NEW_TOKENS"]
