"""Expert parallelism for transformers' packed MoE experts, as torchtitan's ExpertParallel does it, for a traced rank.

torchtitan (torchtitan/distributed/expert_parallel.py, ExpertParallel) shards a layer's grouped experts with DTensor
Shard(0) over the ep ranks (each rank holds E/ep whole experts) and moves tokens, not weights: the token-expert pairs,
sorted by expert, go to the rank that holds their expert by one all-to-all (all_to_all_single_autograd), are put in
expert-major order there (its _permute), run through the local experts, put back (_unpermute) and return by a second
all-to-all; the routing scores weight them back on the rank the tokens came from.

transformers 5 keeps a layer's experts in one module ([E, 2I, h] gate_up_proj, [E, h, I] down_proj) whose grouped
forward (transformers.integrations.moe.grouped_mm_experts_forward) sorts the token-expert pairs by expert, runs the
grouped projections over all E experts, weights the outputs and sums them back per token. ExpertsParallel here
keeps that forward step for step and puts torchtitan's dispatch between the sort and the grouped projections and its
combine between the down projection and the weighting, so a rank's step differs from one device's by exactly what
expert parallelism adds: the two all-to-alls' outputs and the permute and unpermute copies, each S × h, and the
experts' shards in place of the whole experts.

Routing convention (how many pairs a rank receives depends on the router; a fake tensor has no values): balanced
routing. Each rank's S = B·T·k token-expert pairs (B·T tokens a rank, top-k) spread evenly over the E experts, so a
rank sends S/ep pairs to every rank (itself included) and receives S/ep from each: S pairs in all, ep·S/E for each of
its E/ep experts, the same S rows as one device's grouped projections run over. Where ep does not divide S the first
S mod ep ranks take one pair more (the splits still sum to S on every rank).

An uneven load (`load` F > 1, memory's --expert-load): rank 0 is the busiest. It receives ⌈F·S⌉ pairs (capped at
ep·S, every pair of every rank; F ≤ ep), each rank sending it an even share of them (`splits(⌈F·S⌉, ep)`, the first
ranks one more where ep does not divide it); each rank spreads the rest of its S pairs evenly over the other ep - 1
ranks, which so receive (ep·S - ⌈F·S⌉) / (ep - 1) each, fewer than S: not the peak. The traced rank is rank 0, so it
holds what the busiest rank holds: ⌈F·S⌉ rows through its E/ep experts' grouped projections, the permute index and
the all-to-alls' arrivals over them. A load of 1 is the balanced routing above, unchanged.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from ...errors import OptionError, UnsupportedError

ROUTING = ("balanced routing: each rank's B·T·k token-expert pairs spread evenly over the experts, so each rank "
           "sends S/ep of them to every expert-parallel rank and receives as many (S = B·T·k), ep·S/E for each of "
           "its E/ep experts")
LOADED = ("an uneven load: the busiest rank (rank 0, the one traced) receives {load:g} × its balanced share, ⌈{load:g}·S⌉ "
          "token-expert pairs (S = B·T·k), every rank sending it an even part of them; each rank spreads the rest of "
          "its S pairs evenly over the other ep - 1 ranks, which receive fewer than S (not the peak)")


def check_experts(module: Any, name: str, ep: int) -> None:
    """One line for an experts module this style does not cut: not transformers' packed [E, 2I, h] / [E, h, I] pair,
    or an expert count ep does not divide."""
    params = dict(module.named_parameters(recurse=False))
    if set(params) != {"gate_up_proj", "down_proj"} or getattr(module, "is_transposed", False) \
            or getattr(module, "has_bias", False) or not getattr(module, "has_gate", True):
        raise UnsupportedError(f"expert parallel over {name}: its experts hold {', '.join(sorted(params))}; the "
                               "traced expert-parallel style takes transformers' packed gate_up_proj [E, 2I, h] and "
                               "down_proj [E, h, I]")
    experts = params["gate_up_proj"].shape[0]
    if experts % ep:
        raise OptionError("ep {ep} does not divide the {experts} routed experts of {name}", ep=ep, experts=experts,
                          name=name)


def splits(pairs: int, ep: int) -> list[int]:
    """The balanced all-to-all splits of a rank's `pairs` token-expert pairs over `ep` ranks (see the docstring)."""
    return [pairs // ep + (1 if r < pairs % ep else 0) for r in range(ep)]


def busiest_pairs(pairs: int, ep: int, load: float) -> int:
    """The pairs the busiest rank receives: ⌈F·S⌉ of its balanced S, capped at every rank's, ep·S (F read as the
    decimal it was written as, so 1.1 × 10 is 11, not 12)."""
    return min(ep * pairs, math.ceil(Fraction(str(load)) * pairs))


def routes(pairs: int, ep: int, load: float, rank: int) -> tuple[list[int], list[int]]:
    """(what `rank` sends to each rank, what it receives from each): balanced where `load` is 1 (`splits`, sent and
    received alike); else rank 0 the busiest (see the docstring), every rank holding `pairs` of its own."""
    if load == 1:
        even = splits(pairs, ep)
        return even, even
    to_busiest = splits(busiest_pairs(pairs, ep, load), ep)  # what each rank sends to rank 0

    def row(source: int) -> list[int]:
        return [to_busiest[source]] + splits(pairs - to_busiest[source], ep - 1)
    return row(rank), [row(source)[rank] for source in range(ep)]


def expert_parallel_style(load: float = 1) -> Any:
    """An ExpertsParallel (built lazily: torch.distributed is imported only when a trace runs); `load`: the busiest
    rank's share of the token-expert pairs over its balanced one (1: balanced routing)."""
    return _make_style_class()(load)


def _make_style_class() -> type:
    import types

    import torch
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ParallelStyle
    from transformers.integrations.moe import _grouped_linear

    class ExpertsParallel(ParallelStyle):
        """torchtitan's ExpertParallel on a transformers packed-experts module (see the module's docstring)."""

        def __init__(self, load: float = 1) -> None:
            super().__init__()
            self.load = load

        def _apply(self, module: Any, device_mesh: Any) -> Any:
            for key in ("gate_up_proj", "down_proj"):
                param = getattr(module, key)
                value = _beside_tensor_parallel(param, device_mesh) if isinstance(param, DTensor) else \
                    distribute_tensor(param.detach(), device_mesh, [Shard(0)], src_data_rank=self.src_data_rank)
                module.register_parameter(key, torch.nn.Parameter(value, requires_grad=param.requires_grad))
            module.forward = types.MethodType(
                lambda mod, hidden, index, weights: _forward(mod, hidden, index, weights, device_mesh, self.load), module)
            return module

    def _beside_tensor_parallel(param: Any, ep_mesh: Any) -> Any:
        # already cut over tp (moe_parallel's PackedExpertsParallel, on the tp submesh): the rank's E/ep experts of
        # its tp shard, on the (ep, tp) mesh as torchtitan's ExpertTensorParallel places them ([Shard(0), tp's]);
        # its forward hooks still give the experts their local shards and reduce their partial sums over tp
        local = param.to_local().detach()
        count = local.shape[0] // ep_mesh.size()
        mine = local.narrow(0, ep_mesh.get_local_rank() * count, count).clone()  # its own storage, not a view
        # the (ep, tp) mesh sliced from the root by name (the ep dimension may be a flattened one: dp × cp beside
        # context parallel, torchtitan's dp_shard_in_ep × cp)
        mesh = ep_mesh._get_root_mesh()[(*ep_mesh.mesh_dim_names, *param.device_mesh.mesh_dim_names)]
        return DTensor.from_local(mine, mesh, [Shard(0), *param.placements], run_check=False)

    def _local(param: Any) -> Any:
        return param.to_local() if isinstance(param, DTensor) else param

    def _forward(module: Any, hidden: Any, top_k_index: Any, top_k_weights: Any, mesh: Any, load: float) -> Any:
        # grouped_mm_experts_forward, step for step, with torchtitan's dispatch and combine where marked
        ep = mesh.size()
        group = mesh.get_group()
        tokens, top_k = top_k_index.shape
        hidden_dim = hidden.size(-1)
        sample_weights = top_k_weights.reshape(-1)
        _, perm = torch.sort(top_k_index.reshape(-1))
        selected = hidden[perm // top_k]
        sample_weights_g = sample_weights[perm]
        # dispatch (torchtitan's _token_dispatch): the sorted pairs to the ranks holding their experts
        sent, arriving = routes(selected.size(0), ep, load, mesh.get_local_rank())
        received = all_to_all_single_autograd(selected, arriving, sent, group)
        # torchtitan's _permute: the arrivals, rank by rank and each rank's sorted by expert, into expert-major
        # order (each rank's block of n alike, balanced or not: row q of it is for local expert q·(E/ep) // n)
        local_experts = _local(module.gate_up_proj).shape[0]
        with torch.no_grad():
            block = max(1, arriving[0])
            rows = torch.arange(received.size(0), device=received.device)
            permuted = torch.argsort((rows % block) * local_experts // block, stable=True)
            per_expert = torch.full((local_experts,), float(received.size(0) // local_experts),
                                    device=received.device)  # as transformers' histc gives them (float)
            offsets = torch.cumsum(per_expert, dim=0, dtype=torch.int32)
        routed = received[permuted]
        proj = _grouped_linear(routed, _local(module.gate_up_proj), offsets)
        proj = module._apply_gate(proj)
        proj = _grouped_linear(proj, _local(module.down_proj), offsets)
        # torchtitan's _unpermute, then the combine all-to-all back to the pairs' own rank
        unpermuted = proj.new_empty(proj.shape)
        unpermuted[permuted] = proj
        combined = all_to_all_single_autograd(unpermuted, sent, arriving, group)
        weighted = combined * sample_weights_g.unsqueeze(-1)
        inv_perm = torch.empty_like(perm)
        inv_perm[perm] = torch.arange(perm.size(0), device=perm.device)
        weighted = weighted[inv_perm]
        return weighted.view(tokens, top_k, hidden_dim).sum(dim=1).to(hidden.dtype)

    return ExpertsParallel
