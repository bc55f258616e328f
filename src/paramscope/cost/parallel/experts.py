"""What expert parallelism adds to a rank's step beyond one device's, under balanced routing (estimate.py adds it).

Under `--ep E` a rank runs its own batch as one device does, with E/ep of each layer's routed experts; torchtitan's
ExpertParallel (traced/expert_parallel.py applies it to transformers' packed experts) sends each token-expert pair to
its expert's rank and back by two all-to-alls. With balanced routing (each rank's S = B·T·k pairs spread evenly over
the experts) a rank receives S pairs, ep·S/E for each of its experts: the same S rows through the same grouped
projections as one device's, so its activations are one device's plus what the dispatch keeps:

- the permute's index, kept for the backward: torchtitan's _permute puts the arrivals (rank by rank) in expert-major
  order with an int64 index of the S rows, which the gather and the _unpermute scatter save: 8·S bytes a MoE layer;
- the all-to-alls' outputs (S × h each way) and the permute and unpermute copies are transient within the layer's
  forward and backward, where fewer activations are live than at the step's peaks: not added (traces of one rank on
  torch's fake process group agree: tests/test_expert_parallel.py).
"""

from __future__ import annotations

from typing import Any, Iterable

INDEX_BYTES = 8  # int64

ROUTING = "balanced routing: each rank's S = B·T·k token-expert pairs spread evenly over the experts"


def moe_layers(placements: Iterable[Any]) -> int:
    """The layers whose routed experts are split over the expert-parallel ranks."""
    from .pipeline import LAYER_PREFIX

    return len({match.group(0) for p in placements if p.experts_split
                for match in [LAYER_PREFIX.match(p.name)] if match})


def dispatch_index_bytes(layers: int, top_k: int, batch: int, seq: int) -> tuple[int, str]:
    """(bytes, words): the permute indices a rank keeps for the backward, every MoE layer's."""
    pairs = batch * seq * top_k
    total = layers * INDEX_BYTES * pairs
    return total, (f"expert parallel's permute index kept for the backward (torchtitan's _permute: int64 over the S "
                   f"token-expert pairs a rank receives), {layers} MoE layers × {INDEX_BYTES} B × S = "
                   f"{batch}·{seq}·{top_k} = {total:,} B, counted whole at the forward and backward peaks (a bound in the "
                   f"backward, where the layers past their backward have freed theirs); {ROUTING}, so the S rows a "
                   "rank receives are one device's")


def load_words(ep: int, load: float, pairs: int) -> str:
    """The uneven expert load's convention, named (traced/expert_parallel.py routes it): `pairs`, S = B·T·k, a rank's
    token-expert pairs a MoE layer (a microbatch's under a pipeline)."""
    from ..traced.expert_parallel import busiest_pairs

    most = busiest_pairs(pairs, ep, load)
    return (f"expert load {load:g} (a convention, --expert-load): the busiest rank receives {load:g} × its balanced "
            f"share, ⌈{load:g}·S⌉ = {most:,} of S = B·T·k = {pairs:,} token-expert pairs a MoE layer, every rank "
            f"sending it an even part of them; the others are not the peak: each rank spreads the rest of its S pairs "
            f"evenly over the other {ep - 1}, which receive ep·S − {most:,} = {ep * pairs - most:,} between them, "
            "fewer than S each; the figures are the busiest rank's (rank 0's, traced with that routing)")
