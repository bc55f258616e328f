"""The words of the fp32 master copies' conventions in a training answer: bf16-master (DeepSpeed's bf16 and ZeRO: the
fp32 gradients its step casts, on one device and on a rank of a layout, and which framework's rule a layout follows)
and bf16-main-grad (Megatron-LM's fp32 main-gradient buffer)."""

from __future__ import annotations

from typing import Any

# what bf16-master counts of DeepSpeed's bf16 step and what it leaves out (DeepSpeed's source, read: runtime/engine.py,
# runtime/zero/stage_1_and_2.py, runtime/zero/stage3.py, runtime/bf16_optimizer.py)
MASTER_CONVENTION = (
    "bf16-master is DeepSpeed's bf16 (its engine casts the module to bf16; DeepSpeedZeroOptimizer keeps "
    "the fp32 partition it updates, single_partition_of_fp32_groups (ZeRO-3's DeepSpeedZeroOptimizer_Stage3: "
    "fp32_partitioned_groups_flat), and the optimizer's states on it); the states "
    "are counted as torch's fused AdamW per tensor (a 4 B step each), where DeepSpeed's flat partition keeps one per "
    "param group; not counted: DeepSpeed's gradient buckets (reduce_bucket_size, 5e8 elements by default), the flat "
    "bf16 gradient partition its step makes before the fp32 cast, the flat buffer's padding to a multiple of 2 × dp "
    "elements, and BF16_Optimizer's full fp32 gradient buffer (DeepSpeed uses it at ZeRO-1 only with data_types."
    "grad_accum_dtype fp32; by default gradients accumulate in bf16)")


def with_master_copy(copy: int, words: str, share: str = "") -> str:
    """The optimizer step's words under bf16-master: the fp32 gradient copy first."""
    return (f"the fp32 gradients cast for the master copy, {copy:,} B{share} (held through the optimizer step; the bf16 "
            f"gradients are freed once cast, as DeepSpeed's step does); {words}")


def master_copy_on_rank(report: Any, view: Any, layout: Any, whole: int, *, optimizer: str,
                        trainable: frozenset[str], own: frozenset[str], words: str) -> tuple[int, str]:
    """(bytes, words) of the fp32 gradients bf16-master's step casts on one rank of `layout`: its master partition's
    (parallel/states.rank_master_copy: its tp shard, ⌈/ d⌉ under ZeRO 1-3); `whole`: one device's copy."""
    from ..parallel.rules import placements_for
    from ..parallel.states import rank_master_copy

    copy = rank_master_copy(report.params, placements_for(report, view, layout), layout, optimizer=optimizer,
                            trainable=trainable, own=own)
    zero, degree = zero_stage_of(layout), layout.shard_degree
    parts = ["the rank's tensor/expert-parallel shard"] * (layout.tp > 1 or layout.ep > 1 or layout.pp > 1) + \
        [f"ZeRO-{zero}'s partition over {degree} ranks"] * (zero > 0 and degree > 1)
    return copy, with_master_copy(copy, words, f" ({', '.join(parts)}; one device's {whole:,})" if parts else "")


# what bf16-main-grad counts of Megatron-LM's bf16 step (its source, read: megatron/core/distributed/
# distributed_data_parallel.py, param_and_grad_buffer.py, megatron/core/optimizer/optimizer.py, distrib_optimizer.py)
MAIN_GRAD_CONVENTION = (
    "bf16-main-grad is Megatron-LM's bf16 training (Megatron-Core's DistributedDataParallel with "
    "accumulate_allreduce_grads_in_fp32, its default under bf16): the module in bf16 (Float16Module: the forward and "
    "backward are bf16-pure's), one contiguous fp32 main-gradient buffer allocated when the model is wrapped and held "
    "at every moment (each bf16 gradient is added into param.main_grad by a hook and freed at once, so no .grad is "
    "held), fp32 masters and Adam moments: 2 + 4 + 12 B a parameter, as theoretical_memory_usage.py counts them "
    "(18 B; 6 + 12/d under --use-distributed-optimizer). The step casts nothing: main_param.grad = "
    "main_grad.float() is the fp32 buffer itself; the optimizer updates the masters, which are copied into the bf16 "
    "weights. Not counted: a hook's bf16 gradient for the moment before it is added and freed (none for the linear "
    "layers under Megatron's gradient-accumulation fusion), and the buffer's alignment padding (each bucket to a "
    "multiple of d, each parameter's start to 64 elements, under the distributed optimizer)")


def master_layout_words(layout: Any) -> str:
    """Which framework's rule bf16-master follows under `layout`, named."""
    zero = zero_stage_of(layout)
    ranks = "data-parallel" if layout.cp == 1 else "dp × cp"
    over = f"ZeRO-{zero} partitioning them over the {layout.shard_degree} {ranks} ranks" \
        if zero and layout.shard_degree > 1 else f"each {ranks} rank holding them whole (no ZeRO partition)"
    if layout.pp > 1 and not zero and layout.dp * layout.cp > 1:  # DeepSpeed's BF16_Optimizer (states.py)
        over = f"no ZeRO, but BF16_Optimizer partitioning them over the {layout.dp * layout.cp} {ranks} ranks"
    words = [f"bf16-master: DeepSpeed's bf16 and ZeRO, the fp32 masters and Adam moments of what the rank holds, {over}"]
    if layout.tp > 1:
        words.append(f"beside tp {layout.tp} Megatron-DeepSpeed's composition: each tp rank holds its shard's bf16 "
                     "weights and gradients and the masters and moments of that shard; the tp itself as torch's "
                     "DTensor runs it (traced beside: MasterCopyOptimizer on the rank's DTensor shards, the "
                     "embedding's gradient whole on every rank as DTensor gives it)")
    if layout.cp > 1:
        words.append(f"beside cp {layout.cp} the ZeRO group takes the cp ranks too (they hold the same weights: "
                     "Megatron's data-parallel group with context parallel, DeepSpeed's sequence-data-parallel group)")
    if layout.pp > 1:
        words.append(f"beside pp {layout.pp} each stage's own parameters' (DeepSpeed's PipelineEngine, ZeRO 0-1); "
                     + ("at ZeRO 0 its optimizer is BF16_Optimizer (engine.py's _do_optimizer_sanity_check: bf16 with "
                        "a pipeline), which partitions the fp32 masters and moments over the data-parallel ranks "
                        "as ZeRO-1 does and keeps a bf16 "
                        "gradient-accumulation buffer of the stage's parameters (2 B a parameter, its default "
                        "grad_accum_dtype, the model's) at every moment beside the bf16 gradients, in the "
                        "gradients column; its step casts the rank's partition of the buffer to fp32"
                        if layout.zero_stage == 0 else
                        "at ZeRO-1 its optimizer is DeepSpeedZeroOptimizer (BF16_Optimizer only with data_types "
                        "grad_accum_dtype fp32, not DeepSpeed's default, which would add an fp32 accumulation buffer "
                        "of the stage's parameters, 4 B a parameter, not counted); the step's fp32 gradients counted "
                        "as the stage's cast of its partition at the step"))
    if layout.ep > 1:
        words.append(f"beside ep {layout.ep} each rank's routed experts' states are its own experts', partitioned over "
                     f"their expert-data-parallel group ({max(1, layout.shard_degree // layout.ep)} of the ranks: "
                     "those holding the same experts), as DeepSpeed-MoE partitions an expert param group")
    return "; ".join(words)


def zero_stage_of(layout: Any) -> int:
    """The ZeRO stage of a data-parallel layout's shard mode (FSDP2's full sharding is stage 3's)."""
    return {"none": 0, "zero1": 1, "zero2": 2}.get(layout.shard, 3)
