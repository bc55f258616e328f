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
"""

from __future__ import annotations

import dataclasses
import re
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
            "expert parallel: the all-to-all (or all-gather and reduce-scatter) buffers that move tokens to their "
            "experts' ranks are not counted; the prefill workspace is the tensor-parallel formula's")


def flattened_words(tp: int, dp: int) -> str:
    """The routed experts' rule under data parallelism without expert parallelism (vLLM's flatten_tp_across_dp)."""
    return (f"gate and up column-parallel, down row-parallel over tp × dp = {tp * dp} ranks (vLLM's MoE layers "
            "flatten TP across DP without expert parallelism)")


__all__ = ["expert_parallel", "expert_ranges", "experts_of", "flattened_words", "notes", "rule_words"]
