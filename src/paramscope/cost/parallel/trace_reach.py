"""Where --trace can trace a training step under a layout, told before the build (issue 28: a pipeline of Llama
built and answered for 22 s, then "--trace: no rank traced").

device_trace.py traces rank 0's step (pp 1) or each pipeline stage of a class whose stages are replayed from a
derived step; these functions say, from the layout and the config alone, where it cannot, in the words it would
use, so the CLI and TrainingOptions refuse up front. They refuse only what device_trace.py declines whatever the
class (`untraced_by_layout`), and a pipeline's stages only where the class's closed form surely answers them
(`pipeline_trace_reach.untraced_pipeline`): where that is uncertain the build goes ahead and device_trace.py says
what it did."""

from __future__ import annotations

from ..memory.states import MAIN_GRAD_PRECISION
from .layout import ParallelLayout


def untraced_by_layout(layout: ParallelLayout, precision: str | None = None) -> str | None:
    """Why --trace traces no rank under `layout`, for any class, or None (device_trace.traced_check's and
    traced_stages' refusals that read the layout alone). `precision` names whose ZeRO-1 it is: under bf16-main-grad,
    Megatron-LM's distributed optimizer (megatron/core/optimizer/distrib_optimizer.py, DistributedOptimizer), not
    DeepSpeed's."""
    if layout.trivial:
        return None
    fsdp = layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1
    if layout.pp > 1 and fsdp and layout.fsdp_mixed_precision == "policy":
        return ("FSDP2's MixedPrecisionPolicy beside pipeline stages is not traced (a stage's trace runs no "
                "fully_shard; its stages replay the policy's traced FSDP2 rank)")
    if layout.pp > 1:
        return None  # the stages of a class replayed from its derived step are traced: the class decides
    if layout.cp > 1 and fsdp and layout.shard_degree % layout.cp:
        return "context parallelism is traced beside tp, sp and FSDP2 over dp × cp ranks"
    if layout.cp > 1 and layout.ep > 1:  # torchtitan's ep = dp_shard_in_ep × cp (estimate.check_ring_beside_experts)
        if layout.ep % layout.cp or fsdp and (layout.tp > 1 or layout.shard_degree % layout.ep) or \
                layout.shard == "hsdp" and not fsdp:
            return ("context parallelism beside ep is traced with ep = dp_shard_in_ep × cp ranks (torchtitan's), "
                    "under DDP's replication (beside tp too) or FSDP2 over dp × cp ranks, full or hybrid within a "
                    "shard group ep divides (without tp)")
    elif layout.ep > 1 and (layout.shard_degree % layout.ep if fsdp else
                            layout.dp != layout.ep or layout.shard_degree > 1):
        return ("expert parallelism is traced over every data-parallel rank (ep equal to dp) or under FSDP2 over dp "
                "ranks ep divides (torchtitan's (dp / ep, ep, tp) mesh; hybrid sharding within a shard group ep "
                "divides, dp_replicate in front), beside tensor parallel on the (ep, tp) mesh, not under DeepSpeed's "
                "ZeRO")
    if layout.shard in ("zero1", "zero2", "zero3") and precision == MAIN_GRAD_PRECISION:
        return ("Megatron-LM's distributed optimizer (bf16-main-grad's zero 1) is not traced (no Megatron here; its "
                "rank is the closed form's: the fp32 masters and moments over the data-parallel ranks, the bf16 "
                "weights and the fp32 main-gradient buffer whole); plain DDP (zero 0) is")
    if layout.shard in ("zero1", "zero2", "zero3"):
        return "DeepSpeed's ZeRO is not traced (no DeepSpeed here); FSDP2 (zero fsdp) is"
    return None


def hybrid_replicas(layout: ParallelLayout, experts: bool) -> int:
    """The shard groups hybrid sharding replicates (torchtitan's dp_replicate) where --trace lays them out: beside ep
    cutting routed experts (`experts`), whose own FSDP2 unit goes on (dp_replicate, dp_shard_mod_ep); 1 elsewhere,
    where HSDP's rank is traced as FSDP2 over its shard group. The derived rank is FSDP2's over the group in both
    (the same bytes on a Mixtral cut, with and without ep: tests/test_expert_hybrid_shard.py)."""
    if layout.shard != "hsdp" or layout.ep == 1 or not experts or layout.shard_degree == 1:
        return 1
    return layout.dp * layout.cp // layout.shard_degree


# where the Llama closed form's stages are held to their traces, so --trace traces them beside it
CLOSED_FORM_TRACED = ("1F1B with more microbatches than stages, without tensor, context or expert parallelism, FSDP "
                      "sharding, interleaving or checkpointing: every stage before the last peaks in its steady state")


def closed_form_traced(layout: ParallelLayout, *, checkpointing: bool) -> str | None:
    """Why the Llama closed form's stages under `layout` are not held to their traces (its figures there are named
    estimates), or None where they are: 1F1B with more microbatches than stages (every stage before the last in its
    steady state, pipeline_device.mlp_backward_working), one rank a stage (no tp, cp, ep or FSDP sharding), no
    virtual stages, no checkpointing."""
    if layout.schedule != "1f1b" or layout.virtual_stages > 1 or layout.micro_batches <= layout.pp:
        return "outside 1F1B with more microbatches than stages"
    if layout.tp > 1 or layout.cp > 1 or layout.ep > 1 or layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1:
        return "beside tensor, context or expert parallelism or FSDP sharding"
    if checkpointing:
        return "with gradient checkpointing"
    return None
