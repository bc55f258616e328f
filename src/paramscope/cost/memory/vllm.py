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

Where each part lives: this module puts them together (`vllm_preflight` → `VllmPreflight`, each pipeline stage a
`VllmStage`, the smallest tensor-parallel degree that fits); vllm_options.py holds the settings (`VllmOptions`, the
defaults, the --dtype and --kv-cache-dtype flags, the `vllm serve` line); vllm_layers.py the layers as vLLM reads
them (each layer's KV specs, the encoder-decoders it serves, a Mamba state's shapes, the pipeline partition);
vllm_kv_blocks.py the paged cache (pages, groups, the blocks a request holds, a worker's pool, the largest
max_model_len); vllm_reserve.py the non-KV reserve (each stage's weights, the profile run's peak with the fused
experts' workspace, the allowances).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...errors import OptionError, UnsupportedError
from ..hardware import GiB
from .vllm_kv_blocks import KVGroup, kv_group, largest_length, vllm_blocks, vllm_grouping, vllm_pages, worker_group_size
from .vllm_layers import (encoder_shape, partition_words, refuse_unserved_encoder_decoder, vllm_layer_keys,
                          vllm_layer_kinds, vllm_mamba_state, vllm_pp_partition)
from .vllm_options import (DEFAULT_UTILIZATION, VLLM_DEFAULTS_FROM, VllmOptions, cache_dtype_flag, serve_command,
                           serve_defaults, vllm_dtype)
from .vllm_reserve import (CUDA_GRAPH_ALLOWANCE, NON_TORCH_ALLOWANCE, Estimate, fused_experts_at, profile_activation,
                           serving_inputs, stage_weights, weight_notes)

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
    encoder = encoder_shape(text)
    if pp > 1 and encoder is not None:
        raise UnsupportedError("{0} {pp} with {model_type}: vLLM's encoder-decoder (WhisperForConditionalGeneration) "
                               "does not implement pipeline parallelism (SupportsPP)", "pp", pp=pp,
                               model_type=getattr(text, "model_type", "an encoder-decoder"))
    keys = vllm_layer_keys(view.config)[0]
    split = vllm_pp_partition(len(keys), pp, options.pp_layer_partition) if pp > 1 else (len(keys),)
    if pp > 1:
        notes.append(partition_words(split, options.pp_layer_partition))
    if encoder is not None:
        notes.append(f"encoder-decoder: every request holds its cross-attention blocks for the encoder length "
                     f"{encoder[0]:,} ({encoder[1]}) from its first step, whatever its audio's length; vLLM disables "
                     "chunked prefill and prefix caching for encoder-decoders; the encoder's own attention keeps no "
                     "cache (MMEncoderAttention)")
    inputs = serving_inputs(report, view, estimate)
    weights_at = stage_weights(inputs, estimate.weights, pp, split if pp > 1 else None)
    fused_at = fused_experts_at(report.params, text, compute_dtype)
    if any(moe for _, moe in weights_at(tp)) and fused_at(tp) is None:  # said, not dropped in silence
        notes.append("not counted: a MoE layer's moment and vLLM's fused experts' workspace (the routed experts' "
                     "width could not be read off their tensors, packed or quantised, or the config names no top-k)")
    notes.extend(weight_notes(text, compute_dtype))
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
    groups = tuple(kv_group(kind, window, layers, count, per_layer, arithmetic, page, block, length, mamba,
                            batched) for kind, window, layers, count in kinds)

    def request_blocks(n: int) -> int:
        return sum(g.groups * vllm_blocks(g.kind, g.window if g.encoder_tokens is None else g.encoder_tokens,
                                          block, n, batched) for g in groups)

    per_request = request_blocks(length)
    search_to = model_max or length
    starts = [sum(split[:r]) for r in range(len(split))]
    stage_pools = [group_size if pp == 1 else worker_group_size(keys, group_size, starts[r], starts[r] + n)
                   for r, n in enumerate(split)]

    def stages_at(t: int, t_page: int, t_request: int, search: bool) -> list[VllmStage]:
        """Each pipeline stage's worker (rank 0 of its tensor-parallel group) at tensor-parallel degree t."""
        out = []
        for r, ((weights, moe), n) in enumerate(zip(weights_at(t), split)):
            activation = profile_activation(text, compute_dtype, batched, seqs, t, first=r == 0,
                                            last=r == len(split) - 1, encoder=encoder,
                                            experts=fused_at(t) if moe else None)
            available = requested - weights - activation.bytes - non_torch.bytes - graphs.bytes
            per_block = t_page * stage_pools[r]
            blocks = max(available // per_block, 0) if per_block else 0
            largest = largest_length(lambda m: request_blocks(m) * per_block <= available, search_to) \
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
    command, changes = serve_command(model_id, options, tp, length, seqs, fits, largest, smallest,
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


__all__ = ["CUDA_GRAPH_ALLOWANCE", "DEFAULT_UTILIZATION", "NON_TORCH_ALLOWANCE", "VllmOptions", "VllmPreflight",
           "VllmStage", "cache_dtype_flag", "refuse_unserved_encoder_decoder", "serve_defaults", "vllm_blocks",
           "vllm_dtype", "vllm_grouping", "vllm_layer_kinds", "vllm_mamba_state", "vllm_pages", "vllm_pp_partition",
           "vllm_preflight"]
