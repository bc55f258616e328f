"""The non-KV reserve vLLM subtracts before sizing its KV cache, estimated (`Estimate`: each with what vLLM measures
instead): each pipeline stage's weights at a tensor-parallel degree, the profile run's activation peak (a MoE
layer's moment and the fused experts' workspace vLLM's WorkspaceManager keeps beside it), the non-torch and
CUDA-graph allowances, and what vLLM's loaded model holds beyond the weights counted (notes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MiB = 2**20
# memory outside torch's allocator that grows between vLLM's first snapshot (taken after NCCL's initialisation) and
# the end of the profile run: CUDA kernels' modules loaded on first use, library handles. An allowance, not a
# measurement: vLLM logs its own as "non-torch forward increase memory".
NON_TORCH_ALLOWANCE = 256 * MiB
# the CUDA graphs' memory: vLLM (v0.21.0 on) measures it by a dry capture before sizing the KV cache and subtracts
# it, logging "Estimated CUDA graph memory: … GiB total". Its figure depends on the kernels a capture allocates on
# the GPU, not on the config alone, so here it is an allowance, not a model of vLLM's measurement.
CUDA_GRAPH_ALLOWANCE = 512 * MiB
# moe_align_block_size pads each expert's tokens to BLOCK_SIZE_M of the fused kernel's config: 64 in fused_moe.py's
# get_default_config for more tokens than experts (a config tuned for the GPU may take another; its ids are
# kilobytes beside the caches)
MOE_ALIGN_BLOCK = 64


@dataclass(frozen=True)
class Estimate:
    """A part of the non-KV reserve that vLLM measures and paramscope estimates."""

    bytes: int
    arithmetic: str
    source: str  # what vLLM measures, and where


def fused_experts_at(params: Any, text: Any, compute_dtype: str) -> Any:
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


def profile_activation(text: Any, compute_dtype: str, batched: int, seqs: int, tp: int, *, first: bool = True,
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


def weight_notes(text: Any, compute_dtype: str) -> list[str]:
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


def serving_inputs(report: Any, view: Any, estimate: Any) -> Any:
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


def stage_weights(inputs: Any, one_device: Any, pp: int = 1, split: tuple[int, ...] | None = None) -> Any:
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
