"""Where --trace can trace a training step under a layout, told before the build (issue 28: a pipeline of Llama
built and answered for 22 s, then "--trace: no rank traced").

device_trace.py traces rank 0's step (pp 1) or each pipeline stage of a class whose stages are replayed from a
derived step; these functions say, from the layout and the config alone, where it cannot, in the words it would
use, so the CLI and TrainingOptions refuse up front. They refuse only what device_trace.py declines whatever the
class (`untraced_by_layout`), and a pipeline's stages only where the class's closed form surely answers them
(`pipeline_trace_reach.untraced_pipeline`): where that is uncertain the build goes ahead and device_trace.py says
what it did."""

from __future__ import annotations

from .layout import ParallelLayout


def untraced_by_layout(layout: ParallelLayout) -> str | None:
    """Why --trace traces no rank under `layout`, for any class, or None (device_trace.traced_check's and
    traced_stages' refusals that read the layout alone)."""
    if layout.trivial:
        return None
    if layout.pp > 1:
        return None  # the stages of a class replayed from its derived step are traced: the class decides
    fsdp = layout.shard in ("fsdp", "hsdp") and layout.shard_degree > 1
    if layout.cp > 1 and fsdp and layout.shard_degree % layout.cp:
        return "context parallelism is traced beside tp, sp and FSDP2 over dp × cp ranks"
    if layout.cp > 1 and layout.ep > 1:  # torchtitan's ep = dp_shard_in_ep × cp (estimate.check_ring_beside_experts)
        if layout.ep % layout.cp or layout.shard == "hsdp" or layout.shard == "fsdp" and layout.tp > 1:
            return ("context parallelism beside ep is traced with ep = dp_shard_in_ep × cp ranks (torchtitan's), "
                    "under DDP's replication (beside tp too) or FSDP2 over dp × cp ranks (without tp)")
    elif layout.ep > 1 and (layout.dp != layout.ep and layout.shard != "fsdp" or
                            layout.shard_degree > 1 and layout.shard != "fsdp"):
        return ("expert parallelism is traced over every data-parallel rank (ep equal to dp) or under FSDP2's full "
                "sharding over dp ranks ep divides (torchtitan's (dp / ep, ep, tp) mesh), beside tensor parallel on "
                "the (ep, tp) mesh, not under DeepSpeed's ZeRO or hybrid sharding")
    if layout.shard in ("zero1", "zero2", "zero3"):
        return "DeepSpeed's ZeRO is not traced (no DeepSpeed here); FSDP2 (zero fsdp) is"
    return None
