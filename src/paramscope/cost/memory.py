"""Memory to load and serve a model: the analytic engine's answer, as frozen data for the renderers.

    weights (weights.py) + KV cache (kv_cache.py) + the prefill's working memory = the peak at serving

Every figure is at allocator level (bytes of tensors); the CUDA context and the allocator's fragmentation are a
separate reserve that the "fits on" table adds, and the report names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .hardware import ACCELERATORS, GiB, Accelerator
from .kv_cache import KVCache
from .weights import WeightMemory
from ..display import HtmlDisplay

DEFAULT_RESERVE = 1 * GiB  # CUDA context (~0.5 GiB with torch) and fragmentation; `--reserve` sets it


@dataclass(frozen=True)
class Workspace:
    """Working memory of the prefill's forward beyond weights and cache: the largest layer's live tensors."""

    bytes: int
    arithmetic: str
    logits: int  # the last token's logits (generate's logits_to_keep=1), in the compute dtype


@dataclass(frozen=True)
class Fit:
    accelerator: Accelerator
    fits: bool
    free: int  # bytes left after the peak and the reserve (negative: short by)
    largest_batch: int | None  # at the asked context length; None when nothing fits
    largest_context: int | None  # at the asked batch


@dataclass(frozen=True)
class MemoryEstimate(HtmlDisplay):
    mode: str  # "inference" | "training"
    engine: str  # "analytic" | "traced"
    settings: dict[str, Any]
    weights: WeightMemory
    kv_cache: KVCache | None
    activations: Workspace | None
    peak: int
    peak_phase: str
    reserve: int
    fits: tuple[Fit, ...] = ()
    budget: Fit | None = None  # the answer for --gpu or --budget
    notes: tuple[str, ...] = field(default=())
    training: Any = None  # training_estimate.TrainingDetail for mode "training"

    @property
    def with_reserve(self) -> int:
        return self.peak + self.reserve

    def _html(self, fragment: bool) -> str:
        from ..render.html.cost import render_memory_html

        return render_memory_html(None, self, fragment=fragment)


def prefill_workspace(config: Any, *, batch: int, seq: int, dtype_size: int, vocab: int | None, gated: bool = True,
                      layers: int = 2, every_token_logits: bool = False, class_name: str = "",
                      cache_bytes: int = 0, window_extra: int = 0) -> Workspace:
    """The prefill's working memory on top of weights, buffers and the KV cache, at its peak: the last layer.

    Live then, per token: the embedding output (the model keeps `inputs_embeds`) and the layer's input (h each,
    one when there is a single layer), the post-attention residual and the normed MLP input (h each), and the
    MLP's intermediates: gate, up and their product (3 × intermediate) for a gated MLP, the projection and its
    activation (2 × intermediate) otherwise. Besides: RoPE's cos and sin (seq × head_dim each) and the position
    ids (seq × 8 B). Logits are for the last token only, as generate() asks (`logits_to_keep=1`); a model that
    does not generate (a masked-LM encoder) scores every token, and its head holds the logits with the encoder's
    output and the head's transform (hidden each): batch × seq × (vocab + 2 × hidden).

    Exact for Llama-style decoders (RMSNorm, gated MLP, RoPE) at sdpa, checked against a fake-tensor trace. The
    families prefill.py has fitted (GPT-2, T5, the bare BART and DeBERTa-v2) take their own largest moment instead
    (`class_name`; `cache_bytes`, the full KV cache, for the moments before it is held); other layouts differ by
    their own temporaries (MoE routing, eager attention's scores), which the traced engine measures.
    """
    from .kv_cache import config_int, text_config
    from .prefill import family_workspace

    text = text_config(config)
    family = family_workspace(text, class_name, batch=batch, seq=seq, dtype_size=dtype_size,
                              cache_bytes=cache_bytes) if class_name else None
    beyond = (f" + the sliding layers' prompt K and V beyond their windows, kept until the first decode step "
              f"{window_extra:,} B" if window_extra else "")
    if isinstance(family, tuple):
        layer_peak, text_line = family
        logits = batch * (vocab or 0) * dtype_size * (seq if every_token_logits else 1)
        return Workspace(max(layer_peak, logits) + window_extra, text_line + beyond, logits)
    hidden = config_int(text, "hidden_size", "d_model", "n_embd") or 0
    inner = config_int(text, "intermediate_size", "ffn_dim", "n_inner", "d_ff", "decoder_ffn_dim") or 4 * hidden
    held = 2 if layers > 1 else 1
    mlp = 3 if gated else 2
    per_token = ((held + 2) * hidden + mlp * inner) * dtype_size
    heads = config_int(text, "num_attention_heads", "n_head", "num_heads") or 1
    head_dim = config_int(text, "head_dim") or (hidden // heads if heads else 0)
    rotary = getattr(text, "rope_parameters", None) is not None or getattr(text, "rope_theta", None) is not None
    rope = 2 * seq * head_dim * dtype_size if rotary else 0
    positions = seq * 8
    # a sequence that fills the sliding window (the cache holds more than the window): sdpa takes a boolean S × S
    # mask, shared by the batch
    mask = seq * seq if window_extra else 0
    layer_peak = batch * seq * per_token + rope + positions + mask
    text_line = (f"{batch} × {seq:,} tokens × ({held + 2} × hidden {hidden:,} + {mlp} × intermediate {inner:,}) × "
                 f"{dtype_size} B" + (f" + RoPE cos/sin 2 × {seq:,} × {head_dim} × {dtype_size} B" if rope else "")
                 + f" + position ids {seq:,} × 8 B" + (f" + the sliding window's mask {seq:,}² × 1 B" if mask else ""))
    if every_token_logits and vocab:
        logits = batch * seq * vocab * dtype_size
        head_peak = batch * seq * (vocab + 2 * hidden) * dtype_size
        if head_peak > layer_peak:
            return Workspace(head_peak, f"the head: {batch} × {seq:,} tokens × (vocab {vocab:,} + 2 × hidden "
                                        f"{hidden:,}) × {dtype_size} B, every token's logits", logits)
        return Workspace(layer_peak, text_line, logits)
    logits = batch * (vocab or 0) * dtype_size
    return Workspace(max(layer_peak, logits) + window_extra, text_line + beyond, logits)


def fit_table(peak_at, reserve: int, *, batch: int, seq: int, max_context: int | None = None,
              accelerators: tuple[Accelerator, ...] = ACCELERATORS, contexts: bool = True) -> tuple[Fit, ...]:
    """For each accelerator: does the peak fit, and the largest batch (at `seq`) and context (at `batch`)."""
    return tuple(fit_on(a, peak_at, reserve, batch=batch, seq=seq, max_context=max_context, contexts=contexts)
                 for a in accelerators)


def fit_on(accelerator: Accelerator, peak_at, reserve: int, *, batch: int, seq: int,
           max_context: int | None = None, contexts: bool = True) -> Fit:
    """`peak_at(batch, seq)` → bytes; searched by bisection, since memory grows with both.

    The largest context stops at the model's own maximum (`max_context`) when it has one; `contexts=False`
    leaves it unanswered (None), for a peak known at one length only."""
    capacity = accelerator.memory - reserve
    peak = peak_at(batch, seq)
    largest_batch = _largest(lambda b: peak_at(b, seq) <= capacity, 1 << 20)
    largest_context = _largest(lambda s: peak_at(batch, s) <= capacity, max_context or 1 << 24) if contexts \
        else None
    return Fit(accelerator, peak <= capacity, capacity - peak, largest_batch, largest_context)


def _largest(ok, limit: int) -> int | None:
    """The largest n in 1..limit with ok(n), for ok monotone decreasing; None when not even 1 fits."""
    if not ok(1):
        return None
    low, high = 1, 2
    while high <= limit and ok(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        middle = (low + high) // 2
        if ok(middle):
            low = middle
        else:
            high = middle
    return low
