"""Serving memory under llama.cpp: weights, KV cache and compute buffer per device (GPU and CPU/host), as llama.cpp
places them, and the flags that fit a budget.

What llama.cpp does, read from its source (ggml-org/llama.cpp, and the copy llama-cpp-python 0.3.36 ships; the
files and commits in llama_cpp_model.SOURCES; what it reads of the model and where it places each layer are
llama_cpp_model.py's):

- weights (src/llama-model.cpp, `load_tensors`): with `-ngl N`, `i_gpu_start = max(n_layer + 1 − N, 0)` and
  `act_gpu_layers = min(N, n_layer + 1)`: layer il goes to the GPU when il ≥ i_gpu_start, il = n_layer being the
  output layer (output, output_norm): N = 1 offloads the output layer, N the output and the last N − 1 repeating
  layers, n_layer + 1 (or a negative N) everything. (Older builds, ggml-org 00342301, had i_gpu_start = max(n_layer
  − N, 0): the last N repeating layers, the output only with N > n_layer.) The input layer
  (token_embd) always stays on the CPU ("very little benefit to offloading the input layer"). A tied output head is
  `token_embd` created again with TENSOR_DUPLICATED in the output layer's buffer: a second copy on the GPU when the
  output layer is there. `rope_freqs` is created in each layer's buffer as a duplicate: one copy per device that
  holds a layer. `--n-cpu-moe N` adds buffer overrides `blk\\.i\\.ffn_(up|down|gate|gate_up)_(ch|)exps` → CPU for
  i < N (common/common.h `LLM_FFN_EXPS_REGEX`, `llm_ffn_exps_block_regex`). Each tensor costs its bytes in the
  file (a GGUF's header) or in the predicted mixture's file.
- context (src/llama-context.cpp): `n_ctx = GGML_PAD(n_ctx, 256)`; with a unified KV cache one stream of n_ctx
  cells, else `n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256)` cells in each of n_seq_max streams;
  `n_batch = min(n_ctx, n_batch)`, `n_ubatch = min(n_batch, n_ubatch)`.
- KV cache (src/llama-kv-cache.cpp): per layer K = ggml_new_tensor_3d(type_k, n_embd_k_gqa, kv_size, n_stream), V
  alike with n_embd_v_gqa, or without flash attention (V transposed) the largest n_embd_v_gqa of any layer; bytes =
  ggml_row_size(type, width) × cells × streams, a row being width / block × type size for block-quantised types.
  Each layer's cache is on its layer's device (offload_kqv, llama.cpp's default; `--no-kv-offload`: CPU).
- sliding-window layers (src/llama-kv-cache-iswa.cpp): their own cache of
  `GGML_PAD(min(kv_size, n_swa × (unified ? n_seq_max : 1) + n_ubatch), 256)` cells, or kv_size with --swa-full.
- recurrent layers (src/llama-memory-recurrent.cpp, hparams n_embd_r / n_embd_s): F32 states of
  max(1, n_seq_max) rows: conv (d_conv − 1) × (d_inner + 2 × n_group × d_state) (LFM2's short convolution: n_embd ×
  (L_cache − 1)), ssm d_state × d_inner (Qwen3-Next's gated delta net: d_state the key head dim, d_inner the value
  heads × their dim, n_group the key heads). Hybrid families (llama_memory_hybrid: Jamba, Falcon-H1, LFM2,
  Qwen3-Next, and the Mamba-2 hybrids granitehybrid (Granite-4, Bamba) and nemotron_h) keep their attention layers
  in a KV cache and their recurrent layers' states per sequence; Falcon-H1's layers hold both. A layer is recurrent
  where the file's per-layer head_count_kv is 0 (granitehybrid, LFM2; nemotron_h: and feed_forward_length 0, its
  MLP layers keeping nothing); d_inner is what convert_hf_to_gguf.py writes (GraniteHybridModel: mamba_expand ×
  hidden_size; NemotronHModel: mamba_num_heads × mamba_head_dim). RWKV-6/7 (n_embd_r = token_shift_count ×
  n_embd, n_embd_s = n_embd × wkv head size) have no transformers class: their GGUFs are read from the header
  alone (llama_cpp_header.py); RWKV-4, transformers' only RWKV, is no llama.cpp architecture.
- several GPUs (load_tensors, split mode layer): cumulative --tensor-split shares (or each device's free memory)
  divided by their sum, in float32; layer il (n_layer: the output layer) on a GPU goes to
  std::upper_bound(splits, float(il − i_gpu_start) / act_gpu_layers); its weights, KV cache and states there.
- MLA (deepseek2: DeepSeek-V2/V3, Kimi-K2): the converter writes one KV head of key_length kv_lora_rank + n_rot
  (the latent and the rope part) and value_length kv_lora_rank; current llama-kv-cache.cpp allocates K only
  (`has_v = !is_mla`, V a view of K), so a cell is kv_lora_rank + n_rot values a layer. (Builds before that change,
  e.g. ggml-org 3514e9f6, also allocated a V of kv_lora_rank values.)

The compute buffer is measured by llama.cpp when it reserves a graph of n_ubatch tokens; here it is an estimate,
named so, from the largest intermediate tensors (`compute_estimate`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ...errors import OptionError
from .llama_cpp_model import SOURCES, LlamaCppModel, Placement, model_facts, placement
from .result import DEFAULT_RESERVE, check_memory_target

PAD = 256  # GGML_PAD(n_ctx, 256) and the SWA cache's padding
# common/arg.cpp's kv_cache_types: the types --cache-type-k/-v take
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_EXPS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_INPUT = ("token_embd.", "position_embd.", "token_types.")
_MAX_CTX = 1 << 24
_MAX_PARALLEL = 256  # LLAMA_MAX_SEQ
_MAX_DEVICES = 16  # LLAMA_MAX_DEVICES


def pad(n: int, to: int = PAD) -> int:
    return (n + to - 1) // to * to


def type_size(kind: str) -> tuple[int, int]:
    """(block, bytes a block) of a ggml type, from the gguf package (llama.cpp's own table)."""
    import gguf

    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind.upper()]]


def row_size(kind: str, width: int, flag: str = "") -> int:
    """ggml_row_size: bytes of one row of `width` values in `kind` (whole blocks, as ggml asserts)."""
    block, size = type_size(kind)
    if width % block:
        raise OptionError(f"{flag or kind}: rows of {width:,} values are no whole number of {kind} blocks of "
                          f"{block} (llama.cpp refuses this cache type for this model)")
    return width // block * size


@dataclass(frozen=True)
class LlamaCppOptions:
    """llama-server's flags, as it spells them (None: its default), and the memory paramscope fits them to."""

    n_gpu_layers: int | None = None  # None: "auto" (fit the budget) with a budget, else -1 (all layers)
    n_cpu_moe: int | None = None  # None: 0, or the smallest that fits when the layers are fitted
    ctx_size: int | None = None  # None: the model's training context (llama.cpp's -c 0)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    parallel: int = 1
    batch_size: int = 2048
    ubatch_size: int = 512
    flash_attn: bool = False
    swa_full: bool = False
    kv_unified: bool = False
    kv_offload: bool = True
    gpus: int = 1  # GPUs llama.cpp splits the layers over (split mode layer)
    tensor_split: tuple[float, ...] | None = None  # --tensor-split: each GPU's share (None: by free memory)
    # beside llama-server's flags, what paramscope reads (llama_cpp_answer.py): the file a config is quantised to,
    # and the memory each GPU has for the plan's fit
    dtype: str | None = None  # a llama.cpp mixture (q4_k_m, …) for a config; None for a .gguf file (its own types)
    imatrix: bool = False  # the mixture quantised with an importance matrix (llama_cpp_mixture.py)
    gpu: str | None = None  # the GPU whose memory the plan fits (hardware.py's table)
    budget: int | None = None  # or a memory budget in bytes
    reserve: int = DEFAULT_RESERVE  # kept free of llama.cpp's buffers (the CUDA context)

    def check(self) -> None:
        check_memory_target(self.gpu, self.budget, self.reserve)
        if not 1 <= self.gpus <= _MAX_DEVICES:
            raise OptionError("{0} must be between 1 and {limit} (LLAMA_MAX_DEVICES), got {value}", "devices",
                              limit=_MAX_DEVICES, value=self.gpus)
        if self.tensor_split is not None:
            if len(self.tensor_split) > self.gpus:
                raise OptionError("{0} has {count} shares for {gpus} GPU{s}", "tensor_split",
                                  count=len(self.tensor_split), gpus=self.gpus, s="s" if self.gpus > 1 else "")
            if any(not 0 <= v < float("inf") for v in self.tensor_split):
                raise OptionError("{0} shares must be 0 or more, got {value}", "tensor_split",
                                  value=",".join(f"{v:g}" for v in self.tensor_split))
        if self.n_gpu_layers is not None and self.n_gpu_layers < -1:
            raise OptionError("{0} must be -1 (all), auto or 0 or more, got {value}", "n_gpu_layers",
                              value=self.n_gpu_layers)
        if self.n_cpu_moe is not None and self.n_cpu_moe < 0:
            raise OptionError("{0} must be 0 or more, got {value}", "n_cpu_moe", value=self.n_cpu_moe)
        if self.ctx_size is not None and not 0 <= self.ctx_size <= _MAX_CTX:
            raise OptionError("{0} must be between 0 (the model's) and {limit:,}, got {value}", "ctx_size",
                              limit=_MAX_CTX, value=self.ctx_size)
        for option, kind in (("cache_type_k", self.cache_type_k), ("cache_type_v", self.cache_type_v)):
            if kind not in CACHE_TYPES:
                raise OptionError("{0} {kind!r}: llama.cpp takes {types}", option, kind=kind,
                                  types=", ".join(CACHE_TYPES))
        if self.cache_type_v not in ("f32", "f16", "bf16") and not self.flash_attn:
            raise OptionError("{0} {kind} needs {1}: llama.cpp quantises the V cache only with flash attention",
                              "cache_type_v", "flash_attn", kind=self.cache_type_v)
        if not 1 <= self.parallel <= _MAX_PARALLEL:
            raise OptionError("{0} must be between 1 and {limit}, got {value}", "parallel", limit=_MAX_PARALLEL,
                              value=self.parallel)
        for option, value in (("batch_size", self.batch_size), ("ubatch_size", self.ubatch_size)):
            if not 1 <= value <= _MAX_CTX:
                raise OptionError("{0} must be between 1 and {limit:,}, got {value}", option, limit=_MAX_CTX,
                                  value=value)


@dataclass(frozen=True)
class Tensor:
    name: str
    nbytes: int


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "GPU" | "CPU"
    weights: int
    kv: int  # attention K and V
    recurrent: int  # recurrent states
    compute: int  # the compute buffer: an estimate
    output: int  # the logits' output buffer (host): an estimate

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.recurrent + self.compute + self.output


@dataclass(frozen=True)
class CachePart:
    """One of llama.cpp's caches: the layers of one kind and the cells each keeps."""

    kind: str  # "full attention" | "sliding window 4,096" | "recurrent state"
    layers: int
    gpu_layers: int
    cells: int  # per stream; recurrent: rows (sequences)
    streams: int
    bytes: int  # all its layers
    gpu_bytes: int
    arithmetic: str  # one layer, in words
    per_gpu: tuple[int, ...] = ()  # bytes on each GPU (gpu_bytes their sum)


@dataclass(frozen=True)
class Fit:
    """The llama.cpp flags that fit `budget` bytes of GPU memory."""

    budget: int
    fits: bool  # the asked placement and context fit
    n_gpu_layers: int | None  # the largest that fits at the context (None: not even 0)
    n_cpu_moe: int | None  # MoE: the fewest expert layers on the CPU with every layer offloaded
    ctx_size: int | None  # the largest context (a multiple of 256, up to the model's) at that placement
    command: str
    why: str


@dataclass(frozen=True)
class LlamaCppPlan:
    model: str
    weights_from: str
    n_layer: int
    placement: Placement
    n_ctx: int
    n_ctx_from: str
    n_ctx_seq: int
    streams: int
    n_batch: int
    n_ubatch: int
    options: LlamaCppOptions
    devices: tuple[DeviceMemory, ...]
    caches: tuple[CachePart, ...]
    compute_arithmetic: str
    compute_source: str
    moe: bool
    fit: Fit | None
    notes: tuple[str, ...] = field(default=())

    def device(self, name: str) -> DeviceMemory:
        return next(d for d in self.devices if d.device == name)

    @property
    def gpu_devices(self) -> tuple[DeviceMemory, ...]:
        return tuple(d for d in self.devices if d.device != "CPU")

    @property
    def gpu_total(self) -> int:
        """The fullest GPU's total: what each GPU's budget must hold."""
        return max((d.total for d in self.gpu_devices), default=0)


def _context(opts: LlamaCppOptions, facts: LlamaCppModel) -> tuple[int, str, int, int, int, int]:
    """(n_ctx, from, n_ctx_seq, streams, n_batch, n_ubatch) as llama_context's constructor sets them."""
    asked = opts.ctx_size or facts.n_ctx_train or 4096
    source = "--ctx-size" if opts.ctx_size else ("the model's training context" if facts.n_ctx_train else
                                                 "4,096 (the model gives no training context)")
    n_ctx = pad(asked)  # ≥ 256 ≥ --parallel (at most LLAMA_MAX_SEQ = 256): every stream has cells
    if opts.kv_unified:
        n_ctx_seq, streams = n_ctx, 1
    else:
        n_ctx_seq, streams = pad(n_ctx // opts.parallel), opts.parallel
        n_ctx = n_ctx_seq * streams
    n_batch = min(n_ctx, opts.batch_size)
    return n_ctx, source, n_ctx_seq, streams, n_batch, min(n_batch, opts.ubatch_size)


def _caches(facts: LlamaCppModel, opts: LlamaCppOptions, where: Placement, n_ctx_seq: int, streams: int,
            n_ubatch: int) -> list[CachePart]:
    k_type, v_type = opts.cache_type_k, opts.cache_type_v
    v_max = max((layer.v_width for layer in facts.layers), default=0)
    rows = max(1, opts.parallel)
    swa_cells = n_ctx_seq if opts.swa_full else pad(min(n_ctx_seq, facts.n_swa * (opts.parallel if opts.kv_unified
                                                                                 else 1) + n_ubatch))
    groups: dict[tuple, list[int]] = {}
    for il, layer in enumerate(facts.layers):
        groups.setdefault((layer.kind, layer.k_width, layer.v_width, layer.conv, layer.ssm), []).append(il)
    parts = []
    for (kind, k_width, v_width, conv, ssm), ils in groups.items():
        on = [where.layer_device(il) if opts.kv_offload else None for il in ils]
        on_gpu = sum(1 for g in on if g is not None)
        counts = tuple(on.count(g) for g in range(where.gpus))
        if kind in ("full", "swa", "hybrid"):  # a hybrid layer (Falcon-H1) has both caches
            cells = swa_cells if kind == "swa" else n_ctx_seq
            v_cols = v_width if opts.flash_attn else v_max
            k_row, v_row = row_size(k_type, k_width, "--cache-type-k " + k_type), row_size(v_type, v_cols,
                                                                                           "--cache-type-v " + v_type)
            one = (k_row + v_row) * cells * streams
            label = f"sliding window {facts.n_swa:,}" if kind == "swa" else "full attention"
            row = (f"(K {_row_words(k_type, k_width, k_row)} + V {_row_words(v_type, v_cols, v_row)})" if v_cols
                   else f"K {_row_words(k_type, k_width, k_row)} (no V: MLA's V is a view of K)")
            parts.append(CachePart(label, len(ils), on_gpu, cells, streams, one * len(ils), one * on_gpu,
                                   f"{row} × {cells:,} cells" + (f" × {streams} streams" if streams > 1 else ""),
                                   tuple(one * n for n in counts)))
        if kind in ("recurrent", "hybrid"):
            one = (conv + ssm) * 4 * rows
            parts.append(CachePart("recurrent state", len(ils), on_gpu, rows, 1, one * len(ils), one * on_gpu,
                                   f"(conv {conv:,} + ssm {ssm:,}) × 4 B (F32) × {rows} sequence"
                                   f"{'s' if rows > 1 else ''}", tuple(one * n for n in counts)))
    return parts


def _row_words(kind: str, width: int, nbytes: int) -> str:
    block, size = type_size(kind)
    if block == 1:
        return f"{width:,} × {size} B"
    return f"{width:,} {kind} = {width // block:,} blocks of {block} × {size} B = {nbytes:,} B"


def _weights(tensors: tuple[Tensor, ...], where: Placement, n_layer: int) -> tuple[list[int], int]:
    """(bytes on each GPU, CPU bytes) of the weights at a placement."""
    gpu = [0] * where.gpus
    cpu = 0
    names = {t.name for t in tensors}
    tied = "output.weight" not in names
    out = where.output_device
    for t in tensors:
        block = _BLOCK.match(t.name)
        if block:
            il = int(block.group(1))
            on = None if il < where.cpu_moe and _EXPS.search(t.name) else where.layer_device(min(il, n_layer - 1))
        elif t.name.startswith("rope_freqs."):
            continue  # TENSOR_DUPLICATED into each layer's buffer: one copy per device holding a layer (below)
        elif t.name.startswith(_INPUT):
            on = None
            if t.name == "token_embd.weight" and tied and out is not None:
                gpu[out] += t.nbytes  # the output's TENSOR_DUPLICATED copy in the output layer's buffer
        else:
            on = out
        if on is None:
            cpu += t.nbytes
        else:
            gpu[on] += t.nbytes
    rope = sum(t.nbytes for t in tensors if t.name.startswith("rope_freqs."))
    for on in {where.layer_device(il) for il in range(n_layer)}:
        if on is None:
            cpu += rope
        else:
            gpu[on] += rope
    return gpu, cpu


def compute_estimate(facts: LlamaCppModel, opts: LlamaCppOptions, caches: list[CachePart], n_ubatch: int,
                     where: Placement) -> tuple[list[int], int, int, str]:
    """(each GPU's, the CPU's compute buffer, host output buffer, arithmetic): an estimate.

    llama.cpp measures its compute buffer by reserving the graph of one n_ubatch step (ggml-alloc reuses memory
    between tensors whose lives do not overlap). Estimated here for a device that computes layers, at n_ubatch
    tokens: the attention masks, inputs alive through the whole graph (n_kv × n_ubatch for each cache, full and
    sliding, f32, or f16 with flash attention), plus the larger of a layer's peak and the head's: a layer's is the
    larger of the attention scores (n_kv × n_ubatch × n_head f32, none with flash attention) and the FFN's two
    intermediates (2 × n_ff × n_ubatch f32), plus 6 × n_embd × n_ubatch f32 (the residual, the norm, q, k, v and
    the attention's output); the head's, on the output layer's device, the logits n_vocab × n_ubatch f32 and its
    input n_embd × n_ubatch. The logits reuse the layers' memory, so only the larger counts. A CPU that computes
    nothing holds the input embeddings (n_embd × n_ubatch f32). The output buffer (host) holds the logits of
    n_seq_max outputs (llama_context's output_reserve).

    Checked against llama.cpp's own log on CPU (docs/commands.md): within 1.2% without flash attention, 6% over
    with it, on small models."""
    u = n_ubatch
    mask_size = 2 if opts.flash_attn else 4
    attention = [c for c in caches if c.kind != "recurrent state"]
    n_kv = max((c.cells for c in attention), default=0)
    masks = sum(c.cells for c in attention) * u * mask_size
    scores = 0 if opts.flash_attn else n_kv * u * facts.n_head * 4
    ffn = 2 * facts.n_ff * u * 4
    layer = max(scores, ffn) + 6 * facts.n_embd * u * 4
    head = facts.n_vocab * u * 4 + facts.n_embd * u * 4
    computing = {where.layer_device(il) for il in range(facts.n_layer)}
    out = where.output_device

    def device(layers: bool, output: bool) -> int:
        if not layers and not output:
            return 0
        return (masks if layers else 0) + max(layer if layers else 0, head if output else 0)

    gpu = [device(g in computing, out == g) for g in range(where.gpus)]
    cpu = device(None in computing, out is None) or facts.n_embd * u * 4
    output = facts.n_vocab * opts.parallel * 4
    mask_words = " + ".join(f"{c.cells:,}" for c in attention) or "0"
    words = (f"at n_ubatch {u:,} tokens, on a device computing layers: masks ({mask_words}) × {u:,} × {mask_size} B"
             " + the larger of a layer's peak, " + ("" if opts.flash_attn else
                                                    f"max(attention scores {n_kv:,} × {u:,} × {facts.n_head} heads "
                                                    "× 4 B, ")
             + f"FFN 2 × {facts.n_ff:,} × {u:,} × 4 B" + ("" if opts.flash_attn else ")")
             + f" + 6 × {facts.n_embd:,} × {u:,} × 4 B, and the head's on the output layer's device, logits "
               f"{facts.n_vocab:,} × {u:,} × 4 B + {facts.n_embd:,} × {u:,} × 4 B; a CPU computing nothing: input "
               f"embeddings {facts.n_embd:,} × {u:,} × 4 B; output buffer {facts.n_vocab:,} × {opts.parallel} "
               f"sequence{'s' if opts.parallel > 1 else ''} × 4 B (host)")
    if any(c.kind == "recurrent state" for c in caches):
        # src/models/mamba-base.cpp's build_mamba2_layer: the in_proj output (2·d_inner + 2·n_group·d_state + n_head
        # values a token) lives until z is copied out after ssm_scan, beside the convolved xBC, the scan's y and
        # state and y's products; how much of it ggml-alloc overlaps was measured at one point only (4.47 MiB
        # against 3.5 estimated, docs/commands.md), too few to fix a formula, so it stays out and is named
        words += ("; a recurrent layer's own working set (Mamba-2: the in_proj output beside ssm_scan's) is not "
                  "counted: llama.cpp measured 22% more than this estimate on a Mamba-2 hybrid with flash attention, "
                  "where no attention scores outweigh it")
    return gpu, cpu, output, words


COMPUTE_SOURCE = ("estimate, source: llama.cpp reserves a graph of n_ubatch tokens (llama_context's graph_reserve) "
                  "and measures its buffers; here the attention masks plus the larger of one layer's peak (its "
                  "attention scores or FFN intermediates, and hidden states) and the logits'. Leaves out "
                  "ggml-alloc's alignment and what it cannot reuse, MoE routing and expert-gather buffers, backend "
                  "scratch (cuBLAS workspace, flash-attention tiles) and the CUDA context (the --reserve allowance "
                  "covers it)")


def gpu_name(index: int, gpus: int) -> str:
    """"GPU" alone, "GPU0", "GPU1", ... with several (llama.cpp's CUDA0, CUDA1, ...)."""
    return "GPU" if gpus == 1 else f"GPU{index}"


def plan_memory(tensors: tuple[Tensor, ...], facts: LlamaCppModel, opts: LlamaCppOptions, where: Placement
                ) -> tuple[tuple[DeviceMemory, ...], tuple[CachePart, ...], str, tuple[int, ...]]:
    """Per device memory at one placement and context; also (n_ctx, n_ctx_seq, streams, n_batch, n_ubatch)."""
    n_ctx, _, n_ctx_seq, streams, n_batch, n_ubatch = _context(opts, facts)
    caches = _caches(facts, opts, where, n_ctx_seq, streams, n_ubatch)
    w_gpu, w_cpu = _weights(tensors, where, facts.n_layer)
    cpu_kv = sum(c.bytes - c.gpu_bytes for c in caches if c.kind != "recurrent state")
    cpu_rs = sum(c.bytes - c.gpu_bytes for c in caches if c.kind == "recurrent state")
    c_gpu, c_cpu, output, words = compute_estimate(facts, opts, caches, n_ubatch, where)
    gpus = []
    for g in range(where.gpus):
        kv = sum(c.per_gpu[g] for c in caches if c.kind != "recurrent state")
        rs = sum(c.per_gpu[g] for c in caches if c.kind == "recurrent state")
        gpus.append(DeviceMemory(gpu_name(g, where.gpus), w_gpu[g], kv, rs, c_gpu[g], 0))
    devices = (*gpus, DeviceMemory("CPU", w_cpu, cpu_kv, cpu_rs, c_cpu, output))
    return devices, tuple(caches), words, (n_ctx, n_ctx_seq, streams, n_batch, n_ubatch)


def _replace(opts: LlamaCppOptions, **changes: Any) -> LlamaCppOptions:
    from dataclasses import replace

    return replace(opts, **changes)


def at(n_layer: int, ngl: int, cpu_moe: int, opts: LlamaCppOptions) -> Placement:
    """The placement of -ngl `ngl` and --n-cpu-moe `cpu_moe` over the options' GPUs."""
    return placement(n_layer, ngl, cpu_moe, opts.tensor_split, opts.gpus)


def fit_flags(tensors: tuple[Tensor, ...], facts: LlamaCppModel, opts: LlamaCppOptions, budget: int,
              moe: bool) -> tuple[int | None, int | None, int | None, str]:
    """(n_gpu_layers, n_cpu_moe, ctx_size, why): the most offload that fits `budget` bytes on each GPU (the fullest
    one's total) at the context, then the largest context at that placement. GPU memory falls as layers leave it and
    as the context shrinks, so each is the edge of a monotone search (over several GPUs the fullest one's share can
    step by a layer either way as -ngl moves the split points: the search's edge is then within a layer)."""
    n_layer = facts.n_layer

    def gpu(ngl: int, moe_layers: int, o: LlamaCppOptions = opts) -> int:
        devices = plan_memory(tensors, facts, o, at(n_layer, ngl, moe_layers, opts))[0]
        return max(d.total for d in devices if d.device != "CPU")

    base_moe = opts.n_cpu_moe or 0
    ngl, moe_layers, why = None, None, ""
    the_gpu = "the GPU" if opts.gpus == 1 else f"the {opts.gpus} GPUs"
    if gpu(n_layer + 1, base_moe) <= budget:
        ngl, moe_layers, why = n_layer + 1, base_moe, f"every layer and the output on {the_gpu}"
    elif moe and gpu(n_layer + 1, n_layer) <= budget:
        lo, hi = base_moe, n_layer  # the fewest expert layers on the CPU that fit
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if gpu(n_layer + 1, mid) <= budget else (mid + 1, hi)
        ngl, moe_layers, why = n_layer + 1, lo, f"every layer on {the_gpu}, the experts of the first {lo} on the CPU"
    elif gpu(0, base_moe) <= budget:
        lo, hi = 0, n_layer
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if gpu(mid, base_moe) <= budget else (lo, mid - 1)
        ngl, moe_layers, why = lo, base_moe, (f"nothing on {the_gpu} but the compute buffer" if lo == 0 else
                                              f"the output layer and the last {lo - 1} of {n_layer} layers on "
                                              f"{the_gpu}")
    else:
        return None, None, None, "not even the compute buffer with no layer offloaded fits"
    limit = max(facts.n_ctx_train or 0, opts.ctx_size or 0, PAD)
    lo, hi = 0, limit // PAD
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if gpu(ngl, moe_layers, _replace(opts, ctx_size=mid * PAD)) <= budget else (lo, mid - 1)
    return ngl, moe_layers, lo * PAD or None, why


def llama_cpp_plan(tensors: tuple[Tensor, ...], facts: LlamaCppModel, opts: LlamaCppOptions, *, model: str,
                   weights_from: str, budget: int | None, model_arg: str, notes: tuple[str, ...] = ()) -> LlamaCppPlan:
    opts.check()
    moe = any(_EXPS.search(t.name) for t in tensors)
    if opts.n_cpu_moe and not moe:
        raise OptionError("{0} {value}: {model} has no expert tensors (ffn_*_exps)", "n_cpu_moe",
                          value=opts.n_cpu_moe, model=model)
    n_layer = facts.n_layer
    fit = None

    def command(ngl: int, moe_layers: int, ctx: int) -> str:
        parts = [f"llama-server -m {model_arg}", f"-ngl {ngl}"]
        if moe_layers:
            parts.append(f"--n-cpu-moe {moe_layers}")
        parts.append(f"-c {ctx}")
        if opts.cache_type_k != "f16":
            parts.append(f"-ctk {opts.cache_type_k}")
        if opts.cache_type_v != "f16":
            parts.append(f"-ctv {opts.cache_type_v}")
        parts.append("-fa " + ("on" if opts.flash_attn else "off"))
        parts.append(f"-np {opts.parallel}")  # llama-server's own default is auto: 4 unified slots
        if opts.kv_unified:
            parts.append("--kv-unified")
        if opts.swa_full:
            parts.append("--swa-full")
        if opts.batch_size != 2048:
            parts.append(f"-b {opts.batch_size}")
        if opts.ubatch_size != 512:
            parts.append(f"-ub {opts.ubatch_size}")
        if not opts.kv_offload:
            parts.append("--no-kv-offload")
        if opts.tensor_split:
            parts.append("-ts " + ",".join(f"{v:g}" for v in opts.tensor_split))
        return " ".join(parts)

    asked_ngl = opts.n_gpu_layers
    if budget is not None:
        ngl, moe_layers, ctx, why = fit_flags(tensors, facts, opts, budget, moe)
        if asked_ngl is None:  # auto: answer at the fitted placement
            use_ngl = ngl if ngl is not None else 0
            use_moe = moe_layers if moe_layers is not None else (opts.n_cpu_moe or 0)
        else:
            use_ngl, use_moe = asked_ngl, opts.n_cpu_moe or 0
        where = at(n_layer, use_ngl, use_moe, opts)
        devices, caches, words, ctxs = plan_memory(tensors, facts, opts, where)
        at_ctx = ctxs[0]
        line = command(ngl, moe_layers or 0, min(at_ctx, ctx)) if ngl is not None and ctx else ""
        fit = Fit(budget, max(d.total for d in devices if d.device != "CPU") <= budget, ngl, moe_layers if moe else None, ctx, line,
                  why + (f"; the largest context at that placement {ctx:,}" if ctx else ""))
    else:
        where = at(n_layer, -1 if asked_ngl is None else asked_ngl, opts.n_cpu_moe or 0, opts)
        devices, caches, words, ctxs = plan_memory(tensors, facts, opts, where)
    n_ctx, n_ctx_from = ctxs[0], _context(opts, facts)[1]
    extra = list(notes)
    if facts.n_ctx_train and n_ctx > pad(facts.n_ctx_train):
        extra.append(f"--ctx-size {n_ctx:,} is beyond the model's training context {facts.n_ctx_train:,}")
    extra.append(f"placement: {SOURCES['load_tensors']}: -ngl N offloads the output layer and the last N − 1 "
                 "repeating layers (n_layer + 1 or -1: all); token_embd stays on the CPU (a tied output is copied to "
                 "the output layer's device); builds before the output layer was counted (ggml-org 00342301) "
                 "offloaded the last N repeating layers and the output only with N > n_layer")
    extra.append(f"KV cache: {SOURCES['context']} (n_ctx padded to 256) and {SOURCES['kv']}")
    if opts.gpus > 1:
        share = ("--tensor-split " + ",".join(f"{v:g}" for v in opts.tensor_split) if opts.tensor_split else
                 "no --tensor-split: llama.cpp splits by each device's free memory, here taken as equal")
        extra.append(f"{opts.gpus} GPUs, split mode layer (llama.cpp's default), {share}: layer il goes to the first "
                     "GPU whose cumulative share (float32) exceeds (il − i_gpu_start) / act_gpu_layers, the output "
                     f"layer counted as layer n_layer ({SOURCES['tensor_split']}); each GPU holds its layers' "
                     "weights and KV cache and computes them")
        if where.n_gpu_layers > n_layer and opts.kv_offload and not where.cpu_moe:
            extra.append("pipeline parallelism is on (several GPUs, every layer offloaded, split mode layer, KV "
                         "offloaded, no tensor overrides: llama_context's condition): ggml's scheduler keeps "
                         "GGML_SCHED_MAX_COPIES = 4 copies of each split's inputs, which the compute estimate "
                         "leaves out")
    if any(c.kind == "recurrent state" for c in caches):
        extra.append(f"recurrent states: {SOURCES['recurrent']}, F32, max(1, --parallel) rows; the model's "
                     f"shapes: {facts.how}")
    if any(layer.k_width and not layer.v_width for layer in facts.layers):
        extra.append(f"MLA cache: {SOURCES['mla']}: K only, kv_lora_rank + qk_rope_head_dim values a cell; older "
                     "builds add a V of kv_lora_rank values a cell")
    if any(d.device == "CPU" and d.weights for d in devices):
        extra.append("CPU weights are memory-mapped from the file by default (--no-mmap reads them into RAM): "
                     "host memory either way")
    return LlamaCppPlan(model, weights_from, n_layer, where, n_ctx, n_ctx_from, ctxs[1], ctxs[2], ctxs[3], ctxs[4],
                        opts, devices, caches, words, COMPUTE_SOURCE, moe, fit, tuple(extra))


__all__ = ["CACHE_TYPES", "LlamaCppOptions", "LlamaCppPlan", "Tensor", "llama_cpp_plan", "model_facts",
           "placement", "row_size"]
