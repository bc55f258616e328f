"""How fast a model serves, as roofline bounds (`paramscope serve MODEL --gpu NAME`).

Every figure is a bound, not a prediction: a step takes at least the longer of its bytes over the GPU's memory
bandwidth and its FLOPs over the GPU's dense peak (hardware.py's tables, datasheet figures). What it leaves out
makes the real step slower, never faster: kernel launches, activations' traffic, attention's re-reads of K and
V tiles, communication, imperfect overlap.

    decode step at batch B and context C (the step's attention reads C keys: C − 1 cached and the new token's)
      bytes  = weights read once (memory/weights.py in the storage format), where
                 the token embedding (untied) is a gather: one row a token, not the table;
                 MoE: the routed experts' bytes × the expected share of experts the step's B tokens touch under
                 uniform routing, E·(1 − (1 − k/E)^B) of E per layer (top-k of E), rounded to the byte;
                 everything else (attention, dense MLPs, shared experts, routers, norms, the head) whole;
             + KV cache (memory/kv.py, the cache checked against transformers' on meta): each attention layer
               reads C keys (min(window, C) in a sliding or chunked one) and writes the new token's K and V;
               a recurrent state is read and written whole, whatever C
      FLOPs  = generate()'s decode step at C keys (flops/generation.py, checked against FlopCounterMode)
    prefill of S tokens for B sequences (a time-to-first-token bound)
      bytes  = weights read once (experts touched by B·S tokens) + the cache the prefill writes
      FLOPs  = generate()'s prefill (the head on the last token only)
    crossover: the smallest batch whose decode step at C is compute-bound (FLOPs/peak ≥ bytes/bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

from ...display import HtmlDisplay
from ...errors import OptionError, UnsupportedError
from ..hardware import Accelerator, bandwidth, peak_flops

TABLE_BATCHES = (1, 8, 32, 128)
MAX_CROSSOVER = 1 << 20  # the largest batch the crossover search tries
PEAK_DTYPES = ("bf16", "fp16", "fp8", "tf32")
_GATHERED = ("embeddings.word", "embeddings.position", "embeddings.token_type")
_NOT_HELD = ("cross-attention",)

BOUND_WORDS = ("bound: time ≥ max(bytes / bandwidth, FLOPs / peak); kernel launches, activations' traffic, "
               "attention's re-reads of K and V tiles and imperfect overlap only make it slower")
ROUTING_WORDS = ("MoE: expected distinct experts a step's T tokens touch per layer, E·(1 − (1 − k/E)^T) of E, "
                 "under uniform routing (each token picks k of E at random); their bytes rounded to the byte")


@dataclass(frozen=True)
class Roofline:
    gpu: str
    bandwidth: float  # bytes per second
    peak: float  # FLOP/s, dense
    peak_dtype: str
    peak_from: str  # "the GPU table" | "--peak-tflops"
    memory: int | None = None  # the GPU's memory in bytes (the table's nominal figure), what the fits check uses

    def words(self) -> str:
        return (f"{self.gpu}: {self.bandwidth / 1e9:,.0f} GB/s memory bandwidth (datasheet), "
                f"{self.peak / 1e12:,.1f} TFLOP/s dense {self.peak_dtype} peak ({self.peak_from})")


@dataclass(frozen=True)
class StepBound:
    """One step's bytes and FLOPs, and the time each side bounds it to."""

    batch: int
    tokens: int  # the context C (decode) or the prompt S (prefill)
    weight_bytes: int
    kv_bytes: int
    flops: int
    memory_seconds: float
    compute_seconds: float
    experts_touched: float | None = None  # expected distinct experts per MoE layer (the bytes used it exactly)
    # the weights and the KV cache held at batch × tokens (as `memory` counts them for serving, before its
    # workspace and reserve), and whether they fit the GPU's memory; a step that does not fit stays a valid bound
    # but is not achievable on one GPU. None: bounds made without the GPU's memory
    held_bytes: int | None = None
    fits: bool | None = None

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def seconds(self) -> float:
        return max(self.memory_seconds, self.compute_seconds)

    @property
    def binds(self) -> str:
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"

    @property
    def tokens_per_second(self) -> float:
        """Decode: new tokens a second over the batch (one a sequence a step)."""
        return self.batch / self.seconds

    @property
    def per_sequence(self) -> float:
        return 1 / self.seconds


@dataclass(frozen=True)
class ServeSpeed(HtmlDisplay):
    roofline: Roofline
    dtype: str  # the weights' storage format
    kv_dtype: str
    kv_layout: str
    batch: int
    context: int
    prompt: int
    decode: tuple[StepBound, ...]  # at TABLE_BATCHES and --batch, at the context
    prefill: StepBound  # --batch prompts of S tokens
    crossover: int | None  # the smallest compute-bound batch at the context; None: none up to MAX_CROSSOVER
    by_batch: tuple[StepBound, ...]  # the curve against batch, at the context
    by_context: tuple[StepBound, ...]  # the curve against context, at --batch
    arithmetic: tuple[tuple[str, str], ...]  # (what, how it adds up) for the asked batch and context
    conventions: tuple[str, ...]
    notes: tuple[str, ...] = ()
    routing: tuple[int, int] | None = None  # (top-k, experts) of a MoE model
    compute_dtype: str | None = None  # the dtype the model was built in (its unquantised tensors')
    tp: int = 1  # tensor-parallel degree: the bytes and FLOPs are one GPU's
    # the model's Report, as `estimate_serving` answers (`speed.report`); None for bounds made without one. Not in ==
    # or hash: the same bounds are equal whichever engine counted the model
    report: Any = field(default=None, repr=False, compare=False)

    @property
    def at_batch(self) -> StepBound:
        return next(step for step in self.decode if step.batch == self.batch)

    def __repr__(self) -> str:
        """One line: `<ServeSpeed of gpt2 (GPT2LMHeadModel) on H100 SXM: decode ≤ … tokens/s at batch 1 …>`."""
        model = "" if self.report is None else f" of {self.report.model.label} ({self.report.model.class_name})"
        step = self.at_batch
        return (f"<ServeSpeed{model} on {self.roofline.gpu}: decode ≤ {step.tokens_per_second:,.1f} tokens/s at batch "
                f"{self.batch:,}, context {self.context:,} ({step.binds}-bound) · prefill of {self.prompt:,} tokens ≥ "
                f"{self.prefill.seconds * 1e3:,.4g} ms · {self.dtype} weights · bounds>")


# --- the parts -------------------------------------------------------------------------------------------------

def peak_dtype_of(fmt: Any) -> str:
    """The dense peak a format computes at: fp8 checkpoints run fp8 matmuls (W8A8); GGUF's types run on llama.cpp's
    CUDA path in fp16 (dequantised for cuBLAS) or int8 (MMQ), so fp16's peak; the others dequantise to their compute
    dtype (weight-only int4/int8, bitsandbytes, MXFP4 on cards without fp4 units)."""
    if fmt.kind == "fp8":
        return "fp8"
    if fmt.kind == "gguf":
        return "fp16"
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "tf32"}.get(fmt.compute_dtype, "bf16")


def roofline(accelerator: Accelerator, dtype: str, peak_tflops: float | None = None) -> Roofline:
    if dtype not in PEAK_DTYPES:
        raise OptionError("{0} must be one of {choices}, got {value!r}", "peak_dtype", choices=", ".join(PEAK_DTYPES),
                          value=dtype)
    rate = bandwidth(accelerator)
    if rate is None:
        raise OptionError("no memory bandwidth for {gpu} in the GPU table", gpu=accelerator.name)
    if peak_tflops is not None:
        return Roofline(accelerator.name, rate, peak_tflops * 1e12, dtype, "--peak-tflops", accelerator.memory)
    peak = peak_flops(accelerator, dtype)
    if peak is None:
        listed = [d for d in PEAK_DTYPES if peak_flops(accelerator, d) is not None]
        if listed:  # another dtype's peak the table has: the user may mean it
            raise OptionError("no dense {dtype} peak for {gpu} in the GPU table; give {0}, or {1} {listed} (the "
                              "peaks the table has for it)", "peak_tflops", "peak_dtype", dtype=dtype,
                              gpu=accelerator.name, listed="/".join(listed))
        raise OptionError("no dense {dtype} peak for {gpu} in the GPU table; give {0}", "peak_tflops", dtype=dtype,
                          gpu=accelerator.name)
    return Roofline(accelerator.name, rate, peak, dtype, "the GPU table, datasheet", accelerator.memory)


def experts_touched(top_k: int, experts: int, tokens: int) -> Fraction:
    """E·(1 − (1 − k/E)^T): the expected number of distinct experts T tokens touch, each picking k of E uniformly.
    Exact as a fraction; where the untouched share is below 10^-15 (it is then below a byte of any model), E."""
    if top_k >= experts or tokens * -math.log(1 - top_k / experts) > 35:  # (1 − k/E)^T < 10^-15
        return Fraction(experts)
    return experts * (1 - Fraction(experts - top_k, experts) ** tokens)


@dataclass(frozen=True)
class WeightTraffic:
    """What a step reads of the weights, from the storage format's bytes by role."""

    whole: int  # read whole every step
    gathered: tuple[tuple[str, int, int], ...]  # (role, bytes of the table, rows): one row a token
    routed: int  # the routed experts' bytes, all E
    routing: tuple[int, int] | None

    def at(self, tokens: int) -> tuple[int, Fraction | None]:
        """(bytes read by a step over `tokens` tokens, the expected experts touched per MoE layer)."""
        total = Fraction(self.whole)
        for _, table, rows in self.gathered:
            total += Fraction(table * min(tokens, rows), rows)
        touched = None
        if self.routed and self.routing is not None:
            top_k, experts = self.routing
            touched = experts_touched(top_k, experts, tokens)
            total += self.routed * touched / experts
        return round(total), touched

    def words(self, tokens: int) -> str:
        parts = [f"{self.whole:,} B read whole"]
        for role, table, rows in self.gathered:
            parts.append(f"{role} gathered: {table:,} B × min({tokens:,} tokens, {rows:,} rows) / {rows:,}")
        if self.routed and self.routing is not None:
            top_k, experts = self.routing
            touched = experts_touched(top_k, experts, tokens)
            parts.append(f"routed experts {self.routed:,} B × {_fraction(touched)} of {experts} experts touched "
                         f"(top-{top_k}, {tokens:,} tokens) / {experts}")
        return " + ".join(parts) + f" = {self.at(tokens)[0]:,} B"


def weight_traffic(weights: Any, params: Any, config: Any, whole: Any = None) -> WeightTraffic:
    """Split the stored weights (memory/weights.WeightMemory) by how a step reads them. `whole`: the whole model's,
    where `weights` are one tensor-parallel rank's shards (a vocabulary-parallel table's rows are then its share)."""
    from ..flops.analytic import routing

    by_role = dict(weights.by_role)
    whole_by_role = dict((whole or weights).by_role)
    tied = "head.lm" not in by_role  # the head reads the word embedding whole
    gathered = []
    for role in _GATHERED:
        if role not in by_role or (role == "embeddings.word" and tied):
            continue
        rows = sum(p.shape[0] for p in params if p.role == role and len(p.shape) == 2)
        if whole_by_role.get(role):
            rows = -(-rows * by_role[role] // whole_by_role[role])  # the rank's rows
        if rows:
            gathered.append((role, by_role.pop(role), rows))
    top_k, experts = routing(config)
    routed = by_role.pop("moe.experts", 0) if experts else 0
    return WeightTraffic(sum(by_role.values()), tuple(gathered), routed, (top_k, experts) if experts else None)


def kv_traffic(cache: Any, batch: int, context: int) -> int:
    """Bytes a decode step moves of the cache at `context` keys: each attention layer reads its keys (a window's
    at most) and writes the new token's; a recurrent state is read and written."""
    total = 0
    for group in cache.groups:
        if group.kind in _NOT_HELD:
            continue
        window = _window(group.kind)
        keys = context if window is None else min(window, context)
        total += batch * (group.per_token * (keys + 1) + 2 * group.fixed) if group.per_token else \
            batch * 2 * group.fixed
    return total


def kv_words(cache: Any, batch: int, context: int) -> str:
    parts = []
    for group in cache.groups:
        if group.kind in _NOT_HELD:
            continue
        window = _window(group.kind)
        keys = context if window is None else min(window, context)
        keys_words = f"{context:,}" if window is None else f"min({window:,}, {context:,}) = {keys:,}"
        if group.per_token:
            parts.append(f"{group.kind}: {batch} × {group.per_token:,} B × ({keys_words} keys read + 1 written)"
                         + (f" + 2 × {group.fixed:,} B" if group.fixed else ""))
        else:
            parts.append(f"{group.kind}: {batch} × 2 × {group.fixed:,} B (read and written)")
    return "; ".join(parts) + f" = {kv_traffic(cache, batch, context):,} B"


def _has_state(cache: Any) -> bool:
    return any(group.fixed and not group.per_token for group in cache.groups if group.kind not in _NOT_HELD)


def _window(kind: str) -> int | None:
    if kind.startswith(("sliding window ", "chunked ")):
        return int(kind.rsplit(" ", 1)[1].replace(",", ""))
    return None


def _fraction(value: Fraction) -> str:
    return f"{value.numerator:,}" if value.denominator == 1 else f"{float(value):.6g}"


# --- the answer ------------------------------------------------------------------------------------------------

def serve_speed(*, traffic: WeightTraffic, cache: Any, roof: Roofline, step_flops: Callable[[int, int], int],
                prefill_flops: Callable[[int, int], int], batch: int, context: int, prompt: int,
                max_context: int | None, dtype: str, kv_dtype: str, notes: tuple[str, ...] = (),
                compute_dtype: str | None = None, tp: int = 1, held_weights: int | None = None,
                smallest: Callable[[], tuple[Any, int]] | None = None) -> ServeSpeed:
    """The bounds from a model's weight traffic, its cache and its FLOPs: `step_flops(B, C)` a decode step's,
    `prefill_flops(B, S)` a prefill's. `held_weights`: the stored weights one GPU holds (all of them, a tower a
    text step does not read too), which with the cache at each step's batch × tokens is checked against the GPU's
    memory (`roof.memory`). `smallest()`: (parallel/serving.TensorParallelSearch at the asked batch × context,
    memory's reserve), called (and the search made) only where the asked batch or its prefill does not fit."""
    flops_at: dict[tuple[int, int], int] = {}
    check = held_weights is not None and roof.memory is not None

    def held(b: int, c: int) -> dict[str, Any]:
        if not check:
            return {}
        total = held_weights + cache.at(b, c)
        return {"held_bytes": total, "fits": total <= roof.memory}

    def bound(b: int, c: int, flops: int) -> StepBound:
        weight_bytes, touched = traffic.at(b)
        kv_bytes = kv_traffic(cache, b, c)
        return StepBound(b, c, weight_bytes, kv_bytes, flops, (weight_bytes + kv_bytes) / roof.bandwidth,
                         flops / roof.peak, None if touched is None else float(touched), **held(b, c))

    def step(b: int, c: int) -> StepBound:
        if (b, c) not in flops_at:
            flops_at[(b, c)] = step_flops(b, c)
        return bound(b, c, flops_at[(b, c)])

    decode = tuple(step(b, context) for b in sorted({*TABLE_BATCHES, batch}))
    weight_bytes, touched = traffic.at(batch * prompt)
    prefill_kv = cache.at(batch, prompt) - sum(g.constant for g in cache.groups)
    flops = prefill_flops(batch, prompt)
    prefill = StepBound(batch, prompt, weight_bytes, prefill_kv, flops, (weight_bytes + prefill_kv) / roof.bandwidth,
                        flops / roof.peak, None if touched is None else float(touched), **held(batch, prompt))
    # the crossover's search reads B × the batch-1 step's FLOPs (each sequence decodes its own token) where that
    # equals the exact count at the table's batches; the batch it finds is confirmed on the exact count
    one = step(1, context).flops
    linear = all(step(b, context).flops == b * one for b in TABLE_BATCHES)
    crossover = _crossover(lambda b: step(b, context), (lambda b: bound(b, context, b * one)) if linear else None)
    top_batch = max(256, batch, crossover or 0)
    by_batch = tuple(step(b, context) for b in sorted({*(1 << k for k in range(21) if 1 << k <= top_batch),
                                                       batch, *([crossover] if crossover else [])}))
    longest = max(max_context or 4 * context, context)
    by_context = tuple(step(batch, c) for c in sorted({*(128 << k for k in range(20) if 128 << k <= longest),
                                                       context}))
    at = step(batch, context)
    arithmetic = (
        ("weights a decode step reads", traffic.words(batch)),
        ("KV cache a decode step moves", kv_words(cache, batch, context)),
        ("decode FLOPs", (f"one GPU's share (tp {tp}) of " if tp > 1 else "")
         + f"generate()'s decode step at {context:,} keys, batch {batch}: {at.flops:,}"),
        ("decode memory time", f"{at.bytes:,} B / {roof.bandwidth / 1e9:,.0f} GB/s = {_ms(at.memory_seconds)}"),
        ("decode compute time", f"{at.flops:,} / {roof.peak / 1e12:,.1f} TFLOP/s = {_ms(at.compute_seconds)}"),
        ("decode bound", f"max = {_ms(at.seconds)} a step ({at.binds}-bound): ≤ {at.tokens_per_second:,.1f} tokens/s "
                         f"over {batch} sequence{'s' if batch > 1 else ''}, ≤ {at.per_sequence:,.1f} a sequence"),
        ("weights the prefill reads", traffic.words(batch * prompt)),
        ("KV cache the prefill writes", f"{prefill_kv:,} B ({batch} × {prompt:,} tokens"
         + ("; each recurrent state once, whatever the prompt" if _has_state(cache) else "") + ")"),
        ("prefill bound", f"max({prefill.bytes:,} B / bandwidth = {_ms(prefill.memory_seconds)}, {prefill.flops:,} "
                          f"FLOPs / peak = {_ms(prefill.compute_seconds)}) = {_ms(prefill.seconds)} to the first "
                          f"token ({prefill.binds}-bound)"),
    )
    conventions = [BOUND_WORDS,
                   f"context {context:,}: the decode step's attention reads {context:,} keys ({context - 1:,} cached "
                   "and the new token's); a sliding or chunked layer reads min(window, context); a recurrent state is "
                   "read and written whole",
                   "the token embedding is a gather: one row a token is read, not the table (a tied one is read "
                   "whole by the head)",
                   "decode FLOPs are generate()'s (transformers' attention, flops/generation.py); no communication "
                   "and no activations' traffic are counted"]
    if traffic.routing is not None and traffic.routed:
        conventions.append(ROUTING_WORDS)
    if check:
        fit = fit_words(decode, prefill, held_weights, roof, tp, batch, smallest)
        notes = (fit, *notes) if fit else notes
    return ServeSpeed(roof, dtype, kv_dtype, cache.layout, batch, context, prompt, decode, prefill, crossover,
                      by_batch, by_context, arithmetic, tuple(conventions), notes,
                      traffic.routing if traffic.routed else None, compute_dtype, tp)


def fit_words(decode: tuple[StepBound, ...], prefill: StepBound, held_weights: int, roof: Roofline, tp: int,
              batch: int, smallest: Callable[[], tuple[Any, int]] | None = None) -> str | None:
    """Where the weights and the KV cache one GPU holds exceed its memory: the first such row's sum, the rows that
    do not fit, and how to split it (memory's smallest tensor-parallel degree where the asked batch does not fit
    and `smallest` gives it); None where every row and the prefill fit."""
    over = [step for step in (*decode, prefill) if step.fits is False]
    if not over:
        return None
    first = over[0]
    kv = first.held_bytes - held_weights
    gpu = f"one {roof.gpu}" + (f" (one GPU of tp {tp})" if tp > 1 else "")
    rows = ", ".join(f"{step.batch:,}" for step in decode if step.fits is False)
    where = (f"decode at batch {rows}, context {first.tokens:,}" if rows else "") + (
        ("; " if rows else "") + f"the prefill of {prefill.batch} × {prefill.tokens:,} tokens"
        if prefill.fits is False else "")
    return (f"does not fit {gpu}: weights {held_weights:,} B + KV cache {kv:,} B (batch {first.batch:,} × "
            f"{first.tokens:,} tokens) = {first.held_bytes:,} B > {roof.memory:,} B ({where}; held weights and KV "
            "cache only: `memory`'s workspace and reserve come on top). Those rows' bounds stay bounds but are not "
            "achievable on one GPU: `--tp T` splits the weights and the cache; " + _split_words(
                roof, batch, decode, prefill, smallest))


def _split_words(roof: Roofline, batch: int, decode: tuple[StepBound, ...], prefill: StepBound,
                 smallest: Callable[[], tuple[Any, int]] | None) -> str:
    asked = next(step for step in decode if step.batch == batch)
    pointer = f"`paramscope memory MODEL --gpu {roof.gpu!r} --tp T` finds the smallest T that fits"
    if smallest is None or (asked.fits and prefill.fits):
        return pointer
    search, reserve = smallest()
    if search is None:
        return pointer
    at = f"at batch {search.batch:,} × {search.seq:,} tokens (its peak, a prefill of all {search.seq:,} tokens " \
         f"included, + {reserve:,} B reserve)"
    if search.dp_searched:  # a MoE model: memory searched tp × dp, its MoE layers spanning the replicas
        return _layout_words(search, at)
    if search.tp is None:
        widest = max(t for t, peak, _ in search.tried if peak is not None) if any(
            peak is not None for _, peak, _ in search.tried) else None
        return f"no tensor-parallel degree fits in `memory`'s search {at}" + (
            f" (up to tp {widest})" if widest else "")
    return f"`memory`'s smallest tensor-parallel degree that fits {at}: tp {search.tp}, {search.peak:,} B a GPU"


def _layout_words(search: Any, at: str) -> str:
    """A MoE model's smallest layout (parallel/serving.TensorParallelSearch over tp × dp) in words: the layout with
    its replicas and GPUs, as memory's sentence names it."""
    def layout(tp: int, dp: int) -> str:
        gpus = tp * dp * search.pp
        return (f"tp {tp}" + (f" × dp {dp}" if dp > 1 else "") + (f" × pp {search.pp}" if search.pp > 1 else "")
                + f" = {gpus:,} GPU{'s' if gpus > 1 else ''}")

    at = at.replace(" tokens (its peak", " tokens, a replica's batch (its peak", 1)
    order = f" (tried {search.order_words()})"
    if search.tp is None:
        # tried in order of GPUs: the last answered is the widest
        sized = [(tp, dp) for (tp, peak, _), dp in zip(search.tried, search.tried_dp) if peak is not None]
        widest = f" (up to {layout(*sized[-1])})" if sized else ""
        return f"no layout fits in `memory`'s search {at}{order}{widest}"
    return (f"`memory`'s smallest layout that fits {at}{order}: {layout(search.tp, search.dp)}, {search.peak:,} B "
            "a GPU")


def _crossover(step: Callable[[int], StepBound], quick: Callable[[int], StepBound] | None = None) -> int | None:
    """The smallest batch whose step is compute-bound. Compute time less memory time grows with the batch at a
    rate that never falls (FLOPs grow linearly; bytes linearly, or, for MoE, less and less once most experts
    are touched), so once compute-bound a step stays so: doubling finds a bracket, bisection the batch.
    `quick`, where given, answers the search; the exact `step` confirms its answer, or searches again."""
    if quick is not None:
        found = _crossover(quick)
        if found is None or (step(found).binds == "compute" and (found == 1 or step(found - 1).binds == "memory")):
            return found
    if step(1).binds == "compute":
        return 1
    low, high = 1, 2
    while step(high).binds != "compute":
        if high >= MAX_CROSSOVER:
            return None
        low, high = high, min(2 * high, MAX_CROSSOVER)
    while high - low > 1:
        middle = (low + high) // 2
        if step(middle).binds == "compute":
            high = middle
        else:
            low = middle
    return high


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.4g} ms"


def check_serve(batch: int, context: int | None, prompt: int | None) -> None:
    """The bounds on --batch, --context and --seq, before any build."""
    from ..memory.serving import check_batch_and_seq

    check_batch_and_seq(batch, prompt)
    if context is not None:
        check_batch_and_seq(1, context, "context")
        if context < 2:
            raise OptionError("{0} must be 2 or more (a decode step reads the prompt's keys and its own), got "
                              "{value}", "context", value=context)
        if prompt is not None and prompt > context:
            raise OptionError("{0} {value:,} is shorter than the prompt's {prompt:,} tokens: a decode step "
                              "after the prompt reads at least its keys", "context", value=context, prompt=prompt)


def refuse_non_generating(view: Any) -> None:
    from ..dims import text_config

    if not view.can_generate:
        raise UnsupportedError("{name} does not generate: serving speed is for causal language models",
                               name=view.class_name)
    if getattr(text_config(view.config), "is_encoder_decoder", False):
        raise UnsupportedError("serving speed counts decoder-only models here; {name} is an encoder-decoder",
                               name=view.class_name)


__all__ = ["Roofline", "StepBound", "ServeSpeed", "WeightTraffic", "experts_touched", "weight_traffic",
           "kv_traffic", "serve_speed", "fit_words", "roofline", "peak_dtype_of", "check_serve",
           "refuse_non_generating"]
