"""vLLM's launch arithmetic, before launching: KV blocks, tokens of KV, concurrency and the largest context that fit.

What vLLM (V1 engine) computes at start-up, read from its source (commits named in docs/commands.md, "vLLM
pre-flight"):

    requested = ⌈total GPU memory (torch.cuda.mem_get_info) × gpu_memory_utilization⌉   (worker/utils.request_memory)
    non-KV    = weights + the profile run's torch peak increase + non-torch increase     (mem_utils.memory_profiling)
    available = requested − non-KV, in integer bytes                  (gpu_worker.determine_available_memory)
    blocks    = available // (page bytes × layers per pool)                   (kv_cache_utils.get_num_blocks)

A layer's page is one block of its KV cache (kv_cache_interface.py): block_size × num_kv_heads (a rank's) ×
(head_size + head_size_v) × dtype bytes for attention, block_size × (kv_lora_rank + qk_rope_head_dim) × bytes for
MLA (its latent and rope key, one "head", whole on every tensor-parallel rank). The bytes per token and layer are
the project's KV engine's (memory/kv.py: "grouped" and "latent" layouts, a rank's share at `tp`), so the two
never disagree; vLLM adds no padding to an attention page when every layer's page is equal.

Layers are grouped by spec (kv_cache_utils.get_kv_cache_groups): one group when every layer is alike; for
full + sliding-window models (Gemma-2, Gemma-3, gpt-oss) the layers of each kind form groups of `group size`
layers (the smallest kind's count, or the largest's where it is under 1.5× the smallest), each pool shared by one
layer of each group. A request at max_model_len needs, per group: full attention cdiv(len, block) blocks; a
sliding window cdiv(min(window − 1 + max_num_batched_tokens, len), block) + 1 (the window may start mid-block and
a chunked prefill's tokens are allocated before the window slides past them); chunked local attention
cdiv(min(chunk + max_num_batched_tokens, len), block). The maximum concurrency vLLM logs is blocks ÷ the blocks
one request needs (get_max_concurrency_for_kv_cache_config); the tokens of KV it logs are blocks // groups × block
size (_report_kv_cache_config). The largest max_model_len that fits is vLLM's own binary search
(_estimate_max_model_len_from_groups).

Pipeline parallelism (--pp): vLLM places layers by get_pp_indices (distributed/utils.py: layers // pp a stage, the
remainder one a stage to the stages before the last; VLLM_PP_LAYER_PARTITION replaces it). Each worker (a stage's
tensor-parallel rank) measures its own available memory: its layers' weights, the embeddings on the first stage,
the norm and head on the last (a tied head's copy there), its own profile run (the sampler on the last stage only,
the received intermediate tensors on the others). get_kv_cache_configs groups the whole model's layers (group i of
a kind takes that kind's layers[i::groups]), projects the groups onto each worker, computes each worker's blocks
as its available // (page × its largest projected group), then gives every worker the smallest count; each
worker's memory check and largest max_model_len use its own projection.

Encoder-decoders: vLLM's V1 engine serves Whisper alone (BART, T5 and the rest went with V0). Each decoder layer
has a self-attention FullAttentionSpec and a cross-attention CrossAttentionSpec of the same page; the two kinds
form two groups (the hybrid allocator), and a request's cross-attention holds cdiv(encoder length, block) blocks,
the encoder length being max_source_positions (1,500 for Whisper: max_num_encoder_input_tokens).

Recurrent layers (Mamba, Mamba-2, gated delta nets) are MambaSpecs: one block holds a sequence's state, in vLLM's
shapes (`vllm_mamba_state`); with attention beside them vLLM raises the attention block so a page holds a state
and pads the state to the page (`vllm_pages`, HybridAttentionMambaModelConfig).

Which layers slide is vLLM's choice, not transformers': vLLM's model classes (llama.py and the classes built like
it) give a layer a window only where the config's `layer_types` says "sliding_attention"; a config with a
`sliding_window` but no `layer_types` (Mistral-7B-v0.1) runs full attention in vLLM.

The non-KV reserve beyond the weights is measured by vLLM on the GPU; here each part is an estimate, named with its
source: the profile run's activation peak (a dummy forward of max_num_batched_tokens tokens, then the sampler over
max_num_seqs requests), the non-torch memory (an allowance), and the CUDA graphs. Since v0.21.0 vLLM subtracts a
CUDA-graph estimate from the KV budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default):

    available = requested − non-KV − cudagraph estimate                (gpu_worker.determine_available_memory)

and the estimate is a measurement, not a formula of the config: GPUModelRunner.profile_cudagraph_memory captures
graphs against a minimal KV cache and reads torch.cuda.mem_get_info around the captures (the first two per mode,
the second's delta extrapolated to the rest). Here it is an allowance, named as not modelled. The defaults are
vLLM's as people run it today (VLLM_DEFAULTS_FROM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...errors import OptionError, UnsupportedError
from ..dtypes import torch_name
from ..hardware import GiB
from .result import DEFAULT_RESERVE, check_memory_target

MiB = 2**20
# the vLLM release whose defaults the pre-flight follows (named in the output and docs/commands.md); the budget
# arithmetic is the source read at the commits docs/commands.md names
VLLM_DEFAULTS_FROM = ("vLLM v0.27.1's defaults: --gpu-memory-utilization 0.92 (CacheConfig, as vLLM's serve "
                      "reference gives it; 0.9 in earlier releases), the CUDA graphs' memory subtracted from the KV "
                      "budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, \"default since v0.21.0\" as v0.27.1 logs "
                      "it); the budget arithmetic as read at vllm-project/vllm 35d5cda1")
DEFAULT_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE = 16
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # vLLM's CacheConfig.block_size choices (CUDA)
# memory outside torch's allocator that grows between vLLM's first snapshot (taken after NCCL's initialisation) and
# the end of the profile run: CUDA kernels' modules loaded on first use, library handles. An allowance, not a
# measurement: vLLM logs its own as "non-torch forward increase memory".
NON_TORCH_ALLOWANCE = 256 * MiB
# the CUDA graphs' memory: vLLM (v0.21.0 on) measures it by a dry capture before sizing the KV cache and subtracts
# it, logging "Estimated CUDA graph memory: … GiB total". Its figure depends on the kernels a capture allocates on
# the GPU, not on the config alone, so here it is an allowance, not a model of vLLM's measurement.
CUDA_GRAPH_ALLOWANCE = 512 * MiB
# vLLM's `vllm serve` defaults (EngineArgs.get_batch_defaults, OPENAI_API_SERVER): a GPU of 70 GiB or more that is
# not an A100 gets the larger batch; its threshold compares the memory CUDA reports
_LARGE_GPU = 70 * GiB
_SERVE_DEFAULTS = {True: (8192, 1024), False: (2048, 256)}  # large GPU → (max_num_batched_tokens, max_num_seqs)
_MAX_TOKENS = 1 << 24
# moe_align_block_size pads each expert's tokens to BLOCK_SIZE_M of the fused kernel's config: 64 in fused_moe.py's
# get_default_config for more tokens than experts (a config tuned for the GPU may take another; its ids are
# kilobytes beside the caches)
MOE_ALIGN_BLOCK = 64
_DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_KV_DTYPES = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")  # the cache dtypes vLLM's flag names


@dataclass(frozen=True)
class VllmOptions:
    """`--engine vllm`'s settings, each as `vllm serve` spells it (None: vLLM's default for the GPU and model)."""

    gpu_memory_utilization: float = DEFAULT_UTILIZATION
    max_model_len: int | None = None  # None: the model's max_position_embeddings (vLLM's derived length)
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    pp_layer_partition: tuple[int, ...] | None = None  # VLLM_PP_LAYER_PARTITION: stages' layers (None: vLLM's rule)
    # beside vLLM's flags, what paramscope reads (vllm_answer.py): the weights' storage, the KV cache's dtype, the
    # parallel degrees, and the GPU (or budget) whose memory vLLM's utilization multiplies
    dtype: str | None = None  # a storage format (--dtype); None: the checkpoint's declared one
    kv_dtype: str | None = None  # vLLM's --kv-cache-dtype; None: auto (the model's dtype)
    group_size: int | None = None  # GPTQ/AWQ
    tp: int = 1  # --tensor-parallel-size: each figure is one GPU's
    pp: int = 1  # --pipeline-parallel-size
    gpu: str | None = None
    budget: int | None = None  # bytes
    reserve: int = DEFAULT_RESERVE  # the CUDA context, outside vLLM's budget

    def check(self) -> None:
        check_memory_target(self.gpu, self.budget, self.reserve)
        if self.kv_dtype is not None and torch_name(self.kv_dtype) not in _KV_DTYPES:
            raise OptionError("{0} {value}: vLLM's {flag} takes auto (the model's dtype), bfloat16, fp8 or fp8_e5m2",
                              "kv_dtype", value=self.kv_dtype, flag="--kv-cache-dtype")  # vLLM's flag, not ours
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1 or math.isnan(u):
            raise OptionError("{0} must be a fraction in (0, 1], got {value}", "gpu_memory_utilization", value=u)
        if self.block_size not in BLOCK_SIZES:
            raise OptionError("{0} must be one of {choices} (vLLM's choices), got {value}", "block_size",
                              choices=", ".join(map(str, BLOCK_SIZES)), value=self.block_size)
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= _MAX_TOKENS:
                raise OptionError("{0} must be between 1 and {limit:,}, got {value}", name, limit=_MAX_TOKENS,
                                  value=value)
        if self.max_num_seqs is not None and self.max_num_batched_tokens is not None and \
                self.max_num_seqs > self.max_num_batched_tokens:
            raise OptionError("{0} ({seqs:,}) must not exceed {1} ({tokens:,}), as vLLM requires", "max_num_seqs",
                              "max_num_batched_tokens", seqs=self.max_num_seqs, tokens=self.max_num_batched_tokens)
        if self.pp_layer_partition is not None and (not self.pp_layer_partition or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.pp_layer_partition)):
            raise OptionError("{0} must be layer counts of one or more, one a stage, got {value}", "pp_layer_partition",
                              value=",".join(map(str, self.pp_layer_partition)))


@dataclass(frozen=True)
class Estimate:
    """A part of the non-KV reserve that vLLM measures and paramscope estimates."""

    bytes: int
    arithmetic: str
    source: str  # what vLLM measures, and where


@dataclass(frozen=True)
class KVGroup:
    """The layers of one KV cache spec, as vLLM groups them (kv_cache_interface.py)."""

    kind: str  # "full attention" | "sliding window 4,096" | "chunked 8,192" | "MLA latent" | "mamba state"
    spec: str  # vLLM's class: FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MLAAttentionSpec,
    # MambaSpec
    layers: int
    groups: int  # vLLM's KV cache groups of this kind (layers ÷ group size, rounded up)
    bytes_per_token: int  # one layer, one token (a rank's share); a Mamba layer: its state, a sequence
    token_arithmetic: str  # the project's KV engine's, e.g. "2 × 8 kv heads × 128 × 2 B"; Mamba: vLLM's shapes
    page_bytes: int  # one block of one layer: block_size × bytes_per_token
    window: int | None
    blocks_per_request: int  # at max_model_len, one group of this kind
    blocks_arithmetic: str
    encoder_tokens: int | None = None  # cross-attention: the encoder length every request holds (CrossAttentionSpec)


@dataclass(frozen=True)
class VllmStage:
    """One pipeline stage's worker (rank 0 of its tensor-parallel group), as vLLM budgets it."""

    rank: int
    first_layer: int
    last_layer: int
    layers: int  # vLLM's partition (get_pp_indices, or VLLM_PP_LAYER_PARTITION)
    weights: int  # its layers' shards, the embeddings on stage 0, the norm and head on the last
    activation: Estimate  # its profile run's peak (the sampler on the last stage only; intermediate tensors after 0)
    available: int  # ⌈total × utilization⌉ − its non-KV − the CUDA graphs, integer bytes (negative: short)
    pool_layers: int  # layers a KV pool serves on this worker: its largest share of one KV cache group
    bytes_per_block: int  # page × pool_layers
    blocks: int  # what its own memory holds (vLLM then gives every worker the smallest)
    fits: bool  # one sequence of max_model_len fits its memory
    largest: int  # the largest max_model_len its memory holds


@dataclass(frozen=True)
class TensorParallelTry:
    tp: int
    weights: int | None  # a GPU's weights at this degree; None where the degree was refused
    available: int | None
    fits: bool
    why: str


@dataclass(frozen=True)
class VllmPreflight:
    """What vLLM would compute at launch on one GPU (a tensor-parallel rank's GPU under --tp)."""

    gpu: str
    total: int  # the GPU's memory, as vLLM's utilization multiplies it
    total_from: str
    utilization: float
    requested: int  # ⌈total × utilization⌉, as vLLM's request_memory rounds it
    tp: int
    weights: int  # a GPU's weights and buffers: the project's serving weights (parallel/serving.py under tp)
    weights_from: str
    activation: Estimate
    non_torch: Estimate
    cuda_graphs: Estimate
    non_kv: int  # weights + activation + non-torch: vLLM's non_kv_cache_memory (the CUDA graphs are subtracted apart)
    available: int  # requested − non-KV − CUDA graphs: vLLM's "Available KV cache memory"
    block_size: int
    kv_dtype: str
    groups: tuple[KVGroup, ...]
    group_size: int  # layers a KV cache pool serves: one layer of each group
    page_bytes: int  # one block of one layer
    bytes_per_block: int  # page × group size: what one block costs over all layers
    blocks: int  # vLLM's num_gpu_blocks (0 when nothing is available)
    max_model_len: int
    max_model_len_from: str
    max_num_seqs: int
    max_num_batched_tokens: int
    defaults_from: str
    blocks_per_request: int  # one sequence at max_model_len, every group
    max_concurrency: float  # blocks ÷ blocks_per_request: "Maximum concurrency for N tokens per request: X"
    kv_tokens: int  # blocks // KV cache groups × block size: "GPU KV cache size: N tokens" (_report_kv_cache_config)
    largest_max_model_len: int  # the largest that fits (0: not one token), up to the model's own length
    model_max_len: int
    fits: bool
    why: str  # why it does not fit ("" when it does)
    headroom: int  # total − requested: what the CUDA context takes from
    headroom_needs: int  # the reserve (CUDA context); the CUDA graphs come out of the budget (v0.21.0 on)
    smallest_tp: int | None  # where it does not fit at --tp: the smallest degree that fits at this length
    tried: tuple[TensorParallelTry, ...]
    command: str  # `vllm serve …` that fits (or the asked one, when it fits)
    command_changes: str  # what the command changed from the asked settings, in words
    notes: tuple[str, ...] = field(default=())
    pp: int = 1
    stages: tuple[VllmStage, ...] = ()  # each pipeline stage's worker (under --pp; empty without)
    limiting_stage: int = 0  # the stage with the fewest blocks, whose budget the figures above are
    follows: str = VLLM_DEFAULTS_FROM  # the vLLM release whose defaults and budget rule these figures follow


def serve_defaults(total: int, gpu_name: str) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, where from) as `vllm serve` defaults them on this GPU."""
    large = total >= _LARGE_GPU and "a100" not in gpu_name.lower()
    tokens, seqs = _SERVE_DEFAULTS[large]
    why = ("70 GiB or more and not an A100" if large else
           ("an A100" if "a100" in gpu_name.lower() else "under 70 GiB"))
    return tokens, seqs, (f"vllm serve's defaults for a GPU of {why} (EngineArgs.get_batch_defaults, "
                          "OPENAI_API_SERVER)")


def vllm_dtype(config: dict[str, Any], dtype: str | None) -> tuple[str | None, str | None, str]:
    """(the --dtype the serving answer takes, the `vllm serve` flag that says it, a note): a float32 checkpoint
    without --dtype is served in bfloat16, as vLLM's `--dtype auto` resolves a float32 config to 16 bits
    (bfloat16 on GPUs that support it); a plain --dtype is vLLM's --dtype, fp8 its --quantization fp8; other
    formats are the checkpoint's own quantization_config to vLLM, with no flag."""
    from .declared import declared_format
    from .quantization import weight_format

    if dtype is None:
        if declared_format(config)[0].key == "fp32":
            return "bf16", "--dtype bfloat16", ("the config declares float32: vLLM's --dtype auto serves a float32 "
                                                "checkpoint in 16 bits (bfloat16 on GPUs that have it), and the "
                                                "weights are counted in bfloat16")
        return None, None, ""
    fmt = weight_format(dtype)
    if fmt.kind == "plain":
        return dtype, f"--dtype {_DTYPE_NAMES.get(fmt.key, fmt.key)}", ""
    if fmt.key == "fp8":
        return dtype, "--quantization fp8", ""
    return dtype, None, (f"--dtype {fmt.key}: vLLM reads a quantised checkpoint's own quantization_config, so the "
                         "command carries no flag for it")


def cache_dtype_flag(kv_dtype: str, compute_dtype: str | None) -> str | None:
    """`--kv-cache-dtype …` for a KV cache in `kv_dtype` (None: vLLM's auto, the model's dtype)."""
    if kv_dtype == compute_dtype:
        return None
    names = {"float8_e4m3fn": "fp8", "float8_e5m2": "fp8_e5m2", "bfloat16": "bfloat16"}
    if kv_dtype not in names:
        raise OptionError("{0} {value} is no KV cache dtype of vLLM's: it takes auto (the model's dtype, here "
                          "{model}), bfloat16, fp8 or fp8_e5m2", "kv_dtype", value=kv_dtype, model=compute_dtype)
    return f"--kv-cache-dtype {names[kv_dtype]}"


def vllm_preflight(report: Any, view: Any, estimate: Any, options: VllmOptions, accelerator: Any, *,
                   reserve: int, tp: int = 1, pp: int = 1, model_id: str = "", kv_dtype_flag: str | None = None,
                   dtype_flag: str | None = None, extra_notes: tuple[str, ...] = ()) -> VllmPreflight:
    """vLLM's launch figures for `report`/`view` served as `estimate` (memory/serving.py's answer at --tp) on
    `accelerator` (hardware.Accelerator; a --budget is one named "budget"), over `tp` × `pp` GPUs."""
    from ..dims import max_context, text_config

    options.check()
    if isinstance(pp, bool) or not isinstance(pp, int) or not 1 <= pp <= 1024:
        raise OptionError("{0} must be between 1 and 1,024 pipeline stages, got {value}", "pp", value=pp)
    if options.pp_layer_partition is not None and pp == 1:
        raise OptionError("{0} is for {1}: each pipeline stage's layers", "pp_layer_partition", "pp")
    text = text_config(view.config)
    model_max = max_context(text)
    length = options.max_model_len or model_max
    if length is None:
        raise OptionError("{0} is needed: the config gives no max_position_embeddings", "max_model_len")
    length_from = "--max-model-len" if options.max_model_len else "the model's max_position_embeddings"
    if model_max is not None and length > model_max:
        raise OptionError("{0} {value:,} is beyond the model's max_position_embeddings {limit:,}: vLLM refuses it "
                          "(unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)", "max_model_len", value=length,
                          limit=model_max)
    if estimate.kv_cache is None:
        raise UnsupportedError("{name} does not generate: vLLM's KV cache pre-flight is for generating models",
                               name=view.class_name)
    total = accelerator.memory
    total_from = (f"--budget {total:,} B" if accelerator.name == "budget" else
                  f"{accelerator.name}'s nominal {total / GiB:g} GiB; vLLM multiplies what CUDA reports "
                  "(torch.cuda.mem_get_info), a little less (an H100 80GB reports 81,559 MiB): --budget SIZE gives "
                  "the reported figure")
    batched, seqs, defaults_from = serve_defaults(total, accelerator.name)
    batched = options.max_num_batched_tokens or batched
    seqs = options.max_num_seqs or min(seqs, batched)
    if seqs > batched:
        raise OptionError("{0} ({seqs:,}) must not exceed {1} ({tokens:,}), as vLLM requires", "max_num_seqs",
                          "max_num_batched_tokens", seqs=seqs, tokens=batched)
    kv_dtype = estimate.settings["kv_dtype"]
    compute_dtype = estimate.settings.get("compute_dtype") or "bfloat16"
    notes: list[str] = list(extra_notes)
    groups_kinds, per_layer, arithmetic, kind_notes, mamba = vllm_layer_kinds(view.config, kv_dtype, tp,
                                                                              compute_dtype)
    notes.extend(kind_notes)
    block, page, page_notes = vllm_pages(per_layer, mamba, options.block_size, length)
    notes.extend(page_notes)
    encoder = _encoder_shape(text)
    if pp > 1 and encoder is not None:
        raise UnsupportedError("{0} {pp} with {model_type}: vLLM's encoder-decoder (WhisperForConditionalGeneration) "
                               "does not implement pipeline parallelism (SupportsPP)", "pp", pp=pp,
                               model_type=getattr(text, "model_type", "an encoder-decoder"))
    keys = _layer_keys(view.config)[0]
    split = vllm_pp_partition(len(keys), pp, options.pp_layer_partition) if pp > 1 else (len(keys),)
    if pp > 1:
        notes.append(_partition_words(split, options.pp_layer_partition))
    if encoder is not None:
        notes.append(f"encoder-decoder: every request holds its cross-attention blocks for the encoder length "
                     f"{encoder[0]:,} ({encoder[1]}) from its first step, whatever its audio's length; vLLM disables "
                     "chunked prefill and prefix caching for encoder-decoders; the encoder's own attention keeps no "
                     "cache (MMEncoderAttention)")
    inputs = _serving_inputs(report, view, estimate)
    weights_at = _weights_at(inputs, estimate.weights, pp, split if pp > 1 else None)
    fused_at = _fused_experts_at(report.params, text, compute_dtype)
    if any(moe for _, moe in weights_at(tp)) and fused_at(tp) is None:  # said, not dropped in silence
        notes.append("not counted: a MoE layer's moment and vLLM's fused experts' workspace (the routed experts' "
                     "width could not be read off their tensors, packed or quantised, or the config names no top-k)")
    notes.extend(_weight_notes(text, compute_dtype))
    non_torch = Estimate(
        NON_TORCH_ALLOWANCE, f"{NON_TORCH_ALLOWANCE:,} B (an allowance)",
        "vLLM measures the growth of memory outside torch's allocator from its first snapshot (after NCCL's "
        "initialisation) to the profile run's end: kernels' modules, library handles "
        "(utils/mem_utils.memory_profiling, non_torch_increase)")
    graphs = Estimate(
        CUDA_GRAPH_ALLOWANCE, f"{CUDA_GRAPH_ALLOWANCE:,} B (an allowance: vLLM's figure is not modelled)",
        "vLLM subtracts a CUDA-graph estimate from the KV budget (gpu_worker.determine_available_memory, "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default since v0.21.0) that it measures by capturing graphs "
        "against a minimal KV cache (GPUModelRunner.profile_cudagraph_memory: torch.cuda.mem_get_info around the "
        "captures, the second capture's delta extrapolated to the rest); not reproducible from the config, so an "
        "allowance; vLLM logs its own as \"Estimated CUDA graph memory: … GiB total\" (0 with --enforce-eager or "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)")
    # vLLM's request_memory: math.ceil(total × utilization), an integer; every later step subtracts integers, so
    # the rows printed add up to the byte (a float subtraction truncated by int() is 1 B off when negative)
    requested = math.ceil(total * options.gpu_memory_utilization)
    group_size, kinds = vllm_grouping(groups_kinds)
    groups = tuple(_group(kind, window, layers, count, per_layer, arithmetic, page, block, length, mamba,
                          batched) for kind, window, layers, count in kinds)

    def request_blocks(n: int) -> int:
        return sum(g.groups * vllm_blocks(g.kind, g.window if g.encoder_tokens is None else g.encoder_tokens,
                                          block, n, batched) for g in groups)

    per_request = request_blocks(length)
    search_to = model_max or length
    starts = [sum(split[:r]) for r in range(len(split))]
    stage_pools = [group_size if pp == 1 else _worker_group_size(keys, group_size, starts[r], starts[r] + n)
                   for r, n in enumerate(split)]

    def stages_at(t: int, t_page: int, t_request: int, search: bool) -> list[VllmStage]:
        """Each pipeline stage's worker (rank 0 of its tensor-parallel group) at tensor-parallel degree t."""
        out = []
        for r, ((weights, moe), n) in enumerate(zip(weights_at(t), split)):
            activation = _activation(text, compute_dtype, batched, seqs, t, first=r == 0, last=r == len(split) - 1,
                                     encoder=encoder, experts=fused_at(t) if moe else None)
            available = requested - weights - activation.bytes - non_torch.bytes - graphs.bytes
            per_block = t_page * stage_pools[r]
            blocks = max(available // per_block, 0) if per_block else 0
            largest = _largest_length(lambda m: request_blocks(m) * per_block <= available, search_to) \
                if search else 0
            out.append(VllmStage(r, starts[r], starts[r] + n - 1, n, weights, activation, available, stage_pools[r],
                                 per_block, blocks, available > 0 and t_request * per_block <= available, largest))
        return out

    stages = stages_at(tp, page, per_request, True)
    limiting = min(stages, key=lambda st: (st.blocks, st.available))
    blocks = limiting.blocks
    weights, activation, available = limiting.weights, limiting.activation, limiting.available
    non_kv = weights + activation.bytes + non_torch.bytes
    bytes_per_block = limiting.bytes_per_block
    weights_from = ("the serving weights and buffers (memory/weights.py)" if tp == 1 and pp == 1 else
                    f"rank 0's shards at tp {tp} (parallel/serving.py), buffers whole" if pp == 1 else
                    f"stage {limiting.rank}'s rank 0 at tp {tp}, pp {pp}: its layers' shards (parallel/serving.py at "
                    "vLLM's partition), the embeddings on stage 0, the norm and head (a tied head's copy) on the last")
    concurrency = blocks / per_request if per_request else 0.0
    largest = min(st.largest for st in stages)
    fits = all(st.fits for st in stages)
    where = "" if pp == 1 else f"stage {limiting.rank} (layers {limiting.first_layer}–{limiting.last_layer}): "
    short = next((st for st in stages if not st.fits), limiting)
    if short.available <= 0:
        at = "" if pp == 1 else f"stage {short.rank} (layers {short.first_layer}–{short.last_layer}): "
        short_non_kv = short.weights + short.activation.bytes + non_torch.bytes + graphs.bytes
        why = (f"{at}no memory for the KV cache: the non-KV reserve with the CUDA graphs, {short_non_kv:,} B, exceeds "
               f"total × utilization {requested:,} B by {-short.available:,} B (vLLM: \"No available memory for the "
               "cache blocks\")")
    elif not fits:
        at = "" if pp == 1 else f"stage {short.rank} (layers {short.first_layer}–{short.last_layer}): "
        why = (f"{at}one sequence of {length:,} tokens needs {per_request:,} blocks × {short.bytes_per_block:,} B = "
               f"{per_request * short.bytes_per_block:,} B of KV cache, and {short.available:,} B are available "
               f"(vLLM refuses to start: \"the model's max seq len ({length}) is larger than the maximum number of "
               "tokens that can be stored in KV cache\")")
    else:
        why = ""
    if pp > 1:
        notes.append(f"vLLM gives every worker the smallest block count of all ({blocks:,}, {where.rstrip(': ')}) "
                     "and shrinks the others' tensors to it (kv_cache_utils.get_kv_cache_configs): "
                     + "; ".join(f"stage {st.rank} leaves {st.available - blocks * st.bytes_per_block:,} B unused"
                                 for st in stages if st.rank != limiting.rank))
    headroom = total - requested
    # the CUDA graphs are inside the budget now (subtracted above); the headroom holds the CUDA context, which
    # vLLM's first snapshot already finds outside torch
    needs = reserve
    if headroom < needs:
        notes.append(f"the headroom total × (1 − {options.gpu_memory_utilization:g}) = {headroom:,} B is less than "
                     f"the CUDA context (--reserve {reserve:,} B): vLLM refuses to start when the free memory at "
                     "start-up is under total × utilization (lower --gpu-memory-utilization)")
    smallest, tried = None, ()
    if not fits:

        def try_at(t: int) -> tuple[int, int, bool, str]:
            specs, t_per_layer, _, _, t_mamba = vllm_layer_kinds(view.config, kv_dtype, t, compute_dtype)
            t_block, t_page, _ = vllm_pages(t_per_layer, t_mamba, options.block_size, length)
            size, t_groups = vllm_grouping(specs)
            need = sum(count * vllm_blocks(kind, window, t_block, length, batched)
                       for kind, window, _, count in t_groups)
            worst = min(stages_at(t, t_page, need, False), key=lambda st: (st.fits, st.available))
            return (worst.weights, worst.available, worst.fits, "" if worst.fits else
                    f"{need * worst.bytes_per_block:,} B of KV for one sequence, {worst.available:,} B available"
                    + (f" (stage {worst.rank})" if pp > 1 else ""))
        smallest, tried = _smallest_tp(text, try_at, tp)
    if fits and concurrency < seqs:
        notes.append(f"--max-num-seqs {seqs:,} exceeds the {concurrency:.2f} sequences of {length:,} tokens the "
                     "blocks hold at once: vLLM starts, and preempts requests when their blocks run out (shorter "
                     "requests share the blocks)")
    command, changes = _command(model_id, options, tp, length, seqs, fits, largest, smallest,
                                batched if options.max_num_batched_tokens else None, kv_dtype_flag, dtype_flag,
                                model_max, pp)
    return VllmPreflight(
        gpu=accelerator.name, total=total, total_from=total_from, utilization=options.gpu_memory_utilization,
        requested=requested, tp=tp, weights=weights, weights_from=weights_from, activation=activation,
        non_torch=non_torch, cuda_graphs=graphs, non_kv=non_kv, available=available,
        block_size=block, kv_dtype=kv_dtype, groups=groups, group_size=limiting.pool_layers, page_bytes=page,
        bytes_per_block=bytes_per_block, blocks=blocks, max_model_len=length, max_model_len_from=length_from,
        max_num_seqs=seqs, max_num_batched_tokens=batched, defaults_from=defaults_from,
        blocks_per_request=per_request, max_concurrency=concurrency,
        kv_tokens=blocks // sum(g.groups for g in groups) * block,
        largest_max_model_len=largest, model_max_len=search_to, fits=fits, why=why, headroom=headroom,
        headroom_needs=needs, smallest_tp=smallest, tried=tried, command=command, command_changes=changes,
        notes=tuple(notes), pp=pp, stages=tuple(stages) if pp > 1 else (), limiting_stage=limiting.rank)


def _weight_notes(text: Any, compute_dtype: str) -> list[str]:
    """What vLLM's loaded model holds beyond the serving weights counted here, named, not added: its vocabulary
    padding (VocabParallelEmbedding pads the rows to a multiple of 64) and its rotary cos/sin cache (one buffer of
    max_position × rotary_dim, where transformers keeps inv_freq)."""
    from ..dims import config_int, dim, max_context
    from ..dtypes import itemsize

    notes = []
    vocab = config_int(text, "vocab_size")
    if vocab and vocab % 64:
        notes.append(f"vLLM pads the vocabulary's {vocab:,} rows to {-(-vocab // 64) * 64:,} (a multiple of 64, "
                     "VocabParallelEmbedding) in the embedding and the head: those rows are not counted here")
    heads = dim(text, "heads") or 0
    rotary = config_int(text, "qk_rope_head_dim") or config_int(text, "head_dim") or (
        (dim(text, "hidden") or 0) // heads if heads else 0)
    positions = max_context(text)
    if rotary and positions and (getattr(text, "rope_theta", None) is not None or
                                 getattr(text, "rope_parameters", None) is not None):
        cache = positions * rotary * itemsize(compute_dtype)
        notes.append(f"estimate, not counted: vLLM keeps a rotary cos/sin cache of max_position {positions:,} × "
                     f"rotary_dim {rotary} × {itemsize(compute_dtype)} B = {cache:,} B (RotaryEmbedding's "
                     "cos_sin_cache, for the default rope; scaled ropes differ) where transformers keeps inv_freq")
    return notes


def vllm_layer_kinds(config: Any, kv_dtype: str, tp: int, compute_dtype: str = "bfloat16") -> tuple[
        list[tuple[str, int | None, int]], int, str, list[str], tuple[int, str] | None]:
    """([(kind, window, layers)] in vLLM's reading, bytes per token of one attention layer (a rank's; 0 without
    attention), its arithmetic, notes, and a Mamba layer's state (bytes a sequence, arithmetic) or None).

    The bytes per token come from memory/kv.py at `tp` ("latent" for MLA, "grouped" otherwise: K and V once per
    key/value head, as vLLM's paged cache keeps them); a recurrent layer's state is vLLM's own shapes
    (`vllm_mamba_state`), which differ from transformers' cache."""
    from ..dims import is_mla, text_config
    from .kv import kv_cache

    text = text_config(config)
    encoder = _encoder_shape(text)
    mla = is_mla(text)
    cache = kv_cache(config, batch=1, seq=1, dtype=kv_dtype, layout="latent" if mla else "grouped", tp=tp,
                     encoder_seq=encoder[0] if encoder else None)
    attention = [g for g in cache.groups if g.per_token and g.kind != "cross-attention"]
    per_layer = attention[0].per_token // attention[0].layers if attention else 0
    arithmetic = attention[0].arithmetic if attention else ""
    cross = [g for g in cache.groups if g.kind == "cross-attention" and g.fixed]
    if cross and cross[0].fixed != cross[0].layers * cross[0].tokens * per_layer:
        raise UnsupportedError("{model_type}'s cross-attention page differs from its self-attention page: vLLM "
                               "cannot unify them", model_type=getattr(text, "model_type", "this model"))
    per_layer_keys, slid_by_default = _layer_keys(config)
    counts: dict[tuple[str, int | None], int] = {}
    notes = []
    for keys in per_layer_keys:
        for key in keys:
            counts[key] = counts.get(key, 0) + 1
    mamba = None
    if ("mamba state", None) in counts:
        mamba = vllm_mamba_state(text, compute_dtype, tp)
        if mamba is None:
            raise UnsupportedError("{model_type}'s recurrent layers: {0} vllm knows vLLM's state shapes for "
                                   "Mamba (Jamba), Mamba-2 (Bamba, Granite-4.0-H, Nemotron-H, Falcon-H1, Zamba2) "
                                   "and gated delta nets (Qwen3-Next), not this one", "engine",
                                   model_type=getattr(text, "model_type", "this model"))
    if not per_layer and mamba is None:
        raise UnsupportedError("no attention layer holds a KV cache here: vLLM's paged KV pre-flight has nothing to "
                               "allocate")
    if slid_by_default:
        notes.append("the config sets a sliding_window but no layer_types: vLLM's model classes (llama.py and "
                     "those built like it) give a layer a window only where layer_types says so, so every layer "
                     "is full attention here (transformers' cache slides them)")
    return ([(kind, window, layers) for (kind, window), layers in counts.items()], per_layer, arithmetic, notes,
            mamba)


_RECURRENT = ("linear_attention", "conv", "mamba", "mamba2", "ssm", "recurrent", "attention_free")
# the encoder-decoders vLLM's V1 engine serves (model_executor/models/registry.py): Whisper alone; BART, T5, mBART,
# Florence-2 and the rest went with the V0 engine
_VLLM_ENCODER_DECODERS = ("whisper",)


def _encoder_shape(text: Any) -> tuple[int, str] | None:
    """(the encoder length every request's cross-attention holds, where from) for an encoder-decoder vLLM serves;
    None for a decoder-only model; UnsupportedError for an encoder-decoder vLLM V1 does not serve."""
    from ..dims import config_int

    if not getattr(text, "is_encoder_decoder", False):
        return None
    model_type = str(getattr(text, "model_type", "") or "")
    if model_type not in _VLLM_ENCODER_DECODERS:
        raise UnsupportedError("{model_type} is an encoder-decoder vLLM's V1 engine does not serve (it serves Whisper; "
                               "BART, T5 and the other encoder-decoders went with the V0 engine)",
                               model_type=model_type or "this model")
    length = config_int(text, "max_source_positions")
    if not length:
        raise UnsupportedError("{model_type}'s config gives no max_source_positions: the encoder length vLLM's "
                               "cross-attention cache holds", model_type=model_type)
    return length, ("max_source_positions (vLLM's max_num_encoder_input_tokens for an encoder-decoder: "
                    "MULTIMODAL_REGISTRY.get_encdec_max_encoder_len, Whisper's audio padded to 30 s)")


def refuse_unserved_encoder_decoder(config: Any) -> None:
    """Before any build, from the config file's own fields: one line for an encoder-decoder that vLLM's V1 engine
    does not serve (a config that does not declare is_encoder_decoder is caught after the build)."""
    from types import SimpleNamespace

    if isinstance(config, dict) and config.get("is_encoder_decoder") is True:
        _encoder_shape(SimpleNamespace(is_encoder_decoder=True, model_type=str(config.get("model_type", "")),
                                       max_source_positions=config.get("max_source_positions")))


def _layer_keys(config: Any) -> tuple[list[list[tuple[str, int | None]]], bool]:
    """(each decoder layer's KV cache specs in vLLM's reading, in layer order, as (kind, window) keys; whether a
    config's sliding window goes unused because it gives no layer_types). A cross-attention key's second item is
    the encoder length."""
    from ..dims import is_mla, text_config
    from .kv import layer_kinds

    text = text_config(config)
    encoder = _encoder_shape(text)
    mla = is_mla(text)
    has_types = isinstance(getattr(text, "layer_types", None), (list, tuple)) and bool(text.layer_types)
    out: list[list[tuple[str, int | None]]] = []
    slid_by_default = False
    for kind, window in layer_kinds(text):
        keys: list[tuple[str, int | None]] = []
        if kind in ("shared", "none"):
            out.append(keys)
            continue
        if kind in _RECURRENT:
            keys.append(("mamba state", None))
        elif kind in ("sliding_attention", "hybrid_sliding") and window and has_types:
            keys.append((f"sliding window {window:,}", window))
        elif kind == "chunked_attention" and window:
            keys.append((f"chunked {window:,}", window))
        else:
            slid_by_default |= kind in ("sliding_attention", "hybrid_sliding") and bool(window)
            keys.append(("MLA latent" if mla else "full attention", None))
        if kind in ("hybrid", "hybrid_sliding"):  # attention and a Mamba mixer in one layer (Falcon-H1): two specs
            keys.append(("mamba state", None))
        if encoder is not None:  # a decoder layer's cross-attention: a CrossAttentionSpec beside its self-attention
            keys.append(("cross-attention", encoder[0]))
        out.append(keys)
    return out, slid_by_default


def vllm_pp_partition(layers: int, pp: int, partition: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Each pipeline stage's layer count as vLLM's get_pp_indices (distributed/utils.py) gives it: layers // pp
    each, the remainder one a stage to the stages before the last, from the one before the last backwards (the
    last holds the final norm and head); VLLM_PP_LAYER_PARTITION (`partition`) replaces the rule, and must give
    pp counts summing to the layers."""
    if pp > layers:
        raise OptionError("{0} {pp} is more than the model's {layers} layers: each stage holds one or more", "pp",
                          pp=pp, layers=layers)
    if partition is not None:
        if len(partition) != pp or sum(partition) != layers:
            raise OptionError("{0} {value} must give {pp} stages' layers summing to the model's {layers} (vLLM "
                              "checks both)", "pp_layer_partition", value=",".join(map(str, partition)), pp=pp,
                              layers=layers)
        return tuple(partition)
    sizes = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        sizes[-i] += 1
    return tuple(sizes)


def _partition_words(split: tuple[int, ...], partition: tuple[int, ...] | None) -> str:
    layers = sum(split)
    if partition is not None:
        return (f"pipeline stages: VLLM_PP_LAYER_PARTITION={','.join(map(str, split))} places the {layers} layers "
                "(get_pp_indices)")
    if len(set(split)) == 1:
        return f"pipeline stages: {layers} layers, {split[0]} a stage (vLLM's get_pp_indices)"
    return (f"pipeline stages: {layers} layers split unevenly as vLLM does, [{','.join(map(str, split))}]: the "
            "remainder goes to the stages before the last (get_pp_indices; VLLM_PP_LAYER_PARTITION, "
            "--pp-layer-partition here, replaces it)")


def _worker_group_size(keys: list[list[tuple[str, int | None]]], size: int, start: int, end: int) -> int:
    """Layers a KV pool serves on the worker holding layers start..end − 1: vLLM groups the whole model's layers
    (group i of a kind takes that kind's layers[i::groups], _get_kv_cache_groups_uniform_page_size), projects each
    group onto the worker's layers (_project_kv_cache_groups_to_worker), and a worker's pools are its largest
    projected group (get_kv_cache_config_from_groups)."""
    by_kind: dict[tuple[str, int | None], list[int]] = {}
    for index, layer_keys in enumerate(keys):
        for key in layer_keys:
            by_kind.setdefault(key, []).append(index)
    shares = []
    for indices in by_kind.values():
        count = -(-len(indices) // size)
        shares.extend(sum(start <= i < end for i in indices[g::count]) for g in range(count))
    return max(shares) if shares else 0


def vllm_mamba_state(text: Any, dtype: str, tp: int) -> tuple[int, str] | None:
    """(bytes a sequence, arithmetic) of one recurrent layer's state on a tensor-parallel rank, in vLLM's shapes
    (MambaStateShapeCalculator): the convolution keeps conv_kernel − 1 columns, and both states are in the model's
    dtype (vLLM's --mamba-cache-dtype and --mamba-ssm-cache-dtype auto; a model whose vLLM config asks for a
    float32 SSM state holds twice the SSM part); Mamba-2's groups are padded to tp where tp does not divide them
    (extra_groups_for_head_shards). None for a family without a formula here."""
    from ..dims import config_int
    from ..dtypes import itemsize

    size = itemsize(dtype)
    kind = str(getattr(text, "model_type", ""))
    per = f" / tp {tp}" if tp > 1 else ""

    def split(n: int) -> int:
        return n // tp if n % tp == 0 else -(-n // tp)
    if kind in ("mamba", "jamba"):
        hidden = config_int(text, "hidden_size") or 0
        inner = config_int(text, "intermediate_size") if kind == "mamba" else (
            (config_int(text, "mamba_expand") or 2) * hidden)
        conv = config_int(text, "conv_kernel", "mamba_d_conv") or 4
        state = config_int(text, "state_size", "mamba_d_state") or 16
        local = split(inner or 0)
        return (local * (conv - 1) * size + local * state * size,
                f"conv {inner:,}{per} × (kernel {conv} − 1) × {size} B + ssm {inner:,}{per} × {state} × {size} B")
    if kind in ("mamba2", "bamba", "granitemoehybrid", "nemotron_h", "falcon_h1", "zamba2"):
        heads = config_int(text, "mamba_n_heads", "mamba_num_heads", "n_mamba_heads", "num_heads") or 0
        head_dim = config_int(text, "mamba_d_head", "mamba_head_dim", "mamba_headdim", "head_dim") or 0
        state = config_int(text, "mamba_d_state", "ssm_state_size", "state_size") or 0
        groups = config_int(text, "mamba_n_groups", "n_groups", "mamba_ngroups") or 1
        conv = config_int(text, "mamba_d_conv", "conv_kernel") or 4
        if not heads or not head_dim or not state:
            return None
        padded = groups if groups % tp == 0 else groups + tp - groups  # vLLM pads the groups to tp
        conv_dim = heads * head_dim + 2 * padded * state
        return (split(conv_dim) * (conv - 1) * size + split(heads) * head_dim * state * size,
                f"conv ({heads} heads × {head_dim} + 2 × {padded} groups × {state}){per} × (kernel {conv} − 1) "
                f"× {size} B + ssm {heads} heads{per} × {head_dim} × {state} × {size} B")
    if kind in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        k_heads = config_int(text, "linear_num_key_heads") or 0
        v_heads = config_int(text, "linear_num_value_heads") or 0
        k_dim = config_int(text, "linear_key_head_dim") or 0
        v_dim = config_int(text, "linear_value_head_dim") or 0
        conv = config_int(text, "linear_conv_kernel_dim") or 4
        conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
        return (split(conv_dim) * (conv - 1) * size + split(v_heads) * k_dim * v_dim * size,
                f"conv (2 × {k_heads} × {k_dim} + {v_heads} × {v_dim}){per} × (kernel {conv} − 1) × {size} B + "
                f"state {v_heads} heads{per} × {k_dim} × {v_dim} × {size} B")
    return None


def vllm_pages(per_layer: int, mamba: tuple[int, str] | None, block_size: int,
               length: int) -> tuple[int, int, list[str]]:
    """(block size, page bytes of one layer, notes) as vLLM settles them: attention alone, block × bytes per token;
    with Mamba layers, HybridAttentionMambaModelConfig raises the attention block to a multiple of 16 (the
    FlashAttention kernel's alignment) whose page holds a state, and pads the state's page to it; Mamba alone, one
    page a state (its block size is max_model_len)."""
    if mamba is None:
        return block_size, block_size * per_layer, []
    state, _ = mamba
    if not per_layer:
        return length, state, [f"Mamba layers alone: one page a sequence's state ({state:,} B), vLLM's Mamba block "
                               f"size being max_model_len ({length:,})"]
    aligned = 16 * -(-state // (16 * per_layer))
    notes = []
    block = block_size
    if block < aligned:
        block = aligned
        notes.append(f"vLLM sets the attention block size to {aligned} tokens (16 × cdiv(state {state:,} B, 16 × "
                     f"{per_layer:,} B a token)) so that an attention page holds a Mamba state "
                     "(HybridAttentionMambaModelConfig.verify_and_update_config)")
    page = block * per_layer
    if page > state:
        notes.append(f"the Mamba state's page is padded from {state:,} B to the attention page, {page:,} B "
                     f"({100 * (page - state) / state:.2f}%), as vLLM pads it")
    return block, page, notes


def vllm_grouping(kinds: list[tuple[str, int | None, int]]) -> tuple[int, list[tuple[str, int | None, int, int]]]:
    """(layers per group, [(kind, window, layers, groups of that kind)]), as _get_kv_cache_groups_uniform_page_size
    splits a hybrid model: the smallest kind's count, or the largest's where it is under 1.5× the smallest."""
    if len(kinds) == 1:
        kind, window, layers = kinds[0]
        return layers, [(kind, window, layers, 1)]
    smallest = min(layers for _, _, layers in kinds)
    largest = max(layers for _, _, layers in kinds)
    size = largest if largest < smallest * 1.5 else smallest
    return size, [(kind, window, layers, -(-layers // size)) for kind, window, layers in kinds]


def vllm_blocks(kind: str, window: int | None, block: int, length: int, batched: int) -> int:
    """Blocks one request of `length` tokens holds in one group of this kind (the spec's max_memory_usage_bytes ÷
    its page). `window`: the sliding window, the attention chunk, or (cross-attention) the encoder length."""
    if kind.startswith("sliding window"):
        return -(-min(window - 1 + batched, length) // block) + 1
    if kind.startswith("chunked"):
        return -(-min(window + batched, length) // block)
    if kind == "mamba state":
        return 1  # the running state (mamba_cache_mode "none": no per-block checkpoints for prefix caching)
    if kind == "cross-attention":  # `window` is the encoder length: CrossAttentionSpec.max_memory_usage_bytes
        return -(-window // block)
    return -(-length // block)


def _group(kind: str, window: int | None, layers: int, count: int, per_layer: int, arithmetic: str, page: int,
           block: int, length: int, mamba: tuple[int, str] | None, batched: int) -> KVGroup:
    blocks = vllm_blocks(kind, window, block, length, batched)
    if kind == "mamba state":
        return KVGroup(kind, "MambaSpec", layers, count, mamba[0], mamba[1], page, None, blocks,
                       "1 (the sequence's state)")
    if kind == "cross-attention":
        return KVGroup(kind, "CrossAttentionSpec", layers, count, per_layer, arithmetic, page, None, blocks,
                       f"cdiv(encoder length {window:,}, {block}) = {blocks:,}, whatever max_model_len", window)
    if kind.startswith("sliding window"):
        spec = "SlidingWindowSpec"
        words = (f"cdiv(min(window {window:,} − 1 + max_num_batched_tokens {batched:,}, {length:,}), {block}) + 1 "
                 f"= {blocks:,}")
    elif kind.startswith("chunked"):
        spec = "ChunkedLocalAttentionSpec"
        words = f"cdiv(min(chunk {window:,} + max_num_batched_tokens {batched:,}, {length:,}), {block}) = {blocks:,}"
    else:
        spec = "MLAAttentionSpec" if kind == "MLA latent" else "FullAttentionSpec"
        words = f"cdiv({length:,}, {block}) = {blocks:,}"
    return KVGroup(kind, spec, layers, count, per_layer, arithmetic, page, window, blocks, words)


def _largest_length(fits: Any, limit: int) -> int:
    """The largest n in 1..limit with fits(n) (fits only grows harder with n), 0 when not even 1: vLLM's binary
    search."""
    if not fits(1):
        return 0
    low, high = 1, limit
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _fused_experts_at(params: Any, text: Any, compute_dtype: str) -> Any:
    """tp → vLLM's fused experts' workspace on a tp rank of one replica (serving_experts.FusedExpertsWorkspace: the
    same TritonExperts arithmetic as `memory --tp --dp`, here over the profile run's own tokens, M = the tokens of
    the dummy forward, no dispatch; the expert's width read off the module's expert tensors / tp), or None for a
    model without routed experts (or a top-k)."""
    from ..dims import config_int, dim
    from ..dtypes import itemsize
    from ..parallel.serving_experts import GatheredDispatch, fused_experts_workspace

    hidden, topk = dim(text, "hidden"), config_int(text, "num_experts_per_tok", "moe_topk", "top_k")
    if not hidden or not topk:
        return lambda tp: None
    one_replica = GatheredDispatch(1, hidden, topk, itemsize(compute_dtype))
    return lambda tp: fused_experts_workspace(one_replica, params, tp=tp, dp=1, ep=1)


def _moe_moment(text: Any, experts: Any, t: int, size: int) -> tuple[tuple[int, str], int, str]:
    """A MoE layer's moment in vLLM's profile run at `t` tokens, beside the fused experts' workspace `experts`
    (serving_experts.FusedExpertsWorkspace at one replica), and that workspace's bytes and words, held apart.

    Live while TritonExperts.apply runs (fused_moe.py; FusedMoEModularKernel.forward, modular_kernel.py): the
    residual and the normed input [t, h]; the MoE output [t, h] (`torch.zeros_like(hidden_states)`: in place only
    where disable_inplace() is false, and it is true from torch 2.9, which vLLM v0.27 runs); the router's logits
    [t, E] in the compute dtype (the gate's output, an argument of the experts' call); fused_topk's top-k weights
    [t, k] fp32 and ids [t, k] int32; moe_align_block_size's sorted token ids (t·k + E·(B − 1) int32), expert ids
    (⌈that / B⌉ int32) and padded count (1 int32), B = BLOCK_SIZE_M. The caches themselves (workspace13 and
    workspace2) are views of the WorkspaceManager's buffer (v1/worker/workspace.py): one tensor a worker, grown to
    the largest request and never freed, so it is beside every later moment of the profile run (the other layers'
    attention, the sampler), not this layer's alone."""
    from ..dims import config_int

    hidden = experts.dispatch.hidden
    k = experts.dispatch.top_k
    routed = config_int(text, "n_routed_experts", "num_local_experts", "num_experts") or 0
    padded = t * k + routed * (MOE_ALIGN_BLOCK - 1)
    align = 4 * (padded + -(-padded // MOE_ALIGN_BLOCK) + 1)
    moment = (t * 3 * hidden * size + t * routed * size + t * k * (4 + 4) + align,
              f"MoE layer: {t:,} tokens × (3 × hidden {hidden:,} × {size} B (residual, normed input, the MoE output) "
              f"+ router logits {routed:,} × {size} B + top-{k} × (4 B fp32 weight + 4 B int32 id)) + "
              f"moe_align_block_size's ids {align:,} B (({t:,} × {k} + {routed:,} × {MOE_ALIGN_BLOCK - 1}) int32 "
              f"sorted ids, ⌈/ {MOE_ALIGN_BLOCK}⌉ expert ids, at BLOCK_SIZE_M {MOE_ALIGN_BLOCK})")
    held = experts.at(1, t)
    one = t <= experts.chunk
    words = (f"the fused experts' workspace {held:,} B (TritonExperts.workspace_shapes at {t:,} tokens"
             + ("" if one else f" in chunks of VLLM_FUSED_MOE_CHUNK_SIZE {experts.chunk:,}")
             + f" × top-{k}, expert width {experts.width:,} on the rank"
             + (f", gate and up fused {2 * experts.width:,}" if experts.gated else "")
             + ": workspace13 and workspace2" + (" (the output sharing workspace13)" if one else " and the output")
             + ", each rounded up to 256 B in vLLM's WorkspaceManager, held from the first MoE layer on)")
    return moment, held, words


def _activation(text: Any, compute_dtype: str, batched: int, seqs: int, tp: int, *, first: bool = True,
                last: bool = True, encoder: tuple[int, str] | None = None, experts: Any = None) -> Estimate:
    """The profile run's torch peak beyond the weights, estimated: the larger of one decoder layer's live tensors at
    max_num_batched_tokens tokens (vLLM's fused kernels: the residual and the normed input, then the MLP's gate_up
    and activation outputs, or the attention's qkv and output, or a MoE layer's tensors beside its fused experts:
    `_moe_moment`) and the sampler's tensors over max_num_seqs requests (the hidden states, the logits in the
    compute dtype, their fp32 copy, the probabilities and the exponential noise the random sampler divides by).
    Under pipeline parallelism only the last stage runs the sampler, and every stage after the first holds the
    intermediate tensors it receives (hidden states and residual, max_num_batched_tokens × hidden each) through the
    run. An encoder-decoder (Whisper) adds the encoder's moment on one item of the encoder length (vLLM sets the
    encoder budget to it), its output kept for the decoder's cross-attention; its MLP is not gated (fc1, its
    activation). On a stage holding routed experts (`experts`: serving_experts.FusedExpertsWorkspace at the rank's
    width, None on a stage without them) the fused experts' workspace, kept by vLLM's WorkspaceManager once the
    first MoE layer asks for it, is added to whichever moment is the largest."""
    from ..dims import config_int, dim
    from ..dtypes import itemsize

    size = itemsize(compute_dtype)
    t = batched
    hidden = dim(text, "hidden") or 0
    heads = dim(text, "heads") or 1
    kv_heads = dim(text, "kv_heads") or heads
    head_dim = config_int(text, "head_dim") or (hidden // heads if heads else 0)
    qk = (config_int(text, "qk_nope_head_dim") or 0) + (config_int(text, "qk_rope_head_dim") or 0)
    if qk:  # MLA: q, the latent with its rope key, and the per-head K and V it expands to
        v_dim = config_int(text, "v_head_dim") or qk
        attention_width = (-(-heads // tp)) * (2 * qk + 2 * v_dim) + (config_int(text, "kv_lora_rank") or 0) + \
            (config_int(text, "qk_rope_head_dim") or 0)
    else:
        attention_width = (-(-heads // tp)) * 2 * head_dim + 2 * (-(-kv_heads // tp)) * head_dim
    inner = -(-(dim(text, "intermediate") or 4 * hidden) // tp)
    widths = 2 if encoder is not None else 3  # gate_up and its activation (gated), or fc1 and its activation
    moments = [(t * (2 * hidden + attention_width) * size,
                f"attention: {t:,} tokens × (2 × hidden {hidden:,} + q, k, v and output {attention_width:,}) × "
                f"{size} B"),
               (t * (2 * hidden + widths * inner) * size,
                f"MLP: {t:,} tokens × (2 × hidden {hidden:,} + {widths} × intermediate {inner:,}) × {size} B")]
    if encoder is not None:
        length = encoder[0]
        ffn = -(-(config_int(text, "encoder_ffn_dim") or 4 * hidden) // tp)
        moments.append((length * (3 * hidden + 2 * ffn) * size,
                        f"encoder: 1 item × {length:,} tokens × (3 × hidden {hidden:,} + 2 × encoder ffn "
                        f"{ffn:,}) × {size} B"))
    held, held_words = 0, ""
    if experts is not None:
        moe, held, held_words = _moe_moment(text, experts, t, size)
        moments.append(moe)
    vocab = config_int(text, "vocab_size") or 0
    requests = min(seqs, batched)
    if last:
        moments.append((t * hidden * size + requests * vocab * (size + 12),
                        f"sampler: hidden {t:,} × {hidden:,} × {size} B + {requests:,} requests × vocab "
                        f"{vocab:,} × ({size} + 3 × 4) B"))
    value, words = max(moments, key=lambda m: m[0])
    if not first:
        received = 2 * t * hidden * size
        value, words = value + received, (f"{words} + intermediate tensors received: 2 × {t:,} tokens × hidden "
                                          f"{hidden:,} × {size} B")
    if held:
        value, words = value + held, f"{words} + {held_words}"
    return Estimate(value, words,
                    "vLLM measures torch's peak allocation over its profile run (gpu_model_runner.profile_run: a "
                    f"dummy forward of max_num_batched_tokens = {batched:,} tokens, then the sampler over "
                    f"{requests:,} requests on the last pipeline stage; mem_utils.memory_profiling, "
                    "torch_peak_increase); estimated here as the largest of these moments"
                    + ("; beside each, vLLM's fused experts' workspace: FusedMoEModularKernel (modular_kernel.py "
                       "_chunk_info, _allocate_buffers) asks vLLM's WorkspaceManager (v1/worker/workspace.py) for "
                       "TritonExperts' caches (fused_moe.py workspace_shapes) in one request, and the manager keeps "
                       "one buffer grown to the largest request, held through the rest of the run; the convention: "
                       "TritonExperts, vLLM's kernel for unquantised experts (DeepGEMM, CUTLASS or FlashInfer "
                       "experts, as an fp8 checkpoint may run, size their own)" if held else ""))


def _serving_inputs(report: Any, view: Any, estimate: Any) -> Any:
    """What parallel/serving.serving_layout needs to give a GPU's weights at another tensor-parallel degree, from
    the one-device answer (its storage format and the tensors it quantised)."""
    from ..dims import config_int, text_config
    from ..dtypes import itemsize
    from ..parallel.serving import ServingInputs
    from .weights import input_first_weights

    fmt = estimate.weights.format
    quantized = frozenset(estimate.weights.quantized_tensors)
    fp32 = view.kept_in_fp32(fmt.compute_dtype, [p.name for p in report.params] + [b.name for b in report.buffers])
    inputs_first = input_first_weights(view, quantized)
    shape = dict(dtype_size=itemsize(fmt.compute_dtype), vocab=config_int(text_config(view.config), "vocab_size"),
                 layers=report.num_layers or 1, gated=True, every_token_logits=False, class_name=view.class_name)
    return ServingInputs(report, view, fmt, quantized, fp32, inputs_first, None, estimate.settings["kv_dtype"],
                         None, shape)


def _weights_at(inputs: Any, one_device: Any, pp: int = 1, split: tuple[int, ...] | None = None) -> Any:
    """tp → each pipeline stage's GPU (weights and buffers, whether it holds routed experts), in stage order: the
    one-device answer's at tp 1 without pp, else rank 0's shards as parallel/serving.py places them (at `split`,
    vLLM's partition, under pp); raises ParamscopeError where the rules refuse the degree."""
    from ..parallel.serving import serving_layout

    memo: dict[int, list[tuple[int, bool]]] = {
        1: [(one_device.bytes + one_device.buffer_bytes, bool(one_device.by_role.get("moe.experts")))]} \
        if pp == 1 else {}

    def at(tp: int) -> list[tuple[int, bool]]:
        if tp not in memo:
            layout = serving_layout(inputs, tp, pp, 1, 1, split)[0]
            memo[tp] = [(stage.weight_bytes, bool(stage.weights.by_role.get("moe.experts")))
                        for stage in layout.stages]
        return memo[tp]
    return at


def _smallest_tp(text: Any, try_at: Any, tp: int) -> tuple[int | None, tuple[TensorParallelTry, ...]]:
    """The smallest tensor-parallel degree above `tp` at which one sequence of the asked length fits every worker
    (`try_at(t)` → (weights, available, fits, why) of the tightest worker), trying the degrees that divide the
    attention heads (as vLLM requires), up to 64."""
    from ...errors import ParamscopeError
    from ..dims import dim

    heads = dim(text, "heads") or 0
    tried = []
    for t in range(tp + 1, 65):
        if not heads or heads % t:
            continue
        try:
            weights, available, fits, why = try_at(t)
        except ParamscopeError as error:
            tried.append(TensorParallelTry(t, None, None, False, str(error)))
            continue
        tried.append(TensorParallelTry(t, weights, available, fits, why))
        if fits:
            return t, tuple(tried)
    return None, tuple(tried)


def _command(model_id: str, options: VllmOptions, tp: int, length: int, seqs: int, fits: bool, largest: int,
             smallest: int | None, batched: int | None, kv_flag: str | None, dtype_flag: str | None,
             model_max: int | None, pp: int = 1) -> tuple[str, str]:
    """The `vllm serve` line that fits (the asked settings where they fit; else the largest --max-model-len, or the
    smallest --tensor-parallel-size at the asked length), and what it changed."""
    use_tp, use_len, changes = tp, length, ""
    if not fits:
        wider = f"; or --tensor-parallel-size {smallest} at {length:,}" if smallest is not None else ""
        if largest > 0:
            use_len, changes = largest, f"--max-model-len {length:,} → {largest:,}, the largest that fits{wider}"
        elif smallest is not None:
            use_tp, changes = smallest, f"--tensor-parallel-size {tp} → {smallest} (at --max-model-len {length:,})"
        else:
            return "", "nothing fits: the weights and the reserve leave no KV cache at any tensor-parallel degree tried"
    parts = ([f"VLLM_PP_LAYER_PARTITION={','.join(map(str, options.pp_layer_partition))}"]
             if options.pp_layer_partition is not None and pp > 1 else []) + [f"vllm serve {model_id or 'MODEL'}"]
    if use_tp > 1:
        parts.append(f"--tensor-parallel-size {use_tp}")
    if pp > 1:
        parts.append(f"--pipeline-parallel-size {pp}")
    if dtype_flag:
        parts.append(dtype_flag)
    parts.append(f"--gpu-memory-utilization {options.gpu_memory_utilization:g}")
    if options.max_model_len is not None or use_len != model_max:
        parts.append(f"--max-model-len {use_len}")
    if kv_flag:
        parts.append(kv_flag)
    if options.block_size != DEFAULT_BLOCK_SIZE:
        parts.append(f"--block-size {options.block_size}")
    if options.max_num_seqs is not None:
        parts.append(f"--max-num-seqs {seqs}")
    if batched is not None:
        parts.append(f"--max-num-batched-tokens {batched}")
    return " ".join(parts), changes


__all__ = ["VllmOptions", "VllmPreflight", "VllmStage", "cache_dtype_flag", "refuse_unserved_encoder_decoder",
           "serve_defaults", "vllm_blocks", "vllm_dtype", "vllm_grouping", "vllm_layer_kinds", "vllm_mamba_state",
           "vllm_pages", "vllm_pp_partition", "vllm_preflight"]
