"""The layouts one device's training answer refuses, each in one line, before any figure: FSDP2's
MixedPrecisionPolicy outside a mixed precision or its closed form's reach (and the policy's convention, named), an
uneven expert load its derivation does not take, expert parallel beside hybrid sharding over shard groups ep does not
divide, and the context-parallel layouts a derived rank does not answer (alone, and its ring beside ep). estimate.py
asks them; find-layout's evaluation asks check_context_parallel and check_ring_beside_experts too.
"""

from __future__ import annotations

from ...errors import UnsupportedError
from .device import RingQuestion, StepContext
from .device_parts import encoder_refusal, fsdp_sharded, refuse_attention_dropout
from .fsdp_moments import fsdp_moments_missing
from .layout import ParallelLayout, shard_words
from .rules import Placement, cuts_routed_experts


def check_mixed_precision_policy(ctx: StepContext, placements: tuple[Placement, ...]) -> bool:
    """Whether the layout asks FSDP2's MixedPrecisionPolicy (--fsdp-mixed-precision policy), refusing in one line
    where it does not apply: not a mixed precision, or no derivation asked where the policy's closed form
    (fsdp_moments.py: Llama, Mistral and Qwen2; cp without sp or hybrid sharding beside it; not ep) does not reach; elsewhere the rank is derived from
    traces with the policy applied."""
    if ctx.layout.fsdp_mixed_precision != "policy":
        return False
    if not ctx.precision.endswith("-mixed"):
        raise UnsupportedError("{0} policy casts fp32 parameters to 16 bits as FSDP2 gathers them: it needs a mixed "
                               "precision (bf16-mixed, fp16-mixed), got {precision}", "fsdp_mixed_precision",
                               precision=ctx.precision)
    why = "" if ctx.derive else fsdp_moments_missing(ctx, placements)
    if why:
        raise UnsupportedError("{0} policy is answered from the rank's step derived from traces with the policy "
                               "applied; its closed form covers Llama, Mistral and Qwen2 (cp without sp or hybrid sharding "
                               "beside it; not ep), and here "
                               "{why}: leave derive_layout on", "fsdp_mixed_precision", why=why)
    return True


def mixed_precision_words(ctx: StepContext) -> str:
    """The convention a mixed precision under FSDP2 was traced with, named (--fsdp-mixed-precision)."""
    half = ctx.precision.split("-")[0]
    if ctx.layout.fsdp_mixed_precision == "policy":
        default = "the default, as torchtitan's apply_fsdp runs it; " \
            "--fsdp-mixed-precision autocast for torch.autocast over fp32 gathers" \
            if ctx.layout.fsdp_mixed_precision_defaulted else "--fsdp-mixed-precision policy"
        return (f"mixed precision: FSDP2's MixedPrecisionPolicy(param_dtype={half}, reduce_dtype=fp32), torchtitan's "
                f"({default}): the fp32 shards gathered as {half} parameters, no autocast, the "
                f"{half} gradients reduce-scattered in fp32; its closed form (fsdp_moments.py, for Llama, Mistral and "
                f"Qwen2; cp without sp or hybrid sharding beside it; not ep): {half}-pure's step over the fp32 shards, the reduce-scatter input and the "
                "reduced shards in fp32")
    return (f"mixed precision: torch.autocast({half}) over the fp32 parameters FSDP2 gathers in fp32 "
            "(--fsdp-mixed-precision autocast); torchtitan runs FSDP2 with its MixedPrecisionPolicy and no autocast "
            "instead, the default: --fsdp-mixed-precision policy (accelerate's FSDP2 path enters no autocast either)")


def check_hybrid_experts(layout: ParallelLayout, experts: bool) -> None:
    """Expert parallel beside hybrid sharding (HSDP), as torchtitan lays it out: the ep ranks drawn from a shard group
    (ep = dp_shard_in_ep × cp, the shard group's dp_shard × cp ranks; its ParallelDims asserts (dp_shard × cp) % ep
    == 0), the experts' own FSDP2 unit over (dp_replicate, dp_shard_mod_ep), the rest over (dp_replicate,
    dp_shard_cp). One line where ep does not divide the shard group (`experts`: the layout cuts routed experts)."""
    if layout.shard != "hsdp" or layout.ep == 1 or not experts:
        return
    _check_ep_in_shard_group(layout, f"ep {layout.ep} beside")


def _check_ep_in_shard_group(layout: ParallelLayout, head: str) -> None:
    """Under hybrid sharding torchtitan draws the ep ranks from one shard group: one line where ep does not divide
    it, `head` saying what asked (ep beside HSDP, or the ring beside ep under HSDP)."""
    if layout.shard == "hsdp" and layout.shard_degree % layout.ep:
        raise UnsupportedError("{head} hybrid sharding over shard groups of {group} ranks: torchtitan draws the ep "
                               "ranks from a shard group (dp_shard × cp), which ep must divide", head=head,
                               group=layout.shard_degree)


def check_expert_load(ctx: StepContext, placements: tuple[Placement, ...]) -> bool:
    """Whether the layout asks an uneven expert load (--expert-load F > 1 under --ep), refusing in one line what the
    busiest rank's derivation does not take: a class without routed experts, DeepSpeed's ZeRO-3 (not traced), no
    derivation asked. FSDP2 over dp ranks is torchtitan's composition: the experts split over ep ranks (beside tp
    also cut over tp, its ETP = tp), their own FSDP2 unit over the dp / ep ranks holding the same experts (its
    dp_shard_mod_ep), the rest over dp; under hybrid sharding the same within a shard group, replicated over the
    groups (check_hybrid_experts). Beside context parallel the ep ranks are torchtitan's
    dp_shard_in_ep × cp, rank 0 of them the busiest and running its S / cp tokens through torch's ring
    (check_context_parallel refuses what that ring beside ep does not take)."""
    layout = ctx.layout
    if layout.expert_load == 1 or layout.ep == 1:
        return False
    load = f"{layout.expert_load:g}"
    if not cuts_routed_experts(placements):
        raise UnsupportedError("expert load {load}: {cls} has no routed experts for the ep ranks to share",
                               load=load, cls=ctx.view.class_name)
    if layout.shard == "zero3" or not ctx.derive:
        raise UnsupportedError("expert load {load}: the busiest expert-parallel rank is derived from traces with "
                               "expert parallel beside data parallel (ZeRO 0-2, or FSDP2, full or hybrid, over dp "
                               "ranks ep divides), "
                               "tensor parallel, context parallel and pipeline stages; got {layout}", load=load,
                               layout=layout.words())
    return True


def check_context_parallel(ctx: RingQuestion, experts: bool = False) -> None:
    """The context-parallel layouts a derived rank does not answer, each in one line: an encoder, hybrid sharding
    over ranks cp does not divide, cp not dividing S, S that 2·cp does not divide (torch's context_parallel then runs
    unbalanced: not derived), or under sp that 2·cp·tp does not divide, attention dropout, a window shorter than S;
    beside ep where it cuts routed experts (`experts`): what check_ring_beside_experts refuses."""
    from ..dims import config_int

    why = encoder_refusal(ctx) if not getattr(ctx.view, "can_generate", True) else ""
    if why:
        raise UnsupportedError(why)
    cp = ctx.layout.cp
    if fsdp_sharded(ctx.layout) and ctx.layout.shard_degree % cp:
        raise UnsupportedError("context parallel {cp} beside hybrid sharding over {ranks} ranks: torchtitan shards "
                               "over dp_shard × cp ranks, which cp does not divide here", cp=cp,
                               ranks=ctx.layout.shard_degree)
    if experts:
        check_ring_beside_experts(ctx.layout)
    if ctx.seq % cp:
        raise UnsupportedError("context parallelism splits the sequence: cp {cp} does not divide {seq:,}", cp=cp,
                               seq=ctx.seq)
    if ctx.seq % (2 * cp):
        raise UnsupportedError("context parallel {cp} at {seq:,} tokens: torch's context_parallel balances the load "
                               "(two chunks a rank) only where 2·cp divides S, and the rank's step is derived in that "
                               "regime; use a length that 2·cp = {two} divides", cp=cp, seq=ctx.seq, two=2 * cp)
    tp = ctx.layout.tp
    if ctx.layout.sp and ctx.seq % (2 * cp * tp):
        raise UnsupportedError("context parallel {cp} with sequence parallel over tp {tp} at {seq:,} tokens: the tp "
                               "ranks split each of the rank's two chunks again, and the rank's step is derived where "
                               "2·cp·tp = {unit} divides S; use such a length", cp=cp, tp=tp, seq=ctx.seq,
                               unit=2 * cp * tp)
    refuse_attention_dropout(ctx)
    for key in ("sliding_window", "attention_chunk_size"):
        window = config_int(ctx.text, key)
        if window and ctx.seq > window:
            raise UnsupportedError("context parallel at {seq:,} tokens past the {key} {window:,}: torch's ring "
                                   "attention takes no mask, and a window shorter than S needs one", seq=ctx.seq,
                                   key=key, window=window)


def check_ring_beside_experts(layout: ParallelLayout) -> None:
    """The ring beside ep as the trace lays it out (traced/parallel.py, torchtitan's mesh with ETP = tp): the ep ranks
    take every cp rank and some dp ones (ep = dp_shard_in_ep × cp); FSDP2 shards the rest over all dp × cp ranks
    and each rank's experts over the dp × cp / ep ranks holding them (its dp_shard_mod_ep), under hybrid sharding
    within a shard group that ep divides, dp_replicate in front; no ZeRO-3 (not traced), tp (each expert then cut
    over tp too, on the (ep, tp) mesh: torchtitan's ETP) without FSDP2. One line each."""
    cp, ep = layout.cp, layout.ep
    if ep % cp:
        raise UnsupportedError("context parallel {cp} beside ep {ep}: the ep ranks take every cp rank and some dp "
                               "ones (torchtitan's ep = dp_shard_in_ep × cp), so cp must divide ep", cp=cp, ep=ep)
    if layout.tp > 1 and fsdp_sharded(layout):
        raise UnsupportedError("context parallel {cp} beside ep {ep} and tp {tp} under FSDP2: each expert cut over "
                               "tp too (torchtitan's ETP) is traced beside the ring without FSDP2", cp=cp, ep=ep,
                               tp=layout.tp)
    if layout.shard == "zero3":
        raise UnsupportedError("context parallel {cp} beside ep {ep} under {shard}: traced under DDP's replication, "
                               "ZeRO 1-2 and FSDP2's full and hybrid sharding", cp=cp, ep=ep,
                               shard=shard_words(layout))
    _check_ep_in_shard_group(layout, f"context parallel {cp} beside ep {ep} under")
