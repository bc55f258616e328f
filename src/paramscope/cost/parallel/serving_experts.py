"""Expert parallelism when serving (`memory MODEL --tp T --ep`): vLLM's `--enable-expert-parallel`.

vLLM (model_executor/layers/fused_moe: FusedMoEParallelConfig.make, determine_expert_map): with expert parallelism
the MoE layers' EP group is the tp × dp ranks (EP size = TP × DP: `--tp T --dp D --ep`, the ranks flattened as
ep_rank = dp_rank × T + tp_rank, so EP rank 0 is replica 0's tp rank 0) and the experts are not cut within (the MoE's
own tensor-parallel size becomes 1, so no expert width need divide T): each rank holds whole experts, ⌊E / ep⌋ of
them, the first E mod ep ranks one more ("linear" placement: rank r holds a contiguous run; determine_expert_map
asserts nothing of E against ep, so where E < ep the ranks past E hold none). Attention, shared experts, embeddings
and the head stay tensor parallel within each replica (their layers are vLLM's ordinary parallel linears); the
router is replicated. So on rank 0 (which holds the most experts where the split is uneven):

    packed experts [E, …] (transformers' fused tensors, a bias [E, out] included) → [n0, …], every other dim whole
    per-expert modules (experts.<i>.…)                                         → the rank's own, whole; the rest 0

Under data parallelism (`--dp D`, with or without --ep) each MoE layer runs every replica's tokens. vLLM's default
all2all backend (ParallelConfig.all2all_backend = "allgather_reducescatter"; without --ep vLLM falls back to the same
"AllGather+ReduceScatter dispatch/combine", all2all_utils.maybe_make_prepare_finalize) prepares each MoE layer with
MoEPrepareAndFinalizeNaiveDPEPModular.prepare, whose AgRsAll2AllManager.dispatch all_gatherv's, over the DP group,
three tensors of each replica's tokens (hidden states in the compute dtype, fused_topk's top-k weights in fp32 and
ids in int32); they live from the dispatch to the combine's reduce-scatter, through the experts (GatheredDispatch).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from ...errors import OptionError

_EXPERT_INDEX = re.compile(r"(?:^|\.)experts\.(\d+)\.")


def expert_ranges(experts: int, ep: int) -> tuple[tuple[int, int], ...]:
    """Each rank's experts as [start, stop), vLLM's linear placement: ⌊E / ep⌋ each, the first E mod ep one more."""
    base, extra = divmod(experts, ep)
    ranges, start = [], 0
    for rank in range(ep):
        count = base + (1 if rank < extra else 0)
        ranges.append((start, start + count))
        start += count
    return tuple(ranges)


def experts_of(placements: Any) -> int:
    """The routed experts a layer holds (E), from the packed tensors' first dimension or the per-expert modules'
    indices; 0 where the model has none."""
    packed = {p.shape[0] for p in placements if p.role == "moe.experts" and not _EXPERT_INDEX.search(p.name)
              and len(p.shape) >= 2}
    indices = {int(m.group(1)) for p in placements if p.role == "moe.experts"
               for m in [_EXPERT_INDEX.search(p.name)] if m}
    counts = packed | ({max(indices) + 1} if indices else set())
    if len(counts) > 1:
        raise OptionError("{0}: the routed experts' tensors disagree on the number of experts ({counts})", "ep",
                          counts=", ".join(map(str, sorted(counts))))
    return counts.pop() if counts else 0


def expert_parallel(placements: Any, ep: int, model: str) -> tuple[Any, int, tuple[int, int]]:
    """(rank 0's placements with the routed experts split whole over `ep` ranks, E, rank 0's [start, stop))."""
    experts = experts_of(placements)
    if experts == 0:
        raise OptionError("{0} splits routed experts over the ranks, and {model} has none", "ep", model=model)
    start, stop = expert_ranges(experts, ep)[0]
    placed = []
    for p in placements:
        if p.role != "moe.experts":
            placed.append(p)
            continue
        match = _EXPERT_INDEX.search(p.name)
        if match:  # a per-expert module's tensor: on rank 0 whole, or not at all
            held = start <= int(match.group(1)) < stop
            local = tuple(p.shape) if held else tuple(0 for _ in p.shape)
        else:
            local = (stop - start, *p.shape[1:])
        placed.append(dataclasses.replace(p, local_shape=local, tp="replicated", tp_dim=None, experts_split=True))
    return tuple(placed), experts, (start, stop)


def expert_widths(params: Any, hidden: int) -> frozenset[int]:
    """The routed experts' own widths beside the hidden size, read off their tensors: a projection's other dim where
    one of its last two is `hidden` (packed [E, 2i, h] and [E, h, i], per-expert [i, h] and [h, i], either
    orientation), so the fused gate-up's 2i and the down projection's i."""
    widths = set()
    for p in params:
        if p.role != "moe.experts" or len(p.shape) < 2:
            continue
        out, inputs = p.shape[-2], p.shape[-1]
        if inputs == hidden and out != hidden:
            widths.add(out)
        elif out == hidden:
            widths.add(inputs)
    return frozenset(widths)


def workspace_experts_whole(params: Any, text: Any, ep: int) -> bool:
    """Whether a rank's prefill workspace keeps its MLP width whole: under expert parallelism (each rank holds whole
    experts, vLLM's MoE tensor-parallel size 1) where the config's intermediate size is the routed experts' own
    width (Mixtral, OLMoE: every MLP is routed). A config whose intermediate is another MLP's (Qwen-MoE's dense or
    shared expert, DeepSeek's dense layers: a moe_intermediate_size apart) keeps it / tp: those are cut over tp
    under --ep too."""
    from ..dims import dim

    hidden, inner = dim(text, "hidden"), dim(text, "intermediate")
    return ep > 1 and bool(hidden) and bool(inner) and inner in expert_widths(params, hidden)


def rule_words(experts: int, ep: int) -> str:
    counts = sorted({stop - start for start, stop in expert_ranges(experts, ep)}, reverse=True)
    share = f"{counts[0]} a rank" if len(counts) == 1 else \
        f"{counts[0]} on the first {experts % ep} ranks, {counts[1]} on the rest (rank 0: {counts[0]})"
    return f"expert parallel: whole experts, {experts} / ep {ep} = {share} (vLLM's linear placement)"


def notes(experts: int, ep: int, tp: int, held: tuple[int, int], dp: int = 1) -> tuple[str, ...]:
    ranks = (f"{ep} tensor-parallel ranks" if dp == 1 else
             f"{ep} ranks of the {dp} replicas, ep rank = dp rank × {tp} + tp rank,")
    empty = (f"; {experts} experts over {ep} ranks: ranks {experts}–{ep - 1} hold none (vLLM's determine_expert_map "
             "allows it)" if experts < ep else "")
    return (f"expert parallel (vLLM's --enable-expert-parallel): EP size = TP × DP = {tp} × {dp} = {ep}"
            + (" (one replica, no data parallelism)" if dp == 1 else "")
            + f", so the MoE layers' {experts} routed experts are split whole over the {ranks} with no tensor "
            f"parallelism within an expert (so no expert width need divide the tp degree): rank 0 holds experts "
            f"{held[0]}–{held[1] - 1}{empty}; attention, shared experts, embeddings and the head stay tensor "
            "parallel" + (" within each replica" if dp > 1 else "") + ", routers replicated",
            ("expert parallel: the tokens each rank's experts read are the replicas' gathered ones (the "
             "data-parallel dispatch, counted: see its note)" if dp > 1 else
             "expert parallel with one replica: every tp rank already holds the replica's tokens, so nothing is "
             "dispatched (vLLM's MoE layer runs its own experts on them and all-reduces the outputs over tp)")
            + "; the prefill workspace is the tensor-parallel formula's, with the routed experts' widths whole "
            "where it reads them (vLLM's fused experts run whole experts, their intermediate caches at the "
            "expert's full width)")


def flattened_words(tp: int, dp: int) -> str:
    """The routed experts' rule under data parallelism without expert parallelism (vLLM's flatten_tp_across_dp)."""
    return (f"gate and up column-parallel, down row-parallel over tp × dp = {tp * dp} ranks (vLLM's MoE layers "
            "flatten TP across DP without expert parallelism)")


@dataclass(frozen=True)
class GatheredDispatch:
    """What each GPU holds at a MoE layer under vLLM's data parallelism beside its replica's own tensors: the
    dispatch's all-gathered hidden states [D·B·S, h] in the compute dtype, top-k weights [D·B·S, k] fp32 and top-k
    ids [D·B·S, k] int32 (every replica prefilling B × S tokens at once; each tp rank of a replica gathers its
    replica's whole batch, as models without vLLM's sequence-parallel MoE do)."""

    dp: int
    hidden: int
    top_k: int
    dtype_size: int

    def at(self, batch: int, seq: int) -> int:
        tokens = self.dp * batch * seq
        return tokens * (self.hidden * self.dtype_size + self.top_k * (4 + 4))

    def arithmetic(self, batch: int, seq: int) -> str:
        return (f"{self.dp} replicas × {batch:,} × {seq:,} tokens × (hidden {self.hidden:,} × {self.dtype_size} B"
                f" + top-k {self.top_k} × (4 B fp32 weight + 4 B int32 id))")

    def words(self, batch: int, seq: int) -> str:
        unknown = ("; the config names no top-k (num_experts_per_tok): its weights and ids are not counted"
                   if not self.top_k else "")
        return ("the MoE layers' gathered tokens are in each GPU's peak (vLLM's default all2all backend, "
                "allgather_reducescatter, the same without --ep: AgRsAll2AllManager.dispatch all_gatherv's every "
                "replica's hidden states, fused_topk's fp32 top-k weights and int32 top-k ids over the DP group, "
                "held to the combine's reduce-scatter): "
                f"{self.arithmetic(batch, seq)} = {self.at(batch, seq):,} B at the asked point, on every stage "
                "holding a MoE layer, beside the workspace (whose moment is the MoE layer's: the Llama-style "
                "formula's MLP, Mixtral's fitted experts' moments); the "
                "convention: every replica prefills its batch at once (vLLM's chunked prefill caps a step at "
                "max_num_batched_tokens and holds less); not counted: vLLM's fused experts' own workspaces over the "
                "gathered tokens (the workspace is transformers' formula on the rank's shard, over its replica's "
                "tokens; TritonExperts' caches are M·k·max(2i, h) + M·k·max(i, h) in the compute dtype, M the "
                "gathered tokens up to VLLM_FUSED_MOE_CHUNK_SIZE, 16,384, a chunk, i the expert's width on the "
                "rank: whole under --ep, / (tp × dp) without); a model that takes "
                "vLLM's sequence-parallel MoE (DeepSeek-V2/V3, Qwen3-MoE under --ep with tp > 1) gathers "
                "⌈B·S / tp⌉ a tp rank, and an fp8 w8a8 checkpoint 1-byte activations with their scales: a bound "
                "there" + unknown)


def gathered_dispatch(text: Any, dp: int, dtype_size: int) -> GatheredDispatch | None:
    """The dispatch's gathered tensors under `dp` replicas (None with one replica or without a hidden size)."""
    from ..dims import dim

    hidden = dim(text, "hidden")
    if dp < 2 or not hidden:
        return None
    return GatheredDispatch(dp, hidden, dim(text, "top_k") or 0, dtype_size)


__all__ = ["GatheredDispatch", "expert_parallel", "expert_ranges", "expert_widths", "experts_of", "flattened_words",
           "gathered_dispatch", "notes", "rule_words", "workspace_experts_whole"]
